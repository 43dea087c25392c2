"""Which worklist ordering each correction came from: `corrections.reading_order` ('oldest', 'useful', or NULL when
the study was not opened from an ordering, as before this revision).

A column rather than an audit detail because a round counts its pairs by it
(`app.services.reading.reading_order`), a join the audit log's JSON would make slow and
backend-specific. Added in place, with its CHECK as a column constraint, so
SQLite never rebuilds the corrections table that pairs and amendments point at.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03 11:00:00
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

import sqlalchemy as sa  # noqa: TID253 -- this module is heavy; light ones import it lazily
from alembic import op  # noqa: TID253 -- this module is heavy; light ones import it lazily

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CHECK = "ck_corrections_reading_order"
_RULE = "reading_order IN ('oldest', 'useful')"


def upgrade() -> None:
    if op.get_context().dialect.name == "sqlite":
        op.execute(f"ALTER TABLE corrections ADD COLUMN reading_order VARCHAR(16) CONSTRAINT {_CHECK} CHECK ({_RULE})")
    else:
        op.add_column("corrections", sa.Column("reading_order", sa.String(length=16), nullable=True))
        op.create_check_constraint(op.f(_CHECK), "corrections", _RULE)


def downgrade() -> None:
    if op.get_context().dialect.name == "sqlite" and sqlite3.sqlite_version_info >= (3, 35):
        op.execute("ALTER TABLE corrections DROP COLUMN reading_order")
    elif op.get_context().dialect.name == "sqlite":
        with op.batch_alter_table("corrections") as batch:
            batch.drop_column("reading_order")
    else:
        op.drop_constraint(op.f(_CHECK), "corrections", type_="check")
        op.drop_column("corrections", "reading_order")
