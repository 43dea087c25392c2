"""Entailment of a report's facts against reference labels, and the FactS score.

Judging happens in the CheXpert label space (the reference a dataset carries),
falling back to a finer concept name when the reference has one (an "Emphysema"
column). Uncertain findings count as asserted, as the clinical-efficacy
convention does; a denial of a finding the reference never mentions is
entailed, because CheXpert's blank means "not mentioned", not "unknown".

When the reference is a report, not only labels, a fact that the labels entail
is also held against the reference's own facts of the same observation: its
side, severity and temporal change (a device: its type, side, tip position and
change) must agree with at least one of them, else it is contradicted with the
reason ("side: left in the draft, right in the report"). A "small left
effusion" is not the "large right effusion" a radiologist signed, though both
are a Pleural Effusion, nor is an endotracheal tube above the carina the one in
the right mainstem bronchus. Labels carry no attributes, so against
labels alone the judgement stays per observation. The precision and recall of
the score stay per observation either way (as in the paper); attribute
contradictions reach the score through the sentences the precision-aware
variant charges.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Protocol

from orapo_core.errors import OrapoError
from orapo_core.facts import vocabulary as V
from orapo_core.facts.devices import positions_agree
from orapo_core.facts.extract import NEGATIVE, Fact, ReportFacts, extract_facts, labels_from_facts
from orapo_core.facts.labels import normalize_labels, with_no_finding
from orapo_core.facts.ontology import CHEXPERT_14, project

ENTAILED, CONTRADICTED, UNSUPPORTED, NEUTRAL = "entailed", "contradicted", "unsupported", "neutral"


@dataclass(frozen=True)
class FactJudgement:
    fact: Fact
    label: str | None  # the reference label the fact was judged against
    reference: int | None  # that label's reference value
    verdict: str  # entailed | contradicted | unsupported
    reason: str | None = None  # why an attribute check contradicted it: "side: left in the draft, right in the report"


@dataclass(frozen=True)
class SentenceScore:
    index: int
    text: str
    start: int
    end: int
    section: str
    status: str  # entailed | contradicted | unsupported | neutral (no facts)
    score: float  # fraction of its facts entailed; 1.0 for a sentence with no facts
    facts: list[FactJudgement] = field(default_factory=list)


@dataclass(frozen=True)
class ReportScore:
    precision: float
    recall: float
    fbeta: float  # the plain F-beta over asserted and reference labels
    facts_score: float  # fbeta, or its precision-aware variant when asked for
    beta: float
    asserted: list[str]
    reference: list[str]
    missed: list[str]
    sentences: list[SentenceScore]


def _asserted(labels: dict[str, int | None]) -> set[str]:
    return {name for name in CHEXPERT_14 if labels.get(name) in (1, -1)}


def judge_fact(fact: Fact, reference: dict[str, int | None]) -> FactJudgement:
    name = project(fact.observation, "chexpert")
    if name not in reference and fact.observation in reference:
        name = fact.observation
    if name is None:
        return FactJudgement(fact, None, None, UNSUPPORTED)
    value = reference.get(name)
    if fact.polarity == NEGATIVE:
        verdict = CONTRADICTED if value == 1 else UNSUPPORTED if value == -1 else ENTAILED
    else:
        verdict = ENTAILED if value in (1, -1) else CONTRADICTED if value == 0 else UNSUPPORTED
    return FactJudgement(fact, name, value, verdict)


# The attributes a reference report is checked for, and how a reason names them.
ATTRIBUTE_NAMES = {
    "laterality": "side",
    "severity": "severity",
    "device": "device",
    "position": "position",
    "change": "change",
}


def _compared(fact: Fact) -> dict[str, str]:
    """The attributes of a fact that are checked: side, device, tip position and change for a device; side,
    severity and change otherwise."""
    if fact.observation == "Support Devices":
        names: tuple[str, ...] = ("device", "laterality", "position", "change")
    else:
        names = ("laterality", "severity", "change")
    return {n: fact.attributes[n] for n in names if (fact.attributes or {}).get(n)}


def _agree(name: str, drafted: str, reported: str, device: str | None = None) -> bool:
    if name == "severity":
        a, b = V.SEVERITY_GRADES.get(drafted), V.SEVERITY_GRADES.get(reported)
        if a is None or b is None:  # a value the vocabulary does not grade (an LLM extractor's own word)
            return True
        return max(a[0] - b[1], b[0] - a[1]) < V.SEVERITY_CONTRADICTION_GAP
    if name == "change":
        return frozenset((drafted.lower(), reported.lower())) not in V.CHANGE_CONFLICTS
    if name == "position":
        return positions_agree(device, drafted.lower(), reported.lower())
    return drafted.lower() == reported.lower()


class FactExtractor(Protocol):
    """What `score_report` accepts as its extractor (the LLM extractor; the rule-based one by default)."""

    def extract(self, text: str) -> ReportFacts: ...


def _reason(name: str, drafted: str, reported: str | Iterable[str]) -> str:
    values = sorted(set(reported)) if not isinstance(reported, str) else [reported]
    return f"{ATTRIBUTE_NAMES[name]}: {drafted} in the draft, {' and '.join(values)} in the report"


def attribute_conflicts(fact: Fact, reference: Fact) -> list[str]:
    """Reasons `fact` disagrees with one reference fact of its observation; [] when they may be one finding.

    An attribute only one of them states cannot disagree: "effusion" agrees with "small left effusion".
    """
    drafted, reported = _compared(fact), _compared(reference)
    device = drafted.get("device")
    return [
        _reason(n, v, reported[n])
        for n, v in drafted.items()
        if n in reported and not _agree(n, v, reported[n], device)
    ]


def _reference_facts(reference_facts: ReportFacts | None) -> dict[str, list[Fact]] | None:
    """The reference report's asserted facts by the label they are judged under."""
    if reference_facts is None:
        return None
    by_label: dict[str, list[Fact]] = {}
    for fact in reference_facts.facts:
        if fact.polarity != NEGATIVE:
            by_label.setdefault(project(fact.observation, "chexpert") or fact.observation, []).append(fact)
    return by_label


