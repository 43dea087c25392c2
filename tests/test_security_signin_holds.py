"""Sign-in round 2 (D10, D12, session time-outs): growing holds instead of a 15-minute lock, proxy headers believed
only from the proxies a site names, guessers never queue a clean sign-in, one commit per sign-in, and sessions that
end when idle or old.

The holds are checked on a `SignInGuard` with its clock replaced (no test waits out a hold); the proxies and the
time-outs against live servers on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from tests.support.app import launched_app, make_env


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def time(self) -> float:
        return self.now


@pytest.fixture()
def guarded(tmp_path, monkeypatch):
    from app.services.accounts import signin

    settings, db = make_env(tmp_path)
    clock = Clock()
    monkeypatch.setattr(signin, "time", clock)
    return signin.SignInGuard(db), clock, db


def sign_in(guard, name: str, password: str, address: str):
    return asyncio.run(guard.sign_in(name, password, address))


def test_holds_grow_with_failures_and_a_stranger_cannot_keep_a_colleague_out_for_long(guarded):
    from app.services.accounts.signin import ACCOUNT_FAILURES, ACCOUNT_MAX_HOLD_S, PAIR_FIRST_HOLD_S, PAIR_MAX_HOLD_S

    guard, clock, db = guarded
    stranger, colleague = "203.0.113.66", "203.0.113.67"
    for _ in range(ACCOUNT_FAILURES):
        assert sign_in(guard, "rita", "guess-guess", stranger).outcome == "refused"
    holds = []
    for _ in range(6):  # the stranger waits out each hold and guesses again: each hold is longer
        held = sign_in(guard, "rita", "guess-guess", stranger)
        assert held.outcome == "locked"
        holds.append(held.retry_after_s)
        clock.now += held.retry_after_s
        assert sign_in(guard, "rita", "guess-guess", stranger).outcome == "refused"
    assert holds[0] == PAIR_FIRST_HOLD_S and all(b > a for a, b in zip(holds, holds[1:]))
    assert max(holds) <= PAIR_MAX_HOLD_S

    # the stranger's own door is shut for the longest hold; rita, from her own desk, is not held at all
    assert sign_in(guard, "rita", "rita-pass-1", stranger).retry_after_s > ACCOUNT_MAX_HOLD_S
    assert sign_in(guard, "rita", "rita-pass-1", colleague).ok
    assert sign_in(guard, "rita", "rita-pass-1", stranger).outcome == "locked"  # her success does not open it


def test_guessing_from_many_addresses_holds_the_account_a_minute_at_most(guarded):
    from app.services.accounts.signin import ACCOUNT_FAILURES, ACCOUNT_FIRST_HOLD_S, ACCOUNT_MAX_HOLD_S

    guard, clock, db = guarded
    waits, failures, i = [], 0, 0
    while failures < 4 * ACCOUNT_FAILURES:  # a new address for every guess
        answer = sign_in(guard, "omar", "guess-guess", f"198.18.7.{i}")
        i += 1
        if answer.outcome == "locked":
            waits.append(answer.retry_after_s)
            clock.now += answer.retry_after_s  # the guesser waits it out and goes on
        else:
            failures += 1
    assert waits and waits[0] == ACCOUNT_FIRST_HOLD_S and max(waits) <= ACCOUNT_MAX_HOLD_S
    held = sign_in(guard, "omar", "omar-pass-1", "198.18.8.1")  # omar himself, right after the last guess
    assert held.outcome == "locked" and held.retry_after_s <= ACCOUNT_MAX_HOLD_S
    clock.now += ACCOUNT_MAX_HOLD_S
    assert sign_in(guard, "omar", "omar-pass-1", "198.18.8.1").ok


def test_guessers_never_queue_a_clean_sign_in(guarded):
    """With one hashing slot, two guessers stuck in their check (an address that already failed) used to hold the
    only slot; a clean sign-in now hashes in its own lane."""
    from app.services.accounts.signin import SignInGuard

    _, clock, db = guarded
    stuck = threading.Event()

    class Slow(SignInGuard):
        def _check(self, name, password, address):
            if name.startswith("guess"):
                stuck.wait(60)
            return super()._check(name, password, address)

    guard = Slow(db, hash_slots=1)
    guesser = "198.51.100.90"

    async def scene():
        assert (await guard.sign_in("nobody", "x", guesser)).outcome == "refused"  # the address has failed now
        guessing = [asyncio.ensure_future(guard.sign_in(f"guess{i}", "x", guesser)) for i in range(2)]
        await asyncio.sleep(0.2)
        clean = await asyncio.wait_for(guard.sign_in("omar", "omar-pass-1", "198.51.100.91"), timeout=20)
        stuck.set()
        await asyncio.gather(*guessing)
        return clean

    try:
        assert asyncio.run(scene()).ok
    finally:
        stuck.set()


def test_the_suspects_lane_rests_as_long_as_it_hashed(guarded):
    """Guessers used to hash back to back in their lane, so a colleague's clean sign-in almost always shared the CPU
    with one (1.47-1.55x her median alone in bench_signin --seconds 30). The lane now rests as long as each check took:
    the starts of consecutive guesses' checks are at least two check-times apart (a lower bound: load only widens it)."""
    from app.services.accounts.signin import SUSPECT_REST, SignInGuard

    _, clock, db = guarded
    starts: list[float] = []
    check_s = 0.2

    class Timed(SignInGuard):
        def _check(self, name, password, address):
            if name.startswith("guess"):
                starts.append(time.monotonic())
                time.sleep(check_s)
            return super()._check(name, password, address)

    guard = Timed(db, hash_slots=1)
    guesser = "198.51.100.93"

    async def scene():
        assert (await guard.sign_in("nobody", "x", guesser)).outcome == "refused"  # the address has failed now
        await asyncio.gather(*[guard.sign_in(f"guess{i}", "x", guesser) for i in range(3)])

    asyncio.run(scene())
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert len(starts) == 3 and min(gaps) >= (1 + SUSPECT_REST) * check_s * 0.95, gaps


