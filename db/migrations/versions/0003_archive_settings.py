"""The archive settings: one row saying when a signed report goes back to the archive as a DICOM SR.

Which archive is configuration (ORAPO_DICOMWEB_URL and its credentials, never
stored in the database); whether signing sends the report there is an admin's
choice made in the app, so it lives here, like the round schedule.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa  # noqa: TID253 -- this module is heavy; light ones import it lazily
from alembic import op  # noqa: TID253 -- this module is heavy; light ones import it lazily

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "archive_settings",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("sr_send", sa.String(length=16), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_by", sa.Integer(), nullable=True),
        sa.CheckConstraint("id = 1", name=op.f("ck_archive_settings_single_row")),
        sa.CheckConstraint("sr_send IN ('off', 'on_sign', 'manual')", name=op.f("ck_archive_settings_sr_send")),
        sa.ForeignKeyConstraint(["updated_by"], ["users.id"], name=op.f("fk_archive_settings_updated_by_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_archive_settings")),
    )


def downgrade() -> None:
    op.drop_table("archive_settings")
