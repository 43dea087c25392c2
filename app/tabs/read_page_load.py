"""The Read tab when the page loads: the served model's state while it loads, and the study the reader had open.

The study a reader has open is remembered in the browser (`ReportColumn.last_study`, a `gr.BrowserState` holding
the reader's name and the study's id), so after a reload or a new tab the column offers to continue with it.
"""

from __future__ import annotations

from collections.abc import Callable

import gradio as gr  # noqa: TID253 -- this module is heavy; light ones import it lazily

from app.context import AppContext
from app.messages import in_page
from app.services.reading import drafting
from app.tabs import read_guard
from app.tabs.outputs import Outputs
from app.tabs.read_model import card_outputs
from app.tabs.read_report import ReportColumn, model_note
from app.tabs.session import mine
from orapo_core.errors import OrapoError


def wire(
    ctx: AppContext, col: ReportColumn, demo: gr.Blocks, load_study: Callable[..., Outputs], study_outputs: list
) -> None:
    """When the page loads: whether the served model is still loading, and the study the reader had open."""
    c = col

    def remembered(last, user) -> int | None:
        last = last if isinstance(last, dict) else {}
        if last.get("user") != user.username or not str(last.get("study") or "").isdigit():
            return None
        return int(last["study"])

    @in_page()
    def page_load(request: gr.Request) -> Outputs:
        ctx.user(request, allow_password_change=True)
        return model_note(c, ctx.registry)

    demo.load(page_load, outputs=[c.model_note, c.model_timer], api_visibility="private")

    @in_page()
    def first_card(card, request: gr.Request) -> Outputs:
        """Opened before any study: the card of the model drafting now (a study's draft names its own). Asked
        here, not as the page loads, where it would race the banner's look at the same model folder."""
        ctx.user(request)
        return gr.skip() if card else card_outputs(c.card_panel, c.card, ctx, None)

    c.card_panel.expand(first_card, inputs=c.card, outputs=[c.card_panel, c.card], api_visibility="private")

    @in_page()
    def offer_resume(last, session, request: gr.Request):
        """The remembered study, offered while this page has none open. The browser state reads its value when
        it is first shown (the Read tab appears after sign-in), and says so with this change event."""
        user = ctx.user(request, allow_password_change=True)
        session = mine(session, user)  # another user's tab state is refused like in every handler that reads it
        study = None if user.must_change_password or session.study_id else remembered(last, user)
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
    def poll_model(request: gr.Request) -> Outputs:
        ctx.user(request, allow_password_change=True)
        return model_note(c, ctx.registry)

    c.model_timer.tick(
        poll_model, outputs=[c.model_note, c.model_timer], api_visibility="private", show_progress="hidden"
    )

    @in_page(status=c.status)
    def resume(last, text, session, request: gr.Request) -> Outputs:
        user = ctx.user(request)
        session = mine(session, user)
        study = remembered(last, user)
        if study is None:
            raise OrapoError("no_study", "There is no study to continue in this browser; open one from the worklist.")
        read_guard.keep_edit(ctx, user, session, text, tell=session.study_id != study)
        return load_study(user, study, request)

    c.resume_btn.click(resume, inputs=[c.last_study, c.report, c.state], outputs=study_outputs, api_name="resume_study")
