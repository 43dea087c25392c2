"""Entailment of a report's facts against reference labels, and the FactS score.

Judging happens in the CheXpert label space (the reference a dataset carries),
falling back to a finer concept name when the reference has one (an "Emphysema"
column). Uncertain findings count as asserted, as the clinical-efficacy
convention does; a denial of a finding the reference never mentions is
entailed, because CheXpert's blank means "not mentioned", not "unknown".
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
) -> ReportScore:
    """Score extracted facts against normalised reference labels (see `score_report`)."""
    if beta <= 0:
        from orapo_core.errors import OrapoError

        raise OrapoError("bad_beta", f"beta must be positive (got {beta}); beta > 1 favours recall.")
    reference = with_no_finding(reference)
    predicted = labels_from_facts(report.facts, "chexpert")
    asserted, held = _asserted(predicted), _asserted(reference)
    hits = len(asserted & held)
    precision = hits / len(asserted) if asserted else (1.0 if not held else 0.0)
    recall = hits / len(held) if held else 1.0
    plain = fbeta(precision, recall, beta)

    by_sentence: dict[int, list[FactJudgement]] = {}
    for fact in report.facts:
        by_sentence.setdefault(fact.sentence_index, []).append(judge_fact(fact, reference))
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
    return ReportScore(precision, recall, plain, final, beta, sorted(asserted, key=CHEXPERT_14.index), sorted(held, key=CHEXPERT_14.index), missed, sentences)


def score_report(
    text: str,
    *,
    labels=None,
    reference_text: str | None = None,
    beta: float = 1.0,
    precision_aware: bool = False,
    penalty: float = 0.5,
    extractor=None,
) -> ReportScore:
    """FactS of one report against reference labels or a reference report labelled the same way.

    `extractor` is anything with `extract(text) -> ReportFacts` (the LLM extractor);
    the rule-based extractor is used when it is None.
    """
    if labels is None and reference_text is None:
        from orapo_core.errors import OrapoError

        raise OrapoError("no_reference", "score_report needs reference labels or a reference report.")
    extract = extractor.extract if extractor is not None else extract_facts
    reference = normalize_labels(labels) if labels is not None else labels_from_facts(extract(reference_text).facts, "chexpert")
    return score_facts(extract(text), reference, beta=beta, precision_aware=precision_aware, penalty=penalty)
