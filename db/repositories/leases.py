"""Leases with an expiry on the database's clock: take or renew one, give it back, see who holds what.

A lease is one row per name. `acquire` takes it when it is free, expired, or already the caller's (then it is
renewed) in one conditional UPDATE, or INSERTs it when the row does not exist yet; two processes racing for it
are settled by the database (the row lock on PostgreSQL, the write lock on SQLite, the primary key for two
INSERTs), so at most one of them gets True. Every time is read from the database in the same transaction, so
the servers' own clocks never enter into it.
"""

from __future__ import annotations

from sqlalchemy import (  # noqa: TID253 -- this module is heavy; light ones import it lazily
    case,
    delete,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.exc import IntegrityError  # noqa: TID253 -- this module is heavy; light ones import it lazily

from db.models import Lease
from db.records import LeaseRecord
from db.repositories.base import Repository

#: Expired leases are kept this long (so `recover()` can tell a server that died from a process that never was
#: one), then deleted by the next `acquire` of a new name.
KEEP_EXPIRED_S = 7 * 24 * 3600.0


def database_now(session) -> float:
    """Seconds since the epoch on the database's clock (its wall clock now, not its transaction's start)."""
    if session.get_bind().dialect.name == "postgresql":
        return float(session.scalar(text("SELECT extract(epoch from clock_timestamp())")))
    return float(session.scalar(text("SELECT (julianday('now') - 2440587.5) * 86400.0")))


def _record(row: Lease, now: float) -> LeaseRecord:
    return LeaseRecord(row.name, row.holder, row.acquired_at, row.expires_at, now)


class LeaseRepository(Repository):
    def acquire(self, name: str, holder: str, ttl_s: float) -> bool:
        """Take `name` for `ttl_s` seconds, or renew it when `holder` has it; False while someone else's is live."""
        try:
            with self._session() as session:
                now = database_now(session)
                taken = session.execute(
                    update(Lease)
                    .where(Lease.name == name, or_(Lease.holder == holder, Lease.expires_at <= now))
                    # SET reads the row as it was: a renewal keeps its acquired_at, a takeover starts a new one
                    .values(
                        acquired_at=case((Lease.holder == holder, Lease.acquired_at), else_=now),
                        holder=holder,
                        renewed_at=now,
                        expires_at=now + ttl_s,
                    )
                    .execution_options(synchronize_session=False)
                )
                if taken.rowcount == 1:
                    return True
                if session.get(Lease, name) is not None:
                    return False
                session.execute(delete(Lease).where(Lease.expires_at < now - KEEP_EXPIRED_S))
                session.add(Lease(name=name, holder=holder, acquired_at=now, renewed_at=now, expires_at=now + ttl_s))
                session.flush()
                return True
        except IntegrityError:
            return False  # another process inserted the same name first: theirs

    def release(self, name: str, holder: str) -> bool:
        """End `holder`'s lease now (the row stays, expired); False when it was not theirs."""
        with self._session() as session:
            now = database_now(session)
            ended = session.execute(
                update(Lease)
                .where(Lease.name == name, Lease.holder == holder)
                .values(expires_at=now)
                .execution_options(synchronize_session=False)
            )
            return ended.rowcount == 1

    def get(self, name: str) -> LeaseRecord | None:
        """The lease `name`, live or not (see `LeaseRecord.live`), or None when nobody ever took it."""
        with self._session() as session:
            now = database_now(session)
            row = session.get(Lease, name)
            return None if row is None else _record(row, now)

    def with_prefix(self, prefix: str) -> list[LeaseRecord]:
        """Every lease whose name starts with `prefix`, live or expired, by name."""
        with self._session() as session:
            now = database_now(session)
            rows = session.scalars(
                select(Lease).where(Lease.name.startswith(prefix, autoescape=True)).order_by(Lease.name)
            )
            return [_record(row, now) for row in rows]
