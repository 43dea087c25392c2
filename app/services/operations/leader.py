"""Which of several `orapo serve` processes on one database runs what must run once: the schedule, recover(), sweeps.

Servers behind a proxy share one PostgreSQL and one data folder. Each serves
readers and can start a round by hand (the database keeps one round at a time),
but only the leader, whoever holds the lease named "scheduler" (table `leases`,
`db.repositories.leases`), runs the cron and threshold jobs, `recover()` of
rounds a dead process left, and the sweep of the servers' upload cache.

A lease row with an expiry rather than PostgreSQL's `pg_try_advisory_lock` on a
connection held for the leader's life, because:

- it is the same code on SQLite and PostgreSQL (several servers on one machine
  may share a SQLite file, not over a network filesystem), tested on both;
- its takeover time is bounded however the leader died: a session lock is
  freed when PostgreSQL sees the connection end, at once after a kill but, after
  a power cut or a network partition, only when TCP keepalive gives up (two
  hours by default), while the cut-off leader would not know to stop;
- no connection is held open for the leader's life (a pooler in transaction
  mode, PgBouncer's default, silently breaks session locks).

Its price is two small UPDATEs per server every `lease_s / 3` seconds.

Timing, with `lease_s` = ORAPO_LEADER_LEASE_S (default 15 s): every server
ticks every `lease_s / 3`, renewing its own sign of life ("server:<key>") and
the leader lease when it holds it, or trying to take it when it does not. A
leader that dies stops renewing, its lease runs out at most `lease_s` after its
last renewal, and another server takes it at its next tick: **takeover within
`lease_s + lease_s / 3`** (20 s by default); a leader that stops cleanly gives
the lease back, and takeover is the next tick. A leader that cannot renew (the
database unreachable, the process paused) stops acting once its lease would
have run out by its own monotonic clock, counted from before its last renewal
that got through (`acting()`, checked by every leader job before it acts), so a
deposed leader never fires a job the new one fires too. Times in the table are
the database's clock, so servers with skewed clocks still agree.

A process is known by host, pid and start time (`ServerIdentity`; the start
time tells a reused pid apart). A round records the process that watches it
(`RoundMetrics.supervisor`) and `recover()` leaves it alone while that process
lives (`watch_of`). Each server keeps its upload cache in a folder named after
it (`ServerIdentity.folder`), deleted whole once that server is dead
(`live_server_folders`, `app.services.operations.cache_sweep`).
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import psutil

from db import LeaseRepository
from orapo_core.errors import log_line

if TYPE_CHECKING:
    from db.database import Database
    from db.records import LeaseRecord, RoundRecord

log = logging.getLogger(__name__)

DEFAULT_LEASE_S = 15.0
LEADER_LEASE = "scheduler"
SERVER_PREFIX = "server:"
#: How a server's own folder in the upload cache begins (`ServerIdentity.folder`).
FOLDER_PREFIX = "server-"
#: A queued round younger than this may be a request another process is still preparing (selecting its data,
#: writing its held-out set) before it records who watches it; recover() leaves it alone until then, except at
#: a start with no other server alive (what a single server always did).
QUEUED_GRACE_S = 600.0


@dataclass(frozen=True)
class ServerIdentity:
    """One process on one machine: host, pid and the process's start time (seconds since the epoch, 2 decimals)."""

    host: str
    pid: int
    started: float

    @property
    def key(self) -> str:
        return f"{self.host}:{self.pid}:{self.started:.2f}"

    def __str__(self) -> str:
        return f"{self.host} pid {self.pid}"

    def as_dict(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "started": self.started}

    @property
    def folder(self) -> str:
        """This server's folder name in the upload cache: its key as a safe file name (host, pid, start time)."""
        return f"{FOLDER_PREFIX}{_safe_host(self.host)}-{self.pid}-{self.started:.2f}"

    @classmethod
    def from_folder(cls, name: str) -> ServerIdentity | None:
        """The server a cache folder is named after, its host as `folder` spelled it; None for any other name."""
        if not name.startswith(FOLDER_PREFIX):
            return None
        try:
            host, pid, started = name[len(FOLDER_PREFIX) :].rsplit("-", 2)
            return cls(host, int(pid), round(float(started), 2))
        except ValueError:
            return None

    @classmethod
    def from_key(cls, key: str) -> ServerIdentity | None:
        try:
            host, pid, started = key.rsplit(":", 2)
            return cls(host, int(pid), round(float(started), 2))
        except ValueError:
            return None

    @classmethod
    def from_dict(cls, data: Any) -> ServerIdentity | None:
        try:
            return cls(str(data["host"]), int(data["pid"]), round(float(data["started"]), 2))
        except (TypeError, KeyError, ValueError):
            return None


