"""Ingest: one file in, a de-identified study and image out (or a refusal).

The imaging engine decodes and de-identifies in memory; this module is the only
place that writes an image to the storage folder, and it writes only the
de-identified DICOM and the display PNG. Files are grouped into studies by the
hashed StudyInstanceUID, so the PA and lateral of one study land together and a
second upload of the same instance is recognised as a duplicate, not stored
twice. The caller's original file is never copied; the app's upload cache is
cleared by the app after this returns.

A study someone else uploaded is refused before anything is written (a reused
StudyInstanceUID must not slip an image into another radiologist's study). The
study, its image row and the audit entry are one transaction, and the files are
moved into place inside it; the database's unique (study, SOP instance) index
decides between simultaneous uploads of one file, and the losers are answered as
the duplicates they are.
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.services.reading.studies import open_study
from app.settings import web_settings
from db import AuditRepository, StudyRepository
from orapo_core.config import Settings
from orapo_core.errors import OrapoError

if TYPE_CHECKING:
    from db import Database
    from db.records import ImageRecord, UserRecord

#: What `orapo ingest` looks at inside a folder (anything else is skipped, not refused).
IMAGE_SUFFIXES = {".dcm", ".dicom", ".dic", ".png", ".jpg", ".jpeg", ""}


@dataclass(frozen=True)
class IngestOutcome:
    """The result for one input file, as the CLI prints it (one JSON line) and the app shows it."""

    file: str
    ok: bool
    study_id: int | None = None
    image_id: int | None = None
    duplicate: bool = False
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    message: str | None = None
    # stored, never drafted: "Study 3 is a CT (Modality CT), not a chest radiograph: stored, not drafted."
    not_drafted: str | None = None
    added: bool = False  # another image of a study already stored (a lateral after the frontal, say)
    images: int | None = None  # the study's images now

    def summary(self) -> str:
        """The upload's line for the reader, in Markdown: "Stored **lat.dcm**: added to study 1 (now 3 images)"."""
        name = markdown_name(self.file)
        if not self.ok:
            return f"Refused **{name}**: {self.message}"
        count = f" (now {self.images} image{'s' if self.images != 1 else ''})" if self.images else ""
        if self.duplicate:
            where = f"already stored in study {self.study_id}{count}"
        elif self.added:
            where = f"added to study {self.study_id}{count}"
        else:
            where = f"study {self.study_id}, new" + (f"{count}" if self.images and self.images > 1 else "")
        return f"Stored **{name}**: {where}" + (f". {self.not_drafted}" if self.not_drafted else "")

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v not in (None, [], False) or k == "ok"})


def markdown_name(name: str) -> str:
    """A file name as it was uploaded, safe inside bold Markdown: `too_big.dcm` stays `too_big.dcm` on the page
    (its underscore escaped, not replaced by "?"), HTML is shown as text, and control characters are dropped."""
    name = re.sub(r"[\x00-\x1f\x7f]", "", str(name))[:200]
    name = re.sub(r"([\\`*_\[\]|~])", r"\\\1", name)
    return html.escape(name, quote=False) or "(no name)"


