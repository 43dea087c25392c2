"""Two real `orapo serve` processes on one PostgreSQL and one data folder, as behind a proxy.

What must happen once happens once: the cron fires from the leader alone (one round a tick, never two), and
killing the leader (SIGKILL: no clean hand-over) hands the schedule to the other within the lease's stated time
(`app.services.operations.leader`). A reader's sign-in lives in one server's memory, which is why the proxy must keep a
reader on one server (docs/pages/deploy/scaling-out-servers.md): the test pins that, so the day sessions move to the
database it fails and the doc changes with it.

The servers' cron counts seconds (tests.support.servers), the lease is 3 s and the leader checks every second;
a scheduled round is created and fails at once (no model to train: `--no-model`), which is all it takes to count
firings.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from types import SimpleNamespace

import pytest

from tests.support.databases import POSTGRES_URL, empty_database
from tests.support.servers import ServeProcess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgres,
    pytest.mark.skipif(
        not POSTGRES_URL,
        reason="two servers share a PostgreSQL: set ORAPO_TEST_POSTGRES_URL (.ci/postgres.sh starts one)",
    ),
]

LEASE_S = 3.0
TICK_S = 3  # the cron `*/3 * * * *`, in seconds (tests.support.servers)


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    from db import CorrectionRepository, StudyRepository, UserRepository
    from db.repositories import split_for

    root = tmp_path_factory.mktemp("two-servers")
    with empty_database("postgres", root) as database:
        database.upgrade()
        users = UserRepository(database)
        rita = users.create("rita", "rita-pass-1", role="radiologist")
        uid = next(f"uid-{k}" for k in range(1000) if split_for(f"uid-{k}") == "train")
        study = StudyRepository(database).create(uid, "ANON-1")  # one signed correction: a round may be requested
        CorrectionRepository(database).create(study.id, author_id=rita.id, text="Findings: Clear lungs.", signed=True)
        env = {
            "ORAPO_DATA_DIR": str(root / "data"),
            "ORAPO_DATABASE_URL": database.url,
            "ORAPO_DEID_SECRET": "test-secret",
            "ORAPO_LEADER_LEASE_S": str(LEASE_S),
            "ORAPO_ROUND_CHECK_S": "1",
        }
        servers = [ServeProcess(root, name, env, seconds_cron=True).launch() for name in ("a", "b")]
        try:
            for server in servers:
                server.wait_ready()
            yield SimpleNamespace(db=database, servers=servers)
        finally:
            for server in servers:
                server.close()


def _leader(two, timeout: float = 2 * LEASE_S):
    """The server holding the leader lease, once one does."""
    from app.services.operations.leader import LEADER_LEASE, ServerIdentity
    from db import LeaseRepository

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lease = LeaseRepository(two.db).get(LEADER_LEASE)
        if lease is not None and lease.live:
            pid = ServerIdentity.from_key(lease.holder.split("#")[0]).pid
            found = [s for s in two.servers if s.proc.pid == pid and s.proc.poll() is None]
            if found:
                return found[0]
        time.sleep(0.1)
    raise AssertionError(f"no live server leads after {timeout} s")


def _firings(two, since: float) -> Counter:
    """Scheduled requests since `since` (epoch seconds) by cron tick: each creates a round, or is refused before one
    exists (a round still active: `round_active`). A round that then fails is refused too, after its creation."""
    from db import AuditRepository

    fired = Counter()
    for entry in AuditRepository(two.db).query(actor_name="scheduler", limit=10_000):
        if entry.created_at.timestamp() < since:
            continue
        if entry.action == "round.create" or (
            entry.action == "round.refused" and entry.details.get("code") == "round_active"
        ):
            fired[int(entry.created_at.timestamp()) // TICK_S] += 1
    return fired


def _wait_ticks(two, since: float, ticks: int, timeout: float) -> Counter:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fired = _firings(two, since)
        if len(fired) >= ticks:
            return fired
        time.sleep(0.5)
    raise AssertionError(f"fewer than {ticks} cron firings in {timeout} s: {dict(_firings(two, since))}")


@pytest.mark.timeout(120)
def test_a_reader_signed_in_on_one_server_is_unknown_to_the_other(two):
    import httpx

    a, b = two.servers
    with httpx.Client(base_url=a.url, timeout=30) as on_a:
        assert on_a.post("/login", data={"username": "rita", "password": "rita-pass-1"}).status_code == 200
        assert on_a.get("/config").status_code == 200
        cookies = dict(on_a.cookies)
    assert cookies  # the session cookie a proxy would send to either server
    with httpx.Client(base_url=b.url, timeout=30, cookies=cookies) as on_b:
        assert on_b.get("/config").status_code == 401  # sessions live in the process that signed the reader in


@pytest.mark.timeout(60)
def test_the_cron_fires_from_the_leader_alone_one_round_a_tick(two):
    from app.services.rounds import set_schedule
    from db import RoundRepository

    _leader(two)
    since = time.time()
    set_schedule(two.db, cron=f"*/{TICK_S} * * * *", schedule_enabled=True)  # the leader picks it up within 1 s
    fired = _wait_ticks(two, since, ticks=3, timeout=8 * TICK_S)
    assert set(fired.values()) == {1}, f"more than one firing in a tick: {dict(fired)}"
    created = [r for r in RoundRepository(two.db).list(limit=100) if r.trigger == "schedule"]
    assert created and all(r.status in ("queued", "running", "failed") for r in created)
    assert Counter(int(r.created_at.timestamp()) // TICK_S for r in created).most_common(1)[0][1] == 1


@pytest.mark.timeout(60)
def test_killing_the_leader_hands_the_schedule_to_the_other(two):
    from app.services.rounds import set_schedule

    set_schedule(two.db, cron=f"*/{TICK_S} * * * *", schedule_enabled=True)
    leader = _leader(two)
    (follower,) = [s for s in two.servers if s is not leader]
    leader.stop(signal.SIGKILL)
    killed, killed_at = time.monotonic(), time.time()
    new = _leader(two, timeout=LEASE_S + LEASE_S / 3 + 5)
    takeover_s = time.monotonic() - killed
    print(f"takeover after SIGKILL: {takeover_s:.2f} s (lease {LEASE_S} s)")
    assert new is follower
    assert takeover_s <= LEASE_S + LEASE_S / 3 + 2  # the stated bound, and some slack for a busy machine
    fired = _wait_ticks(two, killed_at + takeover_s, ticks=2, timeout=6 * TICK_S)
    assert set(fired.values()) == {1}, dict(fired)
