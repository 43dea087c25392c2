"""Every use of Gradio's internals, in one place: what the app relies on that Gradio does not promise.

The app builds on Gradio's public API (Blocks, components, `launch`), except
for these, each a detail of Gradio 6.31 (`PINNED_GRADIO`) read from its source:

- the cache folder comes from the environment only (`GRADIO_TEMP_DIR`);
- the running server is a `gradio.routes.App` whose `get_blocks()` returns the
  Blocks (how the session middleware and the lifespan find the `AppContext`);
- signed-in sessions are its `tokens` map (token -> username), read by Gradio's
  routes from the cookie `access-token-<cookie_id>` (or `access-token-unsecure-...`);
- the names of its HTTP routes the middleware treats specially;
- `File` / `UploadButton._process_single_file`, replaced to stop a stray temp file per upload;
- the uvicorn server `launch` keeps as `Blocks.server`;
- `launch` adds its CORS middleware (`CustomCORSMiddleware`, which echoes
  localhost origins with credentials) outside the app's own middleware, and
  Starlette builds the middleware stack from `user_middleware` when it is first
  called (the lifespan): `outside_cors` moves the session middleware out of it,
  so that it strips the CORS headers from every answer.
- its page closes its server connection in a window `beforeunload` listener that
  its own modules add, before the `head` scripts run; the unsaved-changes guard
  (`app.page_scripts.EARLY_HEAD`) is therefore put first in the page's `<head>`
  by the session middleware, and holds that listener back while it prompts.

`tests/test_gradio_internals.py` checks each against the installed Gradio, so
an upgrade that changes one fails there by name, not as a signed-out user or
an upload left in the cache. Nothing else in the app touches these.
"""

from __future__ import annotations

import os
import types
from pathlib import Path
from typing import Any

#: The Gradio every detail below was read from (pyproject.toml and constraints.txt pin the same).
PINNED_GRADIO = "6.31.0"

# Gradio's routes the session middleware names (`app.web_security`).
STARTUP_EVENTS_PATH = "/gradio_api/startup-events"  # launch() calls it, unauthenticated, to start the queue
DEEP_LINK_PATH = "/gradio_api/deep_link"  # a snapshot of a tab's state by its session hash
TOKEN_PATHS = frozenset({"/gradio_api/token", "/gradio_api/token/"})  # hands the HttpOnly session token to scripts
UPLOAD_PATHS = frozenset(
    {
        "/gradio_api/upload",
        "/gradio_api/component_server",
        "/gradio_api/component_server/",
        "/gradio_api/process_recording",
    }
)

_CONTEXT = "orapo_context"  # the attributes `attach_context` puts on the Blocks
_WARM_MODEL = "orapo_warm_model"


def use_cache_dir(path: str | Path) -> None:
    """Make `path` Gradio's upload and file cache for the Blocks built after this call.

    Gradio reads its cache folder only from the environment (`gradio.utils.get_upload_folder`, asked by each
    Blocks, component and server app as it is made), so this one process-wide write cannot be avoided; the last
    app built in a process decides. (Modules that read the variable at import, for screen recordings and MCP, are
    not used by this app.)"""
    os.environ["GRADIO_TEMP_DIR"] = str(path)


# -- the app's state, found from the running server -------------------------------------------------------


def attach_context(blocks, ctx, *, warm_model: bool = False) -> None:
    """Keep the app's `AppContext` (and whether the server warms the model) on the Blocks, for `context_of`."""
    setattr(blocks, _CONTEXT, ctx)
    setattr(blocks, _WARM_MODEL, bool(warm_model))


def blocks_of(app):
    """The Blocks a running Gradio server app serves, or None (not a Gradio app, or none configured yet)."""
    try:
        return app.get_blocks()
    except Exception:  # noqa: BLE001 - not a gradio.routes.App, or before launch configured it
        return None


def context_of(app_or_blocks) -> Any:
    """The `AppContext` `build_app` attached, from the running server app (a request scope's "app") or the Blocks."""
    blocks = app_or_blocks if hasattr(app_or_blocks, _CONTEXT) else blocks_of(app_or_blocks)
    return getattr(blocks, _CONTEXT, None)


def warms_model(app_or_blocks) -> bool:
    blocks = app_or_blocks if hasattr(app_or_blocks, _WARM_MODEL) else blocks_of(app_or_blocks)
    return bool(getattr(blocks, _WARM_MODEL, False))


