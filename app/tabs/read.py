"""The Read tab: upload, view (window/level, zoom, header), draft, correct, sign.

Image viewer on the left (`app.tabs.viewer`: Cornerstone3D in the page, the full bit depth behind it),
report on the right, as on a reading workstation.
What this session is reading (study, image, draft) lives in a `gr.State`, so two
radiologists never see each other's study; every handler still re-checks the
user and their right to the study through the services. Gradio finds that state
by a session hash the browser chooses, so the state also names the user it was
made for, and every handler that reads it refuses anyone else (`_mine`).

What is signed is exactly what is on screen: accepting the draft is possible only
while the report still is the draft, and signing (or amending a signed report)
first shows the exact text to be stored, with the report locked, and stores that
text only if the report on screen is still the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from app.messages import in_page
from app.server import AppContext
from app.services import drafting, reports
from app.tabs import viewer
from orapo_core.errors import OrapoError


@dataclass
class ReadUI:
    state: gr.State
    study_outputs: list[Any]


def _accept_allowed(text: str | None, session: dict) -> gr.Button:
    return gr.Button(interactive=bool(session.get("draft_text")) and reports.same_text(text, session["draft_text"]))


def _mine(session: dict | None, user) -> dict:
    """This tab's state, if it was made for `user`; an empty one (made before anyone opened a study) is anyone's."""
    session = session or _empty_state()
    owner = session.get("owner")
    if owner is not None and owner != user.username:
        raise OrapoError("not_your_session", "This page's session belongs to another user; reload the page.")
    return session


def _editing() -> tuple:
    """No confirmation pending: the panel hidden, the actions shown (outputs: pending, panel, actions)."""
    return None, gr.Column(visible=False), gr.Row(visible=True)


def _empty_state() -> dict:
    return {"owner": None, "study_id": None, "image_id": None, "draft_id": None, "draft_text": None}


def _study_markdown(overview, image) -> str:
    s = overview.study
    bits = f"{image.bits_stored}-bit " if image.bits_stored else ""
    parts = [f"**Study {s.id}** · {s.patient_pseudonym}", f"{s.modality or '?'} {s.view_position or ''}".strip(),
             f"{bits}{image.source_format.upper()} {image.width}×{image.height}", f"status **{s.status}**"]
    if s.split == "holdout":
        parts.append("held out for evaluation (not trained on)")
    md = " · ".join(parts)
    if image.warnings:
        md += "\n\n" + "\n".join(f"- Warning: {w}" for w in image.warnings)
    return md


def load_study(ctx: AppContext, user, study_id: int) -> tuple:
    """Every output of the tab for one study: viewer, header, latest draft and report."""
    overview = drafting.open_study(ctx.database, user, study_id)
    image = drafting.first_image(overview)
    draft = overview.latest_draft
    report_text = overview.latest_correction.text if overview.latest_correction else (draft.text if draft else "")
    state = {"owner": user.username, "study_id": overview.study.id, "image_id": image.id,
             "draft_id": draft.id if draft else None, "draft_text": draft.text if draft else None}
    if draft:
        hl = reports.highlights_for(draft, report_text)
        spans, missed, choices = _highlighted(hl), _missed_md(hl), reports.sentence_choices(draft.text)
        model = f"Draft {draft.id} by **{draft.model_name}**" + (f" (version {draft.model_version_id})" if draft.model_version_id else "")
    else:
        spans, missed, choices, model = _highlighted(None), "", [], "No draft yet: press **Draft report**."
    corr = overview.latest_correction
    status = model
    if corr:
        status += f" · report version {corr.version}" + (" · **signed**" if corr.signed_at else " · not signed")
        status += " · saving now makes an amendment (a new version)"
    header = [[k, str(v)] for k, v in sorted(image.header.items())]
    return (
        *_editing(),
        _accept_allowed(report_text, state),
        state,
        viewer.value_for(overview.study.id, image),
        header,
        _study_markdown(overview, image),
        spans,
        missed,
        gr.Dropdown(choices=choices, value=None),
        [],
        gr.Textbox(value=report_text, interactive=True),
        status,
    )


def _highlighted(hl: reports.Highlights | None) -> gr.HighlightedText:
    """The highlights panel for one mode: its spans, its colours and a title that says which mode it is."""
    if hl is None:
        return gr.HighlightedText(value=[], label=reports.TITLES["empty"], color_map=reports.COLOR_MAP)
    return gr.HighlightedText(value=hl.spans, label=hl.title, color_map={**reports.COLOR_MAP, **hl.color_map})


def _missed_md(hl: reports.Highlights) -> str:
    """The legend of the mode shown, and (after editing) the findings the draft missed."""
    chips = " ".join(f'<span class="orapo-chip" style="background:{color}">{label}</span> {meaning}'
                     for label, color, meaning in hl.legend())
    if hl.mode != "facts":
        return (f"**Before your edit**, each sentence shows the share of the model's samples that agree with it: {chips}. "
                "Edit the report to check the draft against it.")
    missed = ", ".join(hl.missed) if hl.missed else "none"
    why = "".join(f"\n- *{sentence}* {reason}" for sentence, reason in hl.reasons)
    return (f"**Checked against your report:** {chips}.\n\n" + (f"**Contradicted:**{why}\n\n" if why else "")
            + f"**Missed by the draft:** {missed}")


# The badge after each sentence never breaks inside (Gradio's highlights break words anywhere); the text between
# words only. Injected once into the page's head.
HIGHLIGHT_CSS = """<style>
#orapo-highlights .textfield { word-break: normal; overflow-wrap: break-word; }
#orapo-highlights .label { white-space: nowrap; word-break: keep-all; }
#orapo-missed .orapo-chip { color: #fff !important; font-weight: 600; font-size: 85%; padding: 1px 6px; border-radius: 4px;
  white-space: nowrap; }
