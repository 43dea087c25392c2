"""Why a study is stored but never drafted: `studies.not_drafted`.

Only chest radiographs are shown to the drafting model. A study whose first
image is something else (a DICOM of another modality or body part, a colour
picture, or a PNG/JPEG its model scored far from any film it was calibrated
on) keeps, here, the words that say what it is, e.g. "a CT (Modality CT), not
a chest radiograph" (`orapo_core.imaging.scope`); the worklist and the Read tab
show them as "Study 3 is ...: stored, not drafted.", drafting refuses the study
and the "most useful first" ordering leaves it out. NULL: a chest radiograph,
drafted as before.

Studies stored before this revision and not read yet (new or drafted) are
judged by the header rules from what they kept (their Modality and Body Part
Examined); a PNG/JPEG study keeps no header and stays as it was, and so does
every study already reported.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06 23:00:00
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

import sqlalchemy as sa  # noqa: TID253 -- this module is heavy; light ones import it lazily
from alembic import op  # noqa: TID253 -- this module is heavy; light ones import it lazily

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("studies", sa.Column("not_drafted", sa.Text(), nullable=True))
    _judge_unread_studies()


def _judge_unread_studies() -> None:
    from orapo_core.imaging.scope import (  # noqa: PLC0415 -- loads pydicom, requests
        out_of_scope,  # the header rules as they stand when this revision runs
    )

    studies = sa.table(
        "studies",
        sa.column("id", sa.Integer()),
        sa.column("modality", sa.String()),
        sa.column("body_part", sa.String()),
        sa.column("status", sa.String()),
        sa.column("not_drafted", sa.Text()),
    )
    connection = op.get_bind()
    rows = connection.execute(
        sa.select(studies.c.id, studies.c.modality, studies.c.body_part).where(
            studies.c.status.in_(("new", "drafted")), studies.c.modality.is_not(None)
        )
    ).all()
    for study_id, modality, body_part in rows:  # a stored Modality: the study came from a DICOM
        reason = out_of_scope({"modality": modality, "body_part": body_part}, "dicom")
        if reason:
            connection.execute(studies.update().where(studies.c.id == study_id).values(not_drafted=reason))


def downgrade() -> None:
    if op.get_context().dialect.name == "sqlite" and sqlite3.sqlite_version_info < (3, 35):
        with op.batch_alter_table("studies") as batch:
            batch.drop_column("not_drafted")
    else:
        op.drop_column("studies", "not_drafted")
