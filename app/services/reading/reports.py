"""The clinician's report: saving, signing and amending it, after a confirmation that shows what is stored.

A saved edit is also a preference pair (chosen = correction, rejected = draft) for
the next round. What the Read tab shows over the draft (the highlights, a
sentence's facts) is `highlights`; the worklist and a study's history are
`worklist`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.services.archive.sr_send import after_signing
from app.services.reading.draft_review import refuse_unsignable_draft
from db import AuditRepository, CorrectionRepository, Database, DraftRepository, PairRepository, UserRepository
from db.records import CorrectionRecord, DraftRecord, UserRecord
from db.repositories.reports import same_text
from orapo_core.config import Settings
from orapo_core.errors import OrapoError
from orapo_core.facts import label_report


@dataclass(frozen=True)
class PendingReport:
    """What Save, Sign or Accept is about to store, shown to the clinician before anything is stored.

    The text is exactly what will be stored; `base_version` and `base_signed` are the report
    version the page opened (0: none yet) and whether it was signed, so a report changed since,
    by anyone, is refused rather than amended unseen.
    """

    study_id: int
    draft_id: int | None
    text: str
    sign: bool
    accept: bool  # the draft, unchanged
    base_version: int
    base_signed: bool  # the latest version is signed: storing makes an amendment of a signed report

    @property
    def needs_confirmation(self) -> bool:
        """Signing always asks; so does an unsigned save that amends a signed report."""
        return self.sign or self.base_signed

    def question(self) -> str:
        what = (
            "Accept the draft unchanged and sign this report?"
            if self.accept
            else "Sign this report?"
            if self.sign
            else "Save this report without signing it?"
        )
        if self.base_signed:
            what += (
                f" This creates an amendment of the signed report: version {self.base_version + 1} "
                f"replaces signed version {self.base_version}, which is kept."
            )
        return what


def prepare_report(
    db: Database,
    user: UserRecord,
    study_id: int,
    draft_id: int | None,
    text: str,
    *,
    sign: bool,
    accept: bool = False,
    base_version: int | None = None,
) -> PendingReport:
    """Check what the clinician asked to store, and say what storing it will do, before anything is stored.

    Accepting is refused once the text differs from the draft (whitespace aside): an edited
    report is signed as written, never swapped for the draft behind the clinician's back.
    `base_version` is the report version the clinician's page opened (0: none); when someone
    stored another version since, storing is refused (`stale_correction`) and nothing is
    stored. None (a script that reads the latest version itself) takes the latest as it is.
    """
    from app.services.reading.drafting import open_study  # noqa: PLC0415 -- loads numpy

    if not (text := (text or "").strip()):
        raise OrapoError("empty_report", "The report is empty; write or accept a report before saving.")
    overview = open_study(db, user, study_id)
    if accept:
        if draft_id is None:
            raise OrapoError("no_draft", "There is no draft to accept; press Draft report first.")
        _check_unchanged(DraftRepository(db).get(int(draft_id)), overview.study.id, text)
    latest = overview.latest_correction
    if base_version is not None:
        check_base_version(db, latest, int(base_version))
    return PendingReport(
        study_id=overview.study.id,
        draft_id=draft_id,
        text=text,
        sign=sign or accept,
        accept=accept,
        base_version=latest.version if latest else 0,
        base_signed=latest is not None and latest.signed_at is not None,
    )


def check_base_version(db: Database, latest: CorrectionRecord | None, base_version: int) -> None:
    """Refuse to store over a report version the clinician has not seen (optimistic concurrency)."""
    if (latest.version if latest else 0) == base_version:
        return
    if latest is None or latest.version < base_version:
        raise OrapoError(
            "stale_correction",
            "This report is not the version your page opened; nothing was saved. "
            "Reload the study to see the latest version.",
        )
    try:
        who = UserRepository(db).get(latest.author_id).username
    except OrapoError:
        who = "another user"
    raise OrapoError(
        "stale_correction",
        f"{who} saved version {latest.version} of this report after your page opened "
        f"{'version ' + str(base_version) if base_version else 'the study'}; nothing was saved. "
        "Reload the study to see it; your text stays on screen until you do.",
    )


def store_report(
    db: Database, user: UserRecord, pending: PendingReport, current_text: str, *, settings: Settings | None = None
) -> CorrectionRecord:
    """Store what the confirmation showed, provided the report on screen is still exactly that text
    and the study's report is still the version the confirmation spoke of."""
    from app.services.reading.drafting import open_study  # noqa: PLC0415 -- loads numpy

    if (current_text or "").strip() != pending.text:
        raise OrapoError(
            "report_changed",
            "The report on screen is not the text you were asked to confirm; "
            "nothing was saved. Review it and save or sign again.",
        )
    latest = open_study(db, user, pending.study_id).latest_correction
    if (latest.version if latest else 0, latest is not None and latest.signed_at is not None) != (
        pending.base_version,
        pending.base_signed,
    ):
        raise OrapoError(
            "stale_correction",
            "This report has been changed since you asked to store it; nothing was "
            "saved. Reopen it from the worklist to see the latest version.",
        )
    if pending.accept:
        assert pending.draft_id is not None  # prepare_report refuses to accept without a draft
        return accept_draft(
            db,
            user,
            pending.study_id,
            pending.draft_id,
            pending.text,
            base_version=pending.base_version,
            settings=settings,
        )
    return save_report(
        db,
        user,
        pending.study_id,
        pending.draft_id,
        pending.text,
        sign=pending.sign,
        base_version=pending.base_version,
        settings=settings,
    )


