"""Several app servers on one database: the lease election, who watches a round, and one round at a time.

Each test runs on SQLite and, with ORAPO_TEST_POSTGRES_URL, on PostgreSQL. Two candidates in one process stand
in for two servers here (each `Leadership` is a candidate of its own); tests/test_two_servers.py runs the real
thing with two `orapo serve` processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from orapo_core.errors import OrapoError


def _identity(host: str, pid: int, started: float = 1000.0):
    from app.services.operations.leader import ServerIdentity

    return ServerIdentity(host, pid, started)


def _candidate(database, host: str, lease_s: float = 1.0, **callbacks):
    from app.services.operations.leader import Leadership

    return Leadership(database, lease_s=lease_s, identity=_identity(host, 100 + len(host)), **callbacks)


# --- the lease ------------------------------------------------------------------------------------------------


def test_a_lease_is_held_renewed_given_back_and_timed_by_the_database(database):
    from db import LeaseRepository

    leases = LeaseRepository(database)
    assert leases.get("scheduler") is None
    assert leases.acquire("scheduler", "a", 30) and not leases.acquire("scheduler", "b", 30)
    first = leases.get("scheduler")
    assert first.holder == "a" and first.live and 29 < first.remaining_s <= 30
    assert abs(first.now - time.time()) < 5  # the database's clock, in seconds since the epoch
    assert leases.acquire("scheduler", "a", 30)  # renewed: same holder, same start, later expiry
    renewed = leases.get("scheduler")
    assert renewed.acquired_at == first.acquired_at and renewed.expires_at >= first.expires_at
    assert not leases.release("scheduler", "b") and leases.release("scheduler", "a")
    assert not leases.get("scheduler").live  # kept, expired: recover() tells a gone server from none
    assert leases.acquire("scheduler", "b", 30) and leases.get("scheduler").acquired_at > first.acquired_at
    assert [lease.name for lease in leases.with_prefix("sched")] == ["scheduler"] and leases.with_prefix("x_") == []


@pytest.mark.parametrize("existing", [False, True], ids=["new-row", "expired-row"])
def test_racing_candidates_on_their_own_connections_get_one_lease(database, existing):
    from db import Database, LeaseRepository

    if existing:
        LeaseRepository(database).acquire("scheduler", "gone", 0.01)
        time.sleep(0.05)
    candidates = [Database(database.url) for _ in range(6)]  # own engines: own connections, as other servers have
    barrier, won = threading.Barrier(len(candidates)), []

    def race(k, db):
        barrier.wait()
        if LeaseRepository(db).acquire("scheduler", f"server-{k}", 30):
            won.append(k)

    threads = [threading.Thread(target=race, args=(k, db)) for k, db in enumerate(candidates)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for db in candidates:
        db.dispose()
    assert len(won) == 1 and LeaseRepository(database).get("scheduler").holder == f"server-{won[0]}"


# --- the election ---------------------------------------------------------------------------------------------


def test_one_of_two_candidates_leads_and_the_other_takes_over_when_the_lease_runs_out(database):
    events = []
    a = _candidate(
        database, "a", on_elected=lambda: events.append("a elected"), on_deposed=lambda: events.append("a deposed")
    )
    b = _candidate(
        database, "b", on_elected=lambda: events.append("b elected"), on_deposed=lambda: events.append("b deposed")
    )
    assert a.tick() and not b.tick() and a.tick() and not b.tick()
    assert a.acting() and not b.acting() and events == ["a elected"]
    assert a.leader().holder == a.holder

    time.sleep(a.lease_s + 0.1)  # a stops renewing (a SIGKILL, a paused process): its lease runs out
    assert not a.acting()  # by its own clock it may no longer act, before it even learns it lost
    assert b.tick() and events == ["a elected", "b elected"]
    assert not a.tick() and events[-1] == "a deposed"  # a wakes up and finds b leading
    assert b.acting() and b.leader().holder == b.holder


def test_a_leader_that_stops_hands_over_at_the_next_tick(database):
    a, b = _candidate(database, "a", lease_s=30), _candidate(database, "b", lease_s=30)
    a.start()
    try:
        assert a.leading and not b.tick()
    finally:
        a.stop()
    assert not a.leading and b.tick()  # no wait for the 30 s lease: a gave it back
    b.stop()


def test_a_leader_cut_off_from_the_database_steps_down_when_its_lease_would_have_run_out(database, monkeypatch):
    from db.repositories.leases import LeaseRepository

    deposed = []
    a = _candidate(database, "a", on_deposed=lambda: deposed.append(True))
    assert a.tick()

    def unreachable(*args, **kwargs):
        raise ConnectionError("the database is unreachable")

    monkeypatch.setattr(LeaseRepository, "acquire", unreachable)
    assert a.tick() and a.acting() and not deposed  # within its lease it goes on
    time.sleep(a.lease_s + 0.1)
    assert not a.tick() and deposed == [True]


def test_a_failing_duty_gives_the_lease_back_for_another_server(database):
    def broken():
        raise RuntimeError("recover() failed")

    a, b = _candidate(database, "a", lease_s=30, on_elected=broken), _candidate(database, "b", lease_s=30)
    assert not a.tick() and b.tick()


def test_only_the_leading_scheduler_runs_round_jobs_and_the_other_takes_them_over(database):
    from app.services.rounds.schedule import CRON_JOB, RoundScheduler, set_schedule

    class Rounds:
        def __init__(self):
            self.recovered = 0

        def recover(self, **kwargs):
            self.recovered += 1
            return []

        def shutdown(self, cancel=True):
            pass

    set_schedule(database, cron="0 2 * * *", schedule_enabled=True)
    services = [Rounds(), Rounds()]
    first, second = (
        RoundScheduler(database, service=s, lease_s=1.5, threshold_check_s=3600, timezone=UTC) for s in services
    )
    first.start(), second.start()
    try:
        assert first.running and not second.running
        assert CRON_JOB in first.jobs() and second.jobs() == {}
        assert [s.recovered for s in services] == [1, 0]  # recover() runs on the leader only
        first.shutdown()
        deadline = time.monotonic() + 5
        while not second.running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert second.running and CRON_JOB in second.jobs() and services[1].recovered == 1
    finally:
        first.shutdown()
        second.shutdown()


# --- recover(): who watches a round ---------------------------------------------------------------------------


def _lease(live: bool):
    from db.records import LeaseRecord

    return LeaseRecord("server:x", "x", 0.0, 100.0 if live else 10.0, 50.0)


def _running(supervisor=None, supervisor_pid=None):
    metrics = {"supervisor": supervisor.as_dict() if supervisor else None, "supervisor_pid": supervisor_pid}
    return SimpleNamespace(status="running", created_at=datetime.now(UTC), metrics=metrics)


def test_who_watches_a_round_decides_whether_recover_may_fail_it():
    import psutil

    from app.services.operations.leader import this_process, watch_of

    me = this_process()
    other = _identity("other-host", 4321)
    local_gone = _identity(me.host, 2**22 + 7)  # no such pid
    parent = _identity(me.host, os.getppid(), round(psutil.Process(os.getppid()).create_time(), 2))

    def gone(record, servers=None, grace=0.0):
        return watch_of(record, me=me, servers=servers or {}, queued_grace_s=grace).gone

    assert not gone(_running(other), {other.key: _lease(live=True)})  # a live server elsewhere watches it
    assert gone(_running(other), {other.key: _lease(live=False)})  # that server stopped renewing
    assert not watch_of(_running(other), me=me, servers={}).local
    assert not gone(_running(other))  # elsewhere and never a server (`orapo rounds run`): cannot tell, left alone
    assert gone(_running(local_gone)) and not gone(_running(parent))  # on this machine its process decides
    assert gone(_running(_identity(parent.host, parent.pid, parent.started + 50)))  # the same pid, reused
    assert gone(_running(me))  # this process, but not running it: its thread is gone
    assert not gone(_running(supervisor_pid=os.getppid())) and gone(_running(supervisor_pid=2**22 + 7))  # older rows
    queued = SimpleNamespace(status="queued", created_at=datetime.now(UTC) - timedelta(seconds=30), metrics={})
    assert gone(queued) and not gone(queued, grace=600) and gone(queued, grace=10)


def test_a_servers_cache_folder_is_named_after_it_and_lives_as_long_as_it_does(database):
    """The upload cache's folders by server (`app.services.operations.cache_sweep`): on this machine the process
    decides, elsewhere the sign-of-life lease; a name that is no server's folder is never a live one."""
    import psutil

    from app.services.operations.leader import SERVER_PREFIX, ServerIdentity, live_server_folders, this_process
    from db import LeaseRepository

    me = this_process()
    odd = ServerIdentity("ward 3/../x:y", 12, 1700000000.5)
    assert odd.folder == "server-ward_3_.._x_y-12-1700000000.50" and "/" not in odd.folder
    assert ServerIdentity.from_folder(me.folder) == me and ServerIdentity.from_folder("0a1b2c") is None
    parent = _identity(me.host, os.getppid(), round(psutil.Process(os.getppid()).create_time(), 2))
    elsewhere_live, elsewhere_gone, never = (_identity("other-host", pid) for pid in (41, 42, 43))
    local_gone = _identity(me.host, 2**22 + 7)  # no such pid
    leases = LeaseRepository(database)
    for identity in (elsewhere_live, elsewhere_gone, local_gone):
        assert leases.acquire(SERVER_PREFIX + identity.key, identity.key, 600)
    leases.release(SERVER_PREFIX + elsewhere_gone.key, elsewhere_gone.key)
    names = [s.folder for s in (me, parent, elsewhere_live, elsewhere_gone, never, local_gone)] + ["exports", "0a1b"]
    assert live_server_folders(names, database, me) == {me.folder, parent.folder, elsewhere_live.folder}


