"""The session middleware: what every HTTP request must pass before Gradio sees it.

Gradio's sign-in proves a name once, hashes on the event loop and keeps a token
forever; its routes check only that a token exists, serve any cached file by
path to any session, and key each tab's state by a session hash the browser
chooses. So this middleware, in front of every route:

- refuses every request that changes state (every method but GET, HEAD and
  OPTIONS, every WebSocket) unless the browser shows it came from the app's own
  page: `Sec-Fetch-Site: same-origin` and an `Origin` that is the app's own
  (`ORAPO_PUBLIC_URL` behind a proxy, else the host and port it was sent to), so
  a page of another origin (another port of the same host, a sibling subdomain,
  a sandboxed `null` origin) cannot act with a signed-in user's cookie; and
  strips every CORS header from every answer, so no other origin may read one
  with credentials (Gradio's own middleware would echo localhost origins);
- answers `POST /login` itself (`SignInGuard`: throttled, audited, hashed in a
  thread) and refuses a sign-in posted from another site (login CSRF);
  `/logout` signs out only a request that comes from the app's own pages;
- honours a session only while its account is active and its password is the
  one it signed in with (`SessionBook` + `UserRepository.session_stamp`), and
  only until it was idle `ORAPO_SESSION_IDLE_MIN` minutes (a click, an upload
  or a page load counts; the page's heartbeat does not) or signed in
  `ORAPO_SESSION_MAX_H` hours;
- serves a file under the admin exports folder only to an administrator,
  deciding on the path the route would resolve, for every route that takes a
  path (`file=`, `file/`, ...), whatever the URL's spelling;
- names the session's user in the request's scope (`SESSION_USER`) for the
  app's own routes (`app.viewer_routes`), which check it again;
- binds each Gradio session hash to the user who first used it, so another
  user's hash opens neither its state nor its event stream; deep links (a
  snapshot of a session's state by its hash) and `/gradio_api/token` (the
  HttpOnly session token handed to page scripts) are off;
- describes the API (Gradio's `/gradio_api/info` and the `window.gradio_api_info`
  its pages embed) to an administrator whole, to a radiologist without the
  administrators' endpoints, and to nobody signed in not at all; serves
  Gradio's monitoring (every function's call counts) and OpenAPI document to
  administrators only;
- puts the page's unsaved-changes guard (`app.page_scripts.EARLY_HEAD`) first
  in the `<head>` of Gradio's HTML pages served to a signed-in session, before
  Gradio's own scripts;
- puts a clear message on an upload refused for its size, and sends
  anti-framing and no-sniff headers (and HSTS with secure cookies) on every
  response.

Cookies are `SameSite=Lax` and `HttpOnly`, and `Secure` when the request came
over HTTPS or `ORAPO_SECURE_COOKIES=1` says a TLS proxy is in front.

Gradio's session tokens, cookie names and route names, and the `AppContext`
found from the running server, come through `app.gradio_internals`; what it
reads from bodies (a request's session hashes, an upload's cache paths), through
`app.web_bodies`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator

from anyio import to_thread
from starlette.requests import HTTPConnection  # noqa: TID253 -- this module is heavy; light ones import it lazily
from starlette.responses import JSONResponse  # noqa: TID253 -- this module is heavy; light ones import it lazily
from starlette.routing import compile_path  # noqa: TID253 -- this module is heavy; light ones import it lazily

from app import gradio_internals, web_signin
from app.gradio_internals import DEEP_LINK_PATH, STARTUP_EVENTS_PATH, TOKEN_PATHS, UPLOAD_PATHS
from app.page_scripts import EARLY_HEAD
from app.services.accounts.auth import is_admin
from app.services.operations.metrics import HEALTH_PATHS
from app.web_bodies import SAFE_METHODS, noting_uploads, session_hashes
from app.web_requests import (
    OWN_REFUSAL,
    cross_site,
    from_own_page,
    inside,
    route_templates,
    with_api_info,
    with_early_script,
    with_headers,
)
from db import UserRepository

# What a browser needs before it has a session: the sign-in page and its assets.
PUBLIC_PATHS = frozenset(
    {
        "/",
        "/favicon.ico",
        "/theme.css",
        "/gradio_api/theme.css",
        "/manifest.json",
        "/robots.txt",
        STARTUP_EVENTS_PATH,
        *HEALTH_PATHS,
    }
)  # health: for load balancers, saying nothing of anyone
PUBLIC_PREFIXES = ("/assets/", "/static/", "/pwa_icon", "/svelte/")
# Gradio's HTML pages: the app and the run history; with a session they get `EARLY_HEAD` first in <head>.
PAGE_PATHS = frozenset({"/", "/gradio_api/runs", "/gradio_api/runs/"})
SIGN_IN_PATHS = frozenset({"/login", "/login/"})
SIGN_OUT_PATHS = frozenset({"/logout", "/logout/"})
# Deep links snapshot a tab's state by its session hash; /token hands the HttpOnly session token to page scripts.
OFF_PATHS = frozenset({DEEP_LINK_PATH, *TOKEN_PATHS})
# Gradio's API description: narrowed to the endpoints the user may call (app.web_requests.with_api_info)
API_INFO_PATHS = frozenset({"/gradio_api/info", "/gradio_api/info/", "/info", "/info/"})
# Gradio's call counts of every function, its OpenAPI document and its monitoring pages: administrators only
ADMIN_ONLY_PREFIXES = ("/monitoring", "/gradio_api/monitoring", "/gradio_api/openapi.json", "/openapi.json")
UPLOAD_ROUTE = "/gradio_api/upload"  # Gradio's file upload: answers with the cache paths of what it stored
SESSION_USER = "orapo.username"  # the scope key naming the user of a request that passed the session check
# Routes that answer GET with a study's pixels: read only by the app's own page (a same-site page on another port
# shares the cookie, as SameSite counts no ports).
DATA_PREFIXES = ("/orapo/viewer/studies/",)


class RequireSession:
    """ASGI middleware; `launch_options` installs it with the settings, the database and the exports folder."""

    def __init__(self, app, settings=None, database=None, admin_files=None):
        self.app = app
        self.settings = settings
        self.database = database
        self.admin_files = os.path.realpath(admin_files) if admin_files is not None else None
        self.max_upload_mb = getattr(settings, "max_upload_mb", None)
        self._routes: tuple[tuple[int, int], list[tuple[re.Pattern, dict, str]]] | None = None

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        secure = bool(getattr(self.settings, "secure_cookies", False)) or scope.get("scheme") in ("https", "wss")
        path = scope.get("path", "")
        if scope["type"] == "http":
            send = with_headers(send, secure, self._upload_limit_message() if path in UPLOAD_PATHS else None)
        ctx = gradio_internals.context_of(scope.get("app"))
        if path in SIGN_IN_PATHS and scope.get("method") == "POST":
            await web_signin.sign_in(scope, receive, send, ctx, secure)
            return
        if path in SIGN_OUT_PATHS:
            await web_signin.sign_out(scope, receive, send, ctx, self.database)
            return
        exports = self._reaches_admin_files(scope)
        if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
            if self._foreign(scope, path):
                await _refuse_foreign(scope, receive, send)
                return
            if exports:
                await _refuse(scope, receive, send, 403, "Forbidden", "Exports are for administrators.")
                return
            if _page(scope):
                viewer = await self._session_user(scope, ctx)
                if viewer is not None:
                    send = with_early_script(send, EARLY_HEAD)  # the app's page; the sign-in page needs no guard
                keep = await self._api_shown(viewer, ctx)  # the sign-in page describes no endpoint at all
                if keep is not None:
                    send = with_api_info(send, keep)
            await self.app(scope, receive, send)
            return
        username = await self._session_user(scope, ctx)
        if username is None:
            await _refuse(scope, receive, send, 401, "Not authenticated", "Sign in first.", auth=True)
            return
        if self._foreign(scope, path):
            await _refuse_foreign(scope, receive, send)
            return
        if path in OFF_PATHS:
            await _refuse(scope, receive, send, 404, "Not found", "This route is turned off in this app.")
            return
        if exports and not await self._is_admin(username):
            await _refuse(scope, receive, send, 403, "Forbidden", "Exports are for administrators.")
            return
        if path.startswith(ADMIN_ONLY_PREFIXES) and not await self._is_admin(username):
            await _refuse(scope, receive, send, 403, "Forbidden", "This is for administrators.")
            return
        if path in API_INFO_PATHS or _page(scope):
            keep = await self._api_shown(username, ctx)
            if keep is not None:
                send = with_api_info(send, keep)
        receive, hashes, too_large = await session_hashes(scope, receive, self._matches(scope))
        if too_large:
            await _refuse(scope, receive, send, 413, "Too large", "This request is too large.")
            return
        book = getattr(ctx, "sessions", None)
        if book is not None and not all(book.claim_hash(h, username) for h in hashes):
            await _refuse(scope, receive, send, 403, "Forbidden", "This page session belongs to another user.")
            return
        scope[SESSION_USER] = username  # the app's own routes (app.viewer_routes) read who this is here
        if _page(scope):
            send = with_early_script(send, EARLY_HEAD)
        if path == UPLOAD_ROUTE and scope.get("method") == "POST" and book is not None:
            await self._upload(scope, receive, send, book, username)
            return
        await self.app(scope, receive, send)

    async def _upload(self, scope, receive, send, book, username: str) -> None:
        """Gradio's upload route, within the user's quota of bytes not yet stored (ORAPO_MAX_UPLOAD_INFLIGHT_MB),
        noting which cache paths it gave this session."""
        size = int(dict(scope.get("headers") or []).get(b"content-length", b"0") or 0)
        quota_mb = int(getattr(self.settings, "max_upload_inflight_mb", 200))
        if book.uploads_in_flight(username) + size > quota_mb * 1024 * 1024:
            await _refuse(
                scope,
                receive,
                send,
                413,
                "upload_quota",
                f"upload_quota: your uploads not yet stored would pass {quota_mb} MB "
                "(ORAPO_MAX_UPLOAD_INFLIGHT_MB); wait until they are stored, or send fewer files at once.",
            )
            return
        book.upload_started(username, size)
        try:
            await self.app(scope, receive, noting_uploads(send, book, _token(scope), size))
        finally:
            book.upload_ended(username, size)

    def _foreign(self, scope, path: str) -> bool:
        """A request that changes state (any method but GET, HEAD and OPTIONS; every WebSocket) or reads a study's
        pixels, not shown to come from the app's own page (`from_own_page`). Signing in and out check their own."""
        if path in SIGN_IN_PATHS or path in SIGN_OUT_PATHS:
            return False
        public_url = getattr(self.settings, "public_url", None)
        if scope["type"] == "websocket" or scope.get("method", "GET").upper() not in SAFE_METHODS:
            return not from_own_page(scope, public_url)
        if path.startswith(DATA_PREFIXES):
            return cross_site(scope)
        return False

    # -- sessions --------------------------------------------------------------------------------------------

    async def _session_user(self, scope, ctx) -> str | None:
        """The user of the request's session, checked now: a known token, an active account, the same password."""
        app, book = scope.get("app"), getattr(ctx, "sessions", None)
        token = _token(scope)
        if token is None or not gradio_internals.has_sessions(app) or book is None:
            return None
        username, session = gradio_internals.token_user(app, token), book.get(token)
        if username is None or session is None or session.username != username:
            # a token this server did not issue through the guard, or one ended since
            gradio_internals.revoke_tokens(app, token=token)
            book.end(token)
            return None
        stamp = await to_thread.run_sync(self._stamp, username)
        if not book.honours(token, stamp):  # disabled, gone, or the password changed since sign-in
            gradio_internals.revoke_tokens(app, token=token)
            book.end(token)
            return None
        idle_s = 60 * float(getattr(self.settings, "session_idle_min", 30.0))
        max_s = 3600 * float(getattr(self.settings, "session_max_h", 12.0))
        if book.expired(token, idle_s=idle_s, max_s=max_s):  # ORAPO_SESSION_IDLE_MIN, ORAPO_SESSION_MAX_H
            gradio_internals.revoke_tokens(app, token=token)
            book.end(token)
            return None
        if _page(scope) or scope.get("type") == "websocket" or scope.get("method", "GET").upper() not in SAFE_METHODS:
            book.touch(token)  # a click, an upload, a page load; a heartbeat or an event stream is not the reader
        return username

    def _stamp(self, username: str) -> str | None:
        return UserRepository(self.database).session_stamp(username)

    async def _is_admin(self, username: str) -> bool:
        return await to_thread.run_sync(is_admin, self.database, username)

    async def _api_shown(self, username: str | None, ctx) -> Callable[[str], bool] | None:
        """Which endpoints of the API description this user may see: an administrator all (None: no filter), a
        radiologist those that are not an administrator's (`AppContext.admin_api`), nobody signed in none."""
        if username is None:
            return lambda name: False
        if await self._is_admin(username):
            return None
        admin_api = frozenset(getattr(ctx, "admin_api", None) or ())
        return lambda name: name.lstrip("/") not in admin_api

    # -- files -----------------------------------------------------------------------------------------------

    def _reaches_admin_files(self, scope) -> bool:
        """Whether any route that takes a path would resolve this request's path into the admin exports folder.

        Each route whose template takes a path (`{...:path}`) is matched against the request's (already
        percent-decoded) path as Starlette matches it, and each of its parameters is resolved the way Gradio's file
        routes resolve a path (absolute against the working folder), symbolic links followed. Public routes
        (`/static/`, `/assets/`, ...) are asked too, before any session is."""
        if self.admin_files is None:
            return False
        for params in self._matches(scope):
            for value in params.values():
                if inside(value, self.admin_files):
                    return True
        return False

    def _matches(self, scope) -> Iterator[dict[str, str]]:
        app = scope.get("app")
        routes = getattr(app, "routes", None)
        if routes is None:
            return
        version = id(routes), len(routes)
        if self._routes is None or self._routes[0] != version:
            compiled = []
            for template in sorted(set(route_templates(routes))):
                if ":path}" in template or "{session_hash}" in template:
                    regex, _, convertors = compile_path(template)
                    compiled.append((regex, convertors, template))
            self._routes = (version, compiled)
        path = scope.get("path", "")
        for regex, convertors, _ in self._routes[1]:
            found = regex.match(path)
            if found:
                yield {k: str(convertors[k].convert(v)) if k in convertors else v for k, v in found.groupdict().items()}

    def _upload_limit_message(self) -> str | None:
        if self.max_upload_mb is None:
            return None
        return (
            f"file_too_large: This file is larger than the upload limit of {self.max_upload_mb} MB "
            "(ORAPO_MAX_UPLOAD_MB); it was not stored."
        )


def _page(scope) -> bool:
    """A request for one of Gradio's HTML pages, whose <head> starts with the unsaved-changes guard
    (`app.page_scripts.EARLY_HEAD`: before Gradio's scripts add their own listeners)."""
    return scope.get("type") == "http" and scope.get("method") == "GET" and scope.get("path") in PAGE_PATHS


def _token(scope) -> str | None:
    return gradio_internals.session_token(scope.get("app"), HTTPConnection(scope).cookies)


async def _refuse_foreign(scope, receive, send) -> None:
    await _refuse(
        scope,
        receive,
        send,
        403,
        "Forbidden",
        "A request from another site (or without its Origin) is refused; use the app's own page.",
    )


async def _refuse(scope, receive, send, status: int, error: str, message: str, *, auth: bool = False) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    detail = {"error": error, "auth_message" if auth else "message": message}
    # marked as the middleware's own answer: an upload's 413 is not rewritten as "too large" (app.web_requests)
    await JSONResponse({"detail": detail}, status_code=status, headers={OWN_REFUSAL: "1"})(scope, receive, send)
