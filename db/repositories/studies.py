"""Studies and their images, and the train/holdout split fixed when a study is saved.

The split is a pure function of the study's hashed UID, so it never changes,
needs no coordination between processes, and a held-out study can never drift
into a training round.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

from sqlalchemy import func, select  # noqa: TID253 -- this module is heavy; light ones import it lazily
from sqlalchemy.exc import IntegrityError  # noqa: TID253 -- this module is heavy; light ones import it lazily

from db.models import ArchiveLink, Correction, Draft, Image, Study
from db.records import STUDY_STATUSES, ImageRecord, StudyOverview, StudyRecord
from db.repositories.base import Repository, must_utc
from db.repositories.reports import CorrectionRepository, DraftRepository, correction_record, draft_record
from orapo_core.errors import OrapoError

HOLDOUT_FRACTION = 0.1


def split_for(study_uid_hash: str, holdout_fraction: float = HOLDOUT_FRACTION) -> str:
    """'holdout' for a fixed fraction of studies, chosen by hashing the study's (already hashed) UID."""
    digest = hashlib.sha256(f"orapo-split:{study_uid_hash}".encode()).digest()
    position = int.from_bytes(digest[:8], "big") / 2**64
    return "holdout" if position < holdout_fraction else "train"


def storage_relative(path: str | None, field: str) -> str | None:
    """A path inside the storage folder, as POSIX text; absolute paths and '..' are refused."""
    if path is None:
        return None
    text = str(path).replace("\\", "/")
    posix = PurePosixPath(text)
    if not text or posix.is_absolute() or PureWindowsPath(str(path)).drive or ".." in posix.parts:
        raise OrapoError("bad_image_path", f"The {field} must be relative to the storage folder, not {path!r}.")
    return posix.as_posix()


def study_record(study: Study) -> StudyRecord:
    return StudyRecord(
        id=study.id,
        study_uid_hash=study.study_uid_hash,
        patient_pseudonym=study.patient_pseudonym,
        view_position=study.view_position,
        modality=study.modality,
        laterality=study.laterality,
        body_part=study.body_part,
        uploaded_by=study.uploaded_by,
        status=study.status,
        split=study.split,
        created_at=must_utc(study.created_at),
        not_drafted=study.not_drafted,
    )


def image_record(image: Image) -> ImageRecord:
    return ImageRecord(
        id=image.id,
        study_id=image.study_id,
        dicom_path=image.dicom_path,
        display_path=image.display_path,
        width=image.width,
        height=image.height,
        bits_stored=image.bits_stored,
        source_format=image.source_format,
        warnings=list(image.warnings or []),
        header=dict(image.header or {}),
        created_at=must_utc(image.created_at),
    )


def _check_status(status: str) -> None:
    if status not in STUDY_STATUSES:
        raise OrapoError("invalid_status", f"A study status is one of {', '.join(STUDY_STATUSES)}, not {status!r}.")


