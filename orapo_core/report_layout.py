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
        body = text[mark.end(): following.start() if following else len(text)]
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
