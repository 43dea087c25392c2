"""The clinician's side of a report: highlights, saving, signing, amending, the worklist.

Before editing, each draft sentence shows the model's self-consistency (how often
its K samples agreed) as a number on a blue shade; once the clinician edits, the
same draft sentences are judged by FactS against the edited text and show a
verdict with a symbol, in green, red or grey: entailed, contradicted (with what
disagrees: side, severity or device), or unsupported. The two modes never share
a colour or a label, so green can only mean "your report says the same". A
saved edit is also a preference pair (chosen = correction, rejected = draft) for
the next round.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from db import Database, DraftRepository
from db.records import CorrectionRecord, DraftRecord, StudyOverview, UserRecord
from db.repositories.reports import same_text
from orapo_core.config import Settings
from orapo_core.errors import OrapoError
from orapo_core.facts.score import ATTRIBUTE_NAMES, FactJudgement, SentenceScore

HIGH, MEDIUM = 0.75, 0.5
# Confidence: blues, darker where fewer samples agree; the label is the number itself.
CONFIDENCE_BANDS = ((HIGH, "#5b9bd5", "most samples agree"), (MEDIUM, "#1e6fc2", "some samples disagree"),
                    (0.0, "#0b2f6b", "most samples disagree: read first"))
# Verdicts: a symbol and a word on green, red or grey. A sentence without a finding has no label.
VERDICT_LABELS = {"entailed": "✓ entailed", "contradicted": "✗ contradicted", "unsupported": "? unsupported"}
VERDICT_COLORS = {"entailed": "#2e7d32", "contradicted": "#c62828", "unsupported": "#757575"}
VERDICT_MEANINGS = {"entailed": "your report says the same",
                    "contradicted": "your report says otherwise (after the colon: side, severity or device)",
                    "unsupported": "your report does not say it"}
_REASON_KINDS = tuple(ATTRIBUTE_NAMES.values())  # what a contradiction can name: side, severity, device
# Every verdict label a sentence can get, with its colour (a contradiction names what disagrees).
COLOR_MAP = {VERDICT_LABELS[v]: c for v, c in VERDICT_COLORS.items()} | {
    f"{VERDICT_LABELS['contradicted']}: {kinds}": VERDICT_COLORS["contradicted"]
    for kinds in ("side", "severity", "device", "side, severity", "side, device")
}
TITLES = {"confidence": "Draft before your edit: the model's confidence per sentence (blue, darker = less sure)",
          "facts": "Draft checked against your report: the FactS verdict per sentence",
          "empty": "Draft, sentence by sentence"}


def confidence_label(confidence: float) -> str:
    """The label of a sentence before editing: its confidence as a number, e.g. "confidence 0.25"."""
    return f"confidence {confidence:.2f}"


def confidence_color(confidence: float) -> str:
    return next(color for floor, color, _ in CONFIDENCE_BANDS if confidence >= floor)


def verdict_label(sentence: SentenceScore) -> str | None:
    """A sentence's verdict label; a contradiction names the attributes that disagree ("✗ contradicted: side")."""
    if sentence.status not in VERDICT_LABELS:
        return None  # nothing in the sentence to check
    label = VERDICT_LABELS[sentence.status]
    if sentence.status == "contradicted":
        kinds = {part.split(":")[0] for j in sentence.facts if j.verdict == "contradicted" and j.reason
                 for part in j.reason.split("; ")}
        if kinds and not any(j.verdict == "contradicted" and not j.reason for j in sentence.facts):
            label += ": " + ", ".join(k for k in _REASON_KINDS if k in kinds)
    return label


@dataclass(frozen=True)
class Highlights:
    spans: list[tuple[str, str | None]]  # (text, label) pairs for gr.HighlightedText
    missed: list[str] = field(default_factory=list)  # findings of the reference the draft does not state
    mode: str = "confidence"  # 'confidence' before editing, 'facts' after
    color_map: dict[str, str] = field(default_factory=dict)  # the colour of every label in `spans`
    reasons: list[tuple[str, str]] = field(default_factory=list)  # (draft sentence, why it is contradicted)
    withheld: list[str] = field(default_factory=list)  # sentences left out of the draft (DraftRecord.withheld)
    added: list[str] = field(default_factory=list)  # sentences the finding check put in (DraftRecord.added)

    @property
    def title(self) -> str:
        """The panel title: which of the two modes is shown."""
        return TITLES[self.mode] if any(label for _, label in self.spans) else TITLES["empty"]

    def legend(self) -> list[tuple[str, str, str]]:
        """(label, colour, meaning) for each colour this mode uses."""
        if self.mode == "facts":
            return [(VERDICT_LABELS[v], VERDICT_COLORS[v], VERDICT_MEANINGS[v]) for v in VERDICT_LABELS]
        bounds = [f"{HIGH:.2f} or more", f"{MEDIUM:.2f} to {HIGH:.2f}", f"under {MEDIUM:.2f}"]
        return [(f"confidence {b}", color, meaning) for b, (_, color, meaning) in zip(bounds, CONFIDENCE_BANDS)]


