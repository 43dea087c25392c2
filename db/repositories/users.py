"""Users: argon2id password hashes, roles, disabling rather than deleting.

Usernames are case-insensitive (stored lower-case). An unknown name and a wrong
password get the same refusal, and an unknown name still pays for one hash
check, so sign-in reveals neither which accounts exist nor by its timing.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from functools import cache

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import select  # noqa: TID253 -- this module is heavy; light ones import it lazily
from sqlalchemy.exc import IntegrityError  # noqa: TID253 -- this module is heavy; light ones import it lazily

from db.models import User, utcnow
from db.records import ROLES, UserRecord
from db.repositories.base import Actor, Repository, as_utc, audit, must_utc
from orapo_core.errors import OrapoError

MIN_PASSWORD_LENGTH = 8
_USERNAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_hasher = PasswordHasher()  # stateless parameters only; safe to share across threads


@cache
def _dummy_hash() -> str:
    # Made on first need, not at import: hashing costs tens of milliseconds and 64 MiB.
    return _hasher.hash(secrets.token_hex(16))


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def generate_password() -> str:
    """A one-time password: 16 URL-safe characters, about 96 bits."""
    return secrets.token_urlsafe(12)


def normalize_username(username: str) -> str:
    name = (username or "").strip().lower()
    if not _USERNAME.match(name):
        raise OrapoError(
            "invalid_username",
            "A username is 1-64 characters: letters, digits, '.', '_' or '-', starting with a letter or digit.",
        )
    return name


def check_password_strength(password: str) -> None:
    if len(password or "") < MIN_PASSWORD_LENGTH:
        raise OrapoError("weak_password", f"A password needs at least {MIN_PASSWORD_LENGTH} characters.")


def _record(user: User) -> UserRecord:
    return UserRecord(
        id=user.id,
        username=user.username,
        role=user.role,
        active=user.active,
        must_change_password=user.must_change_password,
        created_at=must_utc(user.created_at),
        last_login_at=as_utc(user.last_login_at),
    )


class UserRepository(Repository):
    def create(
        self,
        username: str,
        password: str,
        *,
        role: str = "radiologist",
        must_change_password: bool = False,
        actor: Actor = None,
    ) -> UserRecord:
        name = normalize_username(username)
        if role not in ROLES:
            raise OrapoError("invalid_role", f"A role is one of {', '.join(ROLES)}, not {role!r}.")
        check_password_strength(password)
        try:
            with self._session() as session:
                if session.scalar(select(User.id).where(User.username == name)) is not None:
                    raise OrapoError("user_exists", f"A user named {name!r} already exists.")
                user = User(
                    username=name,
                    password_hash=hash_password(password),
                    role=role,
                    active=True,
                    must_change_password=must_change_password,
                )
                session.add(user)
                session.flush()
                audit(session, actor, "user.create", "user", user.id, {"username": name, "role": role})
                return _record(user)
        except IntegrityError as exc:  # two admins adding the same name at once
            raise OrapoError("user_exists", f"A user named {name!r} already exists.") from exc

    def create_with_one_time_password(
        self, username: str, *, role: str = "radiologist", actor: Actor = None
    ) -> tuple[UserRecord, str]:
        """A new user with a generated password they must change at first sign-in; the password is returned once."""
        password = generate_password()
        return self.create(username, password, role=role, must_change_password=True, actor=actor), password

    def authenticate(self, username: str, password: str) -> UserRecord:
        """The user whose name and password these are; refuses wrong passwords and disabled accounts."""
        refused = OrapoError("bad_credentials", "Unknown username or wrong password.")
        name = (username or "").strip().lower()
        with self._session() as session:
            user = session.scalar(select(User).where(User.username == name))
            if user is None:
                try:
                    _hasher.verify(_dummy_hash(), password or "")
                except VerificationError:
                    pass
                raise refused
            try:
                _hasher.verify(user.password_hash, password or "")
            except (VerificationError, InvalidHashError):
                raise refused from None
            if not user.active:
                raise OrapoError("user_disabled", f"The account {name!r} is disabled; ask an administrator.")
            if _hasher.check_needs_rehash(user.password_hash):
                user.password_hash = hash_password(password)
            user.last_login_at = utcnow()
            return _record(user)

    def get(self, user_id: int) -> UserRecord:
        with self._session() as session:
            user = session.get(User, user_id)
            if user is None:
                raise OrapoError("user_not_found", f"There is no user with id {user_id}.")
            return _record(user)

    def get_by_username(self, username: str) -> UserRecord:
        with self._session() as session:
            return _record(self._load(session, username))

    def session_stamp(self, username: str) -> str | None:
        """A short fingerprint of the account's current password hash, or None for an unknown or disabled account.

        A session remembers the stamp of its sign-in and is honoured only while it still matches: a password
        change or reset (a new salted hash) ends every session made before it, and disabling ends them all.
        """
        name = (username or "").strip().lower()
        with self._session() as session:
            row = session.execute(select(User.password_hash, User.active).where(User.username == name)).first()
        if row is None or not row.active:
            return None
        return hashlib.sha256(row.password_hash.encode()).hexdigest()[:32]

    def list(self, *, include_disabled: bool = True) -> list[UserRecord]:
        with self._session() as session:
            query = select(User).order_by(User.username)
            if not include_disabled:
                query = query.where(User.active.is_(True))
            return [_record(u) for u in session.scalars(query)]

    def disable(self, username: str, *, actor: Actor = None) -> UserRecord:
        return self._set_active(username, False, actor)

    def enable(self, username: str, *, actor: Actor = None) -> UserRecord:
        return self._set_active(username, True, actor)

    def set_password(
        self, username: str, password: str, *, must_change_password: bool = False, actor: Actor = None
    ) -> UserRecord:
        """An administrator's reset (or the user's own change once signed in)."""
        check_password_strength(password)
        with self._session() as session:
            user = self._load(session, username)
            user.password_hash = hash_password(password)
            user.must_change_password = must_change_password
            audit(session, actor, "user.password", "user", user.id, {"username": user.username})
            return _record(user)

    def change_password(self, username: str, old_password: str, new_password: str) -> UserRecord:
        """A user's own change: proves the old password first (also clears must_change_password)."""
        user = self.authenticate(username, old_password)
        if old_password == new_password:
            raise OrapoError("password_unchanged", "Choose a new password different from the current one.")
        return self.set_password(user.username, new_password, actor=user)

    def _set_active(self, username: str, active: bool, actor: Actor) -> UserRecord:
        with self._session() as session:
            user = self._load(session, username)
            user.active = active
            audit(
                session,
                actor,
                "user.enable" if active else "user.disable",
                "user",
                user.id,
                {"username": user.username},
            )
            return _record(user)

    @staticmethod
    def _load(session, username: str) -> User:
        name = (username or "").strip().lower()
        user = session.scalar(select(User).where(User.username == name))
        if user is None:
            raise OrapoError("user_not_found", f"There is no user named {name!r}.")
        return user