def check_attributes(judgement: FactJudgement, by_label: dict[str, list[Fact]]) -> FactJudgement:
    """An entailed assertion checked against the reference report's facts of the same observation.

    Two rules, so that a report's impression restating a finding without its side ("Cardiomegaly.")
    neither vouches for a wrong side nor hides one:
    1. each attribute the draft states must agree with one of the values the report states for that
       observation (devices: among the report's devices of the same type), when it states any;
    2. one reference fact must agree on every attribute both state, among those that state any of the
       draft's: "large left effusion" is neither of "small left effusion. Large right effusion."
    A reference that states none of the draft's attributes leaves the verdict as it is.
    """
    fact = judgement.fact
    drafted = _compared(fact)
    if judgement.verdict != ENTAILED or fact.polarity == NEGATIVE or not drafted:
        return judgement
    candidates = by_label.get(project(fact.observation, "chexpert") or fact.observation) or []
    if "device" in drafted:
        types = {r.attributes["device"] for r in candidates if (r.attributes or {}).get("device")}
        if types and drafted["device"] not in types:
            return replace(judgement, verdict=CONTRADICTED, reason=_reason("device", drafted["device"], types))
        candidates = [r for r in candidates if (r.attributes or {}).get("device") == drafted["device"]]
    reasons = []
    for name, value in drafted.items():
        stated = {v for r in candidates if (v := _compared(r).get(name)) is not None}
        if stated and not any(_agree(name, value, v, drafted.get("device")) for v in stated):
            reasons.append(_reason(name, value, stated))
    if not reasons:
        conflicts = [attribute_conflicts(fact, r) for r in candidates if set(_compared(r)) & set(drafted)]
        if not conflicts or not all(conflicts):
            return judgement
        reasons = min(conflicts, key=len)
    return replace(judgement, verdict=CONTRADICTED, reason="; ".join(reasons))


