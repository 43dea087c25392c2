"""What one page has open in its Read tab: the study, its image and draft, and the report version it stands on.

One `PageSession` per page lives in a `gr.State` (Gradio deep-copies the initial value for each session and keeps
what a handler returns for it), so two radiologists never see each other's study. It is frozen: a handler makes a
new one with `dataclasses.replace` and returns it, so a handler that stops half-way (a refusal, a draft finished
for a study the page has left) leaves the page's session as it was. Gradio finds the state by a session hash the
browser chooses, so the session names the user it was made for (`owner`), and every handler that reads it refuses
anyone else's (`mine`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orapo_core.errors import OrapoError


@dataclass(frozen=True)
class PageSession:
    """The Read tab's state for one page; the defaults are a page that has opened nothing yet."""

    owner: str | None = None  # who the page opened its study for; None until it opened one (anyone's, then)
    study_id: int | None = None  # the study the page shows; results for another study change nothing on the page
    image_id: int | None = None
    draft_id: int | None = None  # the draft shown: what the facts are checked against, what "accept" signs
    draft_text: str | None = None
    report_version: int = (
        0  # the stored report version the page opened (0: none); saving sends it, so a newer one is refused
    )
    saved_text: str = ""  # the last text stored for the study (the draft before any report): what counts as unsaved


def mine(session: PageSession | None, user: Any) -> PageSession:
    """This page's session, if it was made for `user`; an empty one (made before anyone opened a study) is anyone's."""
    session = session or PageSession()
    if session.owner is not None and session.owner != user.username:
        raise OrapoError("not_your_session", "This page's session belongs to another user; reload the page.")
    return session
