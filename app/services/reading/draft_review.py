"""Whether a draft may be signed as it is: the draft checks, for the Read tab and for the server's refusal.

The checks (`orapo_core.facts.draft_checks`) read the text alone: an empty numbered item or section, items
numbered out of order, a sentence written twice, a finding stated and denied, a side or severity given one way
in one sentence and another way in another. The page shows each problem's sentence above the report, for the
draft and again for the reader's edit (`draft_problems`), and offers *Accept draft unchanged* only while
`can_accept_unchanged` holds; the server refuses that acceptance itself (`refuse_unsignable_draft`, called where
the draft is checked for being unchanged), so a page opened before the checks, or a script, cannot sign a draft
they flag. An edited report is never refused for them: the reader signs what they wrote.
"""

from __future__ import annotations

from db.records import DraftRecord
from orapo_core.errors import OrapoError
from orapo_core.facts.draft_checks import CODES, DraftProblem, check_draft
from orapo_core.report_layout import same_text

__all__ = ["CODES", "DraftProblem", "can_accept_unchanged", "draft_problems", "refuse_unsignable_draft"]


def draft_problems(text: str | None) -> list[DraftProblem]:
    """What must change in a report `text` before it is signed (each a `code` and a `reason` for the reader, in a
    stable order); [] when nothing. Fast enough for every edit (the rule-based extractor once)."""
    return check_draft(text)


def can_accept_unchanged(draft_text: str | None, shown_text: str | None) -> bool:
    """Whether *Accept draft unchanged* may be offered: the report on screen still is the draft (whitespace aside)
    and the draft checks find nothing in it."""
    return bool((draft_text or "").strip()) and same_text(shown_text, draft_text) and not check_draft(draft_text)


def refuse_unsignable_draft(draft: DraftRecord) -> None:
    """Refuse to accept `draft` unchanged while the draft checks flag it (`draft_has_problems`, naming the first
    problem and how many there are); nothing is stored."""
    problems = check_draft(draft.text)
    if not problems:
        return
    more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
    first = problems[0].reason.rstrip(".")
    raise OrapoError(
        "draft_has_problems",
        f"Nothing was signed: the draft cannot be accepted unchanged while the checks above the report flag it "
        f"({first}{more}); correct it and sign it as written with Save and sign.",
    )
