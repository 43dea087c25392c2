#!/usr/bin/env bash
# Start a throwaway single-node SLURM cluster (Debian's slurm-wlm: slurmctld +
# slurmd, and munge for authentication) on 127.0.0.1 for the round-backend tests
# and print the path of its slurm.conf on stdout; the tests hand it to sbatch,
# squeue, scontrol and scancel as SLURM_CONF. Installs slurm-wlm and munge when
# they are missing and we are root (CI). Idempotent: a cluster this script
# started whose node still answers is reused.
#
#   .ci/slurm.sh          start (or reuse) and print the slurm.conf path
#   .ci/slurm.sh --stop   stop the daemons and delete the folder
#
# Everything lives in one folder (its own munge key and socket, state, spool,
# logs), so a machine's own SLURM or munge, if any, is left alone. One node named
# after this machine (slurmd finds itself by its short hostname) at 127.0.0.1,
# CPUs=2, 4 GiB, partition `debug`; no accounting database, so finished jobs are
# read from slurmctld's memory (MinJobAge) by `scontrol show job`. Memory is
# enforced by the job accounting sampler (OverMemoryKill), not cgroups, which a
# container may not delegate.
set -euo pipefail
DIR=${ORAPO_TEST_SLURM_DIR:-/tmp/orapo-slurm}
CONF="$DIR/slurm.conf"
NODE=$(hostname -s)

alive() {  # our slurmctld answers and our node is up (idle, mixed or allocated)
  [ -s "$CONF" ] && [ -s "$DIR/slurmctld.pid" ] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null \
    && SLURM_CONF="$CONF" timeout 5 sinfo -h -n "$NODE" -o '%t' 2>/dev/null | grep -Eq '^(idle|mix|alloc)'
}

stop() {
  local f
  for f in slurmd slurmctld munged; do
    if [ -s "$DIR/$f.pid" ]; then kill "$(cat "$DIR/$f.pid")" 2>/dev/null || true; fi
  done
  sleep 0.5
}

if [ "${1:-}" = "--stop" ]; then
  stop
  rm -rf "$DIR"
  exit 0
fi

if alive; then echo "$CONF"; exit 0; fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  if [ "$(id -u)" != 0 ]; then
    echo "slurm_missing: install Debian's slurm-wlm and munge packages (as root) to run the SLURM tests." >&2; exit 3
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  # The packages' own services are not wanted (and are not started in a container without an init).
  apt-get install -y -qq --no-install-recommends slurm-wlm munge >&2
fi
if [ "$(id -u)" != 0 ]; then
  echo "slurm_needs_root: slurmd runs jobs as their submitting user and must start as root." >&2; exit 3
fi

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() {
  local p
  for _ in $(seq 200); do
    p=$(( 20000 + RANDOM % 40000 ))
    if [ "$p" != "${1:-}" ] && port_free "$p"; then echo "$p"; return 0; fi
  done
  echo "slurm_no_port: no free local port found for SLURM." >&2; return 1
}

stop
rm -rf "$DIR"
mkdir -p "$DIR/state" "$DIR/spool" "$DIR/munge"
chmod 700 "$DIR" "$DIR/munge"
CTLD_PORT=$(free_port)
SLURMD_PORT=$(free_port "$CTLD_PORT")

# munge: its own key and socket
dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$DIR/munge/munge.key"
munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
  --pid-file="$DIR/munged.pid" --log-file="$DIR/munged.log" --seed-file="$DIR/munge/munge.seed" >&2

# Daemons bind to the address their host name resolves to, not to every interface: slurmd always (its NodeAddr is
# 127.0.0.1); slurmctld only where this machine's name resolves to a loopback address (it would bind elsewhere).
BIND=NoInAddrAny
if getent hosts "$NODE" | awk '{print $1}' | grep -q '^127\.'; then BIND=NoInAddrAny,NoCtldInAddrAny; fi

cat >"$CONF" <<CONF
ClusterName=orapo-test
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldAddr=127.0.0.1
CommunicationParameters=$BIND
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
JobAcctGatherParams=OverMemoryKill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
DefMemPerCPU=1024
MinJobAge=600
ReturnToService=2
KillWait=5
SchedulerParameters=sched_interval=2
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=2 RealMemory=4096 State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
CONF
# slurmd insists on a cgroup.conf beside slurm.conf even when no cgroup plugin is used
printf 'CgroupPlugin=autodetect\nIgnoreSystemd=yes\n' >"$DIR/cgroup.conf"

export SLURM_CONF="$CONF"
slurmctld -f "$CONF" -i >&2
slurmd -f "$CONF" -N "$NODE" >&2
for _ in $(seq 150); do
  if alive; then echo "$CONF"; exit 0; fi
  sleep 0.2
done
echo "slurm_not_ready: the SLURM node did not come up within 30 s; its logs are in $DIR." >&2
tail -n 20 "$DIR/slurmctld.log" "$DIR/slurmd.log" 2>/dev/null >&2 || true
exit 1
