"""Signed reports as DICOM Structured Reports (`orapo export sr`), one file per study.

The SR itself is built and read back by the engine (`orapo_core.imaging.report_sr`);
this module gathers what it needs from the database and the storage folder: the
study's latest correction (which must be signed), the de-identified DICOMs it
refers to, the reader who signed it and the model version whose draft it was
made from. The study is de-identified already, so the SR is written as it is,
into the folder the caller names, beside the FHIR bundles if that is the folder
given (`study-<id>.dcm` next to `study-<id>.json`). With an archive given, each
report is stored there too (STOW-RS, `app.services.archive.pacs.Archive.store`): a study
imported from that archive gets an SR filed in the archive's own study
(`archive_sr`, built in memory and only sent), any other study the de-identified
SR that was written. A sentence the finding check added to the model's draft and the
reader kept is named in the SR as added by an automatic finding check
(`orapo_core.imaging.report_sr.ADDED_NOTE`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING

from app.services.operations.export import SkippedStudy, build_each
from app.services.operations.export_fhir import _model_label, kept_additions
from db import ArchiveLinkRepository, DraftRepository, ModelVersionRepository, StudyRepository, UserRepository
from orapo_core.errors import OrapoError

if TYPE_CHECKING:
    from pydicom import Dataset

    from app.services.archive.pacs import Archive
    from db import Database
    from db.records import CorrectionRecord
    from orapo_core.config import Settings

#: The Verifying Organization an SR names (DICOM requires one for a verified report); the reader's own
#: institution is not known to a de-identified copy.
ORGANIZATION = "OraPO"


@dataclass(frozen=True)
class StudySR:
    study_id: int
    data: bytes
    sop_instance_uid: str
    in_archive_study: bool = False  # filed in the archive's own study (real identity: never written to disk)


@contextlib.contextmanager
def _sr_of(study_id: int) -> Iterator[None]:
    """Around what reads stored headers and builds an SR from them: a failure there is the study's data, not the
    export's (an old study's stored header with a value DICOM does not allow: ingest drops those now), so it becomes
    `sr_unwritable` for this study alone. The cause (whose text may quote the header value) stays chained, unprinted."""
    try:
        yield
    except OrapoError:
        raise
    except Exception as exc:
        raise OrapoError(
            "sr_unwritable",
            f"Study {study_id}'s stored DICOM header cannot be made into a structured "
            "report (it holds a value DICOM does not allow, as a study stored before "
            "ingest checked header values may); nothing was written for it.",
        ) from exc


def _signed_parts(
    db: Database, settings: Settings, study_id: int
) -> tuple[CorrectionRecord, list[Dataset], str, str | None, str, list[str]]:
    """What every SR of a study's signed report is made of: the signed correction, the study's stored (de-identified)
    DICOM headers, the reader's name, the model label, the study's hashed UID and the sentences of the signed text
    the finding check added to the draft (`kept_additions`)."""
    import pydicom

    overview = StudyRepository(db).overview(study_id)
    signed = overview.latest_correction
    if signed is None or signed.signed_at is None:
        raise OrapoError(
            "no_signed_report",
            f"Study {study_id} has no signed report; only a signed report becomes "
            "a DICOM SR (sign it in the Read tab first).",
        )
    images: list[Dataset] = []
    for image in overview.images:
        path = settings.storage_dir / image.dicom_path if image.dicom_path else None
        if path is not None and path.is_file():
            with _sr_of(study_id):
                images.append(pydicom.dcmread(path, stop_before_pixels=True))
    if not images:
        raise OrapoError(
            "no_dicom_image",
            f"Study {study_id} has no stored DICOM image for a structured report to refer to; upload its images again.",
        )
    draft = DraftRepository(db).get(signed.draft_id) if signed.draft_id is not None else overview.latest_draft
    model = _model_label(ModelVersionRepository(db), draft) if draft is not None else None
    reader = UserRepository(db).get(signed.author_id).username
    return signed, images, reader, model, overview.study.study_uid_hash, kept_additions(draft, signed.text)


def study_sr(db: Database, settings: Settings, study_id: int) -> StudySR:
    """The SR of a study's signed report, read back and checked (errors: no_signed_report, no_dicom_image, sr_invalid).
    It belongs to the de-identified study: what `orapo export sr` writes to disk."""
    from orapo_core.imaging.report_sr import build_report_sr, read_report_sr  # noqa: PLC0415 -- loads pydicom, requests

    signed, images, reader, model, uid_hash, added = _signed_parts(db, settings, study_id)
    assert signed.signed_at is not None  # `_signed_parts` refuses an unsigned report
    with _sr_of(study_id):
        data = build_report_sr(
            images,
            report=signed.text,
            reader=reader,
            model=model,
            organization=ORGANIZATION,
            report_key=[uid_hash, signed.id, signed.version],
            signed_at=signed.signed_at,
            software_version=_version(),
            added=added,
        )
        return StudySR(study_id, data, read_report_sr(data).sop_instance_uid)


def archive_sr(
    db: Database, settings: Settings, study_id: int, archive: Archive, *, deidentified: StudySR | None = None
) -> StudySR:
    """The SR `archive` is sent: filed in the archive's own study when the study was imported from the archive
    (a DICOMweb pull or a DIMSE push, `db.ArchiveLinkRepository`), otherwise the de-identified one of `study_sr`
    (`deidentified`, when the caller has built it already).

    The archive's study is found by unsealing its UID with the de-identification secret; its instances' headers
    are read from the archive (WADO-RS metadata) into memory, and the SR refers to the archive's own images that
    this study's images were made from (matched by their hashed UIDs), with the patient and study attributes the
    archive holds. That SR carries the real identity, so it is only ever sent, never written (errors:
    archive_link_invalid, archive_study_not_found, archive_images_not_found, and those of `study_sr`)."""
    from orapo_core.imaging.deid import hashed_uid, unseal_archive_uid  # noqa: PLC0415 -- loads pydicom, requests
    from orapo_core.imaging.report_sr import build_report_sr, read_report_sr  # noqa: PLC0415 -- loads pydicom, requests

    sealed = ArchiveLinkRepository(db).sealed(study_id)
    if sealed is None:
        return deidentified if deidentified is not None else study_sr(db, settings, study_id)
    signed, images, reader, model, uid_hash, added = _signed_parts(db, settings, study_id)
    assert signed.signed_at is not None  # `_signed_parts` refuses an unsigned report
    secret = settings.secret()
    study_uid = unseal_archive_uid(secret, sealed)
    ours = {str(image.SOPInstanceUID) for image in images}
    originals = [
        ds
        for ds in archive.instance_headers(study_uid)
        if "SOPInstanceUID" in ds and hashed_uid(secret, str(ds.SOPInstanceUID)) in ours
    ]
    if not originals:
        raise OrapoError(
            "archive_images_not_found",
            f"The archive's study of study {study_id} no longer holds the "
            "images its report was made from; nothing was sent.",
        )
    data = build_report_sr(
        originals,
        report=signed.text,
        reader=reader,
        model=model,
        organization=ORGANIZATION,
        report_key=[uid_hash, signed.id, signed.version, "archive"],
        signed_at=signed.signed_at,
        software_version=_version(),
        dated_by_signing=True,
        added=added,
    )
    del originals
    return StudySR(study_id, data, read_report_sr(data).sop_instance_uid, in_archive_study=True)


def _version() -> str:
    try:
        return f"orapo {version('orapo')}"
    except PackageNotFoundError:
        return ""


@dataclass(frozen=True)
class SrExport:
    """What `export_sr` wrote, what it could not (each with its reason), and what the archive stored."""

    out: Path
    written: tuple[Path, ...]
    skipped: tuple[SkippedStudy, ...] = ()
    sent: tuple[str, ...] = ()  # the SOP instance UIDs the archive stored
    archive: str = ""
    in_archive_studies: int = 0  # of those sent, how many were filed in the archive's own study
    unsent: tuple[SkippedStudy, ...] = ()  # written, but no SR for the archive could be made (its reason)

    def __str__(self) -> str:
        text = f"{len(self.written)} DICOM SR file(s) written to {self.out}"
        if self.archive:
            text += (
                f"; {len(self.sent)} stored in {self.archive} ({self.in_archive_studies} in the archive's own study)"
            )
        if self.skipped:
            text += f"; {len(self.skipped)} study(ies) skipped:" + "".join(
                f"\n  study {s.study_id}: {s.error}: {s.message}" for s in self.skipped
            )
        if self.unsent:
            text += f"; {len(self.unsent)} not sent:" + "".join(
                f"\n  study {s.study_id}: {s.error}: {s.message}" for s in self.unsent
            )
        return text


def signed_study_ids(db: Database) -> list[int]:
    """Every study whose latest report is signed, oldest first."""
    return [
        o.study.id
        for o in reversed(StudyRepository(db).list(limit=1_000_000))
        if o.latest_correction is not None and o.latest_correction.signed_at is not None
    ]


def export_sr(
    db: Database,
    settings: Settings,
    out: str | Path,
    *,
    study_ids: list[int] | None = None,
    archive: Archive | None = None,
) -> SrExport:
    """One `study-<id>.dcm` per study (every study with a signed report when `study_ids` is None), each also
    stored in `archive` (an `app.services.archive.pacs.Archive`) when one is given, once all are written.

    As for FHIR, a study that cannot be exported is skipped with its reason (listed in `skipped-sr.json`) and the
    others are written; only when nothing could be written is that an error (the single study's own when one
    was asked for)."""
    out = Path(out)
    if study_ids is None:
        study_ids = signed_study_ids(db)
        if not study_ids:
            raise OrapoError("nothing_to_export", "There are no signed reports to export yet.")
    reports: list[StudySR]
    reports, skipped = build_each(study_ids, lambda study_id: study_sr(db, settings, study_id))
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for report in reports:
        path = out / f"study-{report.study_id}.dcm"
        path.write_bytes(report.data)
        written.append(path)
    if skipped:
        (out / "skipped-sr.json").write_text(json.dumps([asdict(s) for s in skipped], indent=1))
    if archive is None:
        return SrExport(out, tuple(written), tuple(skipped))
    outgoing, unsent = [], []
    for report in reports:
        try:
            outgoing.append(archive_sr(db, settings, report.study_id, archive, deidentified=report))
        except OrapoError as exc:
            unsent.append(SkippedStudy(report.study_id, exc.code, exc.message))
    sent = archive.store([r.data for r in outgoing])
    return SrExport(
        out,
        tuple(written),
        tuple(skipped),
        tuple(sent),
        archive.url,
        sum(r.in_archive_study for r in outgoing),
        tuple(unsent),
    )
