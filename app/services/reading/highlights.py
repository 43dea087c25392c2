"""What the Read tab shows over a draft: its sentences highlighted, and the facts of one sentence.

Before editing, each draft sentence shows the model's self-consistency (how often
its K samples agreed) as a number on a blue shade; once the clinician edits, the
same draft sentences are judged by FactS against the edited text and show a
verdict with a symbol, in green, red or grey: entailed, contradicted (with what
disagrees: side, severity or device), or unsupported. The two modes never share
a colour or a label, so green can only mean "your report says the same".
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import combinations
from typing import Any

from db import Database, DraftRepository
from db.records import DraftRecord
from db.repositories.reports import same_text
from orapo_core.facts import extract_facts, score_edit
from orapo_core.facts.score import ATTRIBUTE_NAMES, FactJudgement, SentenceScore

HIGH, MEDIUM = 0.75, 0.5
# Confidence: blues, darker where fewer samples agree; the label is the number itself.
CONFIDENCE_BANDS = (
    (HIGH, "#5b9bd5", "most samples agree"),
    (MEDIUM, "#1e6fc2", "some samples disagree"),
    (0.0, "#0b2f6b", "most samples disagree: read first"),
)
# Verdicts: a symbol and a word on green, red or grey. A sentence without a finding has no label.
VERDICT_LABELS = {
    "entailed": "✓ entailed",
    "contradicted": "✗ contradicted",
    "unsupported": "? unsupported",
    "removed": "− removed",
}
VERDICT_COLORS = {"entailed": "#2e7d32", "contradicted": "#c62828", "unsupported": "#757575", "removed": "#6d4c41"}
VERDICT_MEANINGS = {
    "entailed": "your report says the same",
    "contradicted": "your report says otherwise (after the colon: side, severity, device, position or change)",
    "unsupported": "your report does not say it",
    "removed": "you deleted it from your report",
}
# A sentence the finding check put into the draft (issue 40): marked as such before editing, never with a
# confidence colour, since no sample of the model wrote it.
ADDED_LABEL = "+ added by the finding check"
ADDED_COLOR = "#ef6c00"
ADDED_MEANING = "the model did not write it; the finding check read the finding in the image and added it"
_REASON_KINDS = tuple(ATTRIBUTE_NAMES.values())  # what a contradiction can name: side, severity, device, ...
# Every verdict label a sentence can get, with its colour (a contradiction names what disagrees).
COLOR_MAP = (
    {VERDICT_LABELS[v]: c for v, c in VERDICT_COLORS.items()}
    | {
        f"{VERDICT_LABELS['contradicted']}: {kinds}": VERDICT_COLORS["contradicted"]
        for n in range(1, len(_REASON_KINDS) + 1)
        for kinds in map(", ".join, combinations(_REASON_KINDS, n))
    }
    | {ADDED_LABEL: ADDED_COLOR}
)
TITLES = {
    "confidence": "Draft before your edit: the model's confidence per sentence (blue, darker = less sure)",
    "facts": "Draft checked against your report: the FactS verdict per sentence",
    "empty": "Draft, sentence by sentence",
}


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
        kinds = {
            part.split(":")[0]
            for j in sentence.facts
            if j.verdict == "contradicted" and j.reason
            for part in j.reason.split("; ")
        }
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
        bands = [(f"confidence {b}", color, meaning) for b, (_, color, meaning) in zip(bounds, CONFIDENCE_BANDS)]
        return bands + ([(ADDED_LABEL, ADDED_COLOR, ADDED_MEANING)] if self.added else [])


def confidence_highlights(draft: DraftRecord) -> Highlights:
    spans: list[tuple[str, str | None]] = []
    colors: dict[str, str] = {}
    added = {t.strip() for t in draft.added}
    for s in draft.sentence_scores or []:
        if s["text"].strip() in added:
            label, colors[ADDED_LABEL] = ADDED_LABEL, ADDED_COLOR
        else:
            confidence = float(s["confidence"])
            label = confidence_label(confidence)
            colors[label] = confidence_color(confidence)
        spans += [(s["text"], label), (" ", None)]
    # a draft made with samples=0 has no confidences: its text, unlabelled
    return Highlights(spans[:-1] or [(draft.text, None)], color_map=colors, withheld=draft.withheld, added=draft.added)


def facts_highlights(draft_text: str, corrected_text: str) -> Highlights:
    """The draft's sentences judged against the corrected text, and what the draft missed. A sentence the reader
    deleted is "removed", never "entailed" (a deleted "No pneumothorax." used to be ticked, the edit being silent)."""
    if not (corrected_text or "").strip():
        return Highlights([(draft_text, None)], mode="facts")
    score = score_edit(draft_text, corrected_text)
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
    return Highlights(
        spans[:-1] or [(draft_text, None)], missed=list(score.missed), mode="facts", color_map=colors, reasons=reasons
    )


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
    report = extract_facts(draft_text)
    return [(f"{i + 1}. {s.text[:80]}", i) for i, s in enumerate(report.sentences)]


def sentence_facts(draft_text: str, index: int, reference_text: str | None = None) -> list[list[Any]]:
    """The atomic facts of one draft sentence: mention, finding, polarity, attributes, and the verdict with its reason."""
    index = int(index)
    if reference_text and reference_text.strip():
        for s in score_edit(draft_text, reference_text).sentences:
            if s.index == index:
                return [
                    [
                        j.fact.mention,
                        j.fact.observation,
                        j.fact.polarity,
                        _attrs(j.fact.attributes, j.fact.critical),
                        f"{j.verdict} ({contradiction_reason(j)})" if j.verdict == "contradicted" else j.verdict,
                    ]
                    for j in s.facts
                ]
        return []
    return [
        [f.mention, f.observation, f.polarity, _attrs(f.attributes, f.critical), ""]
        for f in extract_facts(draft_text).facts
        if f.sentence_index == index
    ]


def _attrs(attributes: dict[str, str], critical: bool = False) -> str:
    """A fact's attributes; a critical one (a malpositioned tube or line) says so first."""
    listed = ", ".join(f"{k}={v}" for k, v in sorted((attributes or {}).items()))
    return f"CRITICAL; {listed}" if critical else listed
