"""The Gradio app: a thin layer that translates clicks into service calls.

`build_app` takes its settings and database explicitly and keeps everything it
needs in an `AppContext` made here, not in module globals (Gradio shares module
state across every user). `launch_options` is what `orapo serve` and the tests
pass to `launch`: Gradio's own sign-in backed by the users table, plus a
middleware that refuses every route but the sign-in page to a request without a
session, since a few of Gradio's routes (heartbeat, stream, cancel) do not check.
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gradio as gr

from app.runtime import upload_cache_dir
from orapo_core.config import Settings
from orapo_core.errors import OrapoError

# What a browser needs before it has a session: the sign-in page and its assets.
PUBLIC_PATHS = frozenset({"/", "/login", "/login/", "/favicon.ico", "/theme.css", "/gradio_api/theme.css",
                          "/manifest.json", "/robots.txt",
                          "/gradio_api/startup-events"})  # launch() calls it, unauthenticated, to start the queue
PUBLIC_PREFIXES = ("/assets/", "/static/", "/pwa_icon", "/svelte/")
# Gradio's cache holds patient-derived files (viewer renders, export zips): every CACHE_SWEEP_S, what the app
# put there more than CACHE_MAX_AGE_S ago is deleted, and all of it when the server closes.
CACHE_SWEEP_S = 5 * 60
CACHE_MAX_AGE_S = 60 * 60


@dataclass(frozen=True)
class AppContext:
    """What every tab's handlers share: configuration, the database and the served models."""

    settings: Settings
    database: Any
    registry: Any
    rounds: Any = None  # the app's RoundScheduler: its `.service` runs rounds; started and stopped with the server

    def user(self, request: gr.Request | None, *, role: str | None = None, allow_password_change: bool = False):
        from app.services.auth import signed_in

        return signed_in(self.database, getattr(request, "username", None), role=role,
                         allow_password_change=allow_password_change)


@contextlib.contextmanager
def shown_to_user() -> Iterator[None]:
    """An OrapoError becomes a message in the page (and an error for API callers), never a traceback."""
    try:
        yield
    except OrapoError as exc:
        raise gr.Error(exc.message, title=exc.code.replace("_", " ").capitalize()) from exc


def build_app(*, settings: Settings, database, registry=None, rounds=None) -> gr.Blocks:
    """The Blocks of the whole app. `rounds` (a `RoundScheduler`, default one with the default policy) is
    not started here: the server's lifespan (`launch_options`) starts it and stops it, so building an
    app, as tests do, leaves no thread behind."""
    from app.services.drafting import ModelRegistry
    from app.services.export_downloads import prune_downloads
    from app.services.rounds_schedule import RoundScheduler
    from app.tabs import account, admin, dashboard, read, rounds as rounds_tab_module, worklist

    # Gradio reads its upload folder from the environment when the server starts;
    # keep uploads in the data folder, where ingest deletes each one after use.
    cache = upload_cache_dir(settings)
    cache.mkdir(parents=True, exist_ok=True)
    os.environ["GRADIO_TEMP_DIR"] = str(cache)
    prune_downloads(settings, work=True)  # what a previous run left behind, once its download time is up
    ctx = AppContext(settings, database, registry or ModelRegistry(settings, database),
                     rounds if rounds is not None else RoundScheduler(database, settings))

    with gr.Blocks(title="OraPO: chest X-ray reporting", delete_cache=(CACHE_SWEEP_S, CACHE_MAX_AGE_S)) as demo:
        with gr.Row():
            gr.Markdown("## OraPO · chest X-ray report drafting")
            whoami = gr.Markdown(elem_id="orapo-whoami")
        with gr.Tabs() as tabs:
            with gr.Tab("Read", id="read", visible=False) as read_tab:
                read_ui = read.build(ctx)
            with gr.Tab("Worklist", id="worklist", visible=False) as worklist_tab:
                worklist_ui = worklist.build(ctx)
            with gr.Tab("Dashboard", id="dashboard", visible=False) as dashboard_tab:
                dashboard_ui = dashboard.build(ctx)
            with gr.Tab("Admin", id="admin", visible=False) as admin_tab:
                admin.build(ctx)
            with gr.Tab("Rounds", id="rounds", visible=False) as rounds_tab:
                rounds_tab_module.build(ctx, rounds_tab)
            with gr.Tab("Account", id="account"):
                account_ui = account.build(ctx)
        worklist.wire_open(ctx, worklist_ui, read_ui, tabs)
        dashboard.wire_select(dashboard_ui, dashboard_tab)

        def session_start(request: gr.Request):
            """Which tabs this user sees. Cosmetic only: every handler checks the role again."""
            with shown_to_user():
                user = ctx.user(request, allow_password_change=True)
            ready = not user.must_change_password
            note = f"Signed in as **{user.username}** ({user.role}) · [Sign out](/logout)"
            if not ready:
                note += " · **change your one-time password to continue**"
            return (note, gr.Tab(visible=ready), gr.Tab(visible=ready), gr.Tab(visible=ready),
                    gr.Tab(visible=ready and user.is_admin), gr.Tab(visible=ready and user.is_admin),
                    gr.Tabs(selected="read" if ready else "account"))

        outputs = [whoami, read_tab, worklist_tab, dashboard_tab, admin_tab, rounds_tab, tabs]
        demo.load(session_start, outputs=outputs, api_name="session_start")
        account_ui.password_changed.then(session_start, outputs=outputs, api_visibility="private")
    demo.round_scheduler = ctx.rounds  # found by `rounds_lifespan` once the server runs
    for block in demo.blocks.values():
        if isinstance(block, (gr.File, gr.UploadButton)):
            block._process_single_file = types.MethodType(_path_without_placeholder, block)
    return demo