# -- sessions: Gradio's token map and its cookies -----------------------------------------------------------


def cookie_names(app) -> tuple[str, str] | None:
    """(secure, plain) names of the session cookie Gradio's routes read, or None for an app that has none."""
    cookie_id = getattr(app, "cookie_id", None)
    if cookie_id is None:
        return None
    return f"access-token-{cookie_id}", f"access-token-unsecure-{cookie_id}"


def session_token(app, cookies) -> str | None:
    """The session token a request's cookies carry for `app`."""
    names = cookie_names(app)
    if names is None:
        return None
    return cookies.get(names[0]) or cookies.get(names[1])


def token_user(app, token: str | None) -> str | None:
    """Who Gradio takes the bearer of `token` to be (its routes ask the same map)."""
    tokens = getattr(app, "tokens", None)
    return tokens.get(token) if tokens is not None and token is not None else None


def has_sessions(app) -> bool:
    return getattr(app, "tokens", None) is not None


def grant_token(app, token: str, username: str) -> None:
    """Sign `username` in for Gradio's routes: a request with `token` in the session cookie is theirs."""
    app.tokens[token] = username


def revoke_tokens(app, *, token: str | None = None, username: str | None = None) -> None:
    """Forget `token`, and every token of `username`."""
    tokens = getattr(app, "tokens", None)
    if tokens is None:
        return
    if token is not None:
        tokens.pop(token, None)
    if username is not None:
        for t in [t for t, name in tokens.items() if name == username]:
            tokens.pop(t, None)


# -- uploads and the server ---------------------------------------------------------------------------------


def skip_placeholder_files(blocks) -> None:
    """Gradio's File and UploadButton (type "filepath", `_process_single_file`) create an empty temporary file in
    the cache for every file they pass to a handler, never use it and never delete it: one stray `tmp*` per
    upload. Each such component of `blocks` passes the same path here, without that file; bytes and Gradio's own
    refusal of a wrong file type still come from Gradio."""
    import gradio as gr

    for block in blocks.blocks.values():
        if isinstance(block, (gr.File, gr.UploadButton)):
            block._process_single_file = types.MethodType(_path_without_placeholder, block)


def _path_without_placeholder(component, f):
    from gradio.utils import NamedString
    from gradio_client.utils import is_valid_file

    if component.type != "filepath" or (component.file_types and not is_valid_file(f.path, component.file_types)):
        return type(component)._process_single_file(component, f)
    return NamedString(f.path)


def bound_graceful_shutdown(blocks, seconds: float) -> None:
    """How long closing the launched server waits for open requests before uvicorn runs the lifespan's shutdown."""
    blocks.server.config.timeout_graceful_shutdown = seconds


#: Gradio's CORS middleware, by class name (gradio.route_utils.CustomCORSMiddleware).
CORS_MIDDLEWARE = "CustomCORSMiddleware"


def outside_cors(app, cls) -> bool:
    """Put the middleware `cls` just outside Gradio's CORS middleware in `app`'s stack (Brotli stays outermost, so
    `cls` still sees uncompressed pages), and rebuild the stack; True if it moved. Called from the server's
    lifespan, before the first request is served."""
    entries = list(getattr(app, "user_middleware", None) or [])
    ours = [m for m in entries if m.cls is cls]
    cors = [i for i, m in enumerate(entries) if getattr(m.cls, "__name__", "") == CORS_MIDDLEWARE]
    if not ours or not cors or entries.index(ours[0]) < cors[0]:
        return False
    rest = [m for m in entries if m.cls is not cls]
    at = next(i for i, m in enumerate(rest) if getattr(m.cls, "__name__", "") == CORS_MIDDLEWARE)
    app.user_middleware = rest[:at] + ours + rest[at:]
    app.middleware_stack = app.build_middleware_stack()
    return True


def api_names_under(blocks, containers) -> set[str]:
    """The API names of the events every one of whose triggers lies inside one of `containers` (tabs): a
    `BlockFunction`'s `targets` are (block id, event) pairs, and each block knows its `parent`."""
    inside = {id(c) for c in containers}

    def within(block_id) -> bool:
        block = blocks.blocks.get(block_id) if block_id is not None else None
        while block is not None:
            if id(block) in inside:
                return True
            block = getattr(block, "parent", None)
        return False

    return {
        str(fn.api_name)
        for fn in blocks.fns.values()
        if fn.api_name and fn.targets and all(within(target[0]) for target in fn.targets)
    }