</style>"""


def build(ctx: AppContext) -> ReadUI:
    state = gr.State(_empty_state())
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=480):  # as wide as the report's: a portrait film needs no more
            files = gr.File(label="Drop DICOM, PNG or JPEG files here", file_count="multiple",
                            file_types=[".dcm", ".dicom", ".dic", ".png", ".jpg", ".jpeg"], height=110)
            upload_status = gr.Markdown(elem_id="orapo-upload-status")
            image_viewer = viewer.build()
            with gr.Accordion("De-identified header", open=False):
                header = gr.Dataframe(headers=["Element", "Value"], interactive=False, wrap=True, elem_id="orapo-header")
        with gr.Column(scale=2, min_width=420):
            study_info = gr.Markdown("Upload a study or open one from the worklist.", elem_id="orapo-study")
            draft_btn = gr.Button("Draft report", variant="primary", elem_id="orapo-draft")
            highlights = gr.HighlightedText(label=reports.TITLES["empty"], color_map=reports.COLOR_MAP,
                                            show_legend=False, show_inline_category=True, combine_adjacent=False,
                                            elem_id="orapo-highlights")
            gr.HTML("", head=HIGHLIGHT_CSS, container=False, padding=False, elem_id="orapo-highlight-style")
            missed = gr.Markdown(elem_id="orapo-missed")
            with gr.Row():
                sentence = gr.Dropdown(label="Facts of sentence", choices=[], scale=2, elem_id="orapo-sentence")
            facts = gr.Dataframe(headers=["Mention", "Finding", "Polarity", "Attributes", "Verdict"],
                                 interactive=False, wrap=True, elem_id="orapo-facts")
            report = gr.Textbox(label="Report (edit in place)", lines=8, max_lines=20, elem_id="orapo-report")
            with gr.Row() as actions:
                accept_btn = gr.Button("Accept draft unchanged and sign", interactive=False, elem_id="orapo-accept")
                save_btn = gr.Button("Save correction", elem_id="orapo-save")
                sign_btn = gr.Button("Save and sign", variant="primary", elem_id="orapo-sign")
            with gr.Column(visible=False, elem_id="orapo-confirm") as confirm_panel:
                question = gr.Markdown(elem_id="orapo-confirm-question")
                confirm_text = gr.Textbox(label="Exactly this text will be stored", interactive=False, lines=6,
                                          max_lines=20, elem_id="orapo-confirm-text")
                with gr.Row():
                    confirm_btn = gr.Button("Sign", variant="primary", elem_id="orapo-confirm-sign")
                    back_btn = gr.Button("Go back", elem_id="orapo-confirm-back")
            status = gr.Markdown(elem_id="orapo-status")
    pending = gr.State(None)  # the PendingReport the confirmation shows, until stored or abandoned

    closing = [pending, confirm_panel, actions]
    study_outputs = [*closing, accept_btn, state, image_viewer, header, study_info, highlights, missed,
                     sentence, facts, report, status]

    @in_page(status=upload_status)
    def upload(paths, request: gr.Request):
        user = ctx.user(request)
        outcomes = [drafting.ingest_upload(ctx.database, ctx.settings, user, p) for p in (paths or [])]
        lines = []
        for o in outcomes:
            if o.ok:
                lines.append(f"- Stored **{o.file}**: study {o.study_id}" + (" (already uploaded)" if o.duplicate else ""))
            else:
                lines.append(f"- Refused **{o.file}**: {o.message}")
        opened = next((o.study_id for o in outcomes if o.ok), None)
        summary = "\n".join(lines) or "No file received."
        if opened is None:
            return (None, summary, *[gr.skip()] * len(study_outputs))
        return (None, summary, *load_study(ctx, user, opened))

    files.upload(upload, inputs=files, outputs=[files, upload_status, *study_outputs], api_name="upload_studies")

    @in_page(status=status)
    def draft(session, request: gr.Request, progress=gr.Progress()):
        user = ctx.user(request)
        session = _mine(session, user)
        if not session.get("study_id"):
            raise OrapoError("no_study", "Upload or open a study first.")
        record = drafting.draft_study(ctx.database, ctx.settings, ctx.registry, user, session["study_id"],
                                      progress=progress)
        session = {**session, "draft_id": record.id, "draft_text": record.text}
        hl = reports.confidence_highlights(record)
        return (*_editing(), gr.Button(interactive=True), session, _highlighted(hl), _missed_md(hl),
                gr.Dropdown(choices=reports.sentence_choices(record.text), value=None),
                [], gr.Textbox(value=record.text, interactive=True),
                f"Draft {record.id} by **{record.model_name}** in {record.latency_ms / 1000:.1f} s",
                _study_info(ctx, user, session))

    # 8 drafts may wait at once: the registry's DraftBatcher, not Gradio, bounds the compute (one batched
    # generate at a time), and drafts waiting together are drafted together
    draft_btn.click(draft, inputs=state,
                    outputs=[*closing, accept_btn, state, highlights, missed, sentence, facts, report, status,
                             study_info],
                    api_name="draft_report", concurrency_limit=drafting.DRAFT_MAX_BATCH)

    @in_page()
    def rescore(text, session, request: gr.Request):
        session = _mine(session, ctx.user(request))
        if not session.get("draft_text"):
            return [], ""
        hl = reports.rescore(ctx.database, session["draft_id"], text)
        return _highlighted(hl), _missed_md(hl)

    # .change, not .input: it also fires when a draft or a reopened report fills the box
    report.change(rescore, inputs=[report, state], outputs=[highlights, missed], api_name="rescore_report",
                 trigger_mode="always_last", show_progress="hidden")
    # the button follows the text; the server still refuses an accept whose text is not the draft
    @in_page()
    def accept_allowed(text, session, request: gr.Request):
        return _accept_allowed(text, _mine(session, ctx.user(request)))

    report.change(accept_allowed, inputs=[report, state], outputs=accept_btn, api_visibility="private",
                  trigger_mode="always_last", show_progress="hidden")

    @in_page()
    def show_facts(index, text, session, request: gr.Request):
        session = _mine(session, ctx.user(request))
        if index is None or not session.get("draft_text"):
            return []
        edited = None if reports.same_text(text, session["draft_text"]) else text
        return reports.sentence_facts(session["draft_text"], int(index), edited)

    sentence.change(show_facts, inputs=[sentence, report, state], outputs=facts, api_name="sentence_facts")

    def pick_sentence(evt: gr.SelectData):
        # spans alternate sentence, separator: the n-th sentence is span 2n
        index = evt.index if isinstance(evt.index, int) else 0
        return gr.Dropdown(value=index // 2)

    highlights.select(pick_sentence, outputs=sentence, api_visibility="private")

    def stored(record, ahead: reports.PendingReport, user, session) -> tuple:
        """After storing: the report shows the stored text, unlocked; the status says what was stored."""
        what = "accepted unchanged" if record.accepted_unchanged else "corrected"
        signed = "signed" if record.signed_at else "saved, not signed"
        amended = ""
        if record.previous_id is not None:
            amended = f" (an amendment of {'signed ' if ahead.base_signed else ''}version {record.version - 1})"
        return (*_editing(), gr.Textbox(value=record.text, interactive=True),
                f"Report version {record.version}{amended} {what} and {signed} by {user.username}.",
                _study_info(ctx, user, session))

    def ask(kind: str):
        @in_page(status=status)
        def handler(text, session, request: gr.Request):
            user = ctx.user(request)
            session = _mine(session, user)
            if not session.get("study_id"):
                raise OrapoError("no_study", "Upload or open a study first.")
            ahead = reports.prepare_report(ctx.database, user, session["study_id"], session.get("draft_id"), text,
                                           sign=kind != "save", accept=kind == "accept")
            if not ahead.needs_confirmation:  # an unsigned save that amends no signed report
                record = reports.store_report(ctx.database, user, ahead, text)
                return (*stored(record, ahead, user, session), gr.skip(), gr.skip(), gr.skip())
            # the report is locked while the confirmation shows the exact text to be stored
            return (ahead, gr.Column(visible=True), gr.Row(visible=False), gr.Textbox(interactive=False),
                    gr.skip(), gr.skip(), f"**{ahead.question()}**", ahead.text,
                    gr.Button(value="Sign" if ahead.sign else "Save amendment"))
        return handler

    asking = [*closing, report, status, study_info, question, confirm_text, confirm_btn]
    accept_btn.click(ask("accept"), inputs=[report, state], outputs=asking, api_name="accept_draft")
    save_btn.click(ask("save"), inputs=[report, state], outputs=asking, api_name="save_correction")
    sign_btn.click(ask("sign"), inputs=[report, state], outputs=asking, api_name="sign_report")

    @in_page(status=status)
    def confirm(ahead, text, session, request: gr.Request):
        user = ctx.user(request)
        session = _mine(session, user)
        if ahead is None or ahead.study_id != session.get("study_id"):
            raise OrapoError("nothing_to_confirm",
                             "There is nothing waiting to be stored; save or sign the report again.")
        return stored(reports.store_report(ctx.database, user, ahead, text), ahead, user, session)

    confirm_btn.click(confirm, inputs=[pending, report, state], outputs=[*closing, report, status, study_info],
                      api_name="confirm_report")
    back_btn.click(lambda: (*_editing(), gr.Textbox(interactive=True)), outputs=[*closing, report],
                   api_visibility="private")
    return ReadUI(state=state, study_outputs=study_outputs)


def _study_info(ctx: AppContext, user, session) -> str:
    overview = drafting.open_study(ctx.database, user, session["study_id"])
    return _study_markdown(overview, drafting.first_image(overview))

