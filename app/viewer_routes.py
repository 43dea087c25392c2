"""The viewer's HTTP routes: its script, and a study's pixels for the user who may read that study.

`launch_options` adds these routes to the app Gradio builds, behind the session middleware
(`app.web_security`): no request reaches them without a live session, whose user the middleware names in the
request's scope. Then each pixel request is checked again, as every Read tab handler is, against the user's
right to the study (`drafting.open_study`): another radiologist's study is refused (403), an unknown one is
not found (404). Pixels are never cached by the browser (`no-store`); the script is, by its content hash.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from starlette.concurrency import run_in_threadpool  # noqa: TID253 -- this module is heavy; light ones import it lazily
from starlette.requests import Request  # noqa: TID253 -- this module is heavy; light ones import it lazily
from starlette.responses import (  # noqa: TID253 -- this module is heavy; light ones import it lazily
    FileResponse,
    JSONResponse,
    Response,
)
from starlette.routing import Route  # noqa: TID253 -- this module is heavy; light ones import it lazily

from app.services.accounts.auth import signed_in
from app.web_security import SESSION_USER
from orapo_core.errors import OrapoError

PREFIX = "/orapo/viewer"
STATIC_DIR = Path(__file__).parent / "static" / "viewer"
ASSETS = ("orapo-viewer.js", "THIRD_PARTY_LICENSES.txt")  # what `make viewer` writes; nothing else is served
STATUS = {
    "forbidden": 403,
    "study_not_found": 404,
    "image_not_found": 404,
    "image_missing": 404,
    "unknown_preset": 404,
    "not_signed_in": 401,
    "user_disabled": 403,
    "password_change_required": 403,
}


@lru_cache(maxsize=1)
def script_url() -> str:
    """The bundle's address, with its content hash so a browser may keep it until `make viewer` changes it."""
    path = STATIC_DIR / ASSETS[0]
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12] if path.is_file() else "missing"
    return f"{PREFIX}/assets/{ASSETS[0]}?v={digest}"


def pixels_url(study_id: int, image_id: int) -> str:
    return f"{PREFIX}/studies/{int(study_id)}/pixels?image={int(image_id)}"


def render_url(study_id: int, preset: str = "default") -> str:
    """The study's first image windowed on the server (a PNG of at most FALLBACK_MAX_SIDE): the no-script view and
    the thumbnail a confirmation shows."""
    return f"{PREFIX}/studies/{int(study_id)}/render.png?preset={preset}"


def refused(exc: OrapoError) -> JSONResponse:
    """A refusal as the viewer's routes answer it (also `app.study_image_routes`): the code and sentence, its status."""
    return JSONResponse(
        {"detail": {"error": exc.code, "message": exc.message}},
        status_code=STATUS.get(exc.code, 400),
        headers={"Cache-Control": "no-store"},
    )


def routes(settings, database) -> list[Route]:
    """The routes, bound to this app's settings and database (no module state: one app, one set)."""
    from app.services.reading import viewer  # noqa: PLC0415 -- loads numpy

    def reader(request: Request):
        return signed_in(database, request.scope.get(SESSION_USER))

    async def pixels(request: Request) -> Response:
        image = request.query_params.get("image")
        image_id = None if image is None else int(image) if image.isdigit() else -1  # -1: no such image

        def load():
            return viewer.viewer_image(database, settings, reader(request), request.path_params["study_id"], image_id)

        try:
            image = await run_in_threadpool(load)
        except OrapoError as exc:
            return refused(exc)
        return Response(
            image.pixels,
            media_type="application/octet-stream",
            headers={"X-Orapo-Image": json.dumps(image.header, separators=(",", ":")), "Cache-Control": "no-store"},
        )

    async def fallback(request: Request) -> Response:
        preset = request.query_params.get("preset", "default")

        def render():
            return viewer.fallback_png(database, settings, reader(request), request.path_params["study_id"], preset)

        try:
            png = await run_in_threadpool(render)
        except OrapoError as exc:
            return refused(exc)
        return Response(png, media_type="image/png", headers={"Cache-Control": "no-store"})

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ASSETS or not (STATIC_DIR / name).is_file():
            return JSONResponse({"detail": "Not found"}, status_code=404)
        cache = "private, max-age=31536000, immutable" if request.query_params.get("v") else "no-cache"
        return FileResponse(STATIC_DIR / name, headers={"Cache-Control": cache})

    return [
        Route(f"{PREFIX}/studies/{{study_id:int}}/pixels", pixels, methods=["GET"]),
        Route(f"{PREFIX}/studies/{{study_id:int}}/render.png", fallback, methods=["GET"]),
        Route(f"{PREFIX}/assets/{{name}}", asset, methods=["GET"]),
    ]