def test_a_sign_in_is_one_commit(guarded):
    from sqlalchemy import event

    guard, clock, db = guarded
    commits = []
    listener = lambda connection: commits.append(1)  # noqa: E731
    event.listen(db.engine, "commit", listener)
    try:
        assert sign_in(guard, "omar", "omar-pass-1", "198.51.100.92").ok
    finally:
        event.remove(db.engine, "commit", listener)
    assert len(commits) == 1


@pytest.mark.slow
def test_proxy_headers_are_believed_only_from_the_proxies_a_site_names(tmp_path):
    """From 127.0.0.1, X-Forwarded-For used to be believed: a local caller picked the address the limits count."""
    from app.services.accounts.signin import SignInGuard
    from app.settings import web_settings

    settings, db = make_env(tmp_path)
    guard = SignInGuard(db, address_limit="3 per 15 minutes")
    with launched_app(web_settings(settings), db, signin=guard) as (url, demo):  # ORAPO_TRUSTED_PROXIES unset
        with httpx.Client(base_url=url, timeout=30) as http:
            for i in range(3):  # three guesses, each claiming another address
                answer = http.post(
                    "/login",
                    data={"username": f"who{i}", "password": "guess-guess"},
                    headers={"X-Forwarded-For": f"192.0.2.{i + 1}"},
                )
                assert answer.status_code == 400
            refused = http.post(
                "/login",
                data={"username": "omar", "password": "omar-pass-1"},
                headers={"X-Forwarded-For": "192.0.2.200"},
            )
        assert refused.status_code == 429 and "network address" in refused.text  # all counted against 127.0.0.1


@pytest.mark.slow
def test_sessions_end_when_idle_or_too_old(tmp_path):
    from app.settings import web_settings

    settings, db = make_env(tmp_path)
    idle = web_settings(settings).model_copy(update={"session_idle_min": 2.0 / 60, "session_max_h": 1.0})
    with launched_app(idle, db) as (url, demo):
        with httpx.Client(base_url=url, timeout=30, headers={"Origin": url}) as http:
            assert http.post("/login", data={"username": "rita", "password": "rita-pass-1"}).status_code == 200
            for _ in range(3):  # a page load is the reader's own: it keeps the session going
                time.sleep(1.0)
                assert http.get("/").status_code == 200
            time.sleep(3.0)  # idle; a GET of the config (the page's own polling) does not count, and ends it
            assert http.get("/config").status_code == 401
    old = web_settings(settings).model_copy(update={"session_idle_min": 30.0, "session_max_h": 3.0 / 3600})
    with launched_app(old, db) as (url, demo):
        with httpx.Client(base_url=url, timeout=30, headers={"Origin": url}) as http:
            assert http.post("/login", data={"username": "rita", "password": "rita-pass-1"}).status_code == 200
            assert http.get("/config").status_code == 200
            for _ in range(5):  # however active
                time.sleep(0.8)
                http.get("/")
            assert http.get("/config").status_code == 401
