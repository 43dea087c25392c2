"""The Read tab's drop zone: a batch of files in, one line per file out, every refusal with its reason.

Gradio's own checks in the page drop a file of the wrong type with a toast that
fades in ten seconds, and refuse a whole batch (leaving the drop zone in an error
state) when one file is too large. So the page filters each batch itself first
(`app.page_scripts`): what it keeps goes up, and what it drops is named in the
hidden `#orapo-dropped` (how many it kept; each dropped file's name and reason
code), which the upload handler reads to list those files in the same summary
as the stored and refused ones; when it kept none, nothing goes up and the
summary lists the dropped ones alone. The server still checks everything it
receives.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import gradio as gr  # noqa: TID253 -- this module is heavy; light ones import it lazily

from app.context import AppContext
from app.messages import in_page
from app.services.operations.metrics import count_uploads
from app.services.reading.ingest import markdown_name
from app.tabs import read_guard
from app.tabs.outputs import Outputs
from app.tabs.session import mine

FILE_TYPES = (".dcm", ".dicom", ".dic", ".png", ".jpg", ".jpeg")
MAX_DROPPED = 200  # the most dropped files a summary lists (a page that says more is not believed further)


@dataclass
class DropZone:
    files: gr.File
    dropped: gr.Textbox
    summary: gr.Markdown


def build() -> DropZone:
    files = gr.File(
        label="Drop DICOM, PNG or JPEG files here",
        file_count="multiple",
        file_types=list(FILE_TYPES),
        height=110,
        elem_id="orapo-files",
    )
    dropped = gr.Textbox("", visible="hidden", elem_id="orapo-dropped")  # what the page left out of this batch, and why
    summary = gr.Markdown(elem_id="orapo-upload-status")
    return DropZone(files, dropped, summary)


def _sorted_out(dropped: str | None) -> tuple[int, list]:
    """(how many files the page kept, the files it dropped) from `#orapo-dropped`; (0, []) if unreadable."""
    try:
        batch = json.loads(dropped or "{}")
    except ValueError:
        return 0, []
    if not isinstance(batch, dict) or not isinstance(batch.get("dropped"), list):
        return 0, []
    kept = batch.get("kept")
    return (kept if isinstance(kept, int) else 0), batch["dropped"]


def dropped_lines(dropped: str | None, max_upload_mb: int) -> list[str]:
    """One summary line per file the page dropped; anything unreadable in `dropped` is ignored."""
    reasons = {
        "type": f"not a DICOM, PNG or JPEG file ({', '.join(FILE_TYPES)}); it was not sent.",
        "size": f"larger than the upload limit of {max_upload_mb} MB (ORAPO_MAX_UPLOAD_MB); it was not sent.",
    }
    return [
        f"- Refused **{markdown_name(item.get('name'))}**: {reasons[item.get('reason')]}"
        for item in _sorted_out(dropped)[1][:MAX_DROPPED]
        if isinstance(item, dict) and item.get("reason") in reasons
    ]


def wire(
    ctx: AppContext, zone: DropZone, load_study: Callable[..., Outputs], study_outputs: list, leaving: list
) -> None:
    """Upload a batch: every file ingested (or refused) and deleted from the cache; the first stored one opened
    (`load_study(user, study_id, request)` fills `study_outputs`). `leaving` is the report box and the page's
    session: an unsaved edit of the study open until now is kept first."""

    @in_page(status=zone.summary)
    def upload(paths, dropped, text, session, request: gr.Request) -> Outputs:
        user = ctx.user(request)
        session = mine(session, user)
        outcomes = read_guard.ingest_own_uploads(ctx, user, request, paths or [])
        count_uploads(ctx.metrics, outcomes)  # refused ones, by code (app.services.operations.metrics)
        # one line a file: "Stored **lat.dcm**: added to study 1 (now 2 images)", "Refused **x.dcm**: ..."
        lines = [f"- {o.summary()}" for o in outcomes]
        lines += dropped_lines(dropped, ctx.settings.max_upload_mb)
        opened = next((o.study_id for o in outcomes if o.ok), None)
        # the drop zone is emptied for the next batch, and so is the list of what the page dropped from this one
        batch_done = {zone.files: None, zone.summary: "\n".join(lines) or "No file received.", zone.dropped: ""}
        if opened is None:
            return batch_done
        read_guard.keep_edit(ctx, user, session, text, tell=session.study_id != opened)
        return {**batch_done, **load_study(user, opened, request)}

    zone.files.upload(
        upload,
        inputs=[zone.files, zone.dropped, *leaving],
        outputs=[zone.files, zone.summary, zone.dropped, *study_outputs],
        api_name="upload_studies",
    )

    @in_page()
    def only_dropped(dropped, request: gr.Request):
        """The page dropped every file of a batch: nothing goes up, and the summary says why (else the upload does)."""
        ctx.user(request)
        lines = dropped_lines(dropped, ctx.settings.max_upload_mb)
        return "\n".join(lines) if lines and _sorted_out(dropped)[0] == 0 else gr.skip()

    zone.dropped.change(
        only_dropped, inputs=zone.dropped, outputs=zone.summary, api_visibility="private", show_progress="hidden"
    )