def _stage(final: Path, data: bytes) -> Path:
    """Write `data` next to `final` under a `.part-` name (what the start-up sweep deletes if we die here)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=".part-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def _short(uid: str) -> str:
    return hashlib.sha256(uid.encode()).hexdigest()[:24]


#: Refusals that mean "a concurrent upload stored this study or image first": look again, as if it had come first.
_LOST_RACE = ("study_exists", "image_exists")


@dataclass(frozen=True)
class _Upload:
    """One decoded file and where it goes."""

    name: str
    image: Any  # orapo_core.imaging.IngestedImage
    study_uid: str
    instance_uid: str
    dicom_rel: Path
    display_rel: Path


def ingest_bytes(
    data: bytes, filename: str, *, db: Database, settings: Settings, user: UserRecord | None = None, actor: str = "cli"
) -> IngestOutcome:
    """De-identify one file and store it; refusals come back as an outcome, never as an exception.

    Nothing is written before the study is known to be the uploader's to add to (or new), and the
    study, the image row, its audit entry and its two files are stored all together or not at all.
    """
    from orapo_core.imaging import ingest_bytes as decode  # noqa: PLC0415 -- loads pydicom, requests

    display_name = Path(filename).name
    try:
        image = decode(data, filename, secret=settings.secret(), max_pixels=settings.max_pixels)
    except OrapoError as exc:
        return IngestOutcome(file=display_name, ok=False, error=exc.code, message=exc.message)

    study_uid = image.meta["study_uid"]
    instance_uid = image.meta.get("sop_instance_uid") or study_uid
    folder = Path(_short(study_uid)[:2]) / _short(study_uid)
    upload = _Upload(
        display_name,
        image,
        study_uid,
        instance_uid,
        folder / f"{_short(instance_uid)}.dcm",
        folder / f"{_short(instance_uid)}.png",
    )

    holdout = web_settings(settings).holdout_fraction  # ORAPO_HOLDOUT_FRACTION: the gate's share of new studies
    staged: list[tuple[Path, Path]] = []
    try:
        for _ in range(3):  # a lost race is settled by the next look: the winner's rows are committed by then
            study_id, outcome = _look(db, settings, upload, user)
            if outcome is not None:
                return outcome
            if not staged:
                staged = [
                    (_stage(settings.storage_dir / rel, payload()), settings.storage_dir / rel)
                    for rel, payload in (
                        (upload.dicom_rel, image.to_dicom_bytes),
                        (upload.display_rel, image.display_png_bytes),
                    )
                ]
            try:
                return _store(db, upload, study_id, staged, user=user, actor=actor, holdout_fraction=holdout)
            except OrapoError as exc:
                if exc.code not in _LOST_RACE:
                    raise
        return IngestOutcome(
            file=display_name,
            ok=False,
            error="ingest_busy",
            message="This file is being uploaded by others right now; try again in a moment.",
        )
    finally:
        for tmp, _final in staged:
            tmp.unlink(missing_ok=True)  # gone already when stored


def _look(
    db: Database, settings: Settings, upload: _Upload, user: UserRecord | None
) -> tuple[int | None, IngestOutcome | None]:
    """Before anything is written: (the existing study's id or None, and the outcome if the upload ends here)."""
    studies = StudyRepository(db)
    study = studies.find_by_uid_hash(upload.study_uid)
    if study is None:
        return None, None
    if user is not None:  # the CLI runs as the operator; a signed-in user adds only to a study they may open
        try:
            open_study(db, user, study.id)
        except OrapoError as exc:
            return study.id, IngestOutcome(
                file=upload.name, ok=False, error=exc.code, message=f"{exc.message} Nothing was stored."
            )
    existing = studies.find_image(
        study.id, sop_instance_uid_hash=upload.instance_uid, dicom_path=upload.dicom_rel.as_posix()
    )
    if existing is None:
        return study.id, None
    _restore_missing_files(settings, existing, upload)
    return study.id, IngestOutcome(
        file=upload.name,
        ok=True,
        study_id=study.id,
        image_id=existing.id,
        duplicate=True,
        warnings=list(upload.image.warnings),
        not_drafted=_not_drafted(study.id, study.not_drafted),
        images=len(studies.images(study.id)),
    )


def _restore_missing_files(settings: Settings, existing: ImageRecord, upload: _Upload) -> None:
    """A duplicate whose stored files went missing puts them back, as a first upload would have."""
    image = upload.image
    for rel, payload in ((existing.dicom_path, image.to_dicom_bytes), (existing.display_path, image.display_png_bytes)):
        if rel and not (settings.storage_dir / rel).exists():
            final = settings.storage_dir / rel
            tmp = _stage(final, payload())
            os.replace(tmp, final)


def _store(
    db: Database,
    upload: _Upload,
    study_id: int | None,
    staged: list[tuple[Path, Path]],
    *,
    user: UserRecord | None,
    actor: str,
    holdout_fraction: float,
) -> IngestOutcome:
    """One transaction: the study (when new), the image row, the audit entry; the files move into place before it
    commits and are removed again if it does not."""
    image, meta = upload.image, upload.image.meta
    moved: list[Path] = []
    reason = None
    try:
        with db.session() as session:
            studies = StudyRepository(session)
            if study_id is None:  # a study's first image decides whether it is drafted (the one drafting shows)
                pseudonym = meta.get("patient_pseudonym") or "ANON-" + _short(upload.study_uid)[:10]
                study = studies.create(
                    upload.study_uid,
                    pseudonym,
                    view_position=meta.get("view_position"),
                    modality=meta.get("modality"),
                    laterality=meta.get("laterality"),
                    body_part=meta.get("body_part"),
                    uploaded_by=user.id if user is not None else None,
                    not_drafted=meta.get("not_drafted"),
                    holdout_fraction=holdout_fraction,
                )
            else:
                study = studies.get(study_id)
            added, study_id, reason = study_id is not None, study.id, study.not_drafted
            record = studies.add_image(
                study_id,
                display_path=upload.display_rel.as_posix(),
                dicom_path=upload.dicom_rel.as_posix(),
                width=int(image.display.shape[1]),
                height=int(image.display.shape[0]),
                bits_stored=image.bits_stored,
                source_format=image.source_format,
                warnings=image.warnings,
                header=dict(image.header_items()),
                sop_instance_uid_hash=upload.instance_uid,
            )
            AuditRepository(session).append(
                "study.ingest",
                actor=user if user is not None else actor,
                object_type="study",
                object_id=study_id,
                details={
                    "image_id": record.id,
                    "format": image.source_format,
                    "warnings": len(image.warnings),
                    **({"not_drafted": True} if reason else {}),
                },
            )
            count = len(studies.images(study_id))
            for tmp, final in staged:
                os.replace(tmp, final)
                moved.append(final)
    except BaseException:
        for final in moved:  # no image file without its database row
            final.unlink(missing_ok=True)
        raise
    return IngestOutcome(
        file=upload.name,
        ok=True,
        study_id=study_id,
        image_id=record.id,
        warnings=list(image.warnings),
        not_drafted=_not_drafted(study_id, reason),
        added=added,
        images=count,
    )


def _not_drafted(study_id: int, reason: str | None) -> str | None:
    from orapo_core.imaging.scope import not_drafted_sentence  # noqa: PLC0415 -- loads pydicom, requests

    return not_drafted_sentence(study_id, reason) if reason else None


def iter_files(paths: Iterable[str | Path]) -> Iterator[Path]:
    """Files named directly, and image-like files found under folders (sorted, hidden ones skipped)."""
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for child in sorted(path.rglob("*")):
                if (
                    child.is_file()
                    and not any(p.startswith(".") for p in child.relative_to(path).parts)
                    and child.suffix.lower() in IMAGE_SUFFIXES
                ):
                    yield child
        else:
            yield path


def ingest_paths(
    paths: Iterable[str | Path], *, db: Database, settings: Settings, user: UserRecord | None = None
) -> Iterator[IngestOutcome]:
    """`orapo ingest`: every file, in order, going on past refusals."""
    for path in iter_files(paths):
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            yield IngestOutcome(file=str(path), ok=False, error="file_not_found", message="There is no such file.")
            continue
        except OSError as exc:
            yield IngestOutcome(
                file=str(path),
                ok=False,
                error="unreadable_file",
                message=f"The file could not be read ({exc.strerror}).",
            )
            continue
        outcome = ingest_bytes(data, path.name, db=db, settings=settings, user=user)
        yield IngestOutcome(**{**asdict(outcome), "file": str(path)})
