"""A draft judged against the report a reader made of it: what the reader removed is shown as removed.

`score_report(draft, reference_text=edited)` judges each draft sentence by the labels and attributes of
the edited report, and CheXpert's reading of a blank makes a denial the edited report no longer states
"entailed": a reader who deleted "No pneumothorax." would see it ticked as agreed. `score_edit` first
pairs the draft's sentences with the edited report's: a sentence kept word for word, or rewritten (it
shares a finding with, reads mostly like, or is contained in a sentence the reader wrote), is judged as
before; a sentence with no such counterpart was deleted, and it and its facts are REMOVED. A fact of a
rewritten sentence whose finding the edited report no longer names at all was cut out of it by the
reader, and is REMOVED too ("No pneumothorax or effusion." edited to "No effusion.").
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace
from difflib import SequenceMatcher

from orapo_core.facts.extract import ReportFacts, extract_facts, labels_from_facts
from orapo_core.facts.score import (
    CONTRADICTED,
    ENTAILED,
    NEUTRAL,
    UNSUPPORTED,
    FactExtractor,
    FactJudgement,
    ReportScore,
    SentenceScore,
    score_facts,
)

REMOVED = "removed"

# A rewrite reads mostly like the sentence it replaces, or keeps most of its words (two sentences merged).
SIMILAR_RATIO = 0.6
CONTAINED_SHARE = 0.8
_WORD = re.compile(r"[^\W_]+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _rewrite_of(words: list[str], concepts: set[str], other_words: list[str], other_concepts: set[str]) -> bool:
    if concepts & other_concepts:
        return True
    if not words:
        return False
    if SequenceMatcher(None, words, other_words, autojunk=False).ratio() >= SIMILAR_RATIO:
        return True
    return sum(w in set(other_words) for w in words) / len(words) >= CONTAINED_SHARE


def removed_sentences(draft: ReportFacts, edited: ReportFacts) -> set[int]:
    """Indices of the draft's sentences the reader deleted: neither kept word for word nor rewritten."""
    edited_words = [_words(s.text) for s in edited.sentences]
    taken = [False] * len(edited.sentences)
    draft_words = [_words(s.text) for s in draft.sentences]
    unmatched = []
    for i, words in enumerate(draft_words):
        # Word for word first, each edited sentence used once: a finding written twice and deleted once is caught.
        j = next((j for j, other in enumerate(edited_words) if not taken[j] and other == words), None)
        if j is None:
            unmatched.append(i)
        else:
            taken[j] = True
    concepts = _concepts_by_sentence(draft)
    edited_concepts = _concepts_by_sentence(edited)
    free = [j for j in range(len(edited.sentences)) if not taken[j]]
    return {
        i
        for i in unmatched
        if not any(
            _rewrite_of(draft_words[i], concepts.get(i, set()), edited_words[j], edited_concepts.get(j, set()))
            for j in free
        )
    }


def _concepts_by_sentence(report: ReportFacts) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for fact in report.facts:
        out.setdefault(fact.sentence_index, set()).add(fact.observation)
    return out


def _status(judged: Iterable[FactJudgement]) -> tuple[str, float]:
    judged = list(judged)
    if not judged:
        return NEUTRAL, 1.0
    verdicts = {j.verdict for j in judged}
    status = next((v for v in (CONTRADICTED, UNSUPPORTED, ENTAILED, REMOVED) if v in verdicts), NEUTRAL)
    return status, sum(j.verdict == ENTAILED for j in judged) / len(judged)


def score_edit(draft_text: str, edited_text: str, *, extractor: FactExtractor | None = None) -> ReportScore:
    """The draft judged against the reader's edited report, as `score_report` with `reference_text`, except that
    deleted sentences, and findings cut out of a rewritten sentence, are REMOVED (see the module's docstring)."""
    extract = extractor.extract if extractor is not None else extract_facts
    draft, edited = extract(draft_text or ""), extract(edited_text or "")
    score = score_facts(draft, labels_from_facts(edited.facts, "chexpert"), reference_facts=edited)
    removed = removed_sentences(draft, edited)
    sentences: list[SentenceScore] = []
    for s in score.sentences:
        facts = [
            replace(j, verdict=REMOVED, reason=None)
            if s.index in removed or (j.label is not None and j.reference is None)
            else j
            for j in s.facts
        ]
        status, value = (REMOVED, 0.0) if s.index in removed else _status(facts)
        sentences.append(replace(s, status=status, score=value, facts=facts))
    return replace(score, sentences=sentences)
