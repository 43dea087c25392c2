"""Image features of each draft: `drafts.image_features`, what the language model was shown of the image.

The vision merger's output for the drafted image, averaged over its tokens
(`orapo_core.models.features`), as a JSON list of floats, NULL for drafts made
before this revision or by a model without a merger. The worklist's "most
useful first" ordering compares unread studies' features with those of
studies whose signed report added a finding the draft missed
(`app.services.reading.reading_order`). A de-identified derivative of the pixels, like
the stored image itself: it names no one.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07 09:00:00
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

import sqlalchemy as sa  # noqa: TID253 -- this module is heavy; light ones import it lazily
from alembic import op  # noqa: TID253 -- this module is heavy; light ones import it lazily

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("drafts", sa.Column("image_features", sa.JSON(), nullable=True))


def downgrade() -> None:
    if op.get_context().dialect.name == "sqlite" and sqlite3.sqlite_version_info < (3, 35):
        with op.batch_alter_table("drafts") as batch:
            batch.drop_column("image_features")
    else:
        op.drop_column("drafts", "image_features")
