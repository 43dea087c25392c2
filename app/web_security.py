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
  one it signed in with (`SessionBook` + `UserRepository.session_stamp`);
- serves a file under the admin exports folder only to an administrator,
  deciding on the path the route would resolve, for every route that takes a
  path (`file=`, `file/`, ...), whatever the URL's spelling;
- names the session's user in the request's scope (`SESSION_USER`) for the
  app's own routes (`app.viewer_routes`), which check it again;
- binds each Gradio session hash to the user who first used it, so another
  user's hash opens neither its state nor its event stream; deep links (a
  snapshot of a session's state by its hash) and `/gradio_api/token` (the
  HttpOnly session token handed to page scripts) are off;
- puts the page's unsaved-changes guard (`app.page_scripts.EARLY_HEAD`) first
  in the `<head>` of Gradio's HTML pages served to a signed-in session, before
  Gradio's own scripts;
- puts a clear message on an upload refused for its size, and sends
  anti-framing and no-sniff headers (and HSTS with secure cookies) on every
  response.

Cookies are `SameSite=Lax` and `HttpOnly`, and `Secure` when the request came
over HTTPS or `ORAPO_SECURE_COOKIES=1` says a TLS proxy is in front.

Gradio's session tokens, cookie names and route names, and the `AppContext`
found from the running server, come through `app.gradio_internals`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs

from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import compile_path

from app import gradio_internals
from app.gradio_internals import DEEP_LINK_PATH, STARTUP_EVENTS_PATH, TOKEN_PATHS, UPLOAD_PATHS
from app.page_scripts import EARLY_HEAD
from app.web_requests import (client_address, cross_site, from_own_page, inside, route_templates, same_origin,
                              with_early_script, with_headers)

# What a browser needs before it has a session: the sign-in page and its assets.
PUBLIC_PATHS = frozenset({"/", "/favicon.ico", "/theme.css", "/gradio_api/theme.css", "/manifest.json", "/robots.txt",
                          STARTUP_EVENTS_PATH})