def _round_watched_by(database, supervisor, worker_pid):
    from app.services.rounds.metrics import RoundMetrics
    from db import RoundRepository

    rounds = RoundRepository(database)
    record = rounds.create(trigger="manual", config={})
    rounds.transition(record.id, "running", metrics=RoundMetrics.update(supervisor=supervisor.as_dict()))
    rounds.set_process(record.id, pid=worker_pid)
    return record.id


def test_recover_leaves_a_round_of_a_live_server_elsewhere_and_fails_it_once_that_server_is_gone(database, tmp_path):
    from app.services.rounds import RoundService
    from db import LeaseRepository, RoundRepository
    from orapo_core.config import Settings

    other = _identity("other-host", 4321)
    # a live process here with the pid the round names as its worker: it is the other host's pid, not this one
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        round_id = _round_watched_by(database, other, bystander.pid)
        LeaseRepository(database).acquire(f"server:{other.key}", other.key, 30)
        service = RoundService(database, Settings(data_dir=tmp_path / "data"))
        assert service.recover() == [] and RoundRepository(database).get(round_id).status == "running"

        LeaseRepository(database).release(f"server:{other.key}", other.key)  # that server is gone
        assert [r.id for r in service.recover()] == [round_id]
        failed = RoundRepository(database).get(round_id)
        assert (
            failed.status == "failed"
            and failed.error == "worker_gone: other-host pid 4321, which watched this round, is gone."
        )
        assert bystander.poll() is None  # a pid of another machine is never signalled here
    finally:
        bystander.kill()
        bystander.wait()


