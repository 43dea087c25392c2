"""Errors as values a user can act on: a stable code plus one plain sentence.

Every refusal the engine knows about is raised as `OrapoError` at the boundary
where it is detected; the CLI prints `code: message`, the app shows it as it is,
and neither ever shows a traceback to a clinician.
"""

from __future__ import annotations


class OrapoError(Exception):
    """A refusal with a machine-readable `code` and a human `message`."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    def as_dict(self) -> dict[str, str]:
        return {"error": self.code, "message": self.message}
