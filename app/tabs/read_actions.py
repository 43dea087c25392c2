"""The Read tab's report column, wired: draft, rescore, save, sign and confirm; reload, resume, the model's state.

The components are `app.tabs.read_report`'s; what a study opened fills is `load_study` in `app.tabs.read`,
passed in with the outputs it fills (the viewer's among them). Every handler re-checks the user, the tab's
state (`mine`) and, through the services, the user's right to the study.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import gradio as gr

from app.context import AppContext
from app.messages import in_page, status_line, title_of
from app.services.reading import autosave, drafting, reports, scope
from app.services.reading.draft_batcher import DRAFT_MAX_BATCH
from app.tabs import read_guard
from app.tabs.read_guard import current, edited, require_current
from app.tabs.read_report import (
    ReportColumn,
    _accept_allowed,
    _editing,
    _highlighted,
    _missed_md,
    _quoted,
    _study_info,
    confirm_heading,
    mine,
    model_note,
)
from orapo_core.errors import OrapoError


def wire(ctx: AppContext, col: ReportColumn, load_study: Callable, study_outputs: list) -> None:
    """Every event of the report column. `load_study(ctx, user, study_id)` fills `study_outputs`."""
    c = col
    closing = [c.pending, c.confirm_panel, c.actions]

    def _study(session, user) -> dict:
        session = mine(session, user)
        if not session.get("study_id"):
            raise OrapoError("no_study", "Upload or open a study first.")
        return session

    def drafter(force: bool):
        @in_page(status=c.status)
        def draft(session, text, request: gr.Request, progress=gr.Progress()):
            began = time.perf_counter()  # what the reader waits for: loading the model included
            user = ctx.user(request)
            session = _study(session, user)
            if not force and edited(text, session):
                return {c.draft_panel: gr.Column(visible=True)}  # ask before a draft replaces an edit
            record = drafting.draft_study(ctx.database, ctx.settings, ctx.registry, user, session["study_id"],
                                          progress=progress)
            if not current(ctx, request, session):
                # the page opened another study while this one was drafted: the draft stays with its study (it
                # shows when that study is opened again) and nothing on the page changes
                gr.Info(f"The draft of study {session['study_id']} is ready and stored with it; it shows when you "
                        f"open study {session['study_id']} again.", title="Draft stored")
                return tuple(gr.skip() for _ in drafted)
            if force:
                autosave.discard(ctx.database, user, session["study_id"])  # the reader chose the draft over the edit
            # with no report stored yet, the stored draft is what a reload brings back
            saved = session.get("saved_text") if session.get("report_version") else record.text
            session = {**session, "draft_id": record.id, "draft_text": record.text, "saved_text": saved}
            hl = reports.confidence_highlights(record)
            return (*_editing(), gr.Button(interactive=True), session, _highlighted(hl), _missed_md(hl),
                    gr.Dropdown(choices=reports.sentence_choices(record.text), value=None),
                    [], gr.Textbox(value=record.text, interactive=True),
                    f"Draft {record.id} by **{record.model_name}** in {time.perf_counter() - began:.1f} s"
                    + scope.draft_note(record),
                    _study_info(ctx, user, session), saved, gr.Column(visible=False))
        return draft

    drafted = [*closing, c.accept_btn, c.state, c.highlights, c.missed, c.sentence, c.facts, c.report, c.status,
               c.study_info, c.saved, c.draft_panel]
    # 8 drafts may wait at once: the registry's DraftBatcher, not Gradio, bounds the compute (one running batch,
    # one forward at a time), and a draft asked while others decode joins them
    c.draft_btn.click(drafter(False), inputs=[c.state, c.report], outputs=drafted, api_name="draft_report",
                      concurrency_limit=DRAFT_MAX_BATCH, concurrency_id="draft")
    c.replace_btn.click(drafter(True), inputs=[c.state, c.report], outputs=drafted, api_visibility="private",
                        concurrency_limit=DRAFT_MAX_BATCH, concurrency_id="draft")
    c.keep_btn.click(lambda: gr.Column(visible=False), outputs=c.draft_panel, api_visibility="private")

    @in_page()
    def rescore(text, session, request: gr.Request):
        session = mine(session, ctx.user(request))
        if not current(ctx, request, session):
            return gr.skip(), gr.skip()
        if not session.get("draft_text"):
            return [], ""
        hl = reports.rescore(ctx.database, session["draft_id"], text)
        return _highlighted(hl), _missed_md(hl)

    # .change, not .input: it also fires when a draft or a reopened report fills the box
    c.report.change(rescore, inputs=[c.report, c.state], outputs=[c.highlights, c.missed], api_name="rescore_report",
                    trigger_mode="always_last", show_progress="hidden")

    # the button follows the text; the server still refuses an accept whose text is not the draft
    @in_page()
    def accept_allowed(text, session, request: gr.Request):
        session = mine(session, ctx.user(request))
        return _accept_allowed(text, session) if current(ctx, request, session) else gr.skip()

    c.report.change(accept_allowed, inputs=[c.report, c.state], outputs=c.accept_btn, api_visibility="private",
                    trigger_mode="always_last", show_progress="hidden")

    @in_page()
    def keep_typing(text, session, request: gr.Request):
        """As the reader types: an edit never stored is kept on the server (app.services.reading.autosave), for
        this reader and study; back at the stored report or the draft, there is nothing to keep."""
        user = ctx.user(request)
        session = mine(session, user)
        if not session.get("study_id") or not current(ctx, request, session):
            return
        if edited(text, session):
            autosave.keep(ctx.database, user, session["study_id"], text, base_version=session.get("report_version") or 0)
        elif (text or "").strip():
            autosave.discard(ctx.database, user, session["study_id"], base_version=session.get("report_version") or 0)

    c.report.change(keep_typing, inputs=[c.report, c.state], outputs=None, api_visibility="private",
                    trigger_mode="always_last", show_progress="hidden")

    @in_page()
    def show_facts(index, text, session, request: gr.Request):
        session = mine(session, ctx.user(request))
        if not current(ctx, request, session):
            return gr.skip()
        if index is None or not session.get("draft_text"):
            return []
        edited = None if reports.same_text(text, session["draft_text"]) else text
        return reports.sentence_facts(session["draft_text"], int(index), edited)

    c.sentence.change(show_facts, inputs=[c.sentence, c.report, c.state], outputs=c.facts, api_name="sentence_facts")

    def pick_sentence(evt: gr.SelectData):
        # spans alternate sentence, separator: the n-th sentence is span 2n
        index = evt.index if isinstance(evt.index, int) else 0
        return gr.Dropdown(value=index // 2), gr.Accordion(open=True)

    c.highlights.select(pick_sentence, outputs=[c.sentence, c.facts_panel], api_visibility="private")

    def stored(record, ahead: reports.PendingReport, user, session) -> tuple:
        """After storing: the report shows the stored text, unlocked; the status says what was stored; the page
        now stands on the stored version."""
        what = "accepted unchanged" if record.accepted_unchanged else "corrected"
        signed = "signed" if record.signed_at else "saved, not signed"
        amended = ""
        if record.previous_id is not None:
            amended = f" (an amendment of {'signed ' if ahead.base_signed else ''}version {record.version - 1})"
        session = {**session, "report_version": record.version, "saved_text": record.text}
        autosave.discard(ctx.database, user, record.study_id)
        return (*_editing(), gr.Textbox(value=record.text, interactive=True),
                f"Report version {record.version}{amended} {what} and {signed} by {user.username}.",
                _study_info(ctx, user, session), session, record.text, gr.Button(visible=False))

    def stale(exc: OrapoError) -> dict:
        """Someone else stored a version since this page opened: nothing was stored, the text stays, reload is offered."""
        gr.Warning(exc.message, title=title_of(exc))
        return {c.pending: None, c.confirm_panel: gr.Column(visible=False), c.actions: gr.Row(visible=True),
                c.report: gr.Textbox(interactive=True), c.status: status_line(exc), c.reload_btn: gr.Button(visible=True)}

    def ask(kind: str):
        @in_page(status=c.status)
        def handler(text, session, request: gr.Request):
            user = ctx.user(request)
            session = _study(session, user)
            require_current(ctx, request, session)
            try:
                ahead = reports.prepare_report(ctx.database, user, session["study_id"], session.get("draft_id"), text,
                                               sign=kind != "save", accept=kind == "accept",
                                               base_version=session.get("report_version", 0))
                if not ahead.needs_confirmation:  # an unsigned save that amends no signed report
                    record = reports.store_report(ctx.database, user, ahead, text, settings=ctx.settings)
                    return (*stored(record, ahead, user, session), gr.skip(), gr.skip(), gr.skip())
            except OrapoError as exc:
                if exc.code != "stale_correction":
                    raise
                return stale(exc)
            # the report is locked while the confirmation shows the exact text to be stored
            return (ahead, gr.Column(visible=True), gr.Row(visible=False), gr.Textbox(interactive=False),
                    gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip(), confirm_heading(ctx, user, ahead), ahead.text,
                    gr.Button(value="Sign" if ahead.sign else "Save amendment"))
        return handler

    after_store = [*closing, c.report, c.status, c.study_info, c.state, c.saved, c.reload_btn]
    asking = [*after_store, c.question, c.confirm_text, c.confirm_btn]
    c.accept_btn.click(ask("accept"), inputs=[c.report, c.state], outputs=asking, api_name="accept_draft")
    c.save_btn.click(ask("save"), inputs=[c.report, c.state], outputs=asking, api_name="save_correction")
    c.sign_btn.click(ask("sign"), inputs=[c.report, c.state], outputs=asking, api_name="sign_report")

    @in_page(status=c.status)
    def confirm(ahead, text, session, request: gr.Request):
        user = ctx.user(request)
        session = mine(session, user)
        if ahead is None or ahead.study_id != session.get("study_id"):
            raise OrapoError("nothing_to_confirm",
                             "There is nothing waiting to be stored; save or sign the report again.")
        require_current(ctx, request, session)
        try:
            return stored(reports.store_report(ctx.database, user, ahead, text, settings=ctx.settings), ahead, user, session)
        except OrapoError as exc:
            if exc.code != "stale_correction":
                raise
            return stale(exc)

    c.confirm_btn.click(confirm, inputs=[c.pending, c.report, c.state], outputs=after_store, api_name="confirm_report")
    c.back_btn.click(lambda: (*_editing(), gr.Textbox(interactive=True)), outputs=[*closing, c.report],
                     api_visibility="private")

    status_at = study_outputs.index(c.status)

    @in_page(status=c.status)
    def reload(session, text, request: gr.Request):
        """The study's latest version, with the text that was refused quoted under it, to copy from."""
        user = ctx.user(request)
        session = _study(session, user)
        values = list(load_study(ctx, user, session["study_id"], request))
        if ((text or "").strip() and not reports.same_text(text, values[study_outputs.index(c.state)]["saved_text"])
                and _quoted(text) not in str(values[status_at])):
            values[status_at] += f"\n\n**Your text, not saved** (copy what you need from it):\n\n{_quoted(text)}"
        return tuple(values)

    c.reload_btn.click(reload, inputs=[c.state, c.report], outputs=study_outputs, api_name="reload_study")


