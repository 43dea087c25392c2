"""The layout of a report, in one place: how the project writes one, reads one back, and compares two.

Reference reports (dataset records, the starter's answers, PhantomCXR replay in
rounds) are written "FINDINGS: ...\\n\\nIMPRESSION: ..."; a clinician's report is
read back into its two sections whatever the case of its headers; and two
reports are the same text when they differ only in whitespace (what a clinician
sees as "unchanged"). Standard library only, so the database layer and the
labeler import it for free.
"""

from __future__ import annotations

import re

_SECTION = re.compile(r"^\s*(findings|impression)\s*:", re.IGNORECASE | re.MULTILINE)


def report_text(findings: str | None, impression: str | None) -> str:
    """The reference layout: "FINDINGS: ...\\n\\nIMPRESSION: ...", an empty section left out."""
    findings, impression = (findings or "").strip(), (impression or "").strip()
    parts = [f"FINDINGS: {findings}"] if findings else []
    if impression:
        parts.append(f"IMPRESSION: {impression}")
    return "\n\n".join(parts)


def has_sections(text: str | None) -> bool:
    """Whether `text` is written with 'Findings:'/'Impression:' headers."""
    return bool(_SECTION.search(text or ""))


def split_report(text: str | None) -> tuple[str, str]:
    """(findings, impression) of a report written with 'Findings:'/'Impression:' headers; all findings if none.

    Whitespace inside each section is collapsed to single spaces; text before the first header counts as findings.
    """
    text = text or ""
    marks = list(_SECTION.finditer(text))
    if not marks:
        return normalize_space(text), ""
    sections = {"findings": "", "impression": ""}
    head = text[: marks[0].start()].strip()
    for mark, following in zip(marks, marks[1:] + [None]):
        body = text[mark.end() : following.start() if following else len(text)]
        key = mark.group(1).lower()
        sections[key] = normalize_space(f"{sections[key]} {body}")
    if head:
        sections["findings"] = normalize_space(f"{head} {sections['findings']}")
    return sections["findings"], sections["impression"]


def normalize_space(text: str | None) -> str:
    """The words of `text` separated by single spaces (None is '')."""
    return " ".join((text or "").split())


def same_text(a: str | None, b: str | None) -> bool:
    """Whether two reports say the same words in the same order, whitespace aside (None is '')."""
    return normalize_space(a) == normalize_space(b)


# A numbered item's marker: "1." or "1)" opening the text or after the end of a sentence (so "rib 4." and "1.5 cm"
# are no marker), followed by a space or the end.
_ITEM = re.compile(r"(?:^|(?<=[.!?;:])\s+)(\d{1,2})[.)](?=\s|$)")
_LETTER = re.compile(r"[^\W\d_]")

# What a section says when every sentence of it was left out of a draft (`orapo_core.facts.consistency`): it points
# to the other section instead of inventing a finding or putting back a sentence the operating point left out.
EMPTIED_SECTION = {"findings": "See impression.", "impression": "See findings."}


def sections(text: str | None) -> list[tuple[str, str]]:
    """(name, body) of every 'Findings:'/'Impression:' header of `text` in order, an empty body included (the name
    lower case, the body as written, stripped); [] when `text` has no header."""
    text = text or ""
    marks = list(_SECTION.finditer(text))
    return [
        (mark.group(1).lower(), text[mark.end() : following.start() if following else len(text)].strip())
        for mark, following in zip(marks, marks[1:] + [None])
    ]


def numbered_items(section: str | None) -> list[tuple[int, str]] | None:
    """(number, text) of each item of a numbered list ("1. Cardiomegaly. 2. Small left effusion."), an empty item's
    text ''; None when `section` does not open with an item marker."""
    section = (section or "").strip()
    marks = list(_ITEM.finditer(section))
    if not marks or marks[0].start() != 0:
        return None
    return [
        (int(mark.group(1)), section[mark.end() : following.start() if following else len(section)].strip())
        for mark, following in zip(marks, marks[1:] + [None])
    ]


def renumbered(section: str | None) -> str:
    """`section` with its numbered items numbered 1 to n again and its empty items left out ("1. A. 2. 3. C." reads
    "1. A. 2. C."); a section that is no numbered list comes back with its whitespace collapsed."""
    items = numbered_items(section)
    if items is None:
        return normalize_space(section)
    kept = [text for _, text in items if _LETTER.search(text)]
    return normalize_space(" ".join(f"{i}. {text}" for i, text in enumerate(kept, 1)))


def has_text(text: str | None) -> bool:
    """Whether `text` has a word in it (an item marker or punctuation alone is no text)."""
    return bool(_LETTER.search(text or ""))