def this_process() -> ServerIdentity:
    return ServerIdentity(socket.gethostname(), os.getpid(), round(psutil.Process().create_time(), 2))


def process_alive(identity: ServerIdentity) -> bool:
    """Whether the process `identity` names runs on this machine (its pid alive and started when it says)."""
    try:
        return abs(psutil.Process(identity.pid).create_time() - identity.started) < 1.0
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True  # cannot tell: alive, so nothing it may be watching is failed


def server_leases(database: Database) -> dict[str, LeaseRecord]:
    """Every server's sign-of-life lease (`db.records.LeaseRecord`, live or expired) by its process key."""
    return {lease.name[len(SERVER_PREFIX) :]: lease for lease in LeaseRepository(database).with_prefix(SERVER_PREFIX)}


def other_servers_alive(database: Database, me: ServerIdentity | None = None) -> list[str]:
    """The keys of the servers other than `me` (default: this process) whose sign of life is live; on this machine
    a server whose process is gone does not count, though its lease has not run out yet (a kill -9, restarted)."""
    me = me or this_process()
    alive = []
    for key, lease in server_leases(database).items():
        other = ServerIdentity.from_key(key)
        if (
            not lease.live
            or key == me.key
            or (other is not None and other.host == me.host and not process_alive(other))
        ):
            continue
        alive.append(key)
    return alive


def live_server_folders(names: Iterable[str], database: Database, me: ServerIdentity | None = None) -> set[str]:
    """Which of `names` (entries of the upload cache) are the folders (`ServerIdentity.folder`) of servers alive
    now, `me` (default: this process) always among them. On this machine a server lives while its process runs,
    its lease live or not (a paused process still holds what it was sent); elsewhere, while its sign-of-life lease
    is live. A folder on another machine whose server never took a lease is not a live one: a server takes its
    lease before it listens, so such a folder holds nothing uploaded (Gradio makes it again when it writes)."""
    me = me or this_process()
    servers: dict[str, tuple[ServerIdentity | None, LeaseRecord | None]] = {}
    for key, held in server_leases(database).items():
        identity = ServerIdentity.from_key(key)
        if identity is not None:
            servers[identity.folder] = (identity, held)
    live = set()
    for name in names:
        identity, lease = servers.get(name, (ServerIdentity.from_folder(name), None))
        if name == me.folder:
            live.add(name)
        elif identity is None:
            continue
        elif identity.host in (me.host, _safe_host(me.host)):
            if process_alive(identity):
                live.add(name)
        elif lease is not None and lease.live:
            live.add(name)
    return live


