"""Opening a study: who may read it, its images in reading order, and the patient's earlier studies; the one access
rule every service asks.

An administrator may open any study, a radiologist the studies they uploaded (or
unowned ones, from `orapo ingest`). Drafting, reports, the viewer and ingest
all ask here, so the rule has one home and no service imports another for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from db import StudyRepository
from db.records import ImageRecord, StudyOverview, UserRecord
from orapo_core.errors import OrapoError

if TYPE_CHECKING:
    from db.database import Database


def open_study(db: Database, user: UserRecord, study_id: int) -> StudyOverview:
    """The study, if this user may read it: an admin any, a radiologist those they uploaded (or unowned ones)."""
    overview = StudyRepository(db).overview(int(study_id))
    owner = overview.study.uploaded_by
    if not user.is_admin and owner is not None and owner != user.id:
        raise OrapoError("forbidden", "This study belongs to another radiologist's worklist.")
    return overview


def first_image(overview: StudyOverview) -> ImageRecord:
    if not overview.images:
        raise OrapoError("image_not_found", "This study has no image to show.")
    return overview.images[0]


# ViewPosition values (DICOM PS3.3 C.8.11.5.1.1, and what modalities write in practice): frontal first, then lateral
FRONTAL_VIEWS = ("PA", "AP", "AP SUPINE", "APS", "PAS", "FRONTAL")
LATERAL_VIEWS = ("LL", "RL", "LAT", "LATERAL", "LLD", "RLD")


@dataclass(frozen=True)
class StudyView:
    image: ImageRecord
    label: str  # "PA", "Lateral", "Image 3": what the thumbnail says


def reading_views(overview: StudyOverview) -> list[StudyView]:
    """A study's images as a radiologist hangs them: frontal views first, laterals beside them, then the rest, each
    in upload order. The first is the one drafting reads (`first_image`): a study's first image decides that."""
    frontal, lateral, other = [], [], []
    for n, image in enumerate(overview.images, start=1):
        view = str((image.header or {}).get("ViewPosition") or "").strip().upper()
        if view in FRONTAL_VIEWS:
            frontal.append(StudyView(image, view))
        elif view in LATERAL_VIEWS:
            lateral.append(StudyView(image, "Lateral"))
        else:
            other.append(StudyView(image, f"Image {n}"))
    first = overview.images[0].id if overview.images else None
    views = frontal + lateral + other
    views.sort(key=lambda v: v.image.id != first)  # the drafted image stays first, the rest keep their order
    return views


def priors(db: Database, user: UserRecord, study_id: int, *, limit: int = 20) -> list[StudyOverview]:
    """The same pseudonymous patient's other studies this user may open, newest first, each with its latest report
    (signed or not: `latest_correction.signed` says). A study stored from a PNG or JPEG has a pseudonym of its own
    (no patient in the file), so it has no priors."""
    current = open_study(db, user, study_id).study
    found = StudyRepository(db).list(patient_pseudonym=current.patient_pseudonym, limit=limit + 1)
    mine = [
        o
        for o in found
        if o.study.id != current.id and (user.is_admin or o.study.uploaded_by is None or o.study.uploaded_by == user.id)
    ]
    return mine[:limit]
