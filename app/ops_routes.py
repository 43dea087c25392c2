"""The operators' HTTP routes: `/healthz` and `/readyz` for load balancers and orchestrators, `/metrics` for Prometheus.

`launch_options` adds them to the app Gradio builds, behind the session middleware (`app.web_security`), as it
does the viewer's. The two health paths are public (`HEALTH_PATHS`, in the middleware's `PUBLIC_PATHS`): they
answer without a session and say nothing of any user, study or path. `/healthz` answers 200 while the process
serves HTTP; `/readyz` answers 200 when the database answers a trivial query and the served model is loaded, else
503 with one word per check. `/metrics` needs a session, like every other route, and answers an administrator only
(403 for a radiologist); with `ORAPO_METRICS_PORT` the same text is also served on 127.0.0.1 of that port
(`app.services.operations.metrics.AppMetrics.start`). Nothing is cached (`no-store`).
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool  # noqa: TID253 -- this module is heavy; light ones import it lazily
from starlette.requests import Request  # noqa: TID253 -- this module is heavy; light ones import it lazily
from starlette.responses import (  # noqa: TID253 -- this module is heavy; light ones import it lazily
    JSONResponse,
    Response,
)
from starlette.routing import Route  # noqa: TID253 -- this module is heavy; light ones import it lazily

from app import gradio_internals
from app.services.accounts.auth import is_admin
from app.services.operations.metrics import METRICS_PATH, readiness_checks
from app.web_security import SESSION_USER

NO_STORE = {"Cache-Control": "no-store"}


def routes(settings, database) -> list[Route]:
    """The routes, bound to this app's database; the app's metrics and models come from its `AppContext`."""

    def context(request: Request):
        return gradio_internals.context_of(request.scope.get("app"))

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"}, headers=NO_STORE)

    async def readyz(request: Request) -> Response:
        checks = await run_in_threadpool(readiness_checks, database, getattr(context(request), "registry", None))
        ready = all(word == "ok" for word in checks.values())
        return JSONResponse(checks, status_code=200 if ready else 503, headers=NO_STORE)

    async def metrics(request: Request) -> Response:
        username = request.scope.get(SESSION_USER)
        if not username or not await run_in_threadpool(is_admin, database, username):
            return JSONResponse(
                {"detail": {"error": "forbidden", "message": "The metrics are for administrators."}},
                status_code=403,
                headers=NO_STORE,
            )
        app_metrics = getattr(context(request), "metrics", None)
        if app_metrics is None:
            return JSONResponse({"detail": "Not found"}, status_code=404, headers=NO_STORE)
        body, content_type = await run_in_threadpool(app_metrics.text)
        return Response(body, media_type=content_type, headers=NO_STORE)

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route(METRICS_PATH, metrics, methods=["GET"]),
    ]
