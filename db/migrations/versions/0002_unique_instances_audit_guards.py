"""One image row per (study, SOP instance); the audit log also refuses an insert over an existing entry.

`images.sop_instance_uid_hash` is the de-identified (hashed) SOPInstanceUID that
ingest already groups by. The unique index on (study_id, sop_instance_uid_hash)
is what makes eight simultaneous uploads of one file one row: the database
refuses the others, which ingest then answers as duplicates. It is an index, not
a table constraint, so that SQLite creates it in place instead of rebuilding the
images table, which pairs point at. Existing rows get the UID from their stored
header (the study's UID when the file had none, as ingest does); a duplicate row
an earlier version let in keeps NULL rather than being deleted, since a pair
may name it, and NULLs never collide.

The audit log: SQLite's `INSERT OR REPLACE` deletes the old row without firing
DELETE triggers (recursive triggers are off by default), so an entry could be
rewritten; a BEFORE INSERT trigger now refuses an id that exists. PostgreSQL's
`INSERT ... ON CONFLICT DO UPDATE` already fires the UPDATE trigger; TRUNCATE
fires no row trigger, so a statement trigger refuses it.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 10:00:00
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

import sqlalchemy as sa  # noqa: TID253 -- this module is heavy; light ones import it lazily
from alembic import op  # noqa: TID253 -- this module is heavy; light ones import it lazily

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INDEX = "uq_images_study_id_sop_instance_uid_hash"
_AUDIT_MESSAGE = "audit_log is append-only"


def upgrade() -> None:
    with op.batch_alter_table("images") as batch:
        batch.add_column(sa.Column("sop_instance_uid_hash", sa.String(length=128), nullable=True))
    _fill_instance_uids()
    with op.batch_alter_table("images") as batch:
        batch.create_index(_INDEX, ["study_id", "sop_instance_uid_hash"], unique=True)
    if op.get_context().dialect.name == "postgresql":
        op.execute(
            "CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log "
            "FOR EACH STATEMENT EXECUTE FUNCTION orapo_audit_log_append_only()"
        )
    else:
        op.execute(
            "CREATE TRIGGER audit_log_no_replace BEFORE INSERT ON audit_log "
            "WHEN EXISTS (SELECT 1 FROM audit_log WHERE id = NEW.id) "
            f"BEGIN SELECT RAISE(ABORT, '{_AUDIT_MESSAGE}'); END"
        )


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS audit_log_no_truncate ON audit_log")
    else:
        op.execute("DROP TRIGGER IF EXISTS audit_log_no_replace")
    with op.batch_alter_table("images") as batch:
        batch.drop_index(_INDEX)
    if op.get_context().dialect.name == "sqlite" and sqlite3.sqlite_version_info >= (3, 35):
        # In place: batch mode would rebuild the table, and dropping the old one fails once a pair points at an image.
        op.execute("ALTER TABLE images DROP COLUMN sop_instance_uid_hash")
    else:
        with op.batch_alter_table("images") as batch:
            batch.drop_column("sop_instance_uid_hash")


def _fill_instance_uids() -> None:
    images = sa.table(
        "images",
        sa.column("id", sa.Integer()),
        sa.column("study_id", sa.Integer()),
        sa.column("header", sa.JSON()),
        sa.column("sop_instance_uid_hash", sa.String()),
    )
    studies = sa.table("studies", sa.column("id", sa.Integer()), sa.column("study_uid_hash", sa.String()))
    connection = op.get_bind()
    rows = connection.execute(
        sa.select(images.c.id, images.c.study_id, images.c.header, studies.c.study_uid_hash)
        .join(studies, studies.c.id == images.c.study_id)
        .order_by(images.c.id)
    ).all()
    seen: set[tuple[int, str]] = set()
    for image_id, study_id, header, study_uid_hash in rows:
        uid = str((header or {}).get("SOPInstanceUID") or "") or study_uid_hash
        if (study_id, uid) in seen:
            continue  # the oldest row of a duplicate keeps the instance; the others stay NULL
        seen.add((study_id, uid))
        connection.execute(images.update().where(images.c.id == image_id).values(sop_instance_uid_hash=uid))
