"""Sign-in that resists guessing, and the server's book of who is signed in.

Gradio's own `/login` route calls a synchronous `auth` callable inside its async
handler, so each Argon2 check (0.15-0.45 s) would stop every other request of
the server, and it knows neither the caller's address nor any limit. The
session middleware (`app.web_security`) answers `/login` itself and asks
`SignInGuard.sign_in`, which:

- refuses at once, without hashing, an account or an address that failed too
  often: after 5 failures in 15 minutes an account and address pair is held for
  30 s, doubling with each further failure up to 15 minutes, and the account
  from anywhere for 15 s, doubling only up to a minute (so a stranger guessing
  cannot keep a colleague out for long); 20 failures lock an address until the
  oldest leaves the window (the `limits` package's moving window); an
  administrator can lift any of them;
- hashes in a worker thread, a bounded number at a time (half the CPU cores), so
  guessing can neither block the event loop nor take every core, in two lanes:
  attempts from an address with recent failures share one slot of their own,
  and start only while no clean sign-in waits or hashes, so guessers never
  queue or crowd out a clean sign-in; after each of its checks that slot rests
  as long as the check took (`SUSPECT_REST`), so guessing hashes at most half
  the time and a clean sign-in that arrives meanwhile rarely shares the CPU;
- writes every sign-in, failed sign-in and lockout to the audit log. Attempts
  refused during a lockout are audited too, at most `REFUSALS_AUDITED` an hour
  per account and address; and whatever the names tried, one address writes
  at most `ADDRESS_AUDITED` rows a minute: past it, its attempts are counted
  and the count is written as one summary row, so a guessing script cannot
  fill the database.

The lockout is per process (in-memory storage): one `orapo serve` is one
process. Who is signed in is `app.services.accounts.sessions.SessionBook`.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime
from time import monotonic
from typing import TYPE_CHECKING, Any

import anyio
from anyio import CapacityLimiter, to_thread
from limits import parse  # noqa: TID253 -- this module is heavy; light ones import it lazily
from limits.storage import MemoryStorage  # noqa: TID253 -- this module is heavy; light ones import it lazily
from limits.strategies import (  # noqa: TID253 -- this module is heavy; light ones import it lazily
    MovingWindowRateLimiter,
)

from app.services.accounts.auth import require_role
from app.services.accounts.holds import FailureLog, Lockout, SignInResult, account_key, held_refusal
from app.services.operations.metrics import count_sign_in_failure
from db import AuditRepository, UserRepository
from db.records import UserRecord
from db.repositories.users import normalize_username
from orapo_core.errors import OrapoError

if TYPE_CHECKING:
    from db.database import Database


ACCOUNT_FAILURES, ADDRESS_FAILURES, WINDOW_MINUTES = 5, 20, 15
ACCOUNT_LIMIT = f"{ACCOUNT_FAILURES} per {WINDOW_MINUTES} minutes"
ADDRESS_LIMIT = f"{ADDRESS_FAILURES} per {WINDOW_MINUTES} minutes"
# Holds after ACCOUNT_FAILURES failures within the window, doubling with each further failure: from one address on
# one account (the guesser's own door) up to the whole window; on the account from anywhere, only up to a minute.
# A pair's failures are remembered for an hour, so its holds can grow to their cap.
PAIR_FIRST_HOLD_S, PAIR_MAX_HOLD_S, PAIR_WINDOW_S = 30.0, WINDOW_MINUTES * 60.0, 3600.0
ACCOUNT_FIRST_HOLD_S, ACCOUNT_MAX_HOLD_S = 15.0, 60.0
REFUSALS_AUDITED = "6 per hour"
# Rows an address's unproven attempts (failed sign-ins, lockouts, refusals) may write to the audit log; past it they
# are counted, and the count is written as one `auth.refusals_summarised` row when the address may write again.
ADDRESS_AUDITED = "20 per minute"
ANONYMOUS = "anonymous"  # the audit log's actor for an attempt nobody has proved to be
# After each check in the suspects' lane, the lane rests this many times as long as the check took: guessing hashes
# at most 1 / (1 + SUSPECT_REST) of the time. Measured with benchmarks/bench_signin (docs: research, load).
SUSPECT_REST = 1.0


class SignInGuard:
    """Throttled, audited, off-the-event-loop password checks for one server process.

    Three holds, each refused at once without hashing: an account and address pair that failed
    `ACCOUNT_FAILURES` times is held for a time that doubles from `PAIR_FIRST_HOLD_S` up to `PAIR_MAX_HOLD_S` (the
    guesser's own door); an account, from anywhere, from `ACCOUNT_FIRST_HOLD_S` up to only `ACCOUNT_MAX_HOLD_S`, so a
    stranger guessing cannot keep a colleague out for long; an address that failed `ADDRESS_FAILURES` times on any
    accounts is locked until its oldest failure leaves the window. Hashing runs in two lanes: attempts from an address
    (or pair) with recent failures wait for one slot of their own and start only while no clean sign-in waits or
    hashes, so guessers never queue or crowd out a clean sign-in; after each such check the lane rests as long as
    the check took (`SUSPECT_REST`).
    """

    # the app's `app.services.operations.metrics.AppMetrics` (`build_app` sets it): counts failures by reason
    metrics = None

    def __init__(
        self,
        database: Database,
        *,
        account_limit: str = ACCOUNT_LIMIT,
        address_limit: str = ADDRESS_LIMIT,
        hash_slots: int | None = None,
    ) -> None:
        self._db = database
        self._limiter = MovingWindowRateLimiter(MemoryStorage())
        account = parse(account_limit)
        self._items = {"account": account, "address": parse(address_limit)}
        window = account.get_expiry()
        self._accounts: FailureLog[str] = FailureLog(account.amount, window, ACCOUNT_FIRST_HOLD_S, ACCOUNT_MAX_HOLD_S)
        self._pairs: FailureLog[tuple[str, str]] = FailureLog(
            account.amount, PAIR_WINDOW_S, PAIR_FIRST_HOLD_S, PAIR_MAX_HOLD_S
        )
        self._refusals_audited = parse(REFUSALS_AUDITED)
        self._address_audited = parse(ADDRESS_AUDITED)
        self._unwritten: dict[str, int] = {}  # address -> attempts not written since its last row
        self._seen_locked: set[tuple[str, str]] = set()  # what was held, for one lockout row each and the admin list
        self._lock = threading.Lock()
        self.hash_slots = hash_slots or max(1, (os.cpu_count() or 2) // 2)
        # anyio CapacityLimiters (clean, suspect), made in the server's event loop on first use
        self._slots: tuple[CapacityLimiter, CapacityLimiter] | None = None
        self._clean = 0  # clean sign-ins waiting for or in their hash: suspects wait until there are none
        self._suspects_rest_until = 0.0  # monotonic time before which the suspects' lane starts no check

    async def sign_in(self, username: str, password: str, address: str) -> SignInResult:
        """Check a name and password from `address`; call from the event loop (the hashing runs in a thread)."""
        name = account_key(username)
        locked = self.locked(name, address)
        if locked is not None:
            await to_thread.run_sync(self._audit_refusal, name, address, locked)
            return locked
        if self._slots is None:
            self._slots = (CapacityLimiter(self.hash_slots), CapacityLimiter(1))
        if not self.suspect(name, address):
            self._clean += 1  # on the event loop: no lock needed
            try:
                return await to_thread.run_sync(self._check, name, password or "", address, limiter=self._slots[0])
            finally:
                self._clean -= 1
        async with self._slots[1]:  # one suspect at a time, only while no clean sign-in waits or hashes, and rested
            while self._clean or monotonic() < self._suspects_rest_until:
                await anyio.sleep(0.01)
            began = monotonic()
            try:
                return await to_thread.run_sync(self._check, name, password or "", address)
            finally:
                self._suspects_rest_until = monotonic() + SUSPECT_REST * (monotonic() - began)

    def suspect(self, username: str, address: str) -> bool:
        """Whether this address failed recently (on any account): its attempts hash in the suspects' lane."""
        now = time.time()
        item = self._items["address"]
        with self._lock:
            paired = any(k[1] == address and self._pairs.count(k, now) for k in self._pairs.keys())
        return paired or self._limiter.get_window_stats(item, "address", address)[1] < item.amount

    def locked(self, username: str, address: str) -> SignInResult | None:
        """The refusal for an account, account and address pair, or address held now, or None."""
        name, now = account_key(username), time.time()
        with self._lock:
            until = max(self._pairs.held_until((name, address), now) or 0, self._accounts.held_until(name, now) or 0)
        if until:
            return held_refusal("account", until - now)
        item = self._items["address"]
        if not self._limiter.test(item, "address", address):
            reset, _ = self._limiter.get_window_stats(item, "address", address)
            return held_refusal("network address", reset - now)
        return None

    def lockouts(self, actor: UserRecord) -> list[Lockout]:
        """Accounts and addresses held now (administrators only)."""
        require_role(actor, "admin")
        now, found = time.time(), []
        with self._lock:
            for kind, key in sorted(self._seen_locked):
                if kind == "account":
                    until = max(
                        self._accounts.held_until(key, now) or 0,
                        *[self._pairs.held_until(k, now) or 0 for k in self._pairs.keys() if k[0] == key],
                    )
                else:
                    item = self._items[kind]
                    until = (
                        0 if self._limiter.test(item, kind, key) else self._limiter.get_window_stats(item, kind, key)[0]
                    )
                if not until:
                    self._seen_locked.discard((kind, key))
                    continue
                found.append(Lockout(kind, key, datetime.fromtimestamp(max(until, now), UTC)))
        return found

    def lift(self, actor: UserRecord, target: str) -> list[str]:
        """Forget the failures of an account or an address (administrators only); returns what was locked."""
        require_role(actor, "admin")
        target = (target or "").strip()
        name, now, lifted = account_key(target), time.time(), []
        with self._lock:
            if name and (
                self._accounts.held_until(name, now)
                or any(self._pairs.held_until(k, now) for k in self._pairs.keys() if k[0] == name)
            ):
                lifted.append("account")
            self._accounts.clear(lambda k: k == name)
            self._pairs.clear(lambda k: k[0] == name or k[1] == target)
            self._seen_locked.discard(("account", name))
            self._seen_locked.discard(("address", target))
        item = self._items["address"]
        if target and not self._limiter.test(item, "address", target):
            lifted.append("address")
        self._limiter.clear(item, "address", target)
        if not lifted:
            raise OrapoError("not_locked", f"Neither an account nor an address named {target!r} is locked out.")
        AuditRepository(self._db).append(
            "auth.unlock", actor=actor, object_type="sign_in", object_id=target, details={"lifted": lifted}
        )
        return lifted

    # -- in a worker thread ------------------------------------------------------------------------------------

    def _check(self, name: str, password: str, address: str) -> SignInResult:
        locked = self.locked(name, address)  # again: attempts that waited for a slot while others failed
        if locked is not None:
            self._audit_refusal(name, address, locked)
            return locked
        refused = None
        # one transaction, one commit: the last sign-in time (and a rehashed password) with its audit row
        with self._db.session() as session:
            users = UserRepository(session)
            try:
                user = users.authenticate(name, password)
            except OrapoError as exc:
                refused = exc.code
            else:
                stamp = users.session_stamp(user.username)
                if stamp is None:  # disabled between the check and now
                    refused = "user_disabled"
                else:
                    AuditRepository(session).append(
                        "auth.sign_in", actor=user, object_type="user", object_id=user.id, details={"address": address}
                    )
        if refused is not None:
            return self._failed(name, address, refused)
        with self._lock:  # a success forgives the account's failures, and its own address's: not a guesser's
            self._accounts.clear(lambda k: k == name)
            self._pairs.clear(lambda k: k == (name, address))
            self._seen_locked.discard(("account", name))
        return SignInResult("signed_in", username=user.username, stamp=stamp)

    def _anonymous_row(self, address: str, action: str, **row: Any) -> None:
        """One audit row of an unproven attempt from `address`, unless that address wrote `ADDRESS_AUDITED`
        already: then it is only counted, and the count goes in as one summary row before its next row."""
        if not self._limiter.hit(self._address_audited, "audited", address):
            with self._lock:
                self._unwritten[address] = self._unwritten.get(address, 0) + 1
            return
        with self._lock:
            unwritten = self._unwritten.pop(address, 0)
        audit = AuditRepository(self._db)
        if unwritten:
            audit.append(
                "auth.refusals_summarised",
                actor=ANONYMOUS,
                object_type="address",
                object_id=address,
                details={"address": address, "attempts_not_written": unwritten, "limit": ADDRESS_AUDITED},
            )
        audit.append(action, actor=ANONYMOUS, **row)

    def flush_summaries(self) -> int:
        """Write the counts not yet summarised (the server is stopping); returns how many rows it wrote."""
        with self._lock:
            pending, self._unwritten = self._unwritten, {}
        for address, unwritten in pending.items():
            AuditRepository(self._db).append(
                "auth.refusals_summarised",
                actor=ANONYMOUS,
                object_type="address",
                object_id=address,
                details={"address": address, "attempts_not_written": unwritten, "limit": ADDRESS_AUDITED},
            )
        return len(pending)

    def _failed(self, name: str, address: str, reason: str) -> SignInResult:
        count_sign_in_failure(self.metrics, reason)
        self._anonymous_row(
            address,
            "auth.sign_in_failed",
            object_type="user",
            object_id=_shown(name),
            details={"address": address, "reason": reason},
        )
        now, item = time.time(), self._items["address"]
        self._limiter.hit(item, "address", address)
        with self._lock:
            self._accounts.hit(name, now)
            self._pairs.hit((name, address), now)
            held = {
                "account": max(
                    self._accounts.held_until(name, now) or 0, self._pairs.held_until((name, address), now) or 0
                ),
                "address": 0
                if self._limiter.test(item, "address", address)
                else self._limiter.get_window_stats(item, "address", address)[0],
            }
            failures = {"account": self._accounts.count(name, now), "address": item.amount}
            new = [
                kind
                for kind in held
                if held[kind] and (kind, name if kind == "account" else address) not in self._seen_locked
            ]
            self._seen_locked.update((kind, name if kind == "account" else address) for kind in held if held[kind])
        for kind in new:
            self._anonymous_row(
                address,
                "auth.lockout",
                object_type=kind,
                object_id=_shown(name) if kind == "account" else address,
                details={
                    "address": address,
                    "failures": failures[kind],
                    "until": datetime.fromtimestamp(held[kind], UTC).isoformat(timespec="seconds"),
                },
            )
        return SignInResult("refused", message="Incorrect credentials.")

    def _audit_refusal(self, name: str, address: str, locked: SignInResult) -> None:
        count_sign_in_failure(self.metrics, "locked_out")
        if self._limiter.hit(self._refusals_audited, "refused", name, address):
            self._anonymous_row(
                address,
                "auth.sign_in_failed",
                object_type="user",
                object_id=_shown(name),
                details={"address": address, "reason": "locked_out", "retry_after_s": locked.retry_after_s},
            )
        else:
            with self._lock:
                self._unwritten[address] = self._unwritten.get(address, 0) + 1


def _shown(name: str) -> str:
    """The attempted name as the audit log keeps it: only something that could be a username (a password typed
    into the name field is not written down)."""
    try:
        return normalize_username(name)
    except OrapoError:
        return "(not a username)"