# --- one round at a time, across processes ---------------------------------------------------------------------


def _one_untrained_correction(database):
    from db import CorrectionRepository, StudyRepository, UserRepository
    from db.repositories import split_for

    author = UserRepository(database).create("rita", "rita-pass-1")
    uid = next(f"uid-{k}" for k in range(1000) if split_for(f"uid-{k}") == "train")
    study = StudyRepository(database).create(uid, "ANON-1")
    CorrectionRepository(database).create(study.id, author_id=author.id, text="Findings: Clear lungs.", signed=True)


def test_two_servers_racing_to_start_a_round_start_exactly_one(database, tmp_path):
    """The older request commits last, the worst order: on PostgreSQL, ids are handed out before commit, so
    without the lock in `RoundRepository.create` both requests would see only themselves and both would run."""
    from sqlalchemy import event

    from app.services.rounds import RoundService
    from db import Database, RoundRepository
    from orapo_core.config import Settings

    _one_untrained_correction(database)
    settings = Settings(data_dir=tmp_path / "data")
    first_db, second_db = Database(database.url), Database(database.url)  # two servers: two connection pools
    inserted = threading.Event()

    def slow_commit(conn, cursor, statement, *args):  # the first request pauses between its INSERT and its COMMIT
        if statement.lstrip().upper().startswith("INSERT INTO TRAINING_ROUNDS") and not inserted.is_set():
            inserted.set()
            time.sleep(1.5)

    event.listen(first_db.engine, "after_cursor_execute", slow_commit)
    outcomes = {}

    def request(name, db):
        try:
            outcomes[name] = RoundService(db, settings).request_round(actor="cli")
        except OrapoError as exc:
            outcomes[name] = exc

    first = threading.Thread(target=request, args=("first", first_db))
    first.start()
    assert inserted.wait(30)
    request("second", second_db)
    first.join(60)
    for db in (first_db, second_db):
        db.dispose()
    started = [o for o in outcomes.values() if not isinstance(o, OrapoError)]
    refused = [o for o in outcomes.values() if isinstance(o, OrapoError)]
    assert len(started) == 1 and [e.code for e in refused] == ["round_active"], outcomes
    assert [r.id for r in RoundRepository(database).active()] == [started[0].id]
