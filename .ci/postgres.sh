#!/usr/bin/env bash
# Start a throwaway PostgreSQL server on 127.0.0.1 for the database tests and
# print its SQLAlchemy URL on stdout. Installs Debian's postgresql package when
# the server binaries are missing and we are root (CI). Idempotent: a server
# already running on the port is reused.
set -euo pipefail
cd /  # the postgres user may not be allowed into the caller's folder
PORT=${ORAPO_TEST_PG_PORT:-54329}
PGDATA=${ORAPO_TEST_PGDATA:-/tmp/orapo-pgdata}
URL="postgresql+psycopg://orapo:orapo@127.0.0.1:${PORT}/orapo_test"

bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$bindir" ]; then
  if [ "$(id -u)" != 0 ]; then echo "postgres_missing: install Debian's postgresql package to run the PostgreSQL tests." >&2; exit 3; fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq postgresql >&2
  bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
fi

as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

if ! as_pg "$bindir/pg_isready" -h 127.0.0.1 -p "$PORT" -q 2>/dev/null; then
  if [ ! -s "$PGDATA/PG_VERSION" ]; then
    rm -rf "$PGDATA"; mkdir -p "$PGDATA"
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$PGDATA"
    as_pg "$bindir/initdb" -D "$PGDATA" -A trust -U postgres >/dev/null
  fi
  as_pg "$bindir/pg_ctl" -D "$PGDATA" -l "$PGDATA/server.log" -w \
    -o "-c listen_addresses=127.0.0.1 -p $PORT -k /tmp -c fsync=off -c synchronous_commit=off -c full_page_writes=off" start >&2
fi
as_pg psql -h 127.0.0.1 -p "$PORT" -U postgres -tAc "SELECT 1 FROM pg_roles WHERE rolname='orapo'" | grep -q 1 \
  || as_pg psql -h 127.0.0.1 -p "$PORT" -U postgres -qc "CREATE ROLE orapo LOGIN PASSWORD 'orapo' CREATEDB" >&2
as_pg psql -h 127.0.0.1 -p "$PORT" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='orapo_test'" | grep -q 1 \
  || as_pg psql -h 127.0.0.1 -p "$PORT" -U postgres -qc "CREATE DATABASE orapo_test OWNER orapo" >&2
echo "$URL"
