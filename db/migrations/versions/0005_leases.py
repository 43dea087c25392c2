"""Leases: which of several `orapo serve` processes on one database runs the schedule, and which servers are alive.

A lease row with an expiry rather than PostgreSQL's advisory lock: the same on SQLite and PostgreSQL, and a
dead server's lease runs out after a known time however it died (`app.services.operations.leader` says why).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa  # noqa: TID253 -- this module is heavy; light ones import it lazily
from alembic import op  # noqa: TID253 -- this module is heavy; light ones import it lazily

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("name", sa.String(length=191), nullable=False),
        sa.Column("holder", sa.String(length=191), nullable=False),
        sa.Column("acquired_at", sa.Float(), nullable=False),
        sa.Column("renewed_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_leases")),
    )
    op.create_index(op.f("ix_leases_expires_at"), "leases", ["expires_at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_leases_expires_at"), table_name="leases")
    op.drop_table("leases")
