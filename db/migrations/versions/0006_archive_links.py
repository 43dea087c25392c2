"""Archive links: for a study imported from the archive, the archive's StudyInstanceUID, sealed.

A signed report goes back to the archive as a DICOM SR; to be filed in the
archive's own study (beside its images, under the patient's real identity), the
sender needs that study's UID. It is kept encrypted with a key derived from the
de-identification secret, in a table of its own that only the SR sender reads;
the de-identified images and every other table stay as they were.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-06 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa  # noqa: TID253 -- this module is heavy; light ones import it lazily
from alembic import op  # noqa: TID253 -- this module is heavy; light ones import it lazily

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "archive_links",
        sa.Column("study_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("sealed_study_uid", sa.Text(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["study_id"], ["studies.id"], name=op.f("fk_archive_links_study_id_studies")),
        sa.PrimaryKeyConstraint("study_id", name=op.f("pk_archive_links")),
    )


def downgrade() -> None:
    op.drop_table("archive_links")
