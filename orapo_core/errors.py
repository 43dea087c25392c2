"""Errors as values a user can act on: a stable code plus one plain sentence.

Every refusal the engine knows about is raised as `OrapoError` at the boundary
where it is detected; the CLI prints `code: message`, the app shows it as it is,
and neither ever shows a traceback to a clinician.
"""

from __future__ import annotations

import traceback


class OrapoError(Exception):
    """A refusal with a machine-readable `code` and a human `message`."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    def as_dict(self) -> dict[str, str]:
        return {"error": self.code, "message": self.message}


def log_line(exc: BaseException) -> str:
    """An exception as one log line without its message: a refusal's code, or an unexpected exception's type and
    where it was raised (file:line of each frame, innermost last). Messages are left out because they carry what
    the code had at hand — a file name, a header value — and a log must hold no patient data.
    `ORAPO_DEBUG=1` (read by the callers) logs the whole traceback instead, on a machine where that is allowed."""
    if isinstance(exc, OrapoError):
        return f"refused: {exc.code}"
    frames = traceback.extract_tb(exc.__traceback__)[-4:]
    where = " <- ".join(f"{_short_path(f.filename)}:{f.lineno}" for f in reversed(frames))
    return f"{type(exc).__module__}.{type(exc).__qualname__} at {where or 'unknown'}"


def _short_path(filename: str) -> str:
    parts = filename.replace("\\", "/").split("/")
    for anchor in ("site-packages", "app", "orapo_core", "db"):
        if anchor in parts:
            return "/".join(parts[parts.index(anchor) + (anchor == "site-packages") :])
    return parts[-1]
