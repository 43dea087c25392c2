"""The form of a report: what FactS cannot see and a policy trained on FactS learns to exploit.

FactS scores the findings a report asserts. A report can assert them in text no
reader would sign, and GRPO on FactS found such text (issue 11,
`bench_learning --quick`, seeds 1 and 2): "Small bilateral. pneumothorax. Small
bilateral. pneumothorax. ... No pneumothorax." scores 0.58 against a study with
a pneumothorax and atelectasis, close to the 0.67 of a well-formed report that
names the atelectasis only (tests/test_facts_form.py), since its labels are
what count. `report_form` measures four defects of form, from
the extractor's own sentences and facts, and turns them into a factor in [0, 1]
that the reward multiplies FactS by (`make_facts_reward(form_guard=True)`):

- a sentence that repeats an earlier sentence of its own section (the words,
  case and punctuation aside; an impression restating a finding is no repeat);
- a fragment: a sentence with no finding whose words are only sides, sizes,
  locations and function words ("Small bilateral.");
- a stutter: a sentence with a word written twice back to back ("left left
  ventricle", "Patchy Patchy Patchy The heart ...": what GRPO's drafts
  degenerated into on the general pool, docs, Research, 2026-12-05);
- a self-contradiction: one finding both asserted and denied in the report
  ("No pneumothorax." in the findings, "Moderate right pneumothorax." in the
  impression), unless the two name different sides;
- a section the reference report has (findings, impression) and this one lacks.

    factor = (1 − share of sentences repeated, fragments or stuttering)
             × 0.5 ** (findings contradicted in themselves)
             × 0.5 ** (sections missing)

A report with none of these defects keeps factor 1, so its FactS is unchanged:
every PhantomCXR reference report does (tested). Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from orapo_core.facts import vocabulary as V
from orapo_core.facts.extract import NEGATIVE, POSITIVE, Fact, ReportFacts

# The sections a report of this project is written in (report_layout.report_text) and is charged for missing.
REQUIRED_SECTIONS = ("findings", "impression")
CONTRADICTION_FACTOR = 0.5
MISSING_SECTION_FACTOR = 0.5

_QUALIFIER_PATTERNS = [pattern for name in ("laterality", "severity", "location") for pattern, _ in V.ATTRIBUTES[name]]
_FUNCTION_WORDS = (
    r"a|an|the|and|or|of|in|on|at|to|with|is|are|there|seen|noted|lobe|lobes|side|sided|zone|zones|lung|lungs"
)
_FRAGMENT_RE = re.compile(
    r"(?:(?:" + "|".join(_QUALIFIER_PATTERNS) + "|" + _FUNCTION_WORDS + r")(?![\w-])[\s,;-]*)+",
)
_WORDS_RE = re.compile(r"[^\W\d_]+")


@dataclass(frozen=True)
class ReportForm:
    factor: float  # what FactS is multiplied by: 1.0 for a report without defects of form
    sentences: int
    repeated: list[int] = field(default_factory=list)  # indices of sentences repeating one earlier in their section
    fragments: list[int] = field(default_factory=list)  # indices of sentences that are only qualifiers
    contradictions: list[str] = field(default_factory=list)  # findings the report both asserts and denies
    missing_sections: list[str] = field(default_factory=list)
    stutters: list[int] = field(default_factory=list)  # indices of sentences with a word written twice back to back

    @property
    def defects(self) -> list[str]:
        """Each defect as a short phrase, for a log or a reader."""
        out = []
        if self.repeated:
            out.append(f"{len(self.repeated)} repeated sentence(s)")
        if self.fragments:
            out.append(f"{len(self.fragments)} fragment(s)")
        if self.stutters:
            out.append(f"{len(self.stutters)} stuttering sentence(s)")
        out += [f"{name} both stated and denied" for name in self.contradictions]
        out += [f"no {name} section" for name in self.missing_sections]
        return out


def _normalized(text: str) -> str:
    return " ".join(_WORDS_RE.findall(text.lower()))


def is_fragment(text: str) -> bool:
    """A sentence of nothing but sides, sizes, locations and function words ("Small bilateral.", "Right upper lobe.")."""
    words = _normalized(text)
    return bool(words) and _FRAGMENT_RE.fullmatch(words + " ") is not None


def has_stutter(text: str) -> bool:
    """A word written twice in a row, case aside ("left left ventricle"): a slip no signed report keeps."""
    words = _normalized(text).split()
    return any(a == b for a, b in zip(words, words[1:]))


def _sides(facts: list[Fact]) -> set[str | None]:
    return {(f.attributes or {}).get("laterality") for f in facts}


def _contradicted(report: ReportFacts) -> list[str]:
    """Findings (concepts) the report asserts and denies, the two not told apart by side."""
    asserted: dict[str, list[Fact]] = {}
    denied: dict[str, list[Fact]] = {}
    for fact in report.facts:
        if fact.polarity == POSITIVE:
            asserted.setdefault(fact.observation, []).append(fact)
        elif fact.polarity == NEGATIVE:
            denied.setdefault(fact.observation, []).append(fact)
    out = []
    for concept in asserted.keys() & denied.keys():
        stated, refused = _sides(asserted[concept]), _sides(denied[concept])
        # "No left pneumothorax. Small right pneumothorax." names two sides: no contradiction.
        # A denial without a side denies every side; an assertion without one may be any.
        if None in stated or None in refused or stated & refused:
            out.append(concept)
    return sorted(out)


def report_form(report: ReportFacts, *, required_sections: tuple[str, ...] = REQUIRED_SECTIONS) -> ReportForm:
    """The defects of form of an extracted report, and the factor they make (see the module's docstring).

    `required_sections` are the sections charged when missing: pass those the reference report has.
    """
    seen: set[tuple[str, str]] = set()
    repeated, fragments, stuttering = [], [], []
    with_facts = {f.sentence_index for f in report.facts}
    for s in report.sentences:
        if s.section in V.NON_FINDING_SECTIONS:
            continue
        key = (s.section, _normalized(s.text))
        if key in seen:
            repeated.append(s.index)
        elif s.index not in with_facts and is_fragment(s.text):
            fragments.append(s.index)
        elif has_stutter(s.text):
            stuttering.append(s.index)
        seen.add(key)
    contradictions = _contradicted(report)
    present = {s.section for s in report.sentences}
    missing = [name for name in required_sections if name not in present]
    n = len(report.sentences)
    factor = (1.0 - (len(repeated) + len(fragments) + len(stuttering)) / n) if n else 1.0
    factor *= CONTRADICTION_FACTOR ** len(contradictions) * MISSING_SECTION_FACTOR ** len(missing)
    return ReportForm(max(0.0, min(1.0, factor)), n, repeated, fragments, contradictions, missing, stuttering)
