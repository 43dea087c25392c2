"""Opening a study: who may read it, and its image; the one access rule every service asks.

An administrator may open any study, a radiologist the studies they uploaded (or
unowned ones, from `orapo ingest`). Drafting, reports, the viewer and ingest
all ask here, so the rule has one home and no service imports another for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from db.records import ImageRecord, StudyOverview, UserRecord
from orapo_core.errors import OrapoError

if TYPE_CHECKING:
    from db.database import Database


def open_study(db: Database, user: UserRecord, study_id: int) -> StudyOverview:
    """The study, if this user may read it: an admin any, a radiologist those they uploaded (or unowned ones)."""
    from db import StudyRepository

    overview = StudyRepository(db).overview(int(study_id))
    owner = overview.study.uploaded_by
    if not user.is_admin and owner is not None and owner != user.id:
        raise OrapoError("forbidden", "This study belongs to another radiologist's worklist.")
    return overview


def first_image(overview: StudyOverview) -> ImageRecord:
    if not overview.images:
        raise OrapoError("image_not_found", "This study has no image to show.")
    return overview.images[0]
