"""The Worklist tab: my studies (or everyone's, for an administrator, with each study's owner), their history,
reopening one to amend, and studies to import from the archive (app.tabs.worklist_archive).

Opening the tab lists the studies and the selected study's history afresh: a report signed in the Read tab, or a
round that trained on it, shows without pressing Refresh. The columns have set widths: left to itself the table
sized the Study column by its numbers and broke its header mid-word ("Stud/y").
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr  # noqa: TID253 -- this module is heavy; light ones import it lazily

from app.context import AppContext
from app.messages import in_page
from app.services.reading import reading_order
from app.services.reading import worklist as worklist_service
from app.services.reading.served import drafted_by
from app.tabs import read_guard, worklist_archive
from app.tabs.fields import entered_id, id_field
from app.tabs.outputs import Outputs
from app.tabs.read import ReadUI
from app.tabs.session import mine
from orapo_core.errors import OrapoError

STATUSES = ["all", "new", "drafted", "corrected", "signed", "trained"]
COLUMNS = [
    "Study",
    "Patient (pseudonym)",
    "View",
    "Status",
    "Use",
    "Uploaded",
    "Latest draft",
    "Report version",
    "Signed",
]
OWNER = "Owner"  # after Study, in the "everyone" view only
WIDTHS = ["7%", "16%", "8%", "12%", "14%", "11%", "13%", "8%", "11%"]
EVERYONE_WIDTHS = ["6%", "8%", "14%", "7%", "11%", "12%", "10%", "13%", "8%", "11%"]


@dataclass
class WorklistUI:
    study_id: gr.Textbox
    open_btn: gr.Button
    order: gr.Radio


def rows(overviews, owners: dict[int, str] | None = None) -> list[list]:
    """The table's rows; with `owners` (study id -> username), the Owner column after the study."""
    out = []
    for o in overviews:
        s, d, c = o.study, o.latest_draft, o.latest_correction
        status = f"{s.status} · not drafted: {s.not_drafted}" if s.not_drafted else s.status
        row = [
            s.id,
            s.patient_pseudonym,
            s.view_position or "unknown",
            status,
            worklist_service.STUDY_USE_SHORT[s.split],
            s.created_at.strftime("%Y-%m-%d %H:%M"),
            f"{d.id} by {drafted_by(d)}" if d else "",
            c.version if c else "",
            c.signed_at.strftime("%Y-%m-%d %H:%M") if c and c.signed_at else "",
        ]
        if owners is not None:
            row.insert(1, owners.get(s.id, ""))
        out.append(row)
    return out


def headers(everyone: bool) -> list[str]:
    return [COLUMNS[0], OWNER, *COLUMNS[1:]] if everyone else COLUMNS


def table_update(value: dict, everyone: bool) -> gr.Dataframe:
    """The table with its columns' widths, which differ with the Owner column."""
    return gr.Dataframe(value=value, column_widths=EVERYONE_WIDTHS if everyone else WIDTHS)


def history_rows(h: worklist_service.StudyHistory) -> list[list]:
    out = [[f"draft {d.id}", d.created_at.strftime("%Y-%m-%d %H:%M"), drafted_by(d), "", d.text] for d in h.drafts]
    out += [
        [
            f"report v{c.version}",
            c.created_at.strftime("%Y-%m-%d %H:%M"),
            h.author(c),
            ("signed" if c.signed_at else "unsigned")
            + (", accepted unchanged" if c.accepted_unchanged else "")
            + (f", amends v{c.version - 1}" if c.previous_id is not None else ""),
            c.text,
        ]
        for c in h.corrections
    ]
    return out


