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
    r"(?:(?<=^)|(?<=[\n.]))[ \t]*(?P<name>" + "|".join(sorted((re.escape(h) for h in SECTION_HEADERS), key=len, reverse=True)) + r")[ \t]*:",
    re.IGNORECASE,
)
# A sentence ends at . ? ! followed by space and not inside a number ("1.5 cm"),
# at a semicolon-free line break, or before a numbered item ("1. ... 2. ...").
_BOUNDARY_RE = re.compile(r"(?<!\d\.\d)(?<=[.?!])\s+|\n\s*|\s+(?=\d{1,2}[.)]\s)")
_ENUMERATOR_RE = re.compile(r"^(?:\d{1,2}[.)]|[-*\u2022])\s*")


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
        pos = s_start
        chunk = text[s_start:s_end]
        pieces = []
        last = 0
        for m in _BOUNDARY_RE.finditer(chunk):
            pieces.append((last, m.start()))
            last = m.end()
        pieces.append((last, len(chunk)))
        for a, b in pieces:
            a += pos
            b += pos
            while a < b and text[a].isspace():
                a += 1
            em = _ENUMERATOR_RE.match(text, a, b)
            if em:
                a = em.end()
            while b > a and text[b - 1].isspace():
                b -= 1
            if b > a and any(ch.isalpha() for ch in text[a:b]):
                sentences.append(Sentence(len(sentences), text[a:b], a, b, section))
    return sentences
