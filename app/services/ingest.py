"""Ingest: one file in, a de-identified study and image out (or a refusal).

The imaging engine decodes and de-identifies in memory; this module is the only
place that writes an image to the storage folder, and it writes only the
de-identified DICOM and the display PNG. Files are grouped into studies by the
hashed StudyInstanceUID, so the PA and lateral of one study land together and a
second upload of the same instance is recognised as a duplicate, not stored
twice. The caller's original file is never copied; the app's upload cache is
cleared by the app after this returns.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from orapo_core.config import Settings
from orapo_core.errors import OrapoError

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

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v not in (None, [], False) or k == "ok"})


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _short(uid: str) -> str:
    return hashlib.sha256(uid.encode()).hexdigest()[:24]


def ingest_bytes(data: bytes, filename: str, *, db, settings: Settings, user=None, actor: str = "cli") -> IngestOutcome:
    """De-identify one file and store it; refusals come back as an outcome, never as an exception."""
    from db import AuditRepository, StudyRepository
    from orapo_core.imaging import ingest_bytes as decode

    uploaded_by = user.id if user is not None else None
    display_name = Path(filename).name
    try:
        image = decode(data, filename, secret=settings.secret(), max_pixels=settings.max_pixels)
    except OrapoError as exc:
        return IngestOutcome(file=display_name, ok=False, error=exc.code, message=exc.message)

    meta = image.meta
    study_uid = meta["study_uid"]
    instance_uid = meta.get("sop_instance_uid") or study_uid
    pseudonym = meta.get("patient_pseudonym") or "ANON-" + _short(study_uid)[:10]
    folder = Path(_short(study_uid)[:2]) / _short(study_uid)
    dicom_rel = folder / f"{_short(instance_uid)}.dcm"
    display_rel = folder / f"{_short(instance_uid)}.png"

    studies = StudyRepository(db)
    study = studies.find_by_uid_hash(study_uid)
    if study is not None and (settings.storage_dir / dicom_rel).exists():
        existing = next((im for im in studies.images(study.id) if im.dicom_path == dicom_rel.as_posix()), None)
        if existing is not None:
            return IngestOutcome(file=display_name, ok=True, study_id=study.id, image_id=existing.id,
                                 duplicate=True, warnings=list(image.warnings))

    written = [settings.storage_dir / dicom_rel, settings.storage_dir / display_rel]
    _write_atomic(written[0], image.to_dicom_bytes())
    _write_atomic(written[1], image.display_png_bytes())
    try:
        if study is None:
            try:
                study = studies.create(
                    study_uid, pseudonym,
                    view_position=meta.get("view_position"), modality=meta.get("modality"),
                    laterality=meta.get("laterality"), body_part=meta.get("body_part"), uploaded_by=uploaded_by,
                )
            except OrapoError as exc:
                if exc.code != "study_exists":  # else a concurrent upload of the same study won the race
                    raise
                study = studies.find_by_uid_hash(study_uid)
        record = studies.add_image(
            study.id, display_path=display_rel.as_posix(), dicom_path=dicom_rel.as_posix(),
            width=int(image.display.shape[1]), height=int(image.display.shape[0]),
            bits_stored=image.bits_stored, source_format=image.source_format,
            warnings=image.warnings, header=dict(image.header_items()),
        )
    except BaseException:
        for path in written:  # no image file without its database row
            path.unlink(missing_ok=True)
        raise
    AuditRepository(db).append(
        "study.ingest", actor=user if user is not None else actor, object_type="study", object_id=study.id,
        details={"image_id": record.id, "format": image.source_format, "warnings": len(image.warnings)},
    )
    return IngestOutcome(file=display_name, ok=True, study_id=study.id, image_id=record.id, warnings=list(image.warnings))


def iter_files(paths: Iterable[str | Path]) -> Iterator[Path]:
    """Files named directly, and image-like files found under folders (sorted, hidden ones skipped)."""
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for child in sorted(path.rglob("*")):
                if child.is_file() and not any(p.startswith(".") for p in child.relative_to(path).parts) \
                        and child.suffix.lower() in IMAGE_SUFFIXES:
                    yield child
        else:
            yield path


def ingest_paths(paths: Iterable[str | Path], *, db, settings: Settings, user=None) -> Iterator[IngestOutcome]:
    """`orapo ingest`: every file, in order, going on past refusals."""
    for path in iter_files(paths):
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            yield IngestOutcome(file=str(path), ok=False, error="file_not_found", message="There is no such file.")
            continue
        except OSError as exc:
            yield IngestOutcome(file=str(path), ok=False, error="unreadable_file", message=f"The file could not be read ({exc.strerror}).")
            continue
        outcome = ingest_bytes(data, path.name, db=db, settings=settings, user=user)
        yield IngestOutcome(**{**asdict(outcome), "file": str(path)})