def build(ctx: AppContext, tab: gr.Tab | None = None) -> WorklistUI:
    """The tab's components and handlers; opening `tab` lists the studies (and offers administrators everyone's)."""
    with gr.Row():
        status = gr.Dropdown(STATUSES, value="all", label="Status", scale=1)
        # shown to administrators only, when the tab opens: a radiologist is never offered a refusal
        scope = gr.Radio(
            ["mine", "everyone"], value="mine", label="Studies", scale=1, visible=False, elem_id="orapo-worklist-scope"
        )
        order = gr.Radio(
            list(reading_order.ORDER_LABELS.values()),
            value=reading_order.ORDER_LABELS["oldest"],
            label="Unread studies",
            scale=1,
            elem_id="orapo-worklist-order",
            info="listed first; 'most useful' puts first the drafts the model is least sure of "
            "and the films unlike those it describes the same way",
        )
        refresh = gr.Button("Refresh", scale=0, elem_id="orapo-worklist-refresh")
    table = gr.Dataframe(headers=COLUMNS, interactive=False, wrap=True, column_widths=WIDTHS, elem_id="orapo-worklist")
    with gr.Row():
        study_id = id_field("Selected study", elem_id="orapo-worklist-study", placeholder="click a study in the table")
        open_btn = gr.Button("Open in Read tab (to amend)", variant="primary", scale=0, elem_id="orapo-worklist-open")
    history = gr.Dataframe(
        headers=["Entry", "When", "By", "State", "Text"],
        interactive=False,
        wrap=True,
        label="History: drafts and report versions",
        elem_id="orapo-worklist-history",
    )
    with gr.Accordion("From the archive", open=False, elem_id="orapo-archive"):
        worklist_archive.build(ctx)

    def listed(user, status_value, everyone: bool, order_value) -> dict:
        """The table's headers and rows (everyone's studies with their owners)."""
        studies = worklist_service.worklist(ctx.database, user, status=status_value, everyone=everyone)
        studies = reading_order.ordered(ctx.database, studies, order_value)
        owners = worklist_service.owners(ctx.database, user, studies) if everyone else None
        return {"headers": headers(everyone), "data": rows(studies, owners)}

    @in_page()
    def list_studies(status_value, scope_value, order_value, request: gr.Request):
        return listed(ctx.user(request), status_value, scope_value == "everyone", order_value)

    @in_page()
    def scope_changed(status_value, scope_value, order_value, request: gr.Request):
        everyone = scope_value == "everyone"
        return table_update(listed(ctx.user(request), status_value, everyone, order_value), everyone)

    inputs = [status, scope, order]
    refresh.click(list_studies, inputs=inputs, outputs=table, api_name="worklist")
    status.input(list_studies, inputs=inputs, outputs=table, api_visibility="private")
    scope.input(scope_changed, inputs=inputs, outputs=table, api_visibility="private")
    order.input(list_studies, inputs=inputs, outputs=table, api_visibility="private")

    def fresh_history(user, study) -> list[list]:
        """The selected study's history as it is now; none once the study cannot be opened (or none is chosen)."""
        try:
            study = entered_id(study, "study")
            return [] if study is None else history_rows(worklist_service.history(ctx.database, user, study))
        except OrapoError:
            return []

    @in_page()
    def opened(status_value, scope_value, order_value, study, request: gr.Request) -> Outputs:
        user = ctx.user(request)
        everyone = user.is_admin and scope_value == "everyone"
        return {
            scope: gr.Radio(visible=user.is_admin, value="everyone" if everyone else "mine"),
            table: table_update(listed(user, status_value, everyone, order_value), everyone),
            history: fresh_history(user, study),
        }

    if tab is not None:
        tab.select(opened, inputs=[*inputs, study_id], outputs=[scope, table, history], api_visibility="private")

    @in_page()
    def study_history(study, request: gr.Request):
        user = ctx.user(request)
        study = entered_id(study, "study")
        return [] if study is None else history_rows(worklist_service.history(ctx.database, user, study))

    def pick(evt: gr.SelectData, table_value):
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        return table_value.iloc[row, 0] if hasattr(table_value, "iloc") else table_value[row][0]

    table.select(pick, inputs=table, outputs=study_id, api_visibility="private").then(
        study_history, inputs=study_id, outputs=history, api_visibility="private"
    )
    study_id.submit(study_history, inputs=study_id, outputs=history, api_name="study_history")
    return WorklistUI(study_id=study_id, open_btn=open_btn, order=order)


def wire_open(ctx: AppContext, ui: WorklistUI, read_ui: ReadUI, tabs: gr.Tabs) -> None:
    """Reopening a study fills the Read tab (so saving there amends it) and switches to it."""

    @in_page()
    def open_study(study, order_value, text, session, request: gr.Request) -> Outputs:
        user = ctx.user(request)
        session = mine(session, user)
        study = entered_id(study, "study")
        if study is None:
            raise OrapoError("no_study", "Select a study in the worklist first.")
        # the Read tab's unsaved edit is kept first (reopening the same study brings it back)
        read_guard.keep_edit(ctx, user, session, text, tell=session.study_id != study)
        loaded = read_ui.load_study(
            user, study, request
        )  # refuses a study this reader may not open, before anything is noted
        reading_order.note_opened(ctx.database, user, study, order_value)  # what the correction will record
        return {**loaded, tabs: gr.Tabs(selected="read")}

    ui.open_btn.click(
        open_study,
        inputs=[ui.study_id, ui.order, read_ui.column.report, read_ui.state],
        outputs=[*read_ui.study_outputs, tabs],
        api_name="open_study",
    )
