"""Sections and sentences with character offsets into the original report.

Offsets, not copies, are what the highlighting UI needs: every span refers back
to the text the clinician sees. Headers are recognised only with a colon
("IMPRESSION:"), so a sentence that merely starts with "Findings" stays a sentence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from orapo_core.facts.vocabulary import SECTION_HEADERS


@dataclass(frozen=True)
class Sentence:
    index: int
    text: str
    start: int
    end: int
    section: str


_HEADER_RE = re.compile(
    r"(?:(?<=^)|(?<=[\n.]))[ \t]*(?P<name>"
    + "|".join(sorted((re.escape(h) for h in SECTION_HEADERS), key=len, reverse=True))
    + r")[ \t]*:",
    re.IGNORECASE,
)
# A sentence ends at . ? ! followed by space and not inside a number ("1.5 cm") or after "vs.",
# at a semicolon-free line break, or before a numbered item ("1. ... 2. ...").
_BOUNDARY_RE = re.compile(r"(?<!\d\.\d)(?<![\s(]vs\.)(?<=[.?!])\s+|\n\s*|\s+(?=\d{1,2}[.)]\s)")
# Matched at a sentence start with .match(text, pos), so no "^" (which would only match at 0).
_ENUMERATOR_RE = re.compile(r"(?:\d{1,2}[.)](?=\s)|[-*\u2022])\s*")
_LETTER_RE = re.compile(r"[^\W\d_]")


def split_sections(text: str) -> list[tuple[str, int, int]]:
    """(section, start, end) spans covering the text; text before any header is 'findings'."""
    spans: list[tuple[str, int, int]] = []
    current, start = "findings", 0
    for m in _HEADER_RE.finditer(text):
        if m.start() > start or spans:
            spans.append((current, start, m.start()))
        current, start = SECTION_HEADERS[m.group("name").lower()], m.end()
    spans.append((current, start, len(text)))
    return [s for s in spans if text[s[1] : s[2]].strip()]


def split_sentences(text: str) -> list[Sentence]:
    sentences: list[Sentence] = []
    for section, s_start, s_end in split_sections(text):
        chunk = text[s_start:s_end]
        last = 0
        for m in _BOUNDARY_RE.finditer(chunk):
            _add_sentence(sentences, text, s_start + last, s_start + m.start(), section)
            last = m.end()
        _add_sentence(sentences, text, s_start + last, s_end, section)
    return sentences


def _add_sentence(sentences: list[Sentence], text: str, a: int, b: int, section: str) -> None:
    piece = text[a:b]
    stripped = piece.lstrip()
    a += len(piece) - len(stripped)
    em = _ENUMERATOR_RE.match(text, a, b)
    if em:
        a = em.end()
    piece = text[a:b].rstrip()
    if _LETTER_RE.search(piece):
        sentences.append(Sentence(len(sentences), piece, a, a + len(piece), section))
