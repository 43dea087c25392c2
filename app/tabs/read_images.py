"""The Read tab's thumbnails: every image of the open study, frontal first and lateral beside it; a click shows
that image in the viewer (issue 41 §6: "the viewer only ever shows the first").

The strip is one `gr.HTML` whose value lists the images (`app.services.reading.studies.reading_views`: the drafted
image first, then frontals, laterals, the rest); each thumbnail is a PNG from `app.study_image_routes`, checked
like the viewer's pixels. A study of one image shows no strip. Showing another image changes what the viewer and
the header show, never the page's session: drafting still reads the study's first image, and what is saved or
signed still goes to the open study.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr  # noqa: TID253 -- this module is heavy; light ones import it lazily

from app.context import AppContext
from app.messages import in_page
from app.services.reading import study_images
from app.services.reading.studies import reading_views
from app.study_image_routes import image_png_url
from app.tabs import viewer
from app.tabs.outputs import Outputs
from app.tabs.read_guard import current
from app.tabs.session import mine

TEMPLATE = """<div class="orapo-thumbs" role="group" aria-label="Images of this study">
{{#each value}}<button type="button" class="orapo-thumb" data-image="{{this.id}}" aria-pressed="{{this.shown}}"
 title="Show {{this.label}} in the viewer"><img src="{{this.url}}" alt="{{this.label}}"><span>{{this.label}}</span>
</button>{{/each}}</div>"""
CSS = """.orapo-thumbs { display: flex; gap: 6px; overflow-x: auto; padding: 2px; }
.orapo-thumb { display: flex; flex-direction: column; align-items: center; gap: 2px; padding: 3px; margin: 0;
  border: 2px solid transparent; border-radius: 6px; background: var(--block-background-fill); cursor: pointer;
  font-size: 12px; color: var(--body-text-color); }
.orapo-thumb[aria-pressed=true] { border-color: var(--color-accent); }
.orapo-thumb img { height: 72px; width: auto; max-width: 96px; object-fit: contain; background: #000; }"""
# the image id of the thumbnail clicked goes to the server, which checks it belongs to the page's open study
ON_LOAD = """element.addEventListener('click', (event) => {
  const thumb = event.target.closest('[data-image]');
  if (thumb) trigger('click', {image: thumb.dataset.image});
});"""


@dataclass
class Thumbnails:
    strip: gr.HTML


def build() -> Thumbnails:
    strip = gr.HTML(
        [],
        html_template=TEMPLATE,
        css_template=CSS,
        js_on_load=ON_LOAD,
        visible=False,
        scale=1,
        min_width=180,
        elem_id="orapo-thumbs",
    )
    return Thumbnails(strip)


def thumbnails(overview, shown_id: int) -> list[dict]:
    """The strip's value: one entry per image of the study, in reading order, the one in the viewer marked."""
    study = overview.study.id
    return [
        {
            "id": v.image.id,
            "url": image_png_url(study, v.image.id, thumbnail=True),
            "label": v.label,
            "shown": "true" if v.image.id == shown_id else "false",
        }
        for v in reading_views(overview)
    ]


def header_rows(image) -> list[list[str]]:
    """The de-identified header table of one image."""
    return [[k, str(v)] for k, v in sorted(image.header.items())]


def shown(ui: Thumbnails, overview, image) -> Outputs:
    """The strip for a study just opened, its first image in the viewer (no strip for a study of one image)."""
    return {ui.strip: gr.HTML(thumbnails(overview, image.id), visible=len(overview.images) > 1)}


def _clicked(event: gr.EventData) -> int | None:
    data = getattr(event, "_data", None)
    image = data.get("image") if isinstance(data, dict) else None
    return int(image) if str(image or "").isdigit() else None


def wire(ctx: AppContext, ui: Thumbnails, image_viewer: gr.HTML, header: gr.Dataframe, state: gr.State) -> None:
    """A click on a thumbnail shows that image of the open study in the viewer, with its header."""

    @in_page()
    def show(session, request: gr.Request, event: gr.EventData = None) -> Outputs:  # None: called directly
        user = ctx.user(request)
        session = mine(session, user)
        image_id = _clicked(event)
        if not session.study_id or image_id is None or not current(ctx, request, session):
            return gr.skip()
        overview, image = study_images.study_image(ctx.database, user, session.study_id, image_id)
        return {
            image_viewer: viewer.value_for(overview.study.id, image),
            header: header_rows(image),
            ui.strip: thumbnails(overview, image.id),
        }

    ui.strip.click(show, inputs=[state], outputs=[image_viewer, header, ui.strip], api_visibility="private")
