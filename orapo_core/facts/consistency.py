"""Self-consistency of a draft: how many sampled drafts agree with each of its facts.

A fact the model asserts greedily but not when sampling is one a clinician should
look at first. Agreement is judged per finding at concept level: a sample agrees
with a positive or uncertain fact when it asserts the finding too, and with a
negative fact when it does not assert it (silence agrees with a denial, as in
CheXpert's blank). Pure: texts in, numbers out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from orapo_core.facts.extract import NEGATIVE, Fact, ReportFacts, extract_facts, label_report
from orapo_core.facts.ontology import CONCEPT_TO_CHEXPERT
from orapo_core.report_layout import (
    EMPTIED_SECTION,
    has_sections,
    has_text,
    normalize_space,
    renumbered,
    report_text,
    split_report,
)


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


def keep_agreed(greedy_text: str, sample_texts: list[str], min_agreement: float) -> str:
    """`greedy_text` without the sentences asserting a finding that fewer than `min_agreement` of the samples assert.

    An operating point for the drafts' findings: a sentence whose positive or uncertain fact too few samples repeat
    is left out (a denial is kept whatever the samples say), so the draft says less and is right more often. The
    report keeps the reference layout (`report_layout.report_text`) and stays well formed: numbered items are
    numbered 1 to n again, a section that lost every sentence says where to look (`report_layout.EMPTIED_SECTION`,
    "See findings."), a report that lost every sentence is empty; with no samples, or `min_agreement` 0, the text
    is returned as it is.
    """
    return split_agreed(greedy_text, sample_texts, min_agreement)[0]


def split_agreed(greedy_text: str, sample_texts: list[str], min_agreement: float) -> tuple[str, list[str]]:
    """(`keep_agreed`'s text, the sentences it left out, in order)."""
    if not sample_texts or min_agreement <= 0 or not greedy_text:
        return greedy_text, []
    scored = self_consistency(greedy_text, sample_texts)
    drop = [
        s for s in scored.sentences if any(f.fact.polarity != NEGATIVE and f.agreement < min_agreement for f in s.facts)
    ]
    return _without(greedy_text, drop)


def split_unsupported(text: str, unsupported: set[str]) -> tuple[str, list[str]]:
    """(`text` without the sentences stating or hedging a finding of `unsupported` (CheXpert names), those
    sentences): the finding verifier's veto (`orapo_core.models.verifier`); denials are kept."""
    if not unsupported or not text:
        return text, []
    report = extract_facts(text)
    vetoed = {f.sentence_index for f in report.facts if f.polarity != NEGATIVE and _finding(f) in unsupported}
    return _without(text, [s for s in report.sentences if s.index in vetoed])


def stated_findings(text: str) -> set[str]:
    """The CheXpert findings `text` states or hedges (its FactS labels 1 or -1)."""
    return {name for name, value in label_report(text or "").items() if value in (1, -1) and name != "No Finding"}


def findings_section_end(text: str) -> str:
    """`text` up to the end of its findings (the whole text when it has no sections), then one space: where a
    sentence added to the findings begins (`add_findings`)."""
    findings = split_report(text)[0] if has_sections(text) else text.strip()
    if not findings:
        return ""
    return f"{report_text(findings, None) if has_sections(text) else findings} "


# CheXpert's hierarchy: these are kinds of lung opacity, so "The lungs are clear." denies them too.
OPACITY_KINDS = frozenset({"Lung Lesion", "Consolidation", "Pneumonia", "Atelectasis", "Edema"})
# A sentence calling the whole study normal ("No acute cardiopulmonary process.", "Normal chest radiograph."): FactS
# gives it no fact, and a reader takes it as denying every finding.
# ("No acute osseous abnormality." is about the bones, and stays.)
_NORMAL_STUDY = re.compile(
    r"^\W*(?:\d+\.\s*)?(?:no (?:radiographic )?(?:evidence of )?(?:acute|active) "
    r"(?:cardiopulmonary|intrathoracic|thoracic|chest|disease|process|findings?|abnormalit)|"
    r"normal (?:chest|study|radiograph|exam)|stable chest|"
    r"unremarkable (?:chest|study|radiograph|exam))",
    re.IGNORECASE,
)


def add_findings(text: str, additions: dict[str, str]) -> tuple[str, list[str], list[str]]:
    """(`text` with each sentence of `additions` (CheXpert name -> a sentence stating it) put at the end of its
    findings and of its impression, the sentences put in, the sentences taken out): the finding check's additions
    (`orapo_core.models.verifier`). Taken out is whatever a reader would see the additions contradict: a denial of
    an added finding, of the lung opacity an added opacity is a kind of, and a sentence calling the study normal.
    The impression states the additions too, since it is what a referring clinician reads (a report with a
    pneumothorax in its findings and "No acute process." as its impression contradicts itself); a report without an
    impression does not get one. A finding `text` already states is not added again."""
    additions = {name: sentence for name, sentence in additions.items() if name not in stated_findings(text)}
    if not additions or not text:
        return text, [], []
    denied = set(additions) | ({"Lung Opacity"} if OPACITY_KINDS & set(additions) else set())
    report = extract_facts(text)
    contradicted = {f.sentence_index for f in report.facts if f.polarity == NEGATIVE and _finding(f) in denied}
    with_facts = {f.sentence_index for f in report.facts}
    contradicted |= {s.index for s in report.sentences if s.index not in with_facts and _NORMAL_STUDY.match(s.text)}
    kept, dropped = _without(
        text, [s for s in report.sentences if s.index in contradicted], _denials_kept(report, contradicted, denied)
    )
    added = [sentence.strip() for sentence in additions.values()]
    if has_sections(text):
        # a section the removal left saying where to look says what was added instead
        findings, impression = (
            part if part != EMPTIED_SECTION[name] else ""
            for name, part in zip(("findings", "impression"), split_report(kept))
        )
        had_impression = bool(split_report(text)[1])
        impression = _appended(impression, added) if had_impression else impression
        return report_text(normalize_space(" ".join([findings, *added])), impression), added, dropped
    return normalize_space(" ".join([kept, *added])), added, dropped


def _denials_kept(report: ReportFacts, contradicted: set[int], denied: set[str]) -> dict[int, str]:
    """For each contradicted sentence that is a plain list of denials ("No pleural effusion or pneumothorax."), the
    same list without the denied findings ("No pleural effusion."), so the other denials stay in the report."""
    kept = {}
    for sentence in report.sentences:
        facts = [f for f in report.facts if f.sentence_index == sentence.index]
        if (
            sentence.index not in contradicted
            or not re.match(r"\s*no\s", sentence.text, re.IGNORECASE)
            or any(f.polarity != NEGATIVE for f in facts)
        ):
            continue
        others = list(dict.fromkeys(f.mention.lower() for f in facts if _finding(f) not in denied))
        if others:
            listed = ", ".join(others[:-1]) + " or " + others[-1] if len(others) > 1 else others[0]
            kept[sentence.index] = f"No {listed}."
    return kept


def _appended(impression: str, sentences: list[str]) -> str:
    """`impression` with `sentences` after it, numbered on where it is a numbered list ("1. ... 2. ...")."""
    numbers = [int(n) for n in re.findall(r"(?:^|(?<=\s))(\d+)\.\s", impression)]
    if numbers[:1] == [1]:
        sentences = [f"{numbers[-1] + i}. {sentence}" for i, sentence in enumerate(sentences, 1)]
    return normalize_space(" ".join([impression, *sentences]))


def _finding(fact: Fact) -> str | None:
    """The CheXpert finding a fact is about, as the ontology maps its concept (None: none of the 14)."""
    return CONCEPT_TO_CHEXPERT.get(fact.observation, fact.observation)


def _without(text: str, drop: list, instead: dict[int, str] | None = None) -> tuple[str, list[str]]:
    """`text` without the sentences `drop` (anything with start, end, text and index, in order), each replaced by
    `instead[index]` where given, laid out again; and the texts of the sentences dropped."""
    if not drop:
        return text, []
    kept, cursor = [], 0
    for s in drop:
        kept.append(text[cursor : s.start])
        kept.append((instead or {}).get(s.index, ""))
        cursor = s.end
    kept.append(text[cursor:])
    out = "".join(kept)
    if not has_sections(text):
        return renumbered(out), [s.text for s in drop]
    return _laid_out(split_report(text), split_report(out)), [s.text for s in drop]


def _laid_out(before: tuple[str, str], after: tuple[str, str]) -> str:
    """The reference layout of `after` (findings, impression), a report `before` was cut into: numbered items
    numbered 1 to n again with no empty one, and a section `before` had that lost every sentence kept, saying
    where to look (`EMPTIED_SECTION`) rather than vanishing; with nothing left in either, nothing."""
    sections = [renumbered(part) for part in after]
    if not any(has_text(part) for part in sections):
        return ""
    names = ("findings", "impression")
    sections = [
        part if has_text(part) or not has_text(was) else EMPTIED_SECTION[name]
        for name, was, part in zip(names, before, sections)
    ]
    return report_text(*sections)
