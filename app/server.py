"""The Gradio app: a thin layer that translates clicks into service calls.

`build_app` takes its settings and database explicitly and keeps everything it
needs in an `AppContext` (app.context) made here, not in module globals (Gradio shares module
state across every user). `launch_options` is what `orapo serve` and the tests
pass to `launch`: Gradio's sign-in page, answered by the session middleware
(`app.web_security`: throttled sign-in, sessions that end with a password change
or a disabled account, exports for administrators only, one user per session
hash), the viewer's routes behind it (`app.viewer_routes`, `app.study_image_routes`), and the upload size
limit. Above the tabs, for everyone, a banner while the served model learned from synthetic films only
(`app.services.rounds.model_card.synthetic_banner`), set as the page loads.

Both take the app's settings (`app.settings.WebSettings`; an engine `Settings` is
lifted). What they rely on of Gradio's internals (the cache folder, finding the
context from the running server, the upload patch) is in `app.gradio_internals`.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import os
import sys
from typing import Any

import gradio as gr  # noqa: TID253 -- this module is heavy; light ones import it lazily
from anyio import to_thread
from starlette.middleware import Middleware  # noqa: TID253 -- this module is heavy; light ones import it lazily

from app import gradio_internals, ops_routes, page_scripts, study_image_routes, viewer_routes
from app.context import AppContext
from app.messages import in_page, log_failure
from app.runtime import server_cache_dir
from app.services.accounts.sessions import SessionBook
from app.services.operations.cache_sweep import CACHE_MAX_AGE_S, CACHE_SWEEP_S, delete_uploads, sweep_stale
from app.services.operations.export_downloads import downloads_dir, prune_downloads
from app.services.operations.metrics import AppMetrics
from app.services.reading.registry import ModelRegistry
from app.services.rounds import RoundScheduler
from app.services.rounds.model_card import synthetic_banner
from app.settings import web_settings
from app.tabs import account, admin, dashboard, read, worklist
from app.tabs import rounds as rounds_tab_module
from app.tabs.outputs import Outputs
from app.tabs.read_upload import FILE_TYPES
from app.web_security import RequireSession
from orapo_core.config import Settings

CACHE_SWEEP_JOB = "orapo-cache-sweep"
BANNER_TEMPLATE = '<div class="orapo-banner" role="note"><strong>Not a clinical read.</strong> ${value}</div>'
BANNER_CSS = """.orapo-banner { margin: -6px 0; padding: 3px 10px; border-radius: 6px; border: 1px solid #b26a00;
  background: #fff4e0; color: #5d3a00; font-size: 13px; line-height: 1.35; }"""
# the viewer gives the banner its height, so the whole image and the report still fit the screen (app.tabs.viewer)
BANNER_HEAD = "<style>body:has(.orapo-banner) { --orapo-above-viewer: 40px; }</style>"


def build_app(
    *, settings: Settings, database, registry=None, rounds=None, signin=None, warm_model: bool = False
) -> gr.Blocks:
    """The Blocks of the whole app. `rounds` (a `RoundScheduler`, default one with the default policy, whose
    leader jobs include the shared cache's sweep) is not started here: the server's lifespan (`launch_options`)
    starts it (it joins the election of servers on this database, `app.services.operations.leader`) and stops
    it, so building an app, as tests do, leaves no thread behind; with `warm_model` (as `orapo serve` asks) the lifespan also
    loads and warms the served model in the background. `signin` (a `SignInGuard`) defaults to the
    standard limits."""
    from app.services.accounts.signin import SignInGuard  # noqa: PLC0415 -- loads limits

    settings = web_settings(settings)
    # keep uploads in this server's folder in the data folder, where ingest deletes each one after use and the
    # sweeps delete the whole folder once this server stopped or died (app.services.operations.cache_sweep)
    cache = server_cache_dir(settings)
    cache.mkdir(parents=True, exist_ok=True)
    gradio_internals.use_cache_dir(cache)
    prune_downloads(settings, work=True)  # what a previous run left behind, once its download time is up
    # the leading server also sweeps every server's upload cache (app.services.operations.cache_sweep)
    if rounds is None:
        rounds = RoundScheduler(
            database, settings, leader_jobs=[(CACHE_SWEEP_JOB, lambda: _sweep_stale(settings, database), CACHE_SWEEP_S)]
        )
    registry = registry or ModelRegistry(settings, database)
    signin = signin if signin is not None else SignInGuard(database)
    ctx = AppContext(
        settings, database, registry, rounds, signin, SessionBook(), metrics=AppMetrics(settings, database, registry)
    )
    ctx.metrics.watch(registry, signin)  # drafts and failed sign-ins are counted where they happen

    with gr.Blocks(title="OraPO: chest X-ray reporting", delete_cache=(CACHE_SWEEP_S, CACHE_MAX_AGE_S)) as demo:
        with gr.Row(equal_height=True):
            gr.Markdown("## OraPO · chest X-ray report drafting")
            whoami = gr.Markdown(elem_id="orapo-whoami")
            # the same tab goes to /logout (a same-origin navigation, which the middleware accepts) and then to the
            # sign-in page: no signed-in page is left open behind
            gr.Button("Sign out", link="/logout", link_target="_self", size="sm", scale=0, elem_id="orapo-sign-out")
        # for everyone, while the served model learned from synthetic films only (issue 41 §5); set as the page
        # loads, so a promotion shows at the next load
        banner = gr.HTML(
            "",
            html_template=BANNER_TEMPLATE,
            css_template=BANNER_CSS,
            head=BANNER_HEAD,
            visible=False,
            elem_id="orapo-synthetic-banner",
        )
        with gr.Tabs() as tabs:
            with gr.Tab("Read", id="read", visible=False) as read_tab:
                read_ui = read.build(ctx)
            with gr.Tab("Worklist", id="worklist", visible=False) as worklist_tab:
                worklist_ui = worklist.build(ctx, worklist_tab)
            with gr.Tab("Dashboard", id="dashboard", visible=False) as dashboard_tab:
                dashboard_ui = dashboard.build(ctx)
            with gr.Tab("Admin", id="admin", visible=False) as admin_tab:
                admin.build(ctx, admin_tab)
            with gr.Tab("Rounds", id="rounds", visible=False) as rounds_tab:
                rounds_tab_module.build(ctx, rounds_tab)
            with gr.Tab("Account", id="account"):
                account_ui = account.build(ctx)
        worklist.wire_open(ctx, worklist_ui, read_ui, tabs)
        read.wire_page_load(ctx, read_ui, demo)
        dashboard.wire_select(dashboard_ui, dashboard_tab)

        @in_page()
        def session_start(request: gr.Request) -> Outputs:
            """Which tabs this user sees. Cosmetic only: every handler checks the role again."""
            user = ctx.user(request, allow_password_change=True)
            ready = not user.must_change_password
            note = f"Signed in as **{user.username}** ({user.role})"
            if not ready:
                note += " · **change your one-time password to continue**"
            try:
                warning = synthetic_banner(ctx.database, ctx.settings)
            except Exception as exc:  # no model to serve yet (drafting says so when asked): the page still opens
                log_failure("synthetic banner", exc)
                warning = None
            return {
                whoami: note,
                banner: gr.HTML(html.escape(warning or ""), visible=bool(warning)),
                read_tab: gr.Tab(visible=ready),
                worklist_tab: gr.Tab(visible=ready),
                dashboard_tab: gr.Tab(visible=ready),
                admin_tab: gr.Tab(visible=ready and user.is_admin),
                rounds_tab: gr.Tab(visible=ready and user.is_admin),
                tabs: gr.Tabs(selected="read" if ready else "account"),
            }

        outputs = [whoami, banner, read_tab, worklist_tab, dashboard_tab, admin_tab, rounds_tab, tabs]
        demo.load(session_start, outputs=outputs, api_name="session_start")
        account_ui.password_changed.then(session_start, outputs=outputs, api_visibility="private")
    ctx.admin_api.update(gradio_internals.api_names_under(demo, (admin_tab, rounds_tab)))
    # found by `server_lifespan` and the session middleware (app.web_security) once the server runs
    gradio_internals.attach_context(demo, ctx, warm_model=warm_model)
    demo.round_scheduler = ctx.rounds  # for whoever holds the Blocks: `orapo serve`'s close, tests
    gradio_internals.skip_placeholder_files(demo)
    return demo


def _sweep_stale(settings, database) -> None:
    report = sweep_stale(settings, database)
    if report.cache_files or report.exports:
        print(report.line("leader's cache sweep"), file=sys.stderr, flush=True)


def launch_options(settings: Settings, database) -> dict[str, Any]:
    """Keyword arguments for `demo.launch`: the sign-in page, the session middleware, the page's own scripts
    (`app.page_scripts`) and the upload limit."""
    from app.services.accounts.signin import ACCOUNT_FAILURES, WINDOW_MINUTES  # noqa: PLC0415 -- loads limits

    async def signed_in_only_through_the_middleware(username: str, password: str) -> bool:
        # `auth` makes Gradio show its sign-in page; the middleware answers every POST to /login itself
        # (throttled, audited, hashed off the event loop), so Gradio's own check never issues a token.
        return False

    settings = web_settings(settings)
    # uvicorn (which Gradio starts without naming them) believes X-Forwarded-For and -Proto from FORWARDED_ALLOW_IPS,
    # by default from 127.0.0.1: any local caller could then pick the address the sign-in limits count. Only the
    # proxies the site names are believed (ORAPO_TRUSTED_PROXIES; none by default). Read when `launch` starts the
    # server, right after this.
    os.environ["FORWARDED_ALLOW_IPS"] = settings.trusted_proxies
    return dict(
        auth=signed_in_only_through_the_middleware,
        auth_message=(
            "OraPO: sign in with your account. Ask an administrator if you have none. "
            f"After {ACCOUNT_FAILURES} failed sign-ins within {WINDOW_MINUTES} minutes an account waits "
            "before it may try again, longer after each further failure "
            "(an administrator can lift the wait)."
        ),
        app_kwargs={
            "middleware": [
                Middleware(RequireSession, settings=settings, database=database, admin_files=downloads_dir(settings))
            ],
            # behind the same middleware; /healthz and /readyz are among its public paths
            "routes": [
                *viewer_routes.routes(settings, database),
                *study_image_routes.routes(settings, database),
                *ops_routes.routes(settings, database),
            ],
            "lifespan": server_lifespan,
        },
        max_file_size=settings.max_upload_mb * 1024 * 1024,
        head=page_scripts.head(max_upload_mb=settings.max_upload_mb, file_types=FILE_TYPES),
        ssr_mode=False,
        show_error=False,
        share=False,
    )


async def _sweep_stale_uploads(ctx, every_s: float = 60.0) -> None:
    """Every minute: uploads no upload event stored within ORAPO_UPLOAD_TTL_MIN leave the cache (Gradio's own sweep
    would keep them up to an hour)."""
    book = getattr(ctx, "sessions", None)
    if book is None:
        return
    ttl_s = 60 * float(getattr(ctx.settings, "upload_ttl_min", 10.0))
    while True:
        await asyncio.sleep(min(every_s, ttl_s / 2))
        stale = book.stale_uploads(ttl_s)
        if stale:
            await to_thread.run_sync(delete_uploads, stale)


@contextlib.asynccontextmanager
async def server_lifespan(app):
    """Training rounds live as long as the server: recover and schedule at start, stop them at close. The served
    model starts loading (in the background) as the server starts, when the app was built to warm it."""
    # the session middleware answers before Gradio's CORS middleware does, and strips its headers (app.web_security)
    gradio_internals.outside_cors(app, RequireSession)
    ctx = gradio_internals.context_of(app)
    registry = getattr(ctx, "registry", None)
    if gradio_internals.warms_model(app) and hasattr(registry, "warm_in_background"):
        registry.warm_in_background()
    scheduler = getattr(ctx, "rounds", None)
    if scheduler is not None:
        await to_thread.run_sync(scheduler.start)  # start() first marks rounds a dead process left behind
    metrics = getattr(ctx, "metrics", None)
    if metrics is not None:
        metrics.start()  # with ORAPO_METRICS_PORT, the metrics on that port of 127.0.0.1 too
    uploads = asyncio.create_task(_sweep_stale_uploads(ctx))
    try:
        yield
    finally:
        uploads.cancel()
        if metrics is not None:
            await to_thread.run_sync(metrics.stop)  # its port closed and its thread ended
        if scheduler is not None:
            await to_thread.run_sync(scheduler.shutdown)
        if hasattr(registry, "close"):
            await to_thread.run_sync(registry.close)  # no thread left inside torch when the interpreter ends
        signin = getattr(ctx, "signin", None)
        if signin is not None and hasattr(signin, "flush_summaries"):
            await to_thread.run_sync(signin.flush_summaries)  # refusals counted but not yet written down
