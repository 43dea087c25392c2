"""The Read tab's report column, wired: draft, rescore, save, sign and confirm, reload.

The components are `app.tabs.read_report`'s; what a study opened fills is `ReadUI.load_study` in `app.tabs.read`,
passed in with the outputs it fills (the viewer's among them). Every handler re-checks the user, the page's
session (`mine`) and, through the services, the user's right to the study; every handler of an event with several
outputs returns them keyed by component (`app.tabs.outputs`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import gradio as gr  # noqa: TID253 -- this module is heavy; light ones import it lazily

from app.context import AppContext
from app.messages import in_page, status_line, title_of
from app.services.reading import autosave, drafting, highlights, reports, scope
from app.services.reading.draft_batcher import DRAFT_MAX_BATCH
from app.tabs.outputs import Outputs
from app.tabs.read_guard import current, edited, require_current
from app.tabs.read_model import card_outputs, draft_status
from app.tabs.read_report import (
    ReportColumn,
    _accept_allowed,
    _editing,
    _highlighted,
    _legend_md,
    _missed_md,
    _quoted,
    _study_info,
    confirm_heading,
    problems_md,
)
from app.tabs.session import PageSession, mine
from orapo_core.errors import OrapoError


def wire(ctx: AppContext, col: ReportColumn, load_study: Callable[..., Outputs], study_outputs: list) -> None:
    """Every event of the report column. `load_study(user, study_id, request)` fills `study_outputs`."""
    c = col
    closing = [c.pending, c.confirm_panel, c.actions]

    def _study(session: PageSession | None, user) -> PageSession:
        session = mine(session, user)
        if not session.study_id:
            raise OrapoError("no_study", "Upload or open a study first.")
        return session

    def drafter(force: bool):
        @in_page(status=c.status)
        def draft(session, text, request: gr.Request, progress=gr.Progress()) -> Outputs:
            began = time.perf_counter()  # what the reader waits for: loading the model included
            user = ctx.user(request)
            session = _study(session, user)
            if not force and edited(text, session):
                return {c.draft_panel: gr.Column(visible=True)}  # ask before a draft replaces an edit
            previous = drafting.open_study(ctx.database, user, session.study_id).latest_draft
            record = drafting.draft_study(
                ctx.database, ctx.settings, ctx.registry, user, session.study_id, progress=progress
            )
            if not current(ctx, request, session):
                # the page opened another study while this one was drafted: the draft stays with its study (it
                # shows when that study is opened again) and nothing on the page changes
                gr.Info(
                    f"The draft of study {session.study_id} is ready and stored with it; it shows when you "
                    f"open study {session.study_id} again.",
                    title="Draft stored",
                )
                return gr.skip()
            if force:
                autosave.discard(ctx.database, user, session.study_id)  # the reader chose the draft over the edit
            # with no report stored yet, the stored draft is what a reload brings back
            saved = session.saved_text if session.report_version else record.text
            session = replace(session, draft_id=record.id, draft_text=record.text, saved_text=saved)
            hl = highlights.confidence_highlights(record)
            return {
                **_editing(c),
                c.accept_btn: _accept_allowed(record.text, session),
                c.problems: problems_md(record.text),
                c.state: session,
                c.highlights: _highlighted(hl),
                c.legend: _legend_md(hl),
                c.missed: _missed_md(hl),
                c.sentence: gr.Dropdown(choices=highlights.sentence_choices(record.text), value=None),
                c.facts: [],
                c.report: gr.Textbox(value=record.text, interactive=True),
                c.status: draft_status(record, previous, time.perf_counter() - began) + scope.draft_note(record),
                **card_outputs(c.card_panel, c.card, ctx, record),
                c.study_info: _study_info(ctx, user, session),
                c.saved: saved,
                c.draft_panel: gr.Column(visible=False),
            }

        return draft

    drafted = [
        *closing,
        c.accept_btn,
        c.problems,
        c.state,
        c.highlights,
        c.legend,
        c.missed,
        c.sentence,
        c.facts,
        c.report,
        c.status,
        c.study_info,
        c.saved,
        c.draft_panel,
        c.card_panel,
        c.card,
    ]
    # 8 drafts may wait at once: the registry's DraftBatcher, not Gradio, bounds the compute (one running batch,
    # one forward at a time), and a draft asked while others decode joins them
    c.draft_btn.click(
        drafter(False),
        inputs=[c.state, c.report],
        outputs=drafted,
        api_name="draft_report",
        concurrency_limit=DRAFT_MAX_BATCH,
        concurrency_id="draft",
    )
    c.replace_btn.click(
        drafter(True),
        inputs=[c.state, c.report],
        outputs=drafted,
        api_visibility="private",
        concurrency_limit=DRAFT_MAX_BATCH,
        concurrency_id="draft",
    )
    c.keep_btn.click(lambda: gr.Column(visible=False), outputs=c.draft_panel, api_visibility="private")

    @in_page()
    def rescore(text, session, request: gr.Request) -> Outputs:
        session = mine(session, ctx.user(request))
        if not current(ctx, request, session):
            return gr.skip()
        if not session.draft_text:
            return {c.highlights: [], c.legend: "", c.missed: ""}
        hl = highlights.rescore(ctx.database, session.draft_id, text)
        return {c.highlights: _highlighted(hl), c.legend: _legend_md(hl), c.missed: _missed_md(hl)}

    # .change, not .input: it also fires when a draft or a reopened report fills the box
    c.report.change(
        rescore,
        inputs=[c.report, c.state],
        outputs=[c.highlights, c.legend, c.missed],
        api_name="rescore_report",
        trigger_mode="always_last",
        show_progress="hidden",
    )

    # the button and the checks follow the text; the server still refuses an accept whose text is not the draft,
    # or a draft the checks flag
    @in_page()
    def accept_allowed(text, session, request: gr.Request) -> Outputs:
        session = mine(session, ctx.user(request))
        if not current(ctx, request, session):
            return gr.skip()
        return {c.accept_btn: _accept_allowed(text, session), c.problems: problems_md(text) if session.draft_id else ""}

    c.report.change(
        accept_allowed,
        inputs=[c.report, c.state],
        outputs=[c.accept_btn, c.problems],
        api_visibility="private",
        trigger_mode="always_last",
        show_progress="hidden",
    )

    @in_page()
    def keep_typing(text, session, request: gr.Request):
        """As the reader types: an edit never stored is kept on the server (app.services.reading.autosave), for
        this reader and study; back at the stored report or the draft, there is nothing to keep."""
        user = ctx.user(request)
        session = mine(session, user)
        if not session.study_id or not current(ctx, request, session):
            return
        if edited(text, session):
            autosave.keep(ctx.database, user, session.study_id, text, base_version=session.report_version)
        elif (text or "").strip():
            autosave.discard(ctx.database, user, session.study_id, base_version=session.report_version)

    c.report.change(
        keep_typing,
        inputs=[c.report, c.state],
        outputs=None,
        api_visibility="private",
        trigger_mode="always_last",
        show_progress="hidden",
    )

    @in_page()
    def show_facts(index, text, session, request: gr.Request):
        session = mine(session, ctx.user(request))
        if not current(ctx, request, session):
            return gr.skip()
        if index is None or not session.draft_text:
            return []
        edited = None if reports.same_text(text, session.draft_text) else text
        return highlights.sentence_facts(session.draft_text, int(index), edited)

    c.sentence.change(show_facts, inputs=[c.sentence, c.report, c.state], outputs=c.facts, api_name="sentence_facts")

    def pick_sentence(evt: gr.SelectData) -> Outputs:
        # spans alternate sentence, separator: the n-th sentence is span 2n
        index = evt.index if isinstance(evt.index, int) else 0
        return {c.sentence: gr.Dropdown(value=index // 2), c.facts_panel: gr.Accordion(open=True)}

    c.highlights.select(pick_sentence, outputs=[c.sentence, c.facts_panel], api_visibility="private")

    def stored(record, ahead: reports.PendingReport, user, session: PageSession) -> Outputs:
        """After storing: the report shows the stored text, unlocked; the status says what was stored; the page
        now stands on the stored version."""
        what = "accepted unchanged" if record.accepted_unchanged else "corrected"
        signed = "signed" if record.signed_at else "saved, not signed"
        amended = ""
        if record.previous_id is not None:
            amended = f" (an amendment of {'signed ' if ahead.base_signed else ''}version {record.version - 1})"
        session = replace(session, report_version=record.version, saved_text=record.text)
        autosave.discard(ctx.database, user, record.study_id)
        return {
            **_editing(c),
            c.report: gr.Textbox(value=record.text, interactive=True),
            c.status: f"Report version {record.version}{amended} {what} and {signed} by {user.username}.",
            c.study_info: _study_info(ctx, user, session),
            c.state: session,
            c.saved: record.text,
            c.reload_btn: gr.Button(visible=False),
        }

    def stale(exc: OrapoError) -> Outputs:
        """Someone else stored a version since this page opened: nothing was stored, the text stays, reload is offered."""
        gr.Warning(exc.message, title=title_of(exc))
        return {
            c.pending: None,
            c.confirm_panel: gr.Column(visible=False),
            c.actions: gr.Row(visible=True),
            c.report: gr.Textbox(interactive=True),
            c.status: status_line(exc),
            c.reload_btn: gr.Button(visible=True),
        }

    def ask(kind: str):
        @in_page(status=c.status)
        def handler(text, session, request: gr.Request) -> Outputs:
            user = ctx.user(request)
            session = _study(session, user)
            require_current(ctx, request, session)
            try:
                ahead = reports.prepare_report(
                    ctx.database,
                    user,
                    session.study_id,
                    session.draft_id,
                    text,
                    sign=kind != "save",
                    accept=kind == "accept",
                    base_version=session.report_version,
                )
                if not ahead.needs_confirmation:  # an unsigned save that amends no signed report
                    record = reports.store_report(ctx.database, user, ahead, text, settings=ctx.settings)
                    return stored(record, ahead, user, session)
            except OrapoError as exc:
                if exc.code != "stale_correction":
                    raise
                return stale(exc)
            # the report is locked while the confirmation shows the exact text to be stored
            return {
                c.pending: ahead,
                c.confirm_panel: gr.Column(visible=True),
                c.actions: gr.Row(visible=False),
                c.report: gr.Textbox(interactive=False),
                c.question: confirm_heading(ctx, user, ahead),
                c.confirm_text: ahead.text,
                c.confirm_btn: gr.Button(value="Sign" if ahead.sign else "Save amendment"),
            }

        return handler

    after_store = [*closing, c.report, c.status, c.study_info, c.state, c.saved, c.reload_btn]
    asking = [*after_store, c.question, c.confirm_text, c.confirm_btn]
    c.accept_btn.click(ask("accept"), inputs=[c.report, c.state], outputs=asking, api_name="accept_draft")
    c.save_btn.click(ask("save"), inputs=[c.report, c.state], outputs=asking, api_name="save_correction")
    c.sign_btn.click(ask("sign"), inputs=[c.report, c.state], outputs=asking, api_name="sign_report")

    @in_page(status=c.status)
    def confirm(ahead, text, session, request: gr.Request) -> Outputs:
        user = ctx.user(request)
        session = mine(session, user)
        if ahead is None or ahead.study_id != session.study_id:
            raise OrapoError(
                "nothing_to_confirm", "There is nothing waiting to be stored; save or sign the report again."
            )
        require_current(ctx, request, session)
        try:
            return stored(
                reports.store_report(ctx.database, user, ahead, text, settings=ctx.settings), ahead, user, session
            )
        except OrapoError as exc:
            if exc.code != "stale_correction":
                raise
            return stale(exc)

    c.confirm_btn.click(confirm, inputs=[c.pending, c.report, c.state], outputs=after_store, api_name="confirm_report")

    def go_back() -> Outputs:
        return {**_editing(c), c.report: gr.Textbox(interactive=True)}

    c.back_btn.click(go_back, outputs=[*closing, c.report], api_visibility="private")

    @in_page(status=c.status)
    def reload(session, text, request: gr.Request) -> Outputs:
        """The study's latest version, with the text that was refused quoted under it, to copy from."""
        user = ctx.user(request)
        session = _study(session, user)
        values = load_study(user, session.study_id, request)
        status = str(values[c.status])
        if (
            (text or "").strip()
            and not reports.same_text(text, values[c.state].saved_text)
            and _quoted(text) not in status
        ):
            status += f"\n\n**Your text, not saved** (copy what you need from it):\n\n{_quoted(text)}"
        return {**values, c.status: status}

    c.reload_btn.click(reload, inputs=[c.state, c.report], outputs=study_outputs, api_name="reload_study")
