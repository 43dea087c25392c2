"""Self-consistency of a draft: how many sampled drafts agree with each of its facts.

A fact the model asserts greedily but not when sampling is one a clinician should
look at first. Agreement is judged per finding at concept level: a sample agrees
with a positive or uncertain fact when it asserts the finding too, and with a
negative fact when it does not assert it (silence agrees with a denial, as in
CheXpert's blank). Pure: texts in, numbers out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orapo_core.facts.extract import NEGATIVE, Fact, extract_facts


@dataclass(frozen=True)
class FactAgreement:
    fact: Fact
    agreement: float  # fraction of samples that agree with this fact
    flagged: bool


@dataclass(frozen=True)
class SentenceConfidence:
    index: int
    text: str
    start: int
    end: int
    confidence: float  # fraction of samples agreeing with every fact of the sentence; 1.0 without facts or samples
    facts: list[FactAgreement] = field(default_factory=list)


@dataclass(frozen=True)
class SelfConsistency:
    n_samples: int
    sentences: list[SentenceConfidence]
    flagged: list[FactAgreement]  # facts some samples disagree with, least agreed first


def _asserted_concepts(text: str) -> set[str]:
    return {f.observation for f in extract_facts(text).facts if f.polarity != NEGATIVE}


def _agrees(fact: Fact, asserted: set[str]) -> bool:
    return (fact.observation in asserted) != (fact.polarity == NEGATIVE)


def self_consistency(greedy_text: str, sample_texts: list[str], *, flag_below: float = 1.0) -> SelfConsistency:
    """Per-sentence confidence of `greedy_text`; facts with agreement under `flag_below` are flagged."""
    samples = [_asserted_concepts(t or "") for t in sample_texts]
    n = len(samples)
    report = extract_facts(greedy_text or "")
    by_sentence: dict[int, list[Fact]] = {}
    for fact in report.facts:
        by_sentence.setdefault(fact.sentence_index, []).append(fact)
    sentences, flagged = [], []
    for s in report.sentences:
        facts = by_sentence.get(s.index, [])
        agreements = []
        for fact in facts:
            agreement = sum(_agrees(fact, a) for a in samples) / n if n else 1.0
            item = FactAgreement(fact, agreement, agreement < flag_below)
            agreements.append(item)
            if item.flagged:
                flagged.append(item)
        confidence = sum(all(_agrees(f, a) for f in facts) for a in samples) / n if (n and facts) else 1.0
        sentences.append(SentenceConfidence(s.index, s.text, s.start, s.end, confidence, agreements))
    flagged.sort(key=lambda item: (item.agreement, item.fact.start))
    return SelfConsistency(n, sentences, flagged)
