"""Unsaved report text per reader and study: `report_autosaves`.

When the Read tab switches away from a study whose report box holds an edit
that was never stored (another upload, a worklist study, "Continue where you
left off"), and as the reader types, the text is kept here, and it is offered
back when that reader opens the study again. Storing a report deletes the row.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06 20:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa  # noqa: TID253 -- this module is heavy; light ones import it lazily
from alembic import op  # noqa: TID253 -- this module is heavy; light ones import it lazily

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "report_autosaves",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("base_version", sa.Integer(), nullable=False),
        sa.Column("saved_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["study_id"], ["studies.id"], name=op.f("fk_report_autosaves_study_id_studies")),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_report_autosaves_user_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_report_autosaves")),
        sa.UniqueConstraint("user_id", "study_id", name=op.f("uq_report_autosaves_user_id_study_id")),
    )
    op.create_index(op.f("ix_report_autosaves_study_id"), "report_autosaves", ["study_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_report_autosaves_study_id"), table_name="report_autosaves")
    op.drop_table("report_autosaves")