class StudyRepository(Repository):
    def create(
        self,
        study_uid_hash: str,
        patient_pseudonym: str,
        *,
        view_position: str | None = None,
        modality: str | None = None,
        laterality: str | None = None,
        body_part: str | None = None,
        uploaded_by: int | None = None,
        holdout_fraction: float = HOLDOUT_FRACTION,
        not_drafted: str | None = None,
    ) -> StudyRecord:
        if not study_uid_hash or not patient_pseudonym:
            raise OrapoError("invalid_study", "A study needs its hashed StudyInstanceUID and a patient pseudonym.")
        try:
            with self._session() as session:
                if session.scalar(select(Study.id).where(Study.study_uid_hash == study_uid_hash)) is not None:
                    raise OrapoError("study_exists", "This study has already been uploaded.")
                study = Study(
                    study_uid_hash=study_uid_hash,
                    patient_pseudonym=patient_pseudonym,
                    view_position=view_position,
                    modality=modality,
                    laterality=laterality,
                    body_part=body_part,
                    uploaded_by=uploaded_by,
                    not_drafted=not_drafted,
                    status="new",
                    split=split_for(study_uid_hash, holdout_fraction),
                )
                session.add(study)
                session.flush()
                return study_record(study)
        except IntegrityError as exc:
            raise OrapoError("study_exists", "This study has already been uploaded.") from exc

    def add_image(
        self,
        study_id: int,
        *,
        display_path: str,
        width: int,
        height: int,
        source_format: str,
        dicom_path: str | None = None,
        bits_stored: int | None = None,
        warnings: Iterable[str] = (),
        header: dict[str, Any] | None = None,
        sop_instance_uid_hash: str | None = None,
    ) -> ImageRecord:
        """Paths are relative to the storage folder (`Settings.storage_dir`), so the folder can move.

        A second row for the same (study, SOP instance) is refused ("image_exists"), also when two
        sessions add it at once: the database's unique index decides, not a look-up beforehand."""
        display = storage_relative(display_path, "display_path")
        dicom = storage_relative(dicom_path, "dicom_path")
        with self._session() as session:
            if session.get(Study, study_id) is None:
                raise OrapoError("study_not_found", f"There is no study with id {study_id}.")
            image = Image(
                study_id=study_id,
                sop_instance_uid_hash=sop_instance_uid_hash,
                dicom_path=dicom,
                display_path=display,
                width=int(width),
                height=int(height),
                bits_stored=bits_stored,
                source_format=source_format,
                warnings=list(warnings),
                header=dict(header or {}),
            )
            session.add(image)
            try:
                session.flush()
            except IntegrityError as exc:
                raise OrapoError("image_exists", "This image has already been uploaded.") from exc
            return image_record(image)

    def find_image(
        self, study_id: int, *, sop_instance_uid_hash: str, dicom_path: str | None = None
    ) -> ImageRecord | None:
        """The study's image of this instance; `dicom_path` also finds a row stored before instances were recorded."""
        with self._session() as session:
            same = Image.sop_instance_uid_hash == sop_instance_uid_hash
            if dicom_path is not None:
                same = same | (Image.dicom_path == storage_relative(dicom_path, "dicom_path"))
            image = session.scalar(select(Image).where(Image.study_id == study_id, same).order_by(Image.id).limit(1))
            return None if image is None else image_record(image)

    def get(self, study_id: int) -> StudyRecord:
        with self._session() as session:
            study = session.get(Study, study_id)
            if study is None:
                raise OrapoError("study_not_found", f"There is no study with id {study_id}.")
            return study_record(study)

    def find_by_uid_hash(self, study_uid_hash: str) -> StudyRecord | None:
        with self._session() as session:
            study = session.scalar(select(Study).where(Study.study_uid_hash == study_uid_hash))
            return None if study is None else study_record(study)

    def images(self, study_id: int) -> list[ImageRecord]:
        with self._session() as session:
            return [
                image_record(i)
                for i in session.scalars(select(Image).where(Image.study_id == study_id).order_by(Image.id))
            ]

    def get_image(self, image_id: int) -> ImageRecord:
        with self._session() as session:
            image = session.get(Image, image_id)
            if image is None:
                raise OrapoError("image_not_found", f"There is no image with id {image_id}.")
            return image_record(image)

    def stored_paths(self) -> set[str]:
        """Every file of the storage folder an image row names (DICOM and display), storage-relative: what the
        start-up sweep must keep."""
        with self._session() as session:
            return {
                path for row in session.execute(select(Image.dicom_path, Image.display_path)) for path in row if path
            }

    def _set(self, study_id: int, **values) -> StudyRecord:
        with self._session() as session:
            study = session.get(Study, study_id)
            if study is None:
                raise OrapoError("study_not_found", f"There is no study with id {study_id}.")
            for name, value in values.items():
                setattr(study, name, value)
            return study_record(study)

    def set_status(self, study_id: int, status: str) -> StudyRecord:
        _check_status(status)
        return self._set(study_id, status=status)

    def set_not_drafted(self, study_id: int, reason: str) -> StudyRecord:
        """Mark the study as stored but never drafted, for `reason` (words following "Study N is")."""
        if not reason:
            raise OrapoError("invalid_study", "A study is kept from drafting only with the reason why.")
        return self._set(study_id, not_drafted=reason)

    def list(
        self,
        *,
        uploaded_by: int | None = None,
        status: str | Sequence[str] | None = None,
        split: str | None = None,
        patient_pseudonym: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[StudyOverview]:
        """A worklist, newest first: each study with its images, latest draft and latest correction (`patient_pseudonym`:
        one patient's studies, for the priors)."""
        statuses = [status] if isinstance(status, str) else list(status or [])
        for s in statuses:
            _check_status(s)
        with self._session() as session:
            query = select(Study).order_by(Study.created_at.desc(), Study.id.desc()).limit(limit).offset(offset)
            if uploaded_by is not None:
                query = query.where(Study.uploaded_by == uploaded_by)
            if statuses:
                query = query.where(Study.status.in_(statuses))
            if split is not None:
                query = query.where(Study.split == split)
            if patient_pseudonym is not None:
                query = query.where(Study.patient_pseudonym == patient_pseudonym)
            studies = list(session.scalars(query))
            ids = [s.id for s in studies]
            if not ids:
                return []
            images: dict[int, list[ImageRecord]] = {}
            for image in session.scalars(select(Image).where(Image.study_id.in_(ids)).order_by(Image.id)):
                images.setdefault(image.study_id, []).append(image_record(image))
            latest_draft_ids = select(func.max(Draft.id)).where(Draft.study_id.in_(ids)).group_by(Draft.study_id)
            drafts = {
                d.study_id: draft_record(d)
                for d in session.scalars(select(Draft).where(Draft.id.in_(latest_draft_ids)))
            }
            latest_versions = (
                select(Correction.study_id, func.max(Correction.version).label("version"))
                .where(Correction.study_id.in_(ids))
                .group_by(Correction.study_id)
                .subquery()
            )
            corrections = {
                c.study_id: correction_record(c)
                for c in session.scalars(
                    select(Correction).join(
                        latest_versions,
                        (Correction.study_id == latest_versions.c.study_id)
                        & (Correction.version == latest_versions.c.version),
                    )
                )
            }
            return [
                StudyOverview(
                    study=study_record(s),
                    images=tuple(images.get(s.id, [])),
                    latest_draft=drafts.get(s.id),
                    latest_correction=corrections.get(s.id),
                )
                for s in studies
            ]

    def overview(self, study_id: int) -> StudyOverview:
        study = self.get(study_id)
        return StudyOverview(
            study=study,
            images=tuple(self.images(study_id)),
            latest_draft=DraftRepository(self._db).latest_for_study(study_id),
            latest_correction=CorrectionRepository(self._db).latest_for_study(study_id),
        )


class ArchiveLinkRepository(Repository):
    """The sealed archive StudyInstanceUID of studies imported from the archive (`db.models.ArchiveLink`).

    Only the DICOMweb pull and the DIMSE listener write it, only the SR sender reads it; the value is the sealed
    token, never the UID (`orapo_core.imaging.deid.seal_archive_uid`)."""

    def link(self, study_id: int, sealed_study_uid: str, *, source: str) -> None:
        """Keep the first link of a study: its images came from that archive study, whatever arrives later."""
        with self._session() as session:
            if session.get(ArchiveLink, study_id) is not None:
                return
            try:
                with session.begin_nested():
                    session.add(ArchiveLink(study_id=study_id, sealed_study_uid=sealed_study_uid, source=source))
            except IntegrityError:  # another process linked it in the same moment: its link stands
                pass

    def sealed(self, study_id: int) -> str | None:
        with self._session() as session:
            row = session.get(ArchiveLink, study_id)
            return None if row is None else row.sealed_study_uid