def confidence_highlights(draft: DraftRecord) -> Highlights:
    spans: list[tuple[str, str | None]] = []
    colors: dict[str, str] = {}
    for s in draft.sentence_scores or []:
        confidence = float(s["confidence"])
        label = confidence_label(confidence)
        colors[label] = confidence_color(confidence)
        spans += [(s["text"], label), (" ", None)]
    # a draft made with samples=0 has no confidences: its text, unlabelled
    return Highlights(spans[:-1] or [(draft.text, None)], color_map=colors, withheld=draft.withheld, added=draft.added)


def facts_highlights(draft_text: str, corrected_text: str) -> Highlights:
    """The draft's sentences judged against the corrected text, and what the draft missed."""
    from orapo_core.facts import score_report

    if not (corrected_text or "").strip():
        return Highlights([(draft_text, None)], mode="facts")
    score = score_report(draft_text, reference_text=corrected_text)
    spans: list[tuple[str, str | None]] = []
    reasons: list[tuple[str, str]] = []
    colors: dict[str, str] = {}
    for s in score.sentences:
        label = verdict_label(s)
        if label:
            colors[label] = VERDICT_COLORS[s.status]
        spans.append((s.text, label))
        spans.append((" ", None))
        reasons.extend((s.text, contradiction_reason(j)) for j in s.facts if j.verdict == "contradicted")
    return Highlights(spans[:-1] or [(draft_text, None)], missed=list(score.missed), mode="facts", color_map=colors,
                      reasons=reasons)


def contradiction_reason(judgement: FactJudgement) -> str:
    """Why a fact is contradicted, in words: the attribute that disagrees, or what the report says of the finding."""
    if judgement.reason:
        return judgement.reason
    draft, report = ("denied", "stated") if judgement.fact.polarity == "negative" else ("stated", "denied")
    return f"{judgement.fact.observation.lower()}: {draft} in the draft, {report} in the report"


def highlights_for(draft: DraftRecord, edited_text: str | None) -> Highlights:
    if edited_text is None or same_text(edited_text, draft.text):
        return confidence_highlights(draft)
    return replace(facts_highlights(draft.text, edited_text), withheld=draft.withheld, added=draft.added)


def rescore(db: Database, draft_id: int, edited_text: str | None) -> Highlights:
    """A stored draft's highlights against the report as the clinician is editing it."""
    return highlights_for(DraftRepository(db).get(int(draft_id)), edited_text)


def sentence_choices(draft_text: str) -> list[tuple[str, int]]:
    """(label, index) for each sentence of the draft, for a dropdown."""
    from orapo_core.facts import extract_facts

    report = extract_facts(draft_text)
    return [(f"{i + 1}. {s.text[:80]}", i) for i, s in enumerate(report.sentences)]


def sentence_facts(draft_text: str, index: int, reference_text: str | None = None) -> list[list[Any]]:
    """The atomic facts of one draft sentence: mention, finding, polarity, attributes, and the verdict with its reason."""
    from orapo_core.facts import extract_facts, score_report

    index = int(index)
    if reference_text and reference_text.strip():
        for s in score_report(draft_text, reference_text=reference_text).sentences:
            if s.index == index:
                return [[j.fact.mention, j.fact.observation, j.fact.polarity, _attrs(j.fact.attributes),
                         f"{j.verdict} ({contradiction_reason(j)})" if j.verdict == "contradicted" else j.verdict]
                        for j in s.facts]
        return []
    return [[f.mention, f.observation, f.polarity, _attrs(f.attributes), ""]
            for f in extract_facts(draft_text).facts if f.sentence_index == index]