def _safe_host(host: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", host) or "_"


# --- recover(): who watches a round --------------------------------------------------------------------------


@dataclass(frozen=True)
class Watch:
    """Whether anyone still watches an active round that this process does not run, as `recover()` needs it."""

    gone: bool  # nobody does: recover() may fail the round
    local: bool  # its watcher ran on this machine, so the round's worker pid means a process here
    who: str  # the watcher, for the round's error


def watch_of(
    record: RoundRecord,
    *,
    me: ServerIdentity,
    servers: dict[str, Any],
    queued_grace_s: float = 0.0,
    now: datetime | None = None,
) -> Watch:
    """Who watches `record` (an active round not run by this process) and whether they are gone.

    A running round's watcher is the process its metrics name (`supervisor`): alive while its server lease is
    live, or, on this machine, while that process runs (`orapo rounds run` holds no lease). On another machine,
    a watcher that never held a lease cannot be seen from here: its round is left alone (an admin can cancel it).
    A round from before the watcher was recorded has only `supervisor_pid`, judged on this machine as before."""
    from app.services.rounds.metrics import RoundMetrics  # noqa: PLC0415 -- import cycle through app.services.rounds
    from app.services.rounds.processes import pid_alive  # noqa: PLC0415 -- import cycle through app.services.rounds

    if record.status == "queued":
        created = record.created_at
        age = ((now or datetime.now(UTC)) - created).total_seconds() if created is not None else float("inf")
        return Watch(age >= queued_grace_s, True, "its requester")
    metrics = RoundMetrics.of(record)
    supervisor = ServerIdentity.from_dict(metrics.supervisor)
    if supervisor is None:
        pid = metrics.supervisor_pid
        alive = bool(pid) and pid != me.pid and pid_alive(pid)
        return Watch(not alive, True, f"pid {pid}")
    if supervisor.key == me.key:
        return Watch(True, True, str(supervisor))
    local, lease = supervisor.host == me.host, servers.get(supervisor.key)
    if lease is not None and lease.live:
        return Watch(False, local, str(supervisor))
    if local:
        return Watch(not process_alive(supervisor), True, str(supervisor))
    return Watch(lease is not None, False, str(supervisor))


# --- the election ----------------------------------------------------------------------------------------------


class Leadership:
    """This process's part in the election: a tick every `lease_s / 3` in a daemon thread; `on_elected` and
    `on_deposed` run in that thread (the first tick runs in `start`, so a lone server leads before it returns)."""

    def __init__(
        self,
        database: Database,
        *,
        lease_s: float = DEFAULT_LEASE_S,
        on_elected: Callable[[], None] | None = None,
        on_deposed: Callable[[], None] | None = None,
        identity: ServerIdentity | None = None,
    ) -> None:
        self.db = database
        self.lease_s = float(lease_s)
        self.identity = identity or this_process()
        # two Leaderships in one process (tests, several apps) are two candidates: the token tells them apart
        self.holder = f"{self.identity.key}#{secrets.token_hex(4)}"
        self._on_elected, self._on_deposed = on_elected, on_deposed
        self._deadline: float | None = None  # monotonic time until which this process may act as leader
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def tick_s(self) -> float:
        return self.lease_s / 3

    @property
    def leading(self) -> bool:
        """Whether this process holds the leader lease, as of its last tick."""
        return self._deadline is not None

    def acting(self) -> bool:
        """Leading, and its lease has not run out by this process's own clock: a leader job may act now."""
        deadline = self._deadline
        return deadline is not None and time.monotonic() < deadline

    def leader(self) -> LeaseRecord | None:
        """The leader lease (`db.records.LeaseRecord`: holder, live), or None before any server led."""
        return LeaseRepository(self.db).get(LEADER_LEASE)

    def start(self) -> Leadership:
        if self._thread is not None:
            return self
        self._stop.clear()
        self.tick()
        self._thread = threading.Thread(target=self._loop, name="orapo-leadership", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop ticking; a leader steps down first (`on_deposed`), then both leases are given back."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.tick_s + 30)
        with self._lock:
            was_leading = self.leading
            if was_leading:
                self._depose()
        try:
            leases = LeaseRepository(self.db)
            if was_leading:
                leases.release(LEADER_LEASE, self.holder)  # the next server's tick takes over, no wait for expiry
            leases.release(SERVER_PREFIX + self.identity.key, self.identity.key)
        except Exception:  # noqa: BLE001 - the database is gone: the leases run out by themselves
            log.warning("could not give back the leases; they expire within %.0f s", self.lease_s)

    def tick(self) -> bool:
        """Renew this server's sign of life, then renew or take the leader lease; whether this process leads now."""
        with self._lock:
            began = time.monotonic()
            leases = LeaseRepository(self.db)
            try:
                leases.acquire(SERVER_PREFIX + self.identity.key, self.identity.key, self.lease_s)
                held = leases.acquire(LEADER_LEASE, self.holder, self.lease_s)
            except Exception as exc:  # noqa: BLE001 - the database is unreachable: lead on only while the lease lasts
                if self.leading and not self.acting():
                    log.warning("leader lease not renewed (%s); stepping down", type(exc).__name__)
                    self._depose()
                return self.leading
            if held:
                elected = not self.leading
                # The lease runs out lease_s after the database saw the renewal, which came after `began`.
                self._deadline = began + self.lease_s
                if elected:
                    log.info("this server (%s) now runs the schedule", self.identity)
                    if not self._call(self._on_elected):  # half a leader helps nobody: let another server try
                        self._depose()
                        leases.release(LEADER_LEASE, self.holder)
            elif self.leading:
                log.warning("another server holds the leader lease; stepping down")
                self._depose()
            return self.leading

    def _depose(self) -> None:
        self._deadline = None
        self._call(self._on_deposed)

    def _loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            self.tick()

    @staticmethod
    def _call(callback: Callable[[], None] | None) -> bool:
        if callback is None:
            return True
        try:
            callback()
            return True
        except Exception as exc:  # the election must go on whatever a duty does
            log.error("leader duty failed: %s", log_line(exc))
            return False
