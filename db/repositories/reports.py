"""Drafts and corrections: what the model wrote and what the clinician made of it.

A correction is never overwritten. An amendment is a new row with version + 1
that points at the one it replaces; (study, version) is unique, so two
clinicians amending the same version at once cannot fork the history: the
second is refused and asked to reload.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import func, select  # noqa: TID253 -- this module is heavy; light ones import it lazily
from sqlalchemy.exc import IntegrityError  # noqa: TID253 -- this module is heavy; light ones import it lazily
from sqlalchemy.orm import Session  # noqa: TID253 -- this module is heavy; light ones import it lazily

from db.models import Correction, Draft, ReportAutosave, Study, TrainingRound, User, utcnow
from db.records import READING_ORDERS, AutosaveRecord, CorrectionRecord, DraftRecord
from db.repositories.base import Repository, as_utc, must_utc
from orapo_core.errors import OrapoError
from orapo_core.report_layout import same_text


def draft_record(draft: Draft) -> DraftRecord:
    return DraftRecord(
        id=draft.id,
        study_id=draft.study_id,
        model_version_id=draft.model_version_id,
        model_name=draft.model_name,
        prompt=draft.prompt,
        sampling=dict(draft.sampling or {}),
        text=draft.text,
        facts=draft.facts,
        sentence_scores=draft.sentence_scores,
        latency_ms=draft.latency_ms,
        created_by=draft.created_by,
        created_at=must_utc(draft.created_at),
        image_features=draft.image_features,
    )


def correction_record(correction: Correction) -> CorrectionRecord:
    return CorrectionRecord(
        id=correction.id,
        study_id=correction.study_id,
        draft_id=correction.draft_id,
        author_id=correction.author_id,
        text=correction.text,
        labels=correction.labels,
        accepted_unchanged=correction.accepted_unchanged,
        signed_at=as_utc(correction.signed_at),
        version=correction.version,
        previous_id=correction.previous_id,
        trained_in_round=correction.trained_in_round,
        created_at=must_utc(correction.created_at),
        reading_order=correction.reading_order,
    )


def _study(session: Session, study_id: int) -> Study:
    study = session.get(Study, study_id)
    if study is None:
        raise OrapoError("study_not_found", f"There is no study with id {study_id}.")
    return study


def _latest_versions():
    return (
        select(Correction.study_id, func.max(Correction.version).label("version"))
        .group_by(Correction.study_id)
        .subquery()
    )


class DraftRepository(Repository):
    def create(
        self,
        study_id: int,
        *,
        model_name: str,
        prompt: str,
        text: str,
        sampling: dict[str, Any] | None = None,
        facts: Any = None,
        sentence_scores: Any = None,
        latency_ms: int | None = None,
        model_version_id: int | None = None,
        created_by: int | None = None,
        image_features: list[float] | None = None,
    ) -> DraftRecord:
        with self._session() as session:
            study = _study(session, study_id)
            draft = Draft(
                study_id=study_id,
                model_version_id=model_version_id,
                model_name=model_name,
                prompt=prompt,
                sampling=dict(sampling or {}),
                text=text,
                facts=facts,
                sentence_scores=sentence_scores,
                latency_ms=latency_ms,
                created_by=created_by,
                image_features=list(image_features) if image_features is not None else None,
            )
            session.add(draft)
            if study.status == "new":
                study.status = "drafted"
            session.flush()
            return draft_record(draft)

    def get(self, draft_id: int) -> DraftRecord:
        with self._session() as session:
            draft = session.get(Draft, draft_id)
            if draft is None:
                raise OrapoError("draft_not_found", f"There is no draft with id {draft_id}.")
            return draft_record(draft)

    def latest_for_study(self, study_id: int) -> DraftRecord | None:
        with self._session() as session:
            draft = session.scalar(select(Draft).where(Draft.study_id == study_id).order_by(Draft.id.desc()).limit(1))
            return None if draft is None else draft_record(draft)

    def for_study(self, study_id: int) -> list[DraftRecord]:
        with self._session() as session:
            return [
                draft_record(d)
                for d in session.scalars(select(Draft).where(Draft.study_id == study_id).order_by(Draft.id))
            ]


class CorrectionRepository(Repository):
    def create(
        self,
        study_id: int,
        *,
        author_id: int,
        text: str,
        draft_id: int | None = None,
        labels: Any = None,
        accepted_unchanged: bool | None = None,
        signed: bool = False,
        reading_order: str | None = None,
    ) -> CorrectionRecord:
        """The first correction of a study (version 1). `accepted_unchanged` defaults to "same text as the draft";
        `reading_order` is the worklist ordering the reader opened the study from (None: not from an ordering)."""
        with self._session() as session:
            if session.scalar(select(Correction.id).where(Correction.study_id == study_id).limit(1)) is not None:
                raise OrapoError("correction_exists", "This study already has a report; amend it instead.")
            return self._add(
                session, study_id, author_id, text, draft_id, labels, accepted_unchanged, signed, 1, None, reading_order
            )

    def amend(
        self,
        correction_id: int,
        *,
        author_id: int,
        text: str,
        labels: Any = None,
        accepted_unchanged: bool | None = None,
        signed: bool = False,
        reading_order: str | None = None,
    ) -> CorrectionRecord:
        """A new version of the study's report; `correction_id` must be the latest version."""
        with self._session() as session:
            previous = session.get(Correction, correction_id)
            if previous is None:
                raise OrapoError("correction_not_found", f"There is no correction with id {correction_id}.")
            latest = session.scalar(
                select(func.max(Correction.version)).where(Correction.study_id == previous.study_id)
            )
            if latest != previous.version:
                raise OrapoError(
                    "stale_correction", "This report has been amended since you opened it; reload it first."
                )
            return self._add(
                session,
                previous.study_id,
                author_id,
                text,
                previous.draft_id,
                labels if labels is not None else previous.labels,
                accepted_unchanged,
                signed,
                previous.version + 1,
                previous.id,
                reading_order,
            )

    def _add(
        self,
        session,
        study_id,
        author_id,
        text,
        draft_id,
        labels,
        accepted_unchanged,
        signed,
        version,
        previous_id,
        reading_order=None,
    ) -> CorrectionRecord:
        if reading_order is not None and reading_order not in READING_ORDERS:
            raise OrapoError(
                "invalid_reading_order",
                f"A reading order is one of {', '.join(READING_ORDERS)}, not {reading_order!r}.",
            )
        study = _study(session, study_id)
        if session.get(User, author_id) is None:
            raise OrapoError("user_not_found", f"There is no user with id {author_id}.")
        draft = None
        if draft_id is not None:
            draft = session.get(Draft, draft_id)
            if draft is None or draft.study_id != study_id:
                raise OrapoError("draft_not_found", f"Draft {draft_id} does not belong to study {study_id}.")
        if accepted_unchanged is None:
            accepted_unchanged = draft is not None and same_text(draft.text, text)
        correction = Correction(
            study_id=study_id,
            draft_id=draft_id,
            author_id=author_id,
            text=text,
            labels=labels,
            accepted_unchanged=bool(accepted_unchanged),
            signed_at=utcnow() if signed else None,
            version=version,
            previous_id=previous_id,
            reading_order=reading_order,
        )
        session.add(correction)
        try:
            session.flush()
        except IntegrityError as exc:  # the same version written by someone else meanwhile
            raise OrapoError(
                "stale_correction", "This report was changed by someone else meanwhile; reload it first."
            ) from exc
        study.status = "signed" if signed else "corrected"
        return correction_record(correction)

    def sign(self, correction_id: int) -> CorrectionRecord:
        """Sign the latest version once; a signed report changes only by amendment."""
        with self._session() as session:
            correction = session.get(Correction, correction_id)
            if correction is None:
                raise OrapoError("correction_not_found", f"There is no correction with id {correction_id}.")
            if correction.signed_at is not None:
                raise OrapoError("already_signed", "This report is already signed; amend it to change it.")
            latest = session.scalar(
                select(func.max(Correction.version)).where(Correction.study_id == correction.study_id)
            )
            if latest != correction.version:
                raise OrapoError("stale_correction", "Only the latest version of a report can be signed.")
            correction.signed_at = utcnow()
            _study(session, correction.study_id).status = "signed"
            return correction_record(correction)

    def get(self, correction_id: int) -> CorrectionRecord:
        with self._session() as session:
            correction = session.get(Correction, correction_id)
            if correction is None:
                raise OrapoError("correction_not_found", f"There is no correction with id {correction_id}.")
            return correction_record(correction)

    def latest_for_study(self, study_id: int) -> CorrectionRecord | None:
        with self._session() as session:
            c = session.scalar(
                select(Correction).where(Correction.study_id == study_id).order_by(Correction.version.desc()).limit(1)
            )
            return None if c is None else correction_record(c)

    def history(self, study_id: int) -> list[CorrectionRecord]:
        """Every version of the study's report, oldest first."""
        with self._session() as session:
            rows = session.scalars(
                select(Correction).where(Correction.study_id == study_id).order_by(Correction.version)
            )
            return [correction_record(c) for c in rows]

    def untrained(self, *, signed_only: bool = True, limit: int | None = None) -> list[CorrectionRecord]:
        """Each training-split study's latest report that no round has used yet; held-out studies never appear."""
        with self._session() as session:
            latest = _latest_versions()
            query = (
                select(Correction)
                .join(latest, (Correction.study_id == latest.c.study_id) & (Correction.version == latest.c.version))
                .join(Study, Study.id == Correction.study_id)
                .where(Study.split == "train", Correction.trained_in_round.is_(None))
                .order_by(Correction.id)
            )
            if signed_only:
                query = query.where(Correction.signed_at.is_not(None))
            if limit is not None:
                query = query.limit(limit)
            return [correction_record(c) for c in session.scalars(query)]

    def count_untrained(self, *, signed_only: bool = True) -> int:
        return len(self.untrained(signed_only=signed_only))

    def mark_trained(self, correction_ids: Iterable[int], round_id: int) -> int:
        """Record that a round used these corrections; refuses any from a held-out study."""
        ids = sorted(set(correction_ids))
        with self._session() as session:
            if session.get(TrainingRound, round_id) is None:
                raise OrapoError("round_not_found", f"There is no training round with id {round_id}.")
            rows = list(session.scalars(select(Correction).where(Correction.id.in_(ids))))
            if len(rows) != len(ids):
                missing = sorted(set(ids) - {c.id for c in rows})
                raise OrapoError("correction_not_found", f"There are no corrections with ids {missing}.")
            studies = {s.id: s for s in session.scalars(select(Study).where(Study.id.in_({c.study_id for c in rows})))}
            held_out = sorted(c.id for c in rows if studies[c.study_id].split == "holdout")
            if held_out:
                raise OrapoError(
                    "holdout_study", f"Corrections {held_out} belong to held-out studies and are never trained on."
                )
            for c in rows:
                c.trained_in_round = round_id
                studies[c.study_id].status = "trained"
            return len(rows)