def _attrs(attributes: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted((attributes or {}).items()))


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
        what = ("Accept the draft unchanged and sign this report?" if self.accept
                else "Sign this report?" if self.sign else "Save this report without signing it?")
        if self.base_signed:
            what += (f" This creates an amendment of the signed report: version {self.base_version + 1} "
                     f"replaces signed version {self.base_version}, which is kept.")
        return what


def prepare_report(db: Database, user: UserRecord, study_id: int, draft_id: int | None, text: str, *, sign: bool,
                   accept: bool = False, base_version: int | None = None) -> PendingReport:
    """Check what the clinician asked to store, and say what storing it will do, before anything is stored.

    Accepting is refused once the text differs from the draft (whitespace aside): an edited
    report is signed as written, never swapped for the draft behind the clinician's back.
    `base_version` is the report version the clinician's page opened (0: none); when someone
    stored another version since, storing is refused (`stale_correction`) and nothing is
    stored. None (a script that reads the latest version itself) takes the latest as it is.
    """
    from app.services.reading.drafting import open_study

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
    return PendingReport(study_id=overview.study.id, draft_id=draft_id, text=text, sign=sign or accept, accept=accept,
                         base_version=latest.version if latest else 0,
                         base_signed=latest is not None and latest.signed_at is not None)


def check_base_version(db: Database, latest: CorrectionRecord | None, base_version: int) -> None:
    """Refuse to store over a report version the clinician has not seen (optimistic concurrency)."""
    from db import UserRepository

    if (latest.version if latest else 0) == base_version:
        return
    if latest is None or latest.version < base_version:
        raise OrapoError("stale_correction", "This report is not the version your page opened; nothing was saved. "
                                             "Reload the study to see the latest version.")
    try:
        who = UserRepository(db).get(latest.author_id).username
    except OrapoError:
        who = "another user"
    raise OrapoError("stale_correction",
                     f"{who} saved version {latest.version} of this report after your page opened "
                     f"{'version ' + str(base_version) if base_version else 'the study'}; nothing was saved. "
                     "Reload the study to see it; your text stays on screen until you do.")


def store_report(db: Database, user: UserRecord, pending: PendingReport, current_text: str, *,
                 settings: Settings | None = None) -> CorrectionRecord:
    """Store what the confirmation showed, provided the report on screen is still exactly that text
    and the study's report is still the version the confirmation spoke of."""
    from app.services.reading.drafting import open_study

    if (current_text or "").strip() != pending.text:
        raise OrapoError("report_changed", "The report on screen is not the text you were asked to confirm; "
                                           "nothing was saved. Review it and save or sign again.")
    latest = open_study(db, user, pending.study_id).latest_correction
    if (latest.version if latest else 0, latest is not None and latest.signed_at is not None) != \
            (pending.base_version, pending.base_signed):
        raise OrapoError("stale_correction", "This report has been changed since you asked to store it; nothing was "
                                             "saved. Reopen it from the worklist to see the latest version.")
    if pending.accept:
        assert pending.draft_id is not None  # prepare_report refuses to accept without a draft
        return accept_draft(db, user, pending.study_id, pending.draft_id, pending.text,
                            base_version=pending.base_version, settings=settings)
    return save_report(db, user, pending.study_id, pending.draft_id, pending.text, sign=pending.sign,
                       base_version=pending.base_version, settings=settings)


def _check_unchanged(draft: DraftRecord, study_id: int, text: str) -> None:
    if draft.study_id != study_id:
        raise OrapoError("draft_not_found", "That draft belongs to another study.")
    if not same_text(text, draft.text):
        raise OrapoError("draft_edited", "The report differs from the draft, so it cannot be accepted unchanged; "
                                         "nothing was signed. Sign it as written with Save and sign.")


def save_report(db: Database, user: UserRecord, study_id: int, draft_id: int | None, text: str, *, sign: bool,
                base_version: int | None = None, settings: Settings | None = None) -> CorrectionRecord:
    """Store the clinician's report (version 1, or an amendment of the latest), and its preference pair if edited.

    With `base_version` (the version the page opened), a report stored by anyone since is refused (`stale_correction`).
    The correction (with the worklist ordering it was opened from), its pair and its audit entries are one
    transaction; a committed signature then sends the SR in the background if the admin said so (`sr_send`)."""
    from app.services.archive.sr_send import after_signing

    record = _store_correction(db, user, study_id, draft_id, text, sign=sign, base_version=base_version)
    if sign and record.signed_at is not None:
        after_signing(db, record.study_id, actor=user, settings=settings)
    return record


