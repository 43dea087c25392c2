"""What every repository shares: where its session comes from, and UTC times.

A repository built on a `Database` opens one short session per method call and
commits it, which is what a Gradio callback wants. Built on a `Session`, it
joins that session's transaction and leaves committing to the caller, so
several repositories can change the database all-or-nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session  # noqa: TID253 -- this module is heavy; light ones import it lazily

from db.database import Database
from db.models import AuditLog
from db.records import UserRecord

Actor = UserRecord | str | None
"""Who did it: a signed-in user, a name such as "cli" or "scheduler", or None for the system."""


class Repository:
    def __init__(self, db: Database | Session):
        self._db = db

    @contextmanager
    def _session(self) -> Iterator[Session]:
        if isinstance(self._db, Session):
            yield self._db
            self._db.flush()
        else:
            with self._db.session() as session:
                yield session


def as_utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every stored time is UTC, so say so."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def must_utc(value: datetime) -> datetime:
    result = as_utc(value)
    assert result is not None
    return result


def audit(
    session: Session,
    actor: Actor,
    action: str,
    object_type: str | None = None,
    object_id: Any = None,
    details: dict[str, Any] | None = None,
) -> None:
    """Append one audit entry inside the caller's transaction, so the change and its record stand or fall together."""
    if isinstance(actor, UserRecord):
        actor_id, actor_name = actor.id, actor.username
    else:
        actor_id, actor_name = None, actor or "system"
    session.add(
        AuditLog(
            actor_id=actor_id,
            actor_name=actor_name,
            action=action,
            object_type=object_type,
            object_id=None if object_id is None else str(object_id),
            details=dict(details or {}),
        )
    )
