"""The Read tab: upload, view (window/level, zoom, header), draft, correct, sign.

Image viewer on the left (`app.tabs.viewer`: Cornerstone3D in the page, the full bit depth behind it),
report on the right, as on a reading workstation.
What this page is reading (study, image, draft) is its `PageSession` (`app.tabs.session`), in a `gr.State`, so
two radiologists never see each other's study; every handler still re-checks the
user and their right to the study through the services. Gradio finds that state
by a session hash the browser chooses, so the session also names the user it was
made for, and every handler that reads it refuses anyone else (`mine`).

This module lays out the tab and opens studies (upload, `ReadUI.load_study`); the
report column, and how it never loses an edit, is `app.tabs.read_report` (its
components) and `app.tabs.read_actions` (its events). Beside the drop zone, the
study's images as thumbnails (`app.tabs.read_images`); beside the viewer, a prior
study when one is opened from the "Priors" list (`app.tabs.read_priors`); under
the report, the model card of the draft's model (`app.tabs.read_model`).
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr  # noqa: TID253 -- this module is heavy; light ones import it lazily

from app.context import AppContext
from app.services.reading import autosave, drafting
from app.tabs import (
    read_actions,
    read_guard,
    read_images,
    read_model,
    read_page_load,
    read_priors,
    read_report,
    read_toasts,
    read_upload,
    viewer,
)
from app.tabs.outputs import Outputs


@dataclass
class ReadUI:
    ctx: AppContext
    image_viewer: gr.HTML
    header: gr.Dataframe
    column: read_report.ReportColumn
    thumbnails: read_images.Thumbnails
    priors: read_priors.Priors

    @property
    def state(self) -> gr.State:
        return self.column.state

    @property
    def study_outputs(self) -> list:
        """What opening a study fills (`load_study`): the viewer, its thumbnails and header, the priors, the report
        column and the model card."""
        return [
            self.image_viewer,
            self.header,
            self.thumbnails.strip,
            *self.priors.opened_outputs,
            *self.column.opened_outputs,
            self.column.card_panel,
            self.column.card,
        ]

    def load_study(self, user, study_id: int, request=None) -> Outputs:
        """Every output of the tab for one study (`study_outputs`): viewer (its first image), thumbnails, header,
        priors, latest draft and report, with the reader's unsaved edit of it, if any, and the card of the draft's
        model. The page that sent `request` has this study open from now on."""
        overview = drafting.open_study(self.ctx.database, user, study_id)
        image = drafting.first_image(overview)
        stored = overview.latest_correction or overview.latest_draft
        unsaved = autosave.unsaved(self.ctx.database, user, overview.study.id, stored=stored.text if stored else None)
        read_guard.note_open(self.ctx, request, overview.study.id)
        return {
            self.image_viewer: viewer.value_for(overview.study.id, image),
            self.header: read_images.header_rows(image),
            **read_images.shown(self.thumbnails, overview, image),
            **read_priors.listed(self.priors, self.ctx, user, overview),
            **read_report.opened(self.column, user, overview, image, unsaved),
            **read_model.card_outputs(self.column.card_panel, self.column.card, self.ctx, overview.latest_draft),
        }


def build(ctx: AppContext) -> ReadUI:
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=480):
            with gr.Row(equal_height=False):
                with gr.Column(scale=1, min_width=200):
                    drop_zone = read_upload.build()
                thumbnails = read_images.build()  # hidden for a study of one image
            with gr.Row(equal_height=False):
                with gr.Column(scale=1, min_width=240):
                    image_viewer = viewer.build()
                prior_panel = read_priors.build_panel()  # a prior beside the current image, when one is opened
            with gr.Accordion("De-identified header", open=False):
                header = gr.Dataframe(
                    headers=["Element", "Value"], interactive=False, wrap=True, elem_id="orapo-header"
                )
            priors = read_priors.build_list(prior_panel)
        with gr.Column(scale=1, min_width=420, elem_id="orapo-report-column"):
            column = read_report.build_column(ctx)
    read_toasts.build()

    ui = ReadUI(ctx, image_viewer, header, column, thumbnails, priors)
    read_upload.wire(ctx, drop_zone, ui.load_study, ui.study_outputs, leaving=[column.report, column.state])
    read_actions.wire(ctx, column, ui.load_study, ui.study_outputs)
    read_images.wire(ctx, thumbnails, image_viewer, header, column.state)
    read_priors.wire(ctx, priors, column.state)
    return ui


def wire_page_load(ctx: AppContext, ui: ReadUI, demo: gr.Blocks) -> None:
    """What the tab does when the page loads: the model's state, and the study the reader had open."""
    read_page_load.wire(ctx, ui.column, demo, ui.load_study, ui.study_outputs)
