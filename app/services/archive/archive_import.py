"""The Worklist's "From the archive" view: what the archive holds, and importing chosen studies, as a reader would.

The same search and pull as `orapo pacs search|pull` (app.services.archive.pacs), run as
the signed-in reader: radiologists and administrators may import, each pulled
instance goes through the upload's ingest with the reader as its uploader, and
what happened to each study (imported as study N, already there, refused and
why) comes back as a line the page shows; nothing is raised for a refusal, so
one bad study never hides what the others became.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.services.accounts.auth import require_role
from app.services.archive.pacs import (
    CHEST_MODALITIES,
    Archive,
    ArchiveStudy,
    archive_settings,
    mark_imported,
    pull_study,
)
from db.records import UserRecord
from orapo_core.errors import OrapoError

if TYPE_CHECKING:
    from db.database import Database
    from orapo_core.config import Settings

NO_ARCHIVE = (
    "No archive is configured, so there is nothing to import from here: an administrator sets "
    "ORAPO_DICOMWEB_URL (and its credentials) to the PACS's DICOMweb address and restarts the app."
)


@dataclass(frozen=True)
class StudyImport:
    """What one archive study became: the studies its instances went to, and each refusal (code, sentence)."""

    archive_study: str
    study_ids: tuple[int, ...] = ()
    stored: int = 0
    duplicates: int = 0
    refusals: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @property
    def line(self) -> str:
        studies = ", ".join(f"study {i}" for i in self.study_ids)
        if self.stored:
            text = f"imported as {studies} ({self.stored} image(s))"
            if self.duplicates:
                text += f", {self.duplicates} already there"
        elif self.duplicates:
            text = f"already imported as {studies}"
        else:
            text = "nothing imported"
        if self.refusals:
            text += "; refused: " + "; ".join(f"{code}: {message}" for code, message in self.refusals)
        return text


def archive_note(environ: Mapping[str, str] | None = None) -> str | None:
    """Why the view cannot be used (None when an archive is configured)."""
    try:
        return None if archive_settings(environ) is not None else NO_ARCHIVE
    except OrapoError as exc:
        return f"The archive setting is wrong, so nothing can be imported from here: {exc.message}"


def search(
    db: Database,
    settings: Settings,
    user: UserRecord,
    *,
    date: str | None = None,
    accession: str | None = None,
    modalities: Iterable[str] = CHEST_MODALITIES,
    limit: int = 200,
) -> list[ArchiveStudy]:
    """The archive's chest studies matching the filters, each with the study it was already imported as."""
    require_role(user, "radiologist")
    modalities = [m for m in modalities if m in CHEST_MODALITIES] or list(CHEST_MODALITIES)
    archive = Archive.from_environment()
    found = archive.search(
        date=(date or "").strip() or None,
        accession=(accession or "").strip() or None,
        modalities=modalities,
        limit=limit,
    )
    return mark_imported(found, db=db, settings=settings)


def import_studies(db: Database, settings: Settings, user: UserRecord, study_uids: Iterable[str]) -> list[StudyImport]:
    """Pull each archive study through the upload's ingest as `user`; a study the archive fails on is a refusal."""
    require_role(user, "radiologist")
    study_uids = [uid.strip() for uid in study_uids if uid and uid.strip()]
    if not study_uids:
        raise OrapoError("no_study", "Tick the archive studies to import first.")
    archive = Archive.from_environment()
    results = []
    for study_uid in study_uids:
        study_ids: list[int] = []
        stored = duplicates = 0
        refusals: list[tuple[str, str]] = []
        try:
            for pulled in pull_study(archive, study_uid, db=db, settings=settings, user=user, actor=user.username):
                outcome = pulled.outcome
                if not outcome.ok:
                    refusals.append((outcome.error or "refused", outcome.message or ""))
                    continue
                duplicates, stored = duplicates + outcome.duplicate, stored + (not outcome.duplicate)
                if outcome.study_id is not None and outcome.study_id not in study_ids:
                    study_ids.append(outcome.study_id)
        except OrapoError as exc:
            refusals.append((exc.code, exc.message))
        if not (study_ids or refusals):
            refusals.append(("no_chest_image", "The archive study holds no CR or DX image."))
        results.append(StudyImport(study_uid, tuple(study_ids), stored, duplicates, tuple(refusals)))
    return results