def _store_correction(db: Database, user: UserRecord, study_id: int, draft_id: int | None, text: str, *, sign: bool,
                      base_version: int | None) -> CorrectionRecord:
    from app.services.reading.drafting import open_study
    from app.services.reading.reading_order import opened_from
    from db import AuditRepository, CorrectionRepository, PairRepository
    from orapo_core.facts import label_report

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
            audit.append("correction.sign", actor=user, object_type="study", object_id=overview.study.id,
                         details={"correction_id": record.id, "version": record.version})
            return record
        if latest is None:
            record = corrections.create(overview.study.id, author_id=user.id, text=text,
                                        draft_id=draft.id if draft else None, labels=labels, signed=sign,
                                        reading_order=order)
            action = "correction.create"
        else:
            record = corrections.amend(latest.id, author_id=user.id, text=text, labels=labels, signed=sign,
                                       reading_order=order)
            action = "correction.amend"
        details: dict[str, Any] = {"correction_id": record.id, "version": record.version, "signed": sign,
                                   "accepted_unchanged": record.accepted_unchanged,
                                   "draft_id": draft.id if draft else None,
                                   "model_version_id": draft.model_version_id if draft else None}
        if draft is not None and not record.accepted_unchanged:
            if overview.study.split == "train":
                pair = PairRepository(session).add(overview.study.id, prompt=draft.prompt, chosen=text,
                                                   rejected=draft.text, source="clinician_edit",
                                                   image_id=overview.images[0].id if overview.images else None,
                                                   correction_id=record.id)
                details["pair_id"] = pair.id
            else:
                details["pair_id"] = None  # held-out studies evaluate rounds; they never become training pairs
        audit.append(action, actor=user, object_type="study", object_id=overview.study.id, details=details)
        if sign:
            audit.append("correction.sign", actor=user, object_type="study", object_id=overview.study.id,
                         details={"correction_id": record.id, "version": record.version})
        return record


def accept_draft(db: Database, user: UserRecord, study_id: int, draft_id: int, text: str, *,
                 base_version: int | None = None, settings: Settings | None = None) -> CorrectionRecord:
    """The draft, unchanged, as the signed report; `text` is the report the clinician sees.

    Refused when `text` is not the draft (whitespace aside): what is signed is the text on
    screen, so an edited report is never signed as the draft.
    """
    from app.services.reading.drafting import open_study

    overview = open_study(db, user, study_id)
    _check_unchanged(DraftRepository(db).get(int(draft_id)), overview.study.id, text or "")
    return save_report(db, user, study_id, int(draft_id), text, sign=True, base_version=base_version, settings=settings)


# What a study's split means, in a reader's words (the worklist's column, the Read tab's header).
STUDY_USE_SHORT = {"train": "may train the model", "holdout": "kept aside to check the model"}
HELD_OUT = "kept aside to check the model; not used to train it"


def worklist(db: Database, user: UserRecord, *, status: str | None = None, everyone: bool = False, limit: int = 200) -> list[StudyOverview]:
    """The user's own studies; everyone's for an administrator who asks."""
    from app.services.accounts.auth import require_role
    from db import StudyRepository

    if everyone:
        require_role(user, "admin")
    statuses = None if status in (None, "", "all") else status
    return StudyRepository(db).list(uploaded_by=None if everyone else user.id, status=statuses, limit=limit)


@dataclass(frozen=True)
class StudyHistory:
    overview: StudyOverview
    drafts: list[DraftRecord]
    corrections: list[CorrectionRecord]
    authors: dict[int, str] = field(default_factory=dict)  # user id -> username, for every id in `corrections`

    def author(self, correction: CorrectionRecord) -> str:
        return self.authors.get(correction.author_id, "a deleted user")


def history(db: Database, user: UserRecord, study_id: int) -> StudyHistory:
    from app.services.reading.drafting import open_study
    from db import CorrectionRepository, DraftRepository, UserRepository

    overview = open_study(db, user, study_id)
    corrections = CorrectionRepository(db).history(overview.study.id)
    users = UserRepository(db)
    authors = {}
    for author_id in {c.author_id for c in corrections}:
        try:
            authors[author_id] = users.get(author_id).username
        except OrapoError:
            pass
    return StudyHistory(overview, DraftRepository(db).for_study(overview.study.id), corrections, authors)
