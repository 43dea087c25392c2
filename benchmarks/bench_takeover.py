"""How long scheduled rounds go unattended when the leading `orapo serve` dies: from its SIGKILL to the other leading.

    ORAPO_TEST_POSTGRES_URL=$(.ci/postgres.sh) OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_takeover [--runs 5] [--lease-s 15]

Starts two `orapo serve --no-model` processes on 127.0.0.1 sharing one PostgreSQL (a schema made for the run and
dropped after) and one data folder, with ORAPO_LEADER_LEASE_S=`--lease-s` (15 s, the default, unless told). Then
`--runs` times: finds the leader (the holder of the leader lease), kills it with SIGKILL (no clean hand-over),
times until the other server holds the lease (polled every 50 ms), and starts the killed one again as a follower
for the next run. Prints each takeover, their median and the bound `app.services.operations.leader` states
(`lease_s + lease_s / 3`).

A kill lands anywhere in the leader's renewal cycle, so a takeover takes between about `lease_s - lease_s / 3`
and `lease_s + lease_s / 3`; the median is close to `lease_s`.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tests.support.servers import ServeProcess


def leader_pid(database) -> int | None:
    from app.services.operations.leader import (  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
        LEADER_LEASE,
        ServerIdentity,
    )
    from db import LeaseRepository  # noqa: PLC0415 -- loads sqlalchemy

    lease = LeaseRepository(database).get(LEADER_LEASE)
    if lease is None or not lease.live:
        return None
    return ServerIdentity.from_key(lease.holder.split("#")[0]).pid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--lease-s", type=float, default=15.0)
    args = parser.parse_args()
    if not os.environ.get("ORAPO_TEST_POSTGRES_URL"):
        sys.exit("postgres_missing: set ORAPO_TEST_POSTGRES_URL (`.ci/postgres.sh` starts a server and prints one).")
    from tests.support.databases import empty_database  # noqa: PLC0415 -- loads sqlalchemy

    print(f"command: OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_takeover {shlex.join(sys.argv[1:])}")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}; "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    bound = args.lease_s + args.lease_s / 3
    with (
        tempfile.TemporaryDirectory(prefix="orapo-takeover-") as tmp,
        empty_database("postgres", Path(tmp)) as database,
    ):
        database.upgrade()
        root = Path(tmp)
        env = {
            "ORAPO_DATA_DIR": str(root / "data"),
            "ORAPO_DATABASE_URL": database.url,
            "ORAPO_DEID_SECRET": "bench-secret",
            "ORAPO_LEADER_LEASE_S": str(args.lease_s),
        }
        servers = [ServeProcess(root, f"server-{k}-0", env).launch() for k in range(2)]
        takeovers = []
        try:
            for server in servers:
                server.wait_ready()
            for run in range(args.runs):
                while (pid := leader_pid(database)) is None:
                    time.sleep(0.05)
                leader = next(s for s in servers if s.proc.pid == pid)
                follower = next(s for s in servers if s is not leader)
                leader.stop(signal.SIGKILL)
                killed = time.monotonic()
                while leader_pid(database) != follower.proc.pid:
                    if time.monotonic() - killed > 3 * bound:
                        raise SystemExit(f"no takeover within {3 * bound:.0f} s:\n{follower.log()[-2000:]}")
                    time.sleep(0.05)
                takeovers.append(time.monotonic() - killed)
                print(f"run {run + 1}: takeover after SIGKILL {takeovers[-1]:.2f} s", flush=True)
                restarted = ServeProcess(root, f"{leader.name.rsplit('-', 1)[0]}-{run + 1}", env).launch()
                servers[servers.index(leader)] = restarted
                restarted.wait_ready()
        finally:
            for server in servers:
                server.close()
    print(
        f"\nlease {args.lease_s:g} s, {len(takeovers)} runs: median takeover {statistics.median(takeovers):.2f} s "
        f"(min {min(takeovers):.2f}, max {max(takeovers):.2f}); stated bound {bound:.1f} s"
    )


if __name__ == "__main__":
    main()