def _check_unchanged(draft: DraftRecord, study_id: int, text: str) -> None:
    if draft.study_id != study_id:
        raise OrapoError("draft_not_found", "That draft belongs to another study.")
    if not same_text(text, draft.text):
        raise OrapoError(
            "draft_edited",
            "The report differs from the draft, so it cannot be accepted unchanged; "
            "nothing was signed. Sign it as written with Save and sign.",
        )
    refuse_unsignable_draft(draft)  # a draft whose checks found a problem is never signed as it is


def save_report(
    db: Database,
    user: UserRecord,
    study_id: int,
    draft_id: int | None,
    text: str,
    *,
    sign: bool,
    base_version: int | None = None,
    settings: Settings | None = None,
) -> CorrectionRecord:
    """Store the clinician's report (version 1, or an amendment of the latest), and its preference pair if edited.

    With `base_version` (the version the page opened), a report stored by anyone since is refused (`stale_correction`).
    The correction (with the worklist ordering it was opened from), its pair and its audit entries are one
    transaction; a committed signature then sends the SR in the background if the admin said so (`sr_send`)."""
    record = _store_correction(db, user, study_id, draft_id, text, sign=sign, base_version=base_version)
    if sign and record.signed_at is not None:
        after_signing(db, record.study_id, actor=user, settings=settings)
    return record


def _store_correction(
    db: Database,
    user: UserRecord,
    study_id: int,
    draft_id: int | None,
    text: str,
    *,
    sign: bool,
    base_version: int | None,
) -> CorrectionRecord:
    from app.services.reading.drafting import open_study  # noqa: PLC0415 -- loads numpy
    from app.services.reading.reading_order import opened_from  # noqa: PLC0415 -- loads numpy

    if not (text := (text or "").strip()):
        raise OrapoError("empty_report", "The report is empty; write or accept a report before saving.")
    overview = open_study(db, user, study_id)
    draft = DraftRepository(db).get(int(draft_id)) if draft_id is not None else overview.latest_draft
    if draft is not None and draft.study_id != overview.study.id:
        raise OrapoError("draft_not_found", "That draft belongs to another study.")
    labels, order, latest = label_report(text), opened_from(db, user, overview.study.id), overview.latest_correction
    if base_version is not None:
        check_base_version(db, latest, int(base_version))
    with db.session() as session:
        corrections, audit = CorrectionRepository(session), AuditRepository(session)
        if latest is not None and latest.signed_at is None and sign and same_text(latest.text, text):
            record = corrections.sign(latest.id)  # signing the saved text adds no version and no second pair
            audit.append(
                "correction.sign",
                actor=user,
                object_type="study",
                object_id=overview.study.id,
                details={"correction_id": record.id, "version": record.version},
            )
            return record
        if latest is None:
            record = corrections.create(
                overview.study.id,
                author_id=user.id,
                text=text,
                draft_id=draft.id if draft else None,
                labels=labels,
                signed=sign,
                reading_order=order,
            )
            action = "correction.create"
        else:
            record = corrections.amend(
                latest.id, author_id=user.id, text=text, labels=labels, signed=sign, reading_order=order
            )
            action = "correction.amend"
        details: dict[str, Any] = {
            "correction_id": record.id,
            "version": record.version,
            "signed": sign,
            "accepted_unchanged": record.accepted_unchanged,
            "draft_id": draft.id if draft else None,
            "model_version_id": draft.model_version_id if draft else None,
        }
        if draft is not None and not record.accepted_unchanged:
            if overview.study.split == "train":
                pair = PairRepository(session).add(
                    overview.study.id,
                    prompt=draft.prompt,
                    chosen=text,
                    rejected=draft.text,
                    source="clinician_edit",
                    image_id=overview.images[0].id if overview.images else None,
                    correction_id=record.id,
                )
                details["pair_id"] = pair.id
            else:
                details["pair_id"] = None  # held-out studies evaluate rounds; they never become training pairs
        audit.append(action, actor=user, object_type="study", object_id=overview.study.id, details=details)
        if sign:
            audit.append(
                "correction.sign",
                actor=user,
                object_type="study",
                object_id=overview.study.id,
                details={"correction_id": record.id, "version": record.version},
            )
        return record


def accept_draft(
    db: Database,
    user: UserRecord,
    study_id: int,
    draft_id: int,
    text: str,
    *,
    base_version: int | None = None,
    settings: Settings | None = None,
) -> CorrectionRecord:
    """The draft, unchanged, as the signed report; `text` is the report the clinician sees.

    Refused when `text` is not the draft (whitespace aside): what is signed is the text on
    screen, so an edited report is never signed as the draft.
    """
    from app.services.reading.drafting import open_study  # noqa: PLC0415 -- loads numpy

    overview = open_study(db, user, study_id)
    _check_unchanged(DraftRepository(db).get(int(draft_id)), overview.study.id, text or "")
    return save_report(db, user, study_id, int(draft_id), text, sign=True, base_version=base_version, settings=settings)
