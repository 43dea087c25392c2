"""Who is asking, and may they: sign-in, roles and the forced password change.

Gradio's sign-in only proves a username once and keeps a cookie; it knows
nothing of roles, disabled accounts or one-time passwords. So every handler asks
`signed_in` again on every call, against the database: an account disabled a
minute ago, or a radiologist calling an admin endpoint by its API name, is
refused here, whatever the page showed them.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from db import AuditRepository, UserRepository
from db.records import AuditEntry, UserRecord
from db.repositories.users import generate_password
from orapo_core.errors import OrapoError

if TYPE_CHECKING:
    from app.services.accounts.sessions import SessionBook
    from db.database import Database

ROLE_WORDS = {"admin": "an administrator", "radiologist": "a radiologist"}


def check_credentials(db: Database, username: str, password: str) -> bool:
    """True for a valid, active account (even one that must change its password). The web sign-in goes through
    `app.services.accounts.signin.SignInGuard`, which adds throttling and the audit log to the same check."""
    try:
        UserRepository(db).authenticate(username, password)
    except OrapoError:
        return False
    return True


def is_admin(db: Database, username: str) -> bool:
    """Whether `username` is an active administrator now (the session middleware asks, for admin-only files)."""
    try:
        user = UserRepository(db).get_by_username(username)
    except OrapoError:
        return False
    return user.active and user.role == "admin"


def signed_in(
    db: Database, username: str | None, *, role: str | None = None, allow_password_change: bool = False
) -> UserRecord:
    """The signed-in user, checked now: active, password changed if required, and holding `role` if given."""
    if not username:
        raise OrapoError("not_signed_in", "Sign in first.")
    try:
        user = UserRepository(db).get_by_username(username)
    except OrapoError:
        raise OrapoError("not_signed_in", "Your account no longer exists; sign in again.") from None
    if not user.active:
        raise OrapoError("user_disabled", "Your account is disabled; ask an administrator.")
    if user.must_change_password and not allow_password_change:
        raise OrapoError("password_change_required", "Change your one-time password on the Account tab first.")
    if role is not None:
        require_role(user, role)
    return user


def require_role(user: UserRecord, role: str) -> None:
    """Refuse unless `user` has `role`; an administrator may do whatever a radiologist may."""
    if user.role == role or (user.role == "admin" and role == "radiologist"):
        return
    raise OrapoError("forbidden", f"Only {ROLE_WORDS.get(role, role)} can do this.")


def change_own_password(db: Database, user: UserRecord, old: str, new: str, repeat: str) -> UserRecord:
    if new != repeat:
        raise OrapoError("password_mismatch", "The new password and its repetition differ.")
    return UserRepository(db).change_password(user.username, old, new)


def change_own_password_in_session(
    db: Database, sessions: SessionBook | None, user: UserRecord, request: Any, old: str, new: str, repeat: str
) -> int:
    """`user`'s own change from the session of `request`: that session goes on under the new password (honoured
    by the middleware throughout the change), every other session of theirs ends; returns how many ended."""
    token = _session_token(sessions, request)
    with sessions.changing_password(token) if sessions is not None else contextlib.nullcontext():
        change_own_password(db, user, old, new, repeat)
        return end_other_sessions(db, sessions, user, request)


def _session_token(sessions: SessionBook | None, request: Any) -> str | None:
    raw = getattr(request, "request", None)
    cookies = getattr(raw, "cookies", None) or {}
    return sessions.token_in(cookies) if sessions is not None else None


def end_other_sessions(db: Database, sessions: SessionBook | None, user: UserRecord, request: Any) -> int:
    """After `user` changed their own password: the session of `request` goes on under the new password, every
    other session of theirs ends (the middleware would refuse them anyway: their password stamp is stale)."""
    if sessions is None:
        return 0
    return sessions.password_changed(
        user.username, UserRepository(db).session_stamp(user.username), keep=_session_token(sessions, request)
    )


# Administration: each takes the acting user and checks the role itself, so no
# caller (a tab, a test, a future endpoint) can forget to.


def list_users(db: Database, actor: UserRecord) -> list[UserRecord]:
    require_role(actor, "admin")
    return UserRepository(db).list()


def create_user(db: Database, actor: UserRecord, username: str, role: str) -> tuple[UserRecord, str]:
    """A new account with a one-time password, returned once to show the administrator."""
    require_role(actor, "admin")
    return UserRepository(db).create_with_one_time_password(username, role=role, actor=actor)


def set_user_active(db: Database, actor: UserRecord, username: str, active: bool) -> UserRecord:
    require_role(actor, "admin")
    if not active and (username or "").strip().lower() == actor.username:
        raise OrapoError("cannot_disable_self", "You cannot disable your own account.")
    users = UserRepository(db)
    return users.enable(username, actor=actor) if active else users.disable(username, actor=actor)


def reset_password(db: Database, actor: UserRecord, username: str) -> tuple[UserRecord, str]:
    """A new one-time password the user must change at next sign-in."""
    require_role(actor, "admin")
    password = generate_password()
    return UserRepository(db).set_password(username, password, must_change_password=True, actor=actor), password


def audit_log(
    db: Database, actor: UserRecord, *, action: str | None = None, actor_name: str | None = None, limit: int = 200
) -> list[AuditEntry]:
    require_role(actor, "admin")
    return AuditRepository(db).query(action=action or None, actor_name=actor_name or None, limit=limit)