def wire_page_load(ctx: AppContext, col: ReportColumn, demo: gr.Blocks, load_study: Callable,
                   study_outputs: list) -> None:
    """When the page loads: whether the served model is still loading, and the study the reader had open."""
    c = col

    def remembered(last, user) -> int | None:
        last = last if isinstance(last, dict) else {}
        if last.get("user") != user.username or not str(last.get("study") or "").isdigit():
            return None
        return int(last["study"])

    @in_page()
    def page_load(request: gr.Request):
        ctx.user(request, allow_password_change=True)
        return model_note(ctx.registry)

    demo.load(page_load, outputs=[c.model_note, c.model_timer], api_visibility="private")

    @in_page()
    def offer_resume(last, session, request: gr.Request):
        """The remembered study, offered while this page has none open. The browser state reads its value when
        it is first shown (the Read tab appears after sign-in), and says so with this change event."""
        user = ctx.user(request, allow_password_change=True)
        session = mine(session, user)  # another user's tab state is refused like in every handler that reads it
        study = None if user.must_change_password or session.get("study_id") else remembered(last, user)
        if study is not None:
            try:
                drafting.open_study(ctx.database, user, study)
            except OrapoError:
                study = None
        if study is None:
            return gr.Button(visible=False)
        return gr.Button(f"Continue where you left off: study {study}, as last saved", visible=True)

    c.last_study.change(offer_resume, inputs=[c.last_study, c.state], outputs=c.resume_btn, api_visibility="private")

    @in_page()
    def poll_model(request: gr.Request):
        ctx.user(request, allow_password_change=True)
        return model_note(ctx.registry)

    c.model_timer.tick(poll_model, outputs=[c.model_note, c.model_timer], api_visibility="private",
                       show_progress="hidden")

    @in_page(status=c.status)
    def resume(last, text, session, request: gr.Request):
        user = ctx.user(request)
        session = mine(session, user)
        study = remembered(last, user)
        if study is None:
            raise OrapoError("no_study", "There is no study to continue in this browser; open one from the worklist.")
        read_guard.keep_edit(ctx, user, session, text, tell=(session or {}).get("study_id") != study)
        return load_study(ctx, user, study, request)

    c.resume_btn.click(resume, inputs=[c.last_study, c.report, c.state], outputs=study_outputs,
                       api_name="resume_study")
