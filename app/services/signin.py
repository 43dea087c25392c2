"""Sign-in that resists guessing, and the server's book of who is signed in.

Gradio's own `/login` route calls a synchronous `auth` callable inside its async
handler, so each Argon2 check (0.15-0.45 s) would stop every other request of
the server, and it knows neither the caller's address nor any limit. The
session middleware (`app.web_security`) answers `/login` itself and asks
`SignInGuard.sign_in`, which:

- refuses at once, without hashing, an account or an address that failed too
  often (a moving window kept by the `limits` package: 5 failures in 15 minutes
  lock an account, 20 lock an address; the lock lasts until the oldest failure
  leaves the window, and an administrator can lift it);
- hashes in a worker thread, a bounded number at a time (half the CPU cores), so
  guessing can neither block the event loop nor take every core;
- writes every sign-in, failed sign-in and lockout to the audit log. Attempts
  refused during a lockout are audited too, at most `REFUSALS_AUDITED` an hour
  per account or address, so a guessing script cannot fill the database.

The lockout is per process (in-memory storage): one `orapo serve` is one
process. A `SessionBook` maps each session token to its user and the password
stamp of its sign-in (`UserRepository.session_stamp`), so the middleware can
end a session when the password changes or the account is disabled; it also
records which user each Gradio session hash belongs to.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from limits import parse
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

from db.records import UserRecord
from orapo_core.errors import OrapoError

ACCOUNT_FAILURES, ADDRESS_FAILURES, WINDOW_MINUTES = 5, 20, 15
ACCOUNT_LIMIT = f"{ACCOUNT_FAILURES} per {WINDOW_MINUTES} minutes"
ADDRESS_LIMIT = f"{ADDRESS_FAILURES} per {WINDOW_MINUTES} minutes"
REFUSALS_AUDITED = "6 per hour"
ANONYMOUS = "anonymous"  # the audit log's actor for an attempt nobody has proved to be


@dataclass(frozen=True)
class SignInResult:
    outcome: str  # "signed_in", "refused" (wrong name or password, or a disabled account) or "locked"
    username: str | None = None
    stamp: str | None = None
    retry_after_s: int = 0
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome == "signed_in"


@dataclass(frozen=True)
class Lockout:
    kind: str  # "account" or "address"
    key: str
    until: datetime


class SignInGuard:
    """Throttled, audited, off-the-event-loop password checks for one server process."""

    def __init__(self, database, *, account_limit: str = ACCOUNT_LIMIT, address_limit: str = ADDRESS_LIMIT,
                 hash_slots: int | None = None):
        self._db = database
        self._limiter = MovingWindowRateLimiter(MemoryStorage())
        self._items = {"account": parse(account_limit), "address": parse(address_limit)}
        self._refusals_audited = parse(REFUSALS_AUDITED)
        self._seen_locked: set[tuple[str, str]] = set()  # for the admin's list; `limits` has no listing
        self._lock = threading.Lock()
        self.hash_slots = hash_slots or max(1, (os.cpu_count() or 2) // 2)
        self._slots = None  # an anyio CapacityLimiter, made in the server's event loop on first use

    async def sign_in(self, username: str, password: str, address: str) -> SignInResult:
        """Check a name and password from `address`; call from the event loop (the hashing runs in a thread)."""
        from anyio import CapacityLimiter, to_thread

        name = _account_key(username)
        locked = self.locked(name, address)
        if locked is not None:
            await to_thread.run_sync(self._audit_refusal, name, address, locked)
            return locked
        if self._slots is None:
            self._slots = CapacityLimiter(self.hash_slots)
        return await to_thread.run_sync(self._check, name, password or "", address, limiter=self._slots)

    def locked(self, username: str, address: str) -> SignInResult | None:
        """The refusal for an account or address locked now, or None."""
        for kind, key in (("account", _account_key(username)), ("address", address)):
            item = self._items[kind]
            if not self._limiter.test(item, kind, key):
                reset, _ = self._limiter.get_window_stats(item, kind, key)
                wait = max(1, math.ceil(reset - time.time()))
                what = "account" if kind == "account" else "network address"
                return SignInResult("locked", retry_after_s=wait, message=(
                    f"Too many failed sign-ins for this {what}: try again in {math.ceil(wait / 60)} minute(s), "
                    "or ask an administrator to lift the lockout."))
        return None

    def lockouts(self, actor: UserRecord) -> list[Lockout]:
        """Accounts and addresses locked now (administrators only)."""
        from app.services.auth import require_role

        require_role(actor, "admin")
        now, found = time.time(), []
        with self._lock:
            for kind, key in sorted(self._seen_locked):
                item = self._items[kind]
                if self._limiter.test(item, kind, key):
                    self._seen_locked.discard((kind, key))
                    continue
                reset, _ = self._limiter.get_window_stats(item, kind, key)
                found.append(Lockout(kind, key, datetime.fromtimestamp(max(reset, now), UTC)))
        return found

    def lift(self, actor: UserRecord, target: str) -> list[str]:
        """Forget the failures of an account or an address (administrators only); returns what was locked."""
        from app.services.auth import require_role
        from db import AuditRepository

        require_role(actor, "admin")
        target = (target or "").strip()
        lifted = []
        for kind, key in (("account", _account_key(target)), ("address", target)):
            if key and not self._limiter.test(self._items[kind], kind, key):
                lifted.append(kind)
            self._limiter.clear(self._items[kind], kind, key)
            with self._lock:
                self._seen_locked.discard((kind, key))
        if not lifted:
            raise OrapoError("not_locked", f"Neither an account nor an address named {target!r} is locked out.")
        AuditRepository(self._db).append("auth.unlock", actor=actor, object_type="sign_in", object_id=target,
                                         details={"lifted": lifted})
        return lifted

    # -- in a worker thread ------------------------------------------------------------------------------------

    def _check(self, name: str, password: str, address: str) -> SignInResult:
        from db import AuditRepository, UserRepository

        locked = self.locked(name, address)  # again: attempts that waited for a slot while others failed
        if locked is not None:
            self._audit_refusal(name, address, locked)
            return locked
        users = UserRepository(self._db)
        try:
            user = users.authenticate(name, password)
        except OrapoError as exc:
            return self._failed(name, address, exc.code)
        stamp = users.session_stamp(user.username)
        if stamp is None:  # disabled between the check and now
            return self._failed(name, address, "user_disabled")
        self._limiter.clear(self._items["account"], "account", name)  # a success forgives the account's failures
        with self._lock:
            self._seen_locked.discard(("account", name))
        AuditRepository(self._db).append("auth.sign_in", actor=user, object_type="user", object_id=user.id,
                                         details={"address": address})
        return SignInResult("signed_in", username=user.username, stamp=stamp)

    def _failed(self, name: str, address: str, reason: str) -> SignInResult:
        from db import AuditRepository

        audit = AuditRepository(self._db)
        audit.append("auth.sign_in_failed", actor=ANONYMOUS, object_type="user", object_id=_shown(name),
                     details={"address": address, "reason": reason})
        for kind, key in (("account", name), ("address", address)):
            item = self._items[kind]
            self._limiter.hit(item, kind, key)
            if not self._limiter.test(item, kind, key):
                with self._lock:
                    new = (kind, key) not in self._seen_locked
                    self._seen_locked.add((kind, key))
                if new:
                    reset, _ = self._limiter.get_window_stats(item, kind, key)
                    audit.append("auth.lockout", actor=ANONYMOUS, object_type=kind,
                                 object_id=_shown(key) if kind == "account" else key,
                                 details={"address": address, "failures": item.amount,
                                          "until": datetime.fromtimestamp(reset, UTC).isoformat(timespec="seconds")})
        return SignInResult("refused", message="Incorrect credentials.")

    def _audit_refusal(self, name: str, address: str, locked: SignInResult) -> None:
        from db import AuditRepository

        if self._limiter.hit(self._refusals_audited, "refused", name, address):
            AuditRepository(self._db).append("auth.sign_in_failed", actor=ANONYMOUS, object_type="user",
                                             object_id=_shown(name),
                                             details={"address": address, "reason": "locked_out",
                                                      "retry_after_s": locked.retry_after_s})


def _account_key(username: str | None) -> str:
    return (username or "").strip().lower()[:64]


def _shown(name: str) -> str:
    """The attempted name as the audit log keeps it: only something that could be a username (a password typed
    into the name field is not written down)."""
    from db.repositories.users import normalize_username

    try:
        return normalize_username(name)
    except OrapoError:
        return "(not a username)"


@dataclass(frozen=True)
class SignedInSession:
    username: str
    stamp: str
    address: str
    started: float
    previous_stamp: str | None = None  # the stamp this session had before it changed its own password


class SessionBook:
    """Who each session token belongs to, with the password stamp of its sign-in; and which user each Gradio
    session hash (chosen by the browser, and the key of its per-tab state) belongs to."""

    HASHES_KEPT_S = 24 * 3600  # a session hash unseen this long is forgotten (Gradio has dropped its state)

    def __init__(self):
        self._sessions: dict[str, SignedInSession] = {}
        self._hash_owners: dict[str, tuple[str, float]] = {}
        self._open_studies: dict[str, tuple[int, float]] = {}  # session hash -> the study its Read tab has open
        self._changing: set[str] = set()  # tokens whose session is changing its own password right now
        self._lock = threading.Lock()

    def open(self, username: str, stamp: str, address: str) -> str:
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._sessions[token] = SignedInSession(username, stamp, address, time.time())
        return token

    def get(self, token: str | None) -> SignedInSession | None:
        return self._sessions.get(token) if token else None

    def end(self, token: str | None) -> SignedInSession | None:
        with self._lock:
            return self._sessions.pop(token, None) if token else None

    def end_user(self, username: str, *, keep: str | None = None) -> int:
        """End every session of `username` but `keep`; returns how many ended."""
        with self._lock:
            ended = [t for t, s in self._sessions.items() if s.username == username and t != keep]
            for token in ended:
                del self._sessions[token]
        return len(ended)

    def restamp(self, token: str, stamp: str) -> None:
        """The session that changed its own password goes on under the new one."""
        with self._lock:
            session = self._sessions.get(token)
            if session is not None:
                self._sessions[token] = SignedInSession(session.username, stamp, session.address, session.started,
                                                        previous_stamp=session.stamp)

    def token_in(self, cookies: Mapping[str, str]) -> str | None:
        """The session token among a request's cookies (Gradio names them after a per-server id)."""
        for name, value in cookies.items():
            if name.startswith("access-token-") and value in self._sessions:
                return value
        return None

    @contextlib.contextmanager
    def changing_password(self, token: str | None):
        """While the session `token` changes its own password: the new hash is committed before this session is
        restamped with it, and a request of the same session checked in between (the page's event stream, a
        heartbeat) must not end the very session that proved the old password. Other sessions get no grace."""
        if token is None:
            yield
            return
        with self._lock:
            self._changing.add(token)
        try:
            yield
        finally:
            with self._lock:
                self._changing.discard(token)

    def honours(self, token: str | None, stamp: str | None) -> bool:
        """Whether the session `token` goes on, given `stamp`, the account's stamp read from the database just now
        (None: disabled or gone). One look under the lock, so that a change of this session's own password
        finishing while the stamp was being read cannot end it: the stamp read may be the old one (read before the
        commit; the session is restamped by now, and its previous stamp is that one) or the new one (the session is
        still changing, or restamped with it). Other sessions of the user match neither and end."""
        if stamp is None or token is None:
            return False
        with self._lock:
            session = self._sessions.get(token)
            if session is None:
                return False
            return token in self._changing or stamp in (session.stamp, session.previous_stamp)

    def password_changed(self, username: str, stamp: str | None, *, keep: str | None) -> int:
        """After `username` changed their own password: the session `keep` goes on, every other one ends."""
        if keep is not None and stamp is not None:
            self.restamp(keep, stamp)
        return self.end_user(username, keep=keep)

    def claim_hash(self, session_hash: str, username: str) -> bool:
        """True if `session_hash` is `username`'s (claimed now if nobody had it); False if another user's."""
        now = time.time()
        with self._lock:
            owner = self._hash_owners.get(session_hash)
            if owner is not None and owner[0] != username:
                return False
            self._hash_owners[session_hash] = (username, now)
            if len(self._hash_owners) > 10_000:
                for key in [k for k, (_, seen) in self._hash_owners.items() if now - seen > self.HASHES_KEPT_S]:
                    del self._hash_owners[key]
                    self._open_studies.pop(key, None)
        return True

    def note_open(self, session_hash: str, study_id: int) -> None:
        """The page whose session hash this is now has `study_id` open in its Read tab (an upload, the worklist,
        a resumed or reloaded study): results computed for any other study no longer belong on that page."""
        now = time.time()
        with self._lock:
            self._open_studies[session_hash] = (int(study_id), now)
            if len(self._open_studies) > 10_000:
                for key in [k for k, (_, seen) in self._open_studies.items() if now - seen > self.HASHES_KEPT_S]:
                    del self._open_studies[key]

    def open_study(self, session_hash: str | None) -> int | None:
        """The study the page with this session hash has open (None: none opened through this server)."""
        if not session_hash:
            return None
        with self._lock:
            entry = self._open_studies.get(session_hash)
        return None if entry is None else entry[0]
