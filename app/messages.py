"""A refused action is a message in the page, never an "Error" badge over the panels.

When a Gradio handler raises, the page puts a red "Error" badge over every
output of the event: the last good values (a users table, a report being
written, the whole Rounds tab) disappear under it and typing is blocked until it
is dismissed. So every handler is wrapped in `in_page`: an `OrapoError` becomes
a toast and, where the handler has a status line, the same sentence there;
every other output keeps what it showed (`gr.skip()`). An unexpected exception
is shown the same way, in general words. Either is logged as one line
(`log_failure`: the refusal's code, or the exception's type and where it was
raised), never with its message or a traceback: messages name files and carry
header values, and the server's log must hold no patient data.

Scripts are different: gradio_client (and Gradio's MCP bridge) say who they are
in the `x-gradio-user` header, and get the error they need to stop on.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

import gradio as gr  # noqa: TID253 -- this module is heavy; light ones import it lazily

from orapo_core.errors import OrapoError, log_line

log = logging.getLogger("orapo.app")
SCRIPT_CALLERS = frozenset({"api", "mcp"})  # what gradio_client and Gradio's MCP bridge send in x-gradio-user
UNEXPECTED = (
    "Unexpected error",
    "This action stopped on an unexpected error and may not have finished; what the "
    "page shows is unchanged. Try again, and tell an administrator if it happens again.",
)


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


def log_failure(what: str, exc: BaseException, *, logger: logging.Logger | None = None) -> None:
    """One line in the server's log for a failure: a refusal's code, or an unexpected exception's type and where it
    was raised, never its message (which may name a file or carry a header value) nor a traceback, unless
    `ORAPO_DEBUG=1` asks for the traceback."""
    logger = logger or log
    if os.environ.get("ORAPO_DEBUG") == "1":
        logger.error("%s failed", what, exc_info=exc)
    elif isinstance(exc, OrapoError):
        logger.info("%s %s", what, log_line(exc))
    else:
        logger.error("%s failed: %s", what, log_line(exc))


def in_page(status: gr.components.Component | None = None) -> Callable[[Callable], Callable]:
    """Wrap a handler so that a refusal leaves its outputs as they were and says why.

    `status` (one of the event's outputs, never its only one) receives the sentence as well as the toast;
    an event whose outputs include no status line shows the toast alone. Gradio sees the handler's own
    signature (`gr.Request`, `gr.Progress`, `gr.SelectData` are found through `functools.wraps`).
    """

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def handler(*args, **kwargs):
            name = f"handler {getattr(fn, '__qualname__', fn)}"
            try:
                return fn(*args, **kwargs)
            except OrapoError as exc:
                log_failure(name, exc)
                if from_a_script(_request(args, kwargs)):
                    # one line above, not Gradio's traceback (print_exception): the log holds no patient data
                    raise gr.Error(exc.message, title=title_of(exc), print_exception=False) from None
                gr.Warning(exc.message, title=title_of(exc))
                return {status: status_line(exc)} if status is not None else gr.skip()
            except Exception as exc:
                log_failure(name, exc)
                if from_a_script(_request(args, kwargs)):
                    raise gr.Error(UNEXPECTED[1], title=UNEXPECTED[0], print_exception=False) from None
                gr.Warning(UNEXPECTED[1], title=UNEXPECTED[0])
                return {status: f"**{UNEXPECTED[0]}.** {UNEXPECTED[1]}"} if status is not None else gr.skip()

        return handler

    return wrap
