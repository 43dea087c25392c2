"""The routes of a study's images by id: the viewer's pixels of any of them, and a PNG of each (thumbnail or full).

Beside `app.viewer_routes` (whose pixels are the study's first image, the one drafting reads) and under the same
prefix, so the session middleware treats them alike (`app.web_security.DATA_PREFIXES`: read only by the app's own
page, with a live session naming its user). Each request is checked again against the user's right to the study
(`app.services.reading.study_images`): another radiologist's study is refused (403), an image of another study is
not found (404). Nothing is cached by the browser (`no-store`).
"""

from __future__ import annotations

import json

from starlette.concurrency import run_in_threadpool  # noqa: TID253 -- this module is heavy; light ones import it lazily
from starlette.requests import Request  # noqa: TID253 -- this module is heavy; light ones import it lazily
from starlette.responses import (  # noqa: TID253 -- this module is heavy; light ones import it lazily
    Response,
)
from starlette.routing import Route  # noqa: TID253 -- this module is heavy; light ones import it lazily

from app.services.accounts.auth import signed_in
from app.services.reading import study_images
from app.viewer_routes import PREFIX, refused
from app.web_security import SESSION_USER
from orapo_core.errors import OrapoError

IMAGE_PATH = f"{PREFIX}/studies/{{study_id:int}}/images/{{image_id:int}}"


def image_pixels_url(study_id: int, image_id: int) -> str:
    """What the viewer loads for one image of a study (any of its images)."""
    return f"{PREFIX}/studies/{int(study_id)}/images/{int(image_id)}/pixels"


def image_png_url(study_id: int, image_id: int, *, preset: str = "default", thumbnail: bool = False) -> str:
    """One image of a study windowed on the server: a thumbnail, or the full picture (at most FALLBACK_MAX_SIDE)."""
    size = "&size=thumb" if thumbnail else ""
    return f"{PREFIX}/studies/{int(study_id)}/images/{int(image_id)}/render.png?preset={preset}{size}"


def routes(settings, database) -> list[Route]:
    """The routes, bound to this app's settings and database."""

    def reader(request: Request):
        return signed_in(database, request.scope.get(SESSION_USER))

    def ids(request: Request) -> tuple[int, int]:
        return request.path_params["study_id"], request.path_params["image_id"]

    async def pixels(request: Request) -> Response:
        def load():
            return study_images.viewer_image(database, settings, reader(request), *ids(request))

        try:
            image = await run_in_threadpool(load)
        except OrapoError as exc:
            return refused(exc)
        return Response(
            image.pixels,
            media_type="application/octet-stream",
            headers={"X-Orapo-Image": json.dumps(image.header, separators=(",", ":")), "Cache-Control": "no-store"},
        )

    async def png(request: Request) -> Response:
        preset = request.query_params.get("preset", "default")
        thumbnail = request.query_params.get("size") == "thumb"

        def render():
            return study_images.image_png(
                database, settings, reader(request), *ids(request), preset, thumbnail=thumbnail
            )

        try:
            body = await run_in_threadpool(render)
        except OrapoError as exc:
            return refused(exc)
        return Response(body, media_type="image/png", headers={"Cache-Control": "no-store"})

    return [
        Route(f"{IMAGE_PATH}/pixels", pixels, methods=["GET"]),
        Route(f"{IMAGE_PATH}/render.png", png, methods=["GET"]),
    ]
