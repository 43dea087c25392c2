"""Whether a draft can be signed as it is: its layout, and whether it agrees with itself.

FactS judges a draft against a reference; these checks need none. They read the draft alone, as a radiologist
proof-reads before signing, and name what must change: an empty numbered item or section, items numbered out of
order, a sentence written twice in one section, a finding both stated and denied, and a finding whose side or
severity one sentence gives one way and another the other way. Each problem is a stable code and one sentence
naming the finding and quoting the sentences, for the reader.

They are built not to cry wolf on a report a radiologist would sign (200 PhantomCXR reference reports raise none,
tests/test_draft_checks.py), so each reads the way a reader does:

- A denial repeated is no conflict ("No pneumothorax." in both sections), nor is a finding restated in the
  impression, nor a sentence said once in the findings and again in the impression (radiologists do).
- A denial narrowed by a side, a zone or a device denies only that ("No right effusion." and "Small left
  effusion.") and one narrowed by a word such as "definite", "acute", "large" or "significant" denies only a
  finding called so ("No definite pneumothorax." and "Possible tiny left apical pneumothorax." agree).
- Sides are compared between the findings and the impression: a side the impression gives that the findings give
  the same finding on neither that side nor both sides is a conflict ("left lung base" there, "right lung base"
  here); a side stated in one section only, or two findings on two sides within one section, is none. Bilateral
  conflicts with no single side: a bilateral finding is often described side by side in the findings and named
  once in the impression, or named by its worse side ("bilateral, left greater than right" then "left
  effusion"); a wrong side, left for right, is the error that harms. The impression's pneumonia is held against
  the findings' opacity or consolidation when the findings name the pneumonia itself nowhere.
- Severities conflict when their grades do not overlap (`vocabulary.SEVERITY_GRADES`: small and mild are one
  grade, moderate the next, large and severe the last; "small to moderate" spans two): "small" and "moderate"
  for one finding on one side is a conflict, "small" and "mild" or "small to moderate" and "moderate" is none. A
  sentence without a side is compared with the others when they all give the finding one side.
- Two facts of one sentence are never held against each other: that is the extractor's reading of one phrase.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from orapo_core.facts import vocabulary as V
from orapo_core.facts.extract import NEGATIVE, Fact, ReportFacts, extract_facts
from orapo_core.facts.ontology import CONCEPT_TO_CHEXPERT
from orapo_core.report_layout import has_text, numbered_items, sections

EMPTY_SECTION = "empty_section"
EMPTY_ITEM = "empty_item"
ITEM_NUMBERING = "item_numbering"
REPEATED_SENTENCE = "repeated_sentence"
STATED_AND_DENIED = "stated_and_denied"
SIDE_CONFLICT = "side_conflict"
SEVERITY_CONFLICT = "severity_conflict"
# every code, in the order the problems are listed
CODES = (
    EMPTY_SECTION,
    EMPTY_ITEM,
    ITEM_NUMBERING,
    REPEATED_SENTENCE,
    STATED_AND_DENIED,
    SIDE_CONFLICT,
    SEVERITY_CONFLICT,
)

# CheXpert's kinds of lung opacity: the impression's "pneumonia" is the findings' "opacity" or "consolidation".
_OPACITY_FAMILY = frozenset({"Lung Opacity", "Consolidation", "Pneumonia", "Atelectasis", "Edema", "Lung Lesion"})
# A word that narrows a denial: "No definite pneumothorax." denies only a definite one.
_NARROWING = re.compile(
    r"(?<![\w-])(definite|definitive|convincing|discrete|obvious|gross|frank|overt|appreciable|"
    r"significant|substantial|large|sizable|sizeable|acute|new|displaced|focal|active)\w*",
    re.IGNORECASE,
)
_BILATERAL = "bilateral"


@dataclass(frozen=True)
class DraftProblem:
    """One reason a draft must not be signed as it is: a stable `code` (one of `CODES`), one sentence for the
    reader, and the sentences of the draft it is about (to mark them)."""

    code: str
    reason: str
    sentences: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "reason": self.reason, "sentences": list(self.sentences)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DraftProblem:
        return cls(str(data["code"]), str(data["reason"]), tuple(str(s) for s in data.get("sentences") or ()))


def check_draft(text: str | None) -> list[DraftProblem]:
    """The problems of a report `text` (the module's checks, in the order of `CODES`); [] when it may be signed as
    it is. Pure and fast (the rule-based extractor once), so a page may check every edit."""
    text = text or ""
    if not has_text(text):
        return []
    report = extract_facts(text)
    return [
        *_layout(text),
        *_repeated(report),
        *_stated_and_denied(report),
        *_side_conflicts(report),
        *_severity_conflicts(report),
    ]


# --- layout ------------------------------------------------------------------------------------------------------


def _layout(text: str) -> list[DraftProblem]:
    problems = []
    for name, body in sections(text):
        if not has_text(body):
            problems.append(DraftProblem(EMPTY_SECTION, f"The {name} section is empty."))
            continue
        items = numbered_items(body)
        if items is None:
            continue
        problems += [
            DraftProblem(EMPTY_ITEM, f"Item {number} of the {name} is empty.")
            for number, item in items
            if not has_text(item)
        ]
        numbers = [number for number, _ in items]
        if numbers != list(range(1, len(numbers) + 1)):
            problems.append(
                DraftProblem(
                    ITEM_NUMBERING,
                    f"The {name}'s items are numbered {', '.join(map(str, numbers))}, not 1 to {len(numbers)}.",
                )
            )
    return problems


def _repeated(report: ReportFacts) -> list[DraftProblem]:
    seen: dict[tuple[str, str], list[str]] = {}
    for sentence in report.sentences:
        key = (sentence.section, " ".join(re.sub(r"[^\w\s]", " ", sentence.text.lower()).split()))
        seen.setdefault(key, []).append(sentence.text)
    times = {2: "twice"}
    return [
        DraftProblem(
            REPEATED_SENTENCE,
            f"The sentence {_quoted(said[0])} is written "
            f"{times.get(len(said), f'{len(said)} times')} in the {section}.",
            (said[0],),
        )
        for (section, _), said in seen.items()
        if len(said) > 1
    ]


# --- consistency -------------------------------------------------------------------------------------------------


def _stated_and_denied(report: ReportFacts) -> list[DraftProblem]:
    problems, named = [], set()
    for stated in _stated(report.facts):
        if stated.observation in named:
            continue
        denial = next(
            (
                d
                for d in report.facts
                if d.polarity == NEGATIVE
                and d.observation == stated.observation
                and d.sentence_index != stated.sentence_index
                and _denies(report, d, stated)
            ),
            None,
        )
        if denial is not None:
            named.add(stated.observation)
            said, denied = _sentence(report, stated), _sentence(report, denial)
            problems.append(
                DraftProblem(
                    STATED_AND_DENIED,
                    f"{_name(stated, capital=True)} is stated in {_quoted(said)} and denied in {_quoted(denied)}.",
                    (said, denied),
                )
            )
    return problems


def _denies(report: ReportFacts, denial: Fact, stated: Fact) -> bool:
    """Whether `denial` denies the finding `stated` says, as far as the two sentences tell."""
    d, s = denial.attributes, stated.attributes
    if d.get("laterality") and s.get("laterality") not in (d["laterality"], _BILATERAL):
        return False  # "No right effusion." denies neither a left one nor one of no side
    for name in ("location", "device"):
        if d.get(name) and s.get(name) and d[name] != s[name]:
            return False
    narrowing = _NARROWING.search(report.text, *_qualifier_span(report, denial))
    if narrowing is not None:  # "No definite pneumothorax." denies only what is called definite
        word = narrowing.group(1).lower()
        return re.search(rf"(?<![\w-]){word}", _sentence(report, stated), re.IGNORECASE) is not None
    return True


def _qualifier_span(report: ReportFacts, fact: Fact) -> tuple[int, int]:
    """Where a word qualifying `fact` is written: just before its mention, and after it too for an organ read with
    its qualifier ("The heart is not significantly enlarged."), never past another finding of the sentence."""
    sentence = report.sentences[fact.sentence_index]
    others = [f for f in report.facts if f.sentence_index == fact.sentence_index and f is not fact]
    start = max([sentence.start, fact.start - 30] + [f.end for f in others if f.end <= fact.start])
    organ = fact.observation in V.SIZE_ANATOMY and re.fullmatch(
        V.SIZE_ANATOMY[fact.observation][0], fact.mention.lower()
    )
    end = min([sentence.end] + [f.start for f in others if f.start >= fact.end]) if organ else fact.start
    return start, end


def _side_conflicts(report: ReportFacts) -> list[DraftProblem]:
    findings = [f for f in _stated(report.facts) if _section(report, f) == "findings" and _side(f)]
    problems, named = [], set()
    for fact in _stated(report.facts):
        side = _side(fact)
        if _section(report, fact) != "impression" or side in (None, _BILATERAL) or _family(fact) in named:
            continue
        described = [f for f in findings if f.observation == fact.observation]
        described = described or [f for f in findings if _one_finding(f, fact)]
        if not described or any(_side(f) in (side, _BILATERAL) for f in described):
            continue
        named.add(_family(fact))
        there, here = _sentence(report, described[0]), _sentence(report, fact)
        same = described[0].observation == fact.observation
        reason = (
            f"The findings put {_name(described[0])} on the {_side(described[0])} ({_quoted(there)}) and the "
            f"impression puts {'it' if same else _name(fact)} on the {side} ({_quoted(here)})."
        )
        problems.append(DraftProblem(SIDE_CONFLICT, reason, (there, here)))
    return problems


def _one_finding(a: Fact, b: Fact) -> bool:
    """Whether two facts of different concepts may name one finding: one CheXpert finding (a nodule, a mass), or a
    pneumonia and the opacity it shows."""
    if _family(a) == _family(b):
        return True
    return {a.observation, b.observation} <= _OPACITY_FAMILY and "Pneumonia" in (a.observation, b.observation)


def _severity_conflicts(report: ReportFacts) -> list[DraftProblem]:
    graded = [f for f in _stated(report.facts) if f.attributes.get("severity") in V.SEVERITY_GRADES]
    problems, named = [], set()
    for i, a in enumerate(graded):
        for b in graded[i + 1 :]:
            key = (a.observation, _side(a) or _side(b))
            if (
                b.observation != a.observation
                or a.sentence_index == b.sentence_index
                or key in named
                or not _same_side(a, b, graded)
                or _grades_overlap(a, b)
            ):
                continue
            named.add(key)
            first, second = _sentence(report, a), _sentence(report, b)
            problems.append(
                DraftProblem(
                    SEVERITY_CONFLICT,
                    f"{_name(a, capital=True)} is called "
                    f"{a.attributes['severity']} in {_quoted(first)} and "
                    f"{b.attributes['severity']} in {_quoted(second)}.",
                    (first, second),
                )
            )
    return problems


def _same_side(a: Fact, b: Fact, graded: list[Fact]) -> bool:
    """Whether two facts of one finding speak of one side: the same side, or no side for either, or one without a
    side where every sentence giving that finding a side gives it the same one."""
    if _side(a) == _side(b):
        return True
    if _side(a) and _side(b):
        return False
    return len({_side(f) for f in graded if f.observation == a.observation and _side(f)}) == 1


def _grades_overlap(a: Fact, b: Fact) -> bool:
    low_a, high_a = V.SEVERITY_GRADES[a.attributes["severity"]]
    low_b, high_b = V.SEVERITY_GRADES[b.attributes["severity"]]
    return low_a <= high_b and low_b <= high_a


# --- reading facts -----------------------------------------------------------------------------------------------


def _stated(facts: Iterable[Fact]) -> list[Fact]:
    """The facts a report states or hedges (not denials), in text order."""
    return [f for f in facts if f.polarity != NEGATIVE]


def _side(fact: Fact) -> str | None:
    # a device's side is where it was put in, not a side of the disease
    return None if fact.observation == "Support Devices" else fact.attributes.get("laterality")


def _family(fact: Fact) -> str:
    """What a side is compared under: the CheXpert finding (a nodule and a mass are one lung lesion)."""
    return CONCEPT_TO_CHEXPERT.get(fact.observation) or fact.observation


def _section(report: ReportFacts, fact: Fact) -> str:
    return report.sentences[fact.sentence_index].section


def _sentence(report: ReportFacts, fact: Fact) -> str:
    return report.sentences[fact.sentence_index].text


def _sentence_start(report: ReportFacts, fact: Fact) -> int:
    return report.sentences[fact.sentence_index].start


def _name(fact: Fact, *, capital: bool = False) -> str:
    name = fact.observation.lower()
    return name[:1].upper() + name[1:] if capital else name


def _quoted(sentence: str) -> str:
    return f'"{sentence.strip().rstrip(".")}"'
