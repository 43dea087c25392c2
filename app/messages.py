"""A refused action is a message in the page, never an "Error" badge over the panels.

When a Gradio handler raises, the page puts a red "Error" badge over every
output of the event: the last good values (a users table, a report being
written, the whole Rounds tab) disappear under it and typing is blocked until it
is dismissed. So every handler is wrapped in `in_page`: an `OrapoError` becomes
a toast and, where the handler has a status line, the same sentence there;
every other output keeps what it showed (`gr.skip()`). An unexpected exception
is logged with its traceback and shown the same way, in general words.

Scripts are different: gradio_client (and Gradio's MCP bridge) say who they are
in the `x-gradio-user` header, and get the error they need to stop on.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import gradio as gr

from orapo_core.errors import OrapoError

log = logging.getLogger("orapo.app")
SCRIPT_CALLERS = frozenset({"api", "mcp"})  # what gradio_client and Gradio's MCP bridge send in x-gradio-user
UNEXPECTED = ("Unexpected error", "This action stopped on an unexpected error and may not have finished; what the "
                                  "page shows is unchanged. Try again, and tell an administrator if it happens again.")


def title_of(exc: OrapoError) -> str:
    """A refusal's code as a toast title: `duplicate_user` -> "Duplicate user"."""
    return exc.code.replace("_", " ").capitalize()


def status_line(exc: OrapoError) -> str:
    """A refusal as the sentence a status line shows."""
    return f"**{title_of(exc)}.** {exc.message}"


def from_a_script(request: Any) -> bool:
    """Whether the request came from a script (gradio_client, MCP) rather than the app's page."""
    headers = getattr(request, "headers", None)
    if headers is None:
        return False
    return (headers.get("x-gradio-user") or "").lower() in SCRIPT_CALLERS


def _request(args: tuple, kwargs: dict) -> Any:
    """The handler's request: its `request` argument, or whichever argument is a gr.Request."""
    if kwargs.get("request") is not None:
        return kwargs["request"]
    return next((a for a in (*args, *kwargs.values()) if isinstance(a, gr.Request)), None)


def in_page(status: gr.components.Component | None = None) -> Callable[[Callable], Callable]:
    """Wrap a handler so that a refusal leaves its outputs as they were and says why.

    `status` (one of the event's outputs, never its only one) receives the sentence as well as the toast;
    an event whose outputs include no status line shows the toast alone. Gradio sees the handler's own
    signature (`gr.Request`, `gr.Progress`, `gr.SelectData` are found through `functools.wraps`).
    """

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def handler(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except OrapoError as exc:
                if from_a_script(_request(args, kwargs)):
                    raise gr.Error(exc.message, title=title_of(exc)) from exc
                gr.Warning(exc.message, title=title_of(exc))
                return {status: status_line(exc)} if status is not None else gr.skip()
            except Exception:
                if from_a_script(_request(args, kwargs)):
                    raise
                log.exception("handler %s failed", getattr(fn, "__qualname__", fn))
                gr.Warning(UNEXPECTED[1], title=UNEXPECTED[0])
                return {status: f"**{UNEXPECTED[0]}.** {UNEXPECTED[1]}"} if status is not None else gr.skip()

        return handler

    return wrap
