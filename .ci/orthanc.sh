#!/usr/bin/env bash
# Start a throwaway Orthanc (a real PACS: DICOMweb and DIMSE) on 127.0.0.1 for the
# archive tests and print its URL, with the generated user and password in it, on
# stdout: http://orapo:<password>@127.0.0.1:<http port>/ . The DICOMweb root is
# <url>dicom-web/; the DIMSE port and AE title are what GET <url>system says
# (DicomPort, DicomAet). Installs Debian's orthanc and orthanc-dicomweb packages
# when Orthanc or its DICOMweb plugin is missing and we are root (CI). Idempotent:
# an Orthanc this script started and that still answers is reused.
#
#   .ci/orthanc.sh          start (or reuse) and print the URL
#   .ci/orthanc.sh --stop   stop it and delete its folder
#
# Orthanc has no bind-address setting: HTTP refuses every peer but 127.0.0.1
# (RemoteAccessAllowed false) and needs the password, and DIMSE stores and
# queries only from modalities registered at 127.0.0.1 (DicomCheckModalityHost).
set -euo pipefail
DIR=${ORAPO_TEST_ORTHANC_DIR:-/tmp/orapo-orthanc}
PLUGIN=/usr/share/orthanc/plugins/libOrthancDicomWeb.so
USER_NAME=orapo

alive() {  # the URL in $DIR/url answers /system with our password
  [ -s "$DIR/url" ] && [ -s "$DIR/orthanc.pid" ] && kill -0 "$(cat "$DIR/orthanc.pid")" 2>/dev/null \
    && curl -fsS --max-time 2 "$(cat "$DIR/url")system" >/dev/null 2>&1
}

if [ "${1:-}" = "--stop" ]; then
  if [ -s "$DIR/orthanc.pid" ]; then kill "$(cat "$DIR/orthanc.pid")" 2>/dev/null || true; fi
  rm -rf "$DIR"
  exit 0
fi

if alive; then cat "$DIR/url"; exit 0; fi

if ! command -v Orthanc >/dev/null || [ ! -e "$PLUGIN" ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "orthanc_missing: install Debian's orthanc and orthanc-dicomweb packages to run the archive tests." >&2; exit 3
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  # The package's own service is not wanted (and is not started in a container without an init).
  apt-get install -y -qq --no-install-recommends orthanc orthanc-dicomweb >&2
fi

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() {
  local p
  for _ in $(seq 200); do
    p=$(( 20000 + RANDOM % 40000 ))
    if [ "$p" != "${1:-}" ] && port_free "$p"; then echo "$p"; return 0; fi
  done
  echo "orthanc_no_port: no free local port found for Orthanc." >&2; return 1
}

if [ -s "$DIR/orthanc.pid" ]; then kill "$(cat "$DIR/orthanc.pid")" 2>/dev/null || true; fi
rm -rf "$DIR"
mkdir -p "$DIR/storage"
chmod 700 "$DIR"
HTTP_PORT=$(free_port)
DICOM_PORT=$(free_port "$HTTP_PORT")
PASSWORD=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
URL="http://${USER_NAME}:${PASSWORD}@127.0.0.1:${HTTP_PORT}/"

cat >"$DIR/orthanc.json" <<JSON
{
  "Name": "orapo-test-archive",
  "StorageDirectory": "$DIR/storage",
  "IndexDirectory": "$DIR/storage",
  "Plugins": ["$PLUGIN"],
  "HttpServerEnabled": true,
  "HttpPort": $HTTP_PORT,
  "RemoteAccessAllowed": false,
  "AuthenticationEnabled": true,
  "RegisteredUsers": {"$USER_NAME": "$PASSWORD"},
  "OrthancExplorerEnabled": false,
  "WebDavEnabled": false,
  "HttpDescribeErrors": true,
  "DicomServerEnabled": true,
  "DicomAet": "ORTHANC",
  "DicomPort": $DICOM_PORT,
  "DicomCheckCalledAet": false,
  "DicomCheckModalityHost": true,
  "DicomAlwaysAllowEcho": true,
  "DicomAlwaysAllowStore": false,
  "DicomAlwaysAllowFind": false,
  "DicomAlwaysAllowMove": false,
  "DicomModalities": {"orapo-test": ["ORAPO_TEST", "127.0.0.1", 104]},
  "UnknownSopClassAccepted": false,
  "StableAge": 1,
  "SaveJobs": false,
  "DicomWeb": {"Enable": true, "Root": "/dicom-web/", "EnableWado": false, "StudiesMetadata": "Full",
               "SeriesMetadata": "Full"}
}
JSON
chmod 600 "$DIR/orthanc.json"

setsid Orthanc --logdir="$DIR" "$DIR/orthanc.json" </dev/null >"$DIR/stdout.log" 2>&1 &
echo $! >"$DIR/orthanc.pid"
echo "$URL" >"$DIR/url"
for _ in $(seq 150); do
  if alive && curl -fsS --max-time 2 "${URL}dicom-web/studies" >/dev/null 2>&1; then echo "$URL"; exit 0; fi
  if ! kill -0 "$(cat "$DIR/orthanc.pid")" 2>/dev/null; then break; fi
  sleep 0.2
done
echo "orthanc_not_ready: Orthanc did not answer within 30 s; its log is in $DIR." >&2
tail -n 20 "$DIR/stdout.log" "$DIR"/Orthanc*.log 2>/dev/null >&2 || true
exit 1
