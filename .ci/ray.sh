#!/usr/bin/env bash
# Start a throwaway Ray head (one node, 1 CPU) on 127.0.0.1 for the round-backend
# tests and print its job server's address on stdout: http://127.0.0.1:<port>,
# what JobSubmissionClient and `ray job submit --address` take. Installs the
# pinned Ray (the `ray` extra, constraints.txt) into the checkout's virtual
# environment when it is missing. Idempotent: a head this script started whose
# job server still answers is reused.
#
#   .ci/ray.sh          start (or reuse) and print the address
#   .ci/ray.sh --stop   stop it (`ray stop`, which stops every Ray node of this user on the machine) and delete its folder
#
# Run from the checkout (the Makefile does); BIN names another virtual environment's bin folder.
set -euo pipefail
DIR=${ORAPO_TEST_RAY_DIR:-/tmp/orapo-ray}
BIN=${BIN:-.venv/bin}
RAY="$BIN/ray"

alive() {  # the address in $DIR/address answers the job API
  [ -s "$DIR/address" ] && curl -fsS --max-time 3 "$(cat "$DIR/address")/api/version" >/dev/null 2>&1
}

if [ "${1:-}" = "--stop" ]; then
  if [ -x "$RAY" ] && [ -d "$DIR" ]; then "$RAY" stop >/dev/null 2>&1 || true; fi
  rm -rf "$DIR"
  exit 0
fi

# The tests import Ray's job client from this environment even when a head started by another checkout is reused.
if ! "$BIN/python" -c 'import ray.job_submission' 2>/dev/null; then
  "$BIN/pip" install -q -c constraints.txt -e '.[ray]' >&2 || {
    echo "ray_missing: could not install the pinned Ray (pip install -c constraints.txt -e '.[ray]')." >&2; exit 3; }
fi

if alive; then cat "$DIR/address"; exit 0; fi

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() {
  local p
  for _ in $(seq 200); do
    p=$(( 20000 + RANDOM % 40000 ))
    if [ "$p" != "${1:-}" ] && port_free "$p"; then echo "$p"; return 0; fi
  done
  echo "ray_no_port: no free local port found for Ray." >&2; return 1
}

rm -rf "$DIR"
mkdir -p "$DIR"
chmod 700 "$DIR"
GCS_PORT=$(free_port)
DASHBOARD_PORT=$(free_port "$GCS_PORT")
ADDRESS="http://127.0.0.1:$DASHBOARD_PORT"
# The job server is part of the dashboard; usage stats off (no network). Ray takes a node IP of 127.0.0.1 as "find
# the machine's address" and binds its gRPC servers there, unless it is told this is a one-machine cluster
# (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, the switch behind its loopback-only mode on macOS and Windows).
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
RAY_USAGE_STATS_ENABLED=0 "$RAY" start --head --node-ip-address 127.0.0.1 --port "$GCS_PORT" \
  --dashboard-host 127.0.0.1 --dashboard-port "$DASHBOARD_PORT" --include-dashboard true \
  --num-cpus 1 --num-gpus 0 --temp-dir "$DIR/tmp" --disable-usage-stats >"$DIR/start.log" 2>&1 || {
  echo "ray_not_started: ray start failed; its output is in $DIR/start.log." >&2; tail -n 20 "$DIR/start.log" >&2; exit 1; }
echo "$ADDRESS" >"$DIR/address"
for _ in $(seq 300); do
  if alive; then echo "$ADDRESS"; exit 0; fi
  sleep 0.2
done
echo "ray_not_ready: the Ray job server did not answer within 60 s; logs are in $DIR/tmp." >&2
exit 1