class AutosaveRepository(Repository):
    """Unsaved report text, one row per reader and study: written over on every save, deleted once stored."""

    def put(self, user_id: int, study_id: int, text: str, *, base_version: int = 0) -> AutosaveRecord:
        with self._session() as session:
            _study(session, study_id)
            row = session.scalar(
                select(ReportAutosave).where(ReportAutosave.user_id == user_id, ReportAutosave.study_id == study_id)
            )
            if row is None:
                try:
                    with session.begin_nested():
                        row = ReportAutosave(user_id=user_id, study_id=study_id, text=text, base_version=base_version)
                        session.add(row)
                except IntegrityError:  # the same reader's other tab wrote it first: write over that one
                    row = session.scalar(
                        select(ReportAutosave).where(
                            ReportAutosave.user_id == user_id, ReportAutosave.study_id == study_id
                        )
                    )
                    assert row is not None
            row.text, row.base_version, row.saved_at = text, base_version, utcnow()
            session.flush()
            return _autosave_record(row)

    def get(self, user_id: int, study_id: int) -> AutosaveRecord | None:
        with self._session() as session:
            row = session.scalar(
                select(ReportAutosave).where(ReportAutosave.user_id == user_id, ReportAutosave.study_id == study_id)
            )
            return None if row is None else _autosave_record(row)

    def discard(self, user_id: int, study_id: int, *, base_version: int | None = None) -> bool:
        """Delete the reader's unsaved text of the study (with `base_version`, only one edited from that version)."""
        with self._session() as session:
            row = session.scalar(
                select(ReportAutosave).where(ReportAutosave.user_id == user_id, ReportAutosave.study_id == study_id)
            )
            if row is None or (base_version is not None and row.base_version != base_version):
                return False
            session.delete(row)
            return True


def _autosave_record(row: ReportAutosave) -> AutosaveRecord:
    return AutosaveRecord(
        user_id=row.user_id,
        study_id=row.study_id,
        text=row.text,
        base_version=row.base_version,
        saved_at=must_utc(row.saved_at),
    )
