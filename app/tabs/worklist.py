"""The Worklist tab: my studies (or everyone's, for an administrator), their history, reopening one to amend, and
studies to import from the archive (app.tabs.worklist_archive)."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from app.context import AppContext
from app.messages import in_page
from app.services.reading import reading_order, reports
from app.tabs import read_guard, worklist_archive
from app.tabs.fields import entered_id, id_field
from app.tabs.read_report import mine
from orapo_core.errors import OrapoError

STATUSES = ["all", "new", "drafted", "corrected", "signed", "trained"]
COLUMNS = ["Study", "Patient (pseudonym)", "View", "Status", "Use", "Uploaded", "Latest draft", "Report version", "Signed"]


@dataclass
class WorklistUI:
    study_id: gr.Textbox
    open_btn: gr.Button
    order: gr.Radio


def rows(overviews) -> list[list]:
    out = []
    for o in overviews:
        s, d, c = o.study, o.latest_draft, o.latest_correction
        status = f"{s.status} · not drafted: {s.not_drafted}" if s.not_drafted else s.status
        out.append([s.id, s.patient_pseudonym, s.view_position or "unknown", status, reports.STUDY_USE_SHORT[s.split],
                    s.created_at.strftime("%Y-%m-%d %H:%M"), f"{d.id} ({d.model_name})" if d else "",
                    c.version if c else "", c.signed_at.strftime("%Y-%m-%d %H:%M") if c and c.signed_at else ""])
    return out


def history_rows(h: reports.StudyHistory) -> list[list]:
    out = [[f"draft {d.id}", d.created_at.strftime("%Y-%m-%d %H:%M"), d.model_name, "", d.text] for d in h.drafts]
    out += [[f"report v{c.version}", c.created_at.strftime("%Y-%m-%d %H:%M"), h.author(c),
             ("signed" if c.signed_at else "unsigned") + (", accepted unchanged" if c.accepted_unchanged else "")
             + (f", amends v{c.version - 1}" if c.previous_id is not None else ""), c.text]
            for c in h.corrections]
    return out


def build(ctx: AppContext, tab: gr.Tab | None = None) -> WorklistUI:
    """The tab's components and handlers; opening `tab` lists the studies (and offers administrators everyone's)."""
    with gr.Row():
        status = gr.Dropdown(STATUSES, value="all", label="Status", scale=1)
        # shown to administrators only, when the tab opens: a radiologist is never offered a refusal
        scope = gr.Radio(["mine", "everyone"], value="mine", label="Studies", scale=1, visible=False,
                         elem_id="orapo-worklist-scope")
        order = gr.Radio(list(reading_order.ORDER_LABELS.values()), value=reading_order.ORDER_LABELS["oldest"],
                         label="Unread studies", scale=1, elem_id="orapo-worklist-order",
                         info="listed first; 'most useful' puts first the drafts the model is least sure of "
                              "and the films unlike those it describes the same way")
        refresh = gr.Button("Refresh", scale=0, elem_id="orapo-worklist-refresh")
    table = gr.Dataframe(headers=COLUMNS, interactive=False, wrap=True, elem_id="orapo-worklist")
    with gr.Row():
        study_id = id_field("Selected study", elem_id="orapo-worklist-study", placeholder="click a study in the table")
        open_btn = gr.Button("Open in Read tab (to amend)", variant="primary", scale=0, elem_id="orapo-worklist-open")
    history = gr.Dataframe(headers=["Entry", "When", "By", "State", "Text"], interactive=False, wrap=True,
                           label="History: drafts and report versions", elem_id="orapo-worklist-history")
    with gr.Accordion("From the archive", open=False, elem_id="orapo-archive"):
        worklist_archive.build(ctx)

    def listed(user, status_value, everyone: bool, order_value):
        studies = reports.worklist(ctx.database, user, status=status_value, everyone=everyone)
        return rows(reading_order.ordered(ctx.database, studies, order_value))

    @in_page()
    def list_studies(status_value, scope_value, order_value, request: gr.Request):
        return listed(ctx.user(request), status_value, scope_value == "everyone", order_value)

    inputs = [status, scope, order]
    refresh.click(list_studies, inputs=inputs, outputs=table, api_name="worklist")
    status.input(list_studies, inputs=inputs, outputs=table, api_visibility="private")
    scope.input(list_studies, inputs=inputs, outputs=table, api_visibility="private")
    order.input(list_studies, inputs=inputs, outputs=table, api_visibility="private")

    @in_page()
    def opened(status_value, scope_value, order_value, request: gr.Request):
        user = ctx.user(request)
        everyone = user.is_admin and scope_value == "everyone"
        return (gr.Radio(visible=user.is_admin, value="everyone" if everyone else "mine"),
                listed(user, status_value, everyone, order_value))

    if tab is not None:
        tab.select(opened, inputs=inputs, outputs=[scope, table], api_visibility="private")

    @in_page()
    def study_history(study, request: gr.Request):
        user = ctx.user(request)
        study = entered_id(study, "study")
        return [] if study is None else history_rows(reports.history(ctx.database, user, study))

    def pick(evt: gr.SelectData, table_value):
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        return table_value.iloc[row, 0] if hasattr(table_value, "iloc") else table_value[row][0]

    table.select(pick, inputs=table, outputs=study_id, api_visibility="private").then(
        study_history, inputs=study_id, outputs=history, api_visibility="private")
    study_id.submit(study_history, inputs=study_id, outputs=history, api_name="study_history")
    return WorklistUI(study_id=study_id, open_btn=open_btn, order=order)


def wire_open(ctx: AppContext, ui: WorklistUI, read_ui, tabs: gr.Tabs) -> None:
    """Reopening a study fills the Read tab (so saving there amends it) and switches to it."""
    from app.tabs.read import load_study

    @in_page()
    def open_study(study, order_value, text, session, request: gr.Request):
        user = ctx.user(request)
        session = mine(session, user)
        study = entered_id(study, "study")
        if study is None:
            raise OrapoError("no_study", "Select a study in the worklist first.")
        # the Read tab's unsaved edit is kept first (reopening the same study brings it back)
        read_guard.keep_edit(ctx, user, session, text, tell=(session or {}).get("study_id") != study)
        loaded = load_study(ctx, user, study, request)  # refuses a study this reader may not open, before anything is noted
        reading_order.note_opened(ctx.database, user, study, order_value)  # what the correction will record
        return (*loaded, gr.Tabs(selected="read"))

    ui.open_btn.click(open_study, inputs=[ui.study_id, ui.order, read_ui.column.report, read_ui.state],
                      outputs=[*read_ui.study_outputs, tabs],
                      api_name="open_study")
