"""The Read tab's priors: the same patient's earlier studies, and one of them open beside the current study.

A radiologist reads against the patient's earlier studies (issue 41 §6). The "Priors" accordion lists the
pseudonymous patient's other studies this reader may open (`app.services.reading.studies.priors`, newest first):
date, study, status and the first line of its report. Clicking one opens it in a panel beside the viewer: its image
(a PNG from `app.study_image_routes`) and its full report, read-only.

Opening a prior never changes which study the page has open: no handler here writes the page's session or tells
the server's book of open studies (`read_guard.note_open`), so a save or a sign still goes to the current study
(the issue's §1: never the wrong study).
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr  # noqa: TID253 -- this module is heavy; light ones import it lazily

from app.context import AppContext
from app.messages import in_page
from app.services.reading import studies
from app.services.reading import worklist as worklist_service
from app.study_image_routes import image_png_url
from app.tabs.outputs import Outputs
from app.tabs.read_report import study_date
from app.tabs.session import mine
from orapo_core.errors import OrapoError

HEADERS = ["Date", "Study", "Status", "Report"]
IMAGE_TEMPLATE = """{{#if value}}<img src="{{value}}" alt="The prior study's image"
 style="width:100%;max-height:calc(100vh - 420px);min-height:200px;object-fit:contain;background:#000">{{/if}}"""


@dataclass
class Priors:
    accordion: gr.Accordion
    table: gr.Dataframe
    panel: gr.Column  # beside the viewer, hidden until a prior is opened
    title: gr.Markdown
    image: gr.HTML
    report: gr.Textbox
    close_btn: gr.Button

    @property
    def opened_outputs(self) -> list:
        """What opening a study fills here: the list, and the panel closed."""
        return [self.accordion, self.table, self.panel]


def build_panel() -> dict:
    """The prior's panel (call inside the row beside the viewer); its parts, for `build_list`."""
    with gr.Column(visible=False, scale=1, min_width=240, elem_id="orapo-prior") as panel:
        title = gr.Markdown(elem_id="orapo-prior-title")
        image = gr.HTML("", html_template=IMAGE_TEMPLATE, elem_id="orapo-prior-image")
        report = gr.Textbox(
            label="Its report (read-only)", interactive=False, lines=5, max_lines=14, elem_id="orapo-prior-report"
        )
        close_btn = gr.Button("Close the prior", size="sm", elem_id="orapo-prior-close")
    return {"panel": panel, "title": title, "image": image, "report": report, "close_btn": close_btn}


def build_list(panel: dict) -> Priors:
    """The accordion listing the priors (call where it goes in the page)."""
    with gr.Accordion("Priors of this patient", open=False, elem_id="orapo-priors-panel") as accordion:
        table = gr.Dataframe(
            headers=HEADERS,
            interactive=False,
            wrap=True,
            column_widths=["18%", "12%", "15%", "55%"],
            elem_id="orapo-priors",
        )
        gr.Markdown("Click a study to open it beside the current one (read-only; it changes nothing you save).")
    return Priors(accordion, table, **panel)


def first_line(text: str | None) -> str:
    line = next((s.strip() for s in (text or "").splitlines() if s.strip()), "")
    return line if len(line) <= 100 else line[:99] + "…"


def rows(found) -> list[list]:
    """One row per prior: its date, id, status and the first line of its latest report (signed or not)."""
    out = []
    for o in found:
        corr = o.latest_correction
        if corr is None:
            report = "no report"
        else:
            report = first_line(corr.text) if corr.signed_at else f"(not signed) {first_line(corr.text)}"
        date = study_date(o, o.images[0]) if o.images else f"uploaded {o.study.created_at:%Y-%m-%d}"
        out.append([date, o.study.id, o.study.status, report])
    return out


def listed(ui: Priors, ctx: AppContext, user, overview) -> Outputs:
    """The priors of a study just opened, and the panel closed (a prior belongs to the study it was opened from)."""
    found = studies.priors(ctx.database, user, overview.study.id)
    label = f"Priors of this patient ({len(found)})" if found else "Priors of this patient (none)"
    return {ui.accordion: gr.Accordion(label=label), ui.table: rows(found), ui.panel: gr.Column(visible=False)}


def prior_panel(ui: Priors, ctx: AppContext, user, current_id: int, prior_id: int) -> Outputs:
    """The panel for one prior of the study open (`current_id`): refused unless it is one of that study's priors."""
    if prior_id not in {o.study.id for o in studies.priors(ctx.database, user, current_id)}:
        raise OrapoError("study_not_found", f"Study {prior_id} is not an earlier study of this patient you may open.")
    found = worklist_service.history(ctx.database, user, prior_id)
    overview = found.overview
    signed = [c for c in found.corrections if c.signed_at]
    shown = signed[-1] if signed else (found.corrections[-1] if found.corrections else None)
    image = studies.reading_views(overview)[0].image if overview.images else None
    title = f"**Prior: study {prior_id}** · {study_date(overview, image) if image else 'no image'}"
    if shown is None:
        title += " · no report"
    elif shown.signed_at:
        title += f" · report version {shown.version}, signed by {found.author(shown)} on {shown.signed_at:%Y-%m-%d}"
    else:
        title += f" · report version {shown.version}, **not signed**"
    return {
        ui.panel: gr.Column(visible=True),
        ui.title: title,
        ui.image: image_png_url(prior_id, image.id) if image else "",
        ui.report: shown.text if shown else "",
    }


def wire(ctx: AppContext, ui: Priors, state: gr.State) -> None:
    """Clicking a prior opens it beside the viewer; Close hides it. Neither touches the page's session."""

    @in_page()
    def open_prior(session, request: gr.Request, event: gr.SelectData = None) -> Outputs:  # None: called directly
        user = ctx.user(request)
        session = mine(session, user)
        row = getattr(event, "row_value", None)
        row = row if isinstance(row, list) else []
        if not session.study_id or len(row) < 2 or not str(row[1]).isdigit():
            return gr.skip()
        return prior_panel(ui, ctx, user, session.study_id, int(row[1]))

    ui.table.select(
        open_prior,
        inputs=[state],
        outputs=[ui.panel, ui.title, ui.image, ui.report],
        api_visibility="private",
    )
    ui.close_btn.click(lambda: gr.Column(visible=False), outputs=ui.panel, api_visibility="private")
