"""What every tab's handlers share, made once per app by `build_app` (app.server): the app's state in one place.

Gradio shares module state across every user, so the app keeps none: the
settings, the database, the served models, the round scheduler and the
sign-in state live in one `AppContext`, which `build_app` makes and hands to
each tab's `build(ctx)`. The session middleware and the server's lifespan find
the same object through the running server (`app.gradio_internals.context_of`).
Tabs import this module, never `app.server`, which imports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gradio as gr  # noqa: TID253 -- this module is heavy; light ones import it lazily

from app.services.accounts.auth import signed_in
from app.settings import WebSettings


@dataclass(frozen=True)
class AppContext:
    """What every tab's handlers share: configuration, the database and the served models."""

    settings: WebSettings
    database: Any
    registry: Any
    rounds: Any = None  # the app's RoundScheduler: its `.service` runs rounds; started and stopped with the server
    signin: Any = None  # the SignInGuard the session middleware signs in with (lockouts are lifted here)
    sessions: Any = None  # the SessionBook: who each session token and session hash belongs to
    # the API names of the administrators' tabs (Admin, Rounds), filled once the tabs are built: the session
    # middleware leaves them out of the API description a radiologist is shown
    admin_api: set[str] = field(default_factory=set)
    # the app's `app.services.operations.metrics.AppMetrics`: Prometheus counters, served at /metrics
    metrics: Any = None

    def user(self, request: gr.Request | None, *, role: str | None = None, allow_password_change: bool = False):
        return signed_in(
            self.database, getattr(request, "username", None), role=role, allow_password_change=allow_password_change
        )
