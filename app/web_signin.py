"""Signing in and out, answered by the session middleware (`app.web_security`) before Gradio sees the request.

`POST /login` is refused when posted from another site (login CSRF), checked by
the `SignInGuard` (throttled, audited, hashed in a thread) and answered with the
session cookie (`HttpOnly`, `SameSite=Lax`, `Secure` over HTTPS); `/logout` ends
every session of its user, but only for a request that shows it came from the
app's own page.
"""

from __future__ import annotations

from typing import Any

from anyio import to_thread
from starlette.requests import (  # noqa: TID253 -- this module is heavy; light ones import it lazily
    HTTPConnection,
    Request,
)
from starlette.responses import (  # noqa: TID253 -- this module is heavy; light ones import it lazily
    JSONResponse,
    RedirectResponse,
    Response,
)

from app import gradio_internals
from app.web_requests import client_address, cross_site, same_origin
from db import AuditRepository, UserRepository
from orapo_core.errors import OrapoError

MAX_SIGN_IN_BODY = 16 * 1024


def _token(scope) -> str | None:
    return gradio_internals.session_token(scope.get("app"), HTTPConnection(scope).cookies)


async def sign_in(scope, receive, send, ctx, secure: bool) -> None:
    """Answer `POST /login`: refused from another site, throttled and audited by the `SignInGuard`, and a session
    cookie on success."""
    guard, book, app = getattr(ctx, "signin", None), getattr(ctx, "sessions", None), scope.get("app")
    if guard is None or book is None:
        await JSONResponse({"detail": "Sign-in is not available."}, status_code=503)(scope, receive, send)
        return
    if cross_site(scope):
        await JSONResponse({"detail": "A sign-in posted from another site is refused."}, status_code=403)(
            scope, receive, send
        )
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
        response: Response = JSONResponse(
            {"detail": result.message}, status_code=429, headers={"Retry-After": str(result.retry_after_s)}
        )
    elif not result.ok:
        response = JSONResponse({"detail": "Incorrect credentials."}, status_code=400)
    else:
        token = book.open(result.username, result.stamp, address)
        gradio_internals.grant_token(app, token, result.username)
        response = JSONResponse({"success": True})
        secure_name, plain_name = gradio_internals.cookie_names(app)
        response.set_cookie(
            secure_name if secure else plain_name, token, httponly=True, samesite="lax", secure=secure, path="/"
        )
    await response(scope, receive, send)


async def sign_out(scope, receive, send, ctx, database) -> None:
    """Answer `/logout`: only a request from the app's own page ends the sessions of its user."""
    # A link in the page (GET) must show that it came from the app itself; a POST must not come from elsewhere.
    allowed = same_origin(scope) if scope.get("method") in ("GET", "HEAD") else not cross_site(scope)
    if not allowed:
        await JSONResponse({"detail": "A sign-out requested by another site is refused."}, status_code=403)(
            scope, receive, send
        )
        return
    app, book = scope.get("app"), getattr(ctx, "sessions", None)
    token = _token(scope)
    session = book.end(token) if book is not None else None
    ended = 0
    if session is not None:
        # as Gradio's own sign-out does: every session of this user ends, not only this browser's
        ended = 1 + book.end_user(session.username)
        gradio_internals.revoke_tokens(app, username=session.username)
        await to_thread.run_sync(_audit_sign_out, database, session, client_address(scope), ended)
    gradio_internals.revoke_tokens(app, token=token)
    response = RedirectResponse(url="/", status_code=302)
    for name in gradio_internals.cookie_names(app) or ():
        response.delete_cookie(name, path="/")
    await response(scope, receive, send)


def _audit_sign_out(database, session, address: str, ended: int) -> None:
    try:
        actor: Any = UserRepository(database).get_by_username(session.username)
    except OrapoError:
        actor = session.username
    AuditRepository(database).append(
        "auth.sign_out",
        actor=actor,
        object_type="user",
        object_id=getattr(actor, "id", None),
        details={"address": address, "sessions_ended": ended},
    )
