"""The Read tab: upload, view (window/level, zoom, header), draft, correct, sign.

Image viewer on the left (`app.tabs.viewer`: Cornerstone3D in the page, the full bit depth behind it),
report on the right, as on a reading workstation.
What this session is reading (study, image, draft) lives in a `gr.State`, so two
radiologists never see each other's study; every handler still re-checks the
user and their right to the study through the services. Gradio finds that state
by a session hash the browser chooses, so the state also names the user it was
made for, and every handler that reads it refuses anyone else (`mine`).

This module lays out the tab and opens studies (upload, `load_study`); the
report column, and how it never loses an edit, is `app.tabs.read_report` (its
components) and `app.tabs.read_actions` (its events).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from app.context import AppContext
from app.services.reading import autosave, drafting
from app.tabs import read_actions, read_guard, read_report, read_upload, viewer


@dataclass
class ReadUI:
    state: gr.State
    study_outputs: list[Any]
    column: read_report.ReportColumn


def load_study(ctx: AppContext, user, study_id: int, request=None) -> tuple:
    """Every output of the tab for one study (`ReadUI.study_outputs`): viewer, header, latest draft and report, with
    the reader's unsaved edit of it, if any. The page that sent `request` has this study open from now on."""
    overview = drafting.open_study(ctx.database, user, study_id)
    image = drafting.first_image(overview)
    header = [[k, str(v)] for k, v in sorted(image.header.items())]
    stored = overview.latest_correction or overview.latest_draft
    unsaved = autosave.unsaved(ctx.database, user, overview.study.id, stored=stored.text if stored else None)
    read_guard.note_open(ctx, request, overview.study.id)
    return (viewer.value_for(overview.study.id, image), header, *read_report.opened(user, overview, image, unsaved))


def build(ctx: AppContext) -> ReadUI:
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=480):
            drop_zone = read_upload.build()
            image_viewer = viewer.build()
            with gr.Accordion("De-identified header", open=False):
                header = gr.Dataframe(headers=["Element", "Value"], interactive=False, wrap=True, elem_id="orapo-header")
        with gr.Column(scale=1, min_width=420, elem_id="orapo-report-column"):
            column = read_report.build_column(ctx)

    study_outputs = [image_viewer, header, *column.opened_outputs]

    read_upload.wire(ctx, drop_zone, load_study, study_outputs, leaving=[column.report, column.state])
    read_actions.wire(ctx, column, load_study, study_outputs)
    return ReadUI(state=column.state, study_outputs=study_outputs, column=column)


def wire_page_load(ctx: AppContext, ui: ReadUI, demo: gr.Blocks) -> None:
    """What the tab does when the page loads: the model's state, and the study the reader had open."""
    read_actions.wire_page_load(ctx, ui.column, demo, load_study, ui.study_outputs)