def fbeta(precision: float, recall: float, beta: float) -> float:
    b2 = beta * beta
    denominator = b2 * precision + recall
    return (1 + b2) * precision * recall / denominator if denominator > 0 else 0.0


def score_facts(
    report: ReportFacts,
    reference: dict[str, int | None],
    *,
    beta: float = 1.0,
    precision_aware: bool = False,
    penalty: float = 0.5,
    reference_facts: ReportFacts | None = None,
) -> ReportScore:
    """Score extracted facts against normalised reference labels (see `score_report`).

    With `reference_facts` (the reference report's extraction) entailed assertions are also checked
    for side, severity, change, device type and tip position against the reference's facts of the same observation.
    """
    if beta <= 0:
        raise OrapoError("bad_beta", f"beta must be positive (got {beta}); beta > 1 favours recall.")
    reference = with_no_finding(reference)
    predicted = labels_from_facts(report.facts, "chexpert")
    asserted, held = _asserted(predicted), _asserted(reference)
    hits = len(asserted & held)
    precision = hits / len(asserted) if asserted else (1.0 if not held else 0.0)
    recall = hits / len(held) if held else 1.0
    plain = fbeta(precision, recall, beta)

    by_label = _reference_facts(reference_facts)
    by_sentence: dict[int, list[FactJudgement]] = {}
    for fact in report.facts:
        judgement = judge_fact(fact, reference)
        if by_label is not None:
            judgement = check_attributes(judgement, by_label)
        by_sentence.setdefault(fact.sentence_index, []).append(judgement)
    sentences = []
    for s in report.sentences:
        judged = by_sentence.get(s.index, [])
        verdicts = {j.verdict for j in judged}
        status = next((v for v in (CONTRADICTED, UNSUPPORTED, ENTAILED) if v in verdicts), NEUTRAL)
        score = sum(j.verdict == ENTAILED for j in judged) / len(judged) if judged else 1.0
        sentences.append(SentenceScore(s.index, s.text, s.start, s.end, s.section, status, score, judged))

    final = plain
    if precision_aware:
        # Asserting every finding keeps recall at 1; charging each contradicted or
        # unsupported sentence takes that shortcut away while a clean report keeps its F-beta.
        judged_sentences = [s for s in sentences if s.status != NEUTRAL]
        if judged_sentences:
            bad = sum(s.status in (CONTRADICTED, UNSUPPORTED) for s in judged_sentences) / len(judged_sentences)
            final = plain * (1.0 - penalty * bad)
    missed = [n for n in CHEXPERT_14 if n != "No Finding" and n in held and n not in asserted]
    return ReportScore(
        precision,
        recall,
        plain,
        final,
        beta,
        sorted(asserted, key=CHEXPERT_14.index),
        sorted(held, key=CHEXPERT_14.index),
        missed,
        sentences,
    )


def score_report(
    text: str,
    *,
    labels: object = None,
    reference_text: str | None = None,
    beta: float = 1.0,
    precision_aware: bool = False,
    penalty: float = 0.5,
    extractor: FactExtractor | None = None,
    attribute_check: bool = True,
) -> ReportScore:
    """FactS of one report against reference labels or a reference report labelled the same way.

    Labels, when given, decide the observations; a reference report, when given, also decides
    side, severity, change, device type and tip position (`attribute_check`, on by default: see `score_facts`).
    `extractor` is anything with `extract(text) -> ReportFacts` (the LLM extractor);
    the rule-based extractor is used when it is None.
    """
    extract = extractor.extract if extractor is not None else extract_facts
    reference_facts = extract(reference_text) if reference_text is not None else None
    if labels is not None:
        reference = normalize_labels(labels)
    elif reference_facts is not None:
        reference = labels_from_facts(reference_facts.facts, "chexpert")
    else:
        raise OrapoError("no_reference", "score_report needs reference labels or a reference report.")
    return score_facts(
        extract(text),
        reference,
        beta=beta,
        precision_aware=precision_aware,
        penalty=penalty,
        reference_facts=reference_facts if attribute_check else None,
    )