def _path_without_placeholder(component, f):
    """Gradio's File and UploadButton (type "filepath", gradio 6.31 `_process_single_file`) create an empty
    temporary file in the cache for every file they pass to a handler, never use it and never delete it: one
    stray `tmp*` per upload. The handler gets the same path here, without that file; bytes and Gradio's own
    refusal of a wrong file type still come from Gradio."""
    from gradio.utils import NamedString
    from gradio_client.utils import is_valid_file

    if component.type != "filepath" or (component.file_types and not is_valid_file(f.path, component.file_types)):
        return type(component)._process_single_file(component, f)
    return NamedString(f.path)


def launch_options(settings: Settings, database) -> dict[str, Any]:
    """Keyword arguments for `demo.launch`: sign-in against the users table and the session middleware."""
    from starlette.middleware import Middleware

    from app.services.auth import check_credentials, is_admin
    from app.services.export_downloads import downloads_dir

    return dict(
        auth=lambda username, password: check_credentials(database, username, password),
        auth_message="OraPO: sign in with your account. Ask an administrator if you have none.",
        app_kwargs={"middleware": [Middleware(RequireSession, is_admin=lambda name: is_admin(database, name),
                                              admin_files=downloads_dir(settings))],
                    "lifespan": rounds_lifespan},
        ssr_mode=False,
        show_error=False,
        share=False,
    )


@contextlib.asynccontextmanager
async def rounds_lifespan(app):
    """Training rounds live as long as the server: recover and schedule at start, stop them at close."""
    from anyio import to_thread

    scheduler = getattr(app.get_blocks(), "round_scheduler", None)
    if scheduler is not None:
        await to_thread.run_sync(scheduler.start)  # start() first marks rounds a dead process left behind
    try:
        yield
    finally:
        if scheduler is not None:
            await to_thread.run_sync(scheduler.shutdown)


class RequireSession:
    """ASGI middleware: anything but the sign-in page needs a valid Gradio session cookie, and the files
    of admin exports (Gradio serves them by path to any session) need an administrator's."""

    def __init__(self, app, is_admin=None, admin_files=None):
        self.app = app
        self.is_admin = is_admin
        self.admin_files = os.path.normpath(admin_files) if admin_files is not None else None

    async def __call__(self, scope, receive, send):
        from starlette.responses import JSONResponse

        path = scope.get("path", "")
        if scope["type"] not in ("http", "websocket") or _public(path):
            await self.app(scope, receive, send)
            return
        username = _session_user(scope)
        if username is None:
            response = JSONResponse({"detail": {"error": "Not authenticated", "auth_message": "Sign in first."}},
                                    status_code=401)
        elif self._admin_only(path) and not (self.is_admin is not None and self.is_admin(username)):
            response = JSONResponse({"detail": {"error": "Forbidden", "message": "Exports are for administrators."}},
                                    status_code=403)
        else:
            await self.app(scope, receive, send)
            return
        await response(scope, receive, send)


    def _admin_only(self, path: str) -> bool:
        """A request for a file under `admin_files` (Gradio's file routes carry the absolute path after `file=`)."""
        from urllib.parse import unquote

        if self.admin_files is None or "file=" not in path:
            return False
        target = os.path.normpath(unquote(path.split("file=", 1)[1]))
        return target == self.admin_files or target.startswith(self.admin_files + os.sep)


def _public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


def _session_user(scope) -> str | None:
    """The username of the request's Gradio session, or None without a valid one."""
    from starlette.requests import HTTPConnection

    conn = HTTPConnection(scope)
    app = scope.get("app")
    tokens = getattr(app, "tokens", None)
    cookie_id = getattr(app, "cookie_id", None)
    if tokens is None or cookie_id is None:
        return None
    token = conn.cookies.get(f"access-token-{cookie_id}") or conn.cookies.get(f"access-token-unsecure-{cookie_id}")
    return tokens.get(token) if token is not None else None
