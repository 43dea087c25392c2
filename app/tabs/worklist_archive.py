"""The Worklist's "From the archive" view: search the PACS (QIDO-RS), see what is already here, import what is not.

Built inside the Worklist tab for radiologists and administrators. Without an
archive configured it is one sentence saying so and how to configure one;
whether one is configured is read as the app starts, like every other setting.
Each import's outcome is a line in the page (imported as study N, already
imported, refused and why): a refusal is news about the study, not an error.
"""

from __future__ import annotations

import gradio as gr  # noqa: TID253 -- this module is heavy; light ones import it lazily

from app.context import AppContext
from app.messages import in_page
from app.services.archive import archive_import
from app.services.archive.pacs import CHEST_MODALITIES
from app.tabs.outputs import Outputs

COLUMNS = ["Study date", "Modality", "Accession", "Images", "Description", "In this app", "Archive study UID"]


def _day(date: str) -> str:
    return f"{date[:4]}-{date[4:6]}-{date[6:]}" if len(date) == 8 else date or "?"


def rows(studies) -> list[list]:
    return [
        [
            _day(s.date),
            "/".join(s.modalities),
            s.accession,
            "" if s.instances is None else s.instances,
            s.description,
            f"already imported as study {s.imported_study_id}" if s.imported_study_id else "not imported",
            s.study_uid,
        ]
        for s in studies
    ]


def choices(studies) -> list[tuple[str, str]]:
    """What a reader ticks: the studies not imported yet, by date, modality and accession."""
    return [
        (f"{_day(s.date)} {'/'.join(s.modalities)} {s.accession or '(no accession)'}", s.study_uid)
        for s in studies
        if not s.imported_study_id
    ]


def build(ctx: AppContext) -> None:
    """The view's components and handlers, in the caller's layout (an accordion of the Worklist tab)."""
    note = archive_import.archive_note()
    if note is not None:
        gr.Markdown(note, elem_id="orapo-archive-note")
        return
    gr.Markdown(
        "Studies in the archive (PACS). Import runs the same de-identification and checks as an upload; "
        "what was imported appears in the worklist above.",
        elem_id="orapo-archive-note",
    )
    with gr.Row(equal_height=True):
        date = gr.Textbox(
            label="Study date or range",
            placeholder="2024-05-01 or 2024-05-01..2024-05-31",
            scale=2,
            elem_id="orapo-archive-date",
        )
        modality = gr.CheckboxGroup(
            list(CHEST_MODALITIES),
            value=list(CHEST_MODALITIES),
            label="Modality",
            scale=1,
            elem_id="orapo-archive-modality",
        )
        accession = gr.Textbox(label="Accession number", scale=1, elem_id="orapo-archive-accession")
        search_btn = gr.Button("Search the archive", scale=0, elem_id="orapo-archive-search")
    table = gr.Dataframe(headers=COLUMNS, interactive=False, wrap=True, elem_id="orapo-archive-table")
    chosen = gr.CheckboxGroup([], label="Studies to import", elem_id="orapo-archive-chosen")
    import_btn = gr.Button("Import", variant="primary", elem_id="orapo-archive-import")
    result = gr.Markdown(elem_id="orapo-archive-result")

    def listed(studies) -> Outputs:
        """The table and the choice of studies to import, for the studies a search found."""
        return {table: rows(studies), chosen: gr.CheckboxGroup(choices=choices(studies), value=[])}

    def found(user, date_value, modalities, accession_value) -> list:
        return archive_import.search(
            ctx.database,
            ctx.settings,
            user,
            date=date_value,
            accession=accession_value,
            modalities=modalities or CHEST_MODALITIES,
        )

    @in_page(status=result)
    def search(date_value, modalities, accession_value, request: gr.Request) -> Outputs:
        studies = found(ctx.user(request), date_value, modalities, accession_value)
        imported = sum(1 for s in studies if s.imported_study_id)
        return {
            **listed(studies),
            result: f"{len(studies)} study(ies) in the archive, {imported} already imported."
            if studies
            else "The archive has no CR or DX study matching these filters.",
        }

    @in_page(status=result)
    def import_chosen(picked, date_value, modalities, accession_value, request: gr.Request) -> Outputs:
        user = ctx.user(request)
        outcomes = archive_import.import_studies(ctx.database, ctx.settings, user, picked or [])
        lines = [f"- `{o.archive_study}`: {o.line}" for o in outcomes]
        imported = sum(1 for o in outcomes if o.stored)
        return {
            **listed(found(user, date_value, modalities, accession_value)),
            result: f"Imported {imported} of {len(outcomes)} study(ies):\n" + "\n".join(lines),
        }

    filters = [date, modality, accession]
    search_btn.click(search, inputs=filters, outputs=[table, chosen, result], api_name="archive_search")
    import_btn.click(
        import_chosen, inputs=[chosen, *filters], outputs=[table, chosen, result], api_name="archive_import"
    )