PUBLIC_PREFIXES = ("/assets/", "/static/", "/pwa_icon", "/svelte/")
# Gradio's HTML pages: the app and the run history; with a session they get `EARLY_HEAD` first in <head>.
PAGE_PATHS = frozenset({"/", "/gradio_api/runs", "/gradio_api/runs/"})
SIGN_IN_PATHS = frozenset({"/login", "/login/"})
SIGN_OUT_PATHS = frozenset({"/logout", "/logout/"})
# Deep links snapshot a tab's state by its session hash; /token hands the HttpOnly session token to page scripts.
OFF_PATHS = frozenset({DEEP_LINK_PATH, *TOKEN_PATHS})
MAX_SIGN_IN_BODY = 16 * 1024
MAX_JSON_BODY = 10 * 1024 * 1024  # event payloads carry text and file references, never file bytes
SESSION_USER = "orapo.username"  # the scope key naming the user of a request that passed the session check
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
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
            await self._sign_in(scope, receive, send, ctx, secure)
            return
        if path in SIGN_OUT_PATHS:
            await self._sign_out(scope, receive, send, ctx)
            return
        exports = self._reaches_admin_files(scope)
        if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
            if self._foreign(scope, path):
                await _refuse_foreign(scope, receive, send)
                return
            if exports:
                await _refuse(scope, receive, send, 403, "Forbidden", "Exports are for administrators.")
                return
            if _page(scope) and await self._session_user(scope, ctx) is not None:
                send = with_early_script(send, EARLY_HEAD)  # the app's page; the sign-in page needs no guard
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
        receive, hashes, too_large = await self._session_hashes(scope, receive)
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
        await self.app(scope, receive, send)

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

    # -- sign-in and sign-out ----------------------------------------------------------------------------------

    async def _sign_in(self, scope, receive, send, ctx, secure: bool) -> None:
        guard, book, app = getattr(ctx, "signin", None), getattr(ctx, "sessions", None), scope.get("app")
        if guard is None or book is None:
            await JSONResponse({"detail": "Sign-in is not available."}, status_code=503)(scope, receive, send)
            return
        if cross_site(scope):
            await JSONResponse({"detail": "A sign-in posted from another site is refused."},
                               status_code=403)(scope, receive, send)
            return
        request = Request(scope, receive)
        if int(request.headers.get("content-length") or 0) > MAX_SIGN_IN_BODY:
            await JSONResponse({"detail": "Request too large."}, status_code=413)(scope, receive, send)
            return
        try:
            form = await request.form(max_files=0, max_fields=8)
            username, password = str(form.get("username") or ""), str(form.get("password") or "")
        except Exception:  # a malformed form: no credentials to check
            await JSONResponse({"detail": "Send a username and a password."}, status_code=400)(scope, receive, send)
            return
        if not username.strip() or not password:
            await JSONResponse({"detail": "Send a username and a password."}, status_code=400)(scope, receive, send)
            return
        address = client_address(scope)
        result = await guard.sign_in(username, password, address)
        if result.outcome == "locked":
            response: Response = JSONResponse({"detail": result.message}, status_code=429,
                                              headers={"Retry-After": str(result.retry_after_s)})
        elif not result.ok:
            response = JSONResponse({"detail": "Incorrect credentials."}, status_code=400)
        else:
            token = book.open(result.username, result.stamp, address)
            gradio_internals.grant_token(app, token, result.username)
            response = JSONResponse({"success": True})
            secure_name, plain_name = gradio_internals.cookie_names(app)
            response.set_cookie(secure_name if secure else plain_name, token, httponly=True, samesite="lax",
                                secure=secure, path="/")
        await response(scope, receive, send)

    async def _sign_out(self, scope, receive, send, ctx) -> None:
        from anyio import to_thread

        # A link in the page (GET) must show that it came from the app itself; a POST must not come from elsewhere.
        allowed = same_origin(scope) if scope.get("method") in ("GET", "HEAD") else not cross_site(scope)
        if not allowed:
            await JSONResponse({"detail": "A sign-out requested by another site is refused."},
                               status_code=403)(scope, receive, send)
            return
        app, book = scope.get("app"), getattr(ctx, "sessions", None)
        token = _token(scope)
        session = book.end(token) if book is not None else None
        ended = 0
        if session is not None:
            # as Gradio's own sign-out does: every session of this user ends, not only this browser's
            ended = 1 + book.end_user(session.username)
            gradio_internals.revoke_tokens(app, username=session.username)
            await to_thread.run_sync(self._audit_sign_out, session, client_address(scope), ended)
        gradio_internals.revoke_tokens(app, token=token)
        response = RedirectResponse(url="/", status_code=302)
        for name in gradio_internals.cookie_names(app) or ():
            response.delete_cookie(name, path="/")
        await response(scope, receive, send)

    def _audit_sign_out(self, session, address: str, ended: int) -> None:
        from db import AuditRepository, UserRepository
        from orapo_core.errors import OrapoError

        try:
            actor: Any = UserRepository(self.database).get_by_username(session.username)
        except OrapoError:
            actor = session.username
        AuditRepository(self.database).append("auth.sign_out", actor=actor, object_type="user",
                                              object_id=getattr(actor, "id", None),
                                              details={"address": address, "sessions_ended": ended})

    # -- sessions --------------------------------------------------------------------------------------------

    async def _session_user(self, scope, ctx) -> str | None:
        """The user of the request's session, checked now: a known token, an active account, the same password."""
        from anyio import to_thread

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
        return username

    def _stamp(self, username: str) -> str | None:
        from db import UserRepository

        return UserRepository(self.database).session_stamp(username)

    async def _is_admin(self, username: str) -> bool:
        from anyio import to_thread

        from app.services.auth import is_admin

        return await to_thread.run_sync(is_admin, self.database, username)

    async def _session_hashes(self, scope, receive):
        """The Gradio session hashes a request names (path, query or JSON body); the body is read and replayed."""
        hashes = set(parse_qs(scope.get("query_string", b"").decode("latin-1")).get("session_hash", []))
        for params in self._matches(scope):
            if "session_hash" in params:
                hashes.add(params["session_hash"])
        headers = dict(scope.get("headers") or [])
        content_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if scope["type"] != "http" or scope.get("method") != "POST" or content_type != b"application/json":
            return receive, hashes, False
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > MAX_JSON_BODY:
                return receive, hashes, True
        body = b"".join(chunks)
        try:
            data = json.loads(body or b"null")
        except ValueError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("session_hash"), str):
            hashes.add(data["session_hash"])
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay, hashes, False

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
        return (f"file_too_large: This file is larger than the upload limit of {self.max_upload_mb} MB "
                "(ORAPO_MAX_UPLOAD_MB); it was not stored.")


def _page(scope) -> bool:
    """A request for one of Gradio's HTML pages, whose <head> starts with the unsaved-changes guard
    (`app.page_scripts.EARLY_HEAD`: before Gradio's scripts add their own listeners)."""
    return scope["type"] == "http" and scope.get("method") == "GET" and scope.get("path") in PAGE_PATHS


def _token(scope) -> str | None:
    return gradio_internals.session_token(scope.get("app"), HTTPConnection(scope).cookies)


async def _refuse_foreign(scope, receive, send) -> None:
    await _refuse(scope, receive, send, 403, "Forbidden",
                  "A request from another site (or without its Origin) is refused; use the app's own page.")


async def _refuse(scope, receive, send, status: int, error: str, message: str, *, auth: bool = False) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    detail = {"error": error, "auth_message" if auth else "message": message}
    await JSONResponse({"detail": detail}, status_code=status)(scope, receive, send)
