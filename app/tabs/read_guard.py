"""Which study a page has open, and what happens to results and edits that belong to another.

A handler's inputs are read when its event starts; a draft takes a second or two,
and meanwhile the reader may upload or open another study. So every result is
bound to the study it was computed for (the page's `PageSession` at the start), and the
server keeps which study each page has open (`SessionBook.note_open`, by the
page's Gradio session hash, noted whenever a study is opened in the Read tab):

- a result for a study the page no longer has open changes nothing on the page;
  what it stored (a draft) stays with its own study and shows when that study is
  opened again (`current`);
- a save or a sign whose study is not the one the page has open is refused, and
  nothing is stored (`require_current`);
- before the page opens another study, an unsaved edit of the report is kept for
  that reader and study (`keep_edit`, `app.services.reading.autosave`) and offered back
  when the study is opened again.

Uploads are the session's own too (`ingest_own_uploads`): the handler reads only
cache files that this session uploaded (the session middleware notes what
Gradio's upload route gave each session), and deletes a file only once no other
session that uploaded the same bytes (Gradio names cache files by content)
still waits to read it.
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr  # noqa: TID253 -- this module is heavy; light ones import it lazily

from app.context import AppContext
from app.services.reading import autosave, drafting, reports
from app.services.reading.ingest import IngestOutcome
from app.tabs.session import PageSession
from orapo_core.errors import OrapoError


def _hash(request) -> str | None:
    return getattr(request, "session_hash", None) or None


def note_open(ctx: AppContext, request, study_id: int) -> None:
    """The page that sent `request` now has `study_id` open in its Read tab."""
    book, session_hash = ctx.sessions, _hash(request)
    if book is not None and session_hash:
        book.note_open(session_hash, study_id)


def page_study(ctx: AppContext, request) -> int | None:
    """The study the page that sent `request` has open (None: it opened none through this server)."""
    book = ctx.sessions
    return book.open_study(_hash(request)) if book is not None else None


def current(ctx: AppContext, request, session: PageSession) -> bool:
    """Whether the study of `session` (the page's session when the event started) is still the page's open study."""
    open_now = page_study(ctx, request)
    return open_now is None or open_now == session.study_id


def require_current(ctx: AppContext, request, session: PageSession) -> None:
    """Refuse to store anything for a study the page no longer shows."""
    open_now = page_study(ctx, request)
    if open_now is not None and open_now != session.study_id:
        raise OrapoError(
            "study_not_open",
            f"This page now shows study {open_now}, not study {session.study_id}; nothing was "
            "stored. Check the image and the report on screen, then save or sign again.",
        )


def edited(text: str | None, session: PageSession) -> bool:
    """The report box holds text that is neither the stored report nor the draft: leaving it would lose it."""
    if not (text or "").strip():
        return False
    return not any(reports.same_text(text, known) for known in (session.saved_text, session.draft_text) if known)


def keep_edit(ctx: AppContext, user, session: PageSession | None, text: str | None, *, tell: bool = True) -> bool:
    """Before the page leaves the study of `session`: keep an unsaved edit of its report for this reader (True if
    one was kept), and say where it went."""
    session = session or PageSession()
    study = session.study_id
    if not study or session.owner not in (None, user.username) or not edited(text, session):
        return False
    autosave.keep(ctx.database, user, study, text or "", base_version=session.report_version)
    if tell:
        gr.Info(
            f"Your unsaved edit of study {study} is kept; it comes back when you open study {study} again.",
            title="Edit kept",
        )
    return True


def ingest_own_uploads(ctx: AppContext, user, request, paths: list) -> list:
    """Ingest the files of an upload event that this session uploaded; any other path is refused unread."""
    book = ctx.sessions
    if book is None:
        return drafting.ingest_uploads(ctx.database, ctx.settings, user, paths)
    token = book.token_in(getattr(request, "cookies", None) or {})
    own = [p for p in paths if book.uploaded_by(token, p)]
    outcomes = iter(
        drafting.ingest_uploads(
            ctx.database, ctx.settings, user, own, release=lambda path: book.release_upload(token, path)
        )
    )
    return [
        next(outcomes)
        if p in own
        else IngestOutcome(
            file=Path(str(p)).name,
            ok=False,
            error="not_your_upload",
            message="This file was not uploaded from this page; upload it again.",
        )
        for p in paths
    ]
