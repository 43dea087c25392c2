"""The product's settings beyond the engine's: where the server listens, which database, the web limits.

The engine (`orapo_core.config.Settings`) knows the data folder, the model and
de-identification; it serves nothing and stores no rows. What only the app and
its database need lives here, read from the same `ORAPO_*` environment
variables: `WebSettings` is the engine's `Settings` plus these fields, so one
object goes to both layers. Like `Settings`, it is built where it is needed,
never held in a module global.

`web_settings` lifts an engine `Settings` (what engine-only callers and many
tests build) into a `WebSettings`: its own values kept, the web fields read from
the environment as before the split.
"""

from __future__ import annotations

from pydantic import Field  # noqa: TID253 -- this module is heavy; light ones import it lazily

from orapo_core.config import Settings

#: How many loaded models (base + adapter) the web process keeps: the served one and the one served before it,
#: so that a rollback drafts at once; ORAPO_MAX_RESIDENT_MODELS.
DEFAULT_MAX_RESIDENT_MODELS = 2

#: The share of uploads held out for the gate (`db.repositories.studies.HOLDOUT_FRACTION`); ORAPO_HOLDOUT_FRACTION.
DEFAULT_HOLDOUT_FRACTION = 0.1


class WebSettings(Settings):
    """`Settings` plus what only the app and its database read (the env variable names are unchanged)."""

    database_url: str | None = Field(
        default=None,
        description="Any SQLAlchemy URL, e.g. `postgresql+psycopg://user:pw@host/db` to scale out; default the SQLite file in the data folder.",
    )
    host: str = Field(default="127.0.0.1", description="Address `orapo serve` binds to.")
    port: int = Field(default=7860, description="Port `orapo serve` listens on.")
    max_upload_mb: int = Field(
        default=100,
        ge=1,
        description="An uploaded file larger than this many MiB is refused (`file_too_large`), by the page before it is sent and by the server.",
    )
    public_url: str | None = Field(
        default=None,
        description="The address users open the app at when a proxy serves it (e.g. https://orapo.example-hospital.org); a request that changes state must come from this origin. Unset: the host and port the request was sent to.",
    )
    session_idle_min: float = Field(
        default=30.0,
        gt=0,
        description="A session that made no request of its own (a click, an upload, a page load; not the page's heartbeat) for this many minutes ends: the next request signs it out.",
    )
    session_max_h: float = Field(
        default=12.0, gt=0, description="A session ends this many hours after its sign-in, however active."
    )
    trusted_proxies: str = Field(
        default="",
        description="Comma-separated addresses of the reverse proxies whose X-Forwarded-For and X-Forwarded-Proto the server believes (e.g. 127.0.0.1 for nginx on the same host). Empty: none, so no caller can choose the address the sign-in limits count.",
    )
    max_upload_inflight_mb: int = Field(
        default=200,
        ge=1,
        description="The most MiB one user's uploads may hold in the upload cache before upload events store them; a larger upload is refused (upload_quota).",
    )
    upload_ttl_min: float = Field(
        default=10.0,
        gt=0,
        description="An upload that no upload event stored within this many minutes is deleted from the upload cache.",
    )
    secure_cookies: bool = Field(
        default=False,
        description="Mark the session cookie Secure and send HSTS; set it when a TLS proxy serves the app over HTTPS (a request that arrives as https, or with `X-Forwarded-Proto: https` from a proxy in ORAPO_TRUSTED_PROXIES, gets both anyway).",
    )
    leader_lease_s: float = Field(
        default=15.0,
        ge=1.0,
        description="Several servers on one database: the one holding the leader lease runs scheduled rounds, recovery and sweeps; another takes over at most this long plus a third of it after the leader dies (app.services.operations.leader).",
    )
    round_check_s: float = Field(
        default=60.0,
        gt=0,
        description="How often the leading server checks the corrections threshold, picks up schedule changes saved elsewhere and fails rounds whose server is gone.",
    )
    draft_wait_ms: float = Field(
        default=20.0,
        ge=0,
        le=5000,
        description="How long a draft asked while the model is idle waits for other readers' drafts to prefill with it (a draft asked while others decode joins them at the next step anyway).",
    )
    max_resident_models: int = Field(
        default=DEFAULT_MAX_RESIDENT_MODELS,
        ge=1,
        description="How many models (base + adapter) the web process keeps loaded: the served one and the most recently used others, so a rollback to the previous version drafts at once; the least recently used is unloaded once its drafts in flight finish. Versions on one base folder (the baseline and a round's LoRA candidate) share one copy of the base, each adapter loaded on it by name.",
    )
    holdout_fraction: float = Field(
        default=DEFAULT_HOLDOUT_FRACTION,
        ge=0.0,
        le=0.5,
        description="Share of newly uploaded studies kept out of training, chosen from each study's hashed StudyInstanceUID: their signed reports are the held-out set on which the gate judges a round's candidate (topped up with PhantomCXR studies for the per-finding false-positive checks). A larger share gives the gate more reports to decide on and rounds fewer corrections to learn from; it applies to studies uploaded after it is set, never moving one already stored.",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Also serve the Prometheus metrics on this port of 127.0.0.1 only (no session needed), for a Prometheus or an agent on the same host; unset: only at `/metrics`, for administrators signed in.",
    )

    @property
    def sqlalchemy_url(self) -> str:
        from db.database import sqlite_url  # noqa: PLC0415 -- loads sqlalchemy

        return self.database_url or sqlite_url(self.resolved_data_dir)


#: The fields `WebSettings` adds to the engine's.
WEB_FIELDS = tuple(name for name in WebSettings.model_fields if name not in Settings.model_fields)


def web_settings(settings: Settings | None = None) -> WebSettings:
    """`settings` as a `WebSettings`: itself when it is one; else its engine values, with the web fields it carries
    (a `model_copy(update=...)` can carry them) or, for the rest, the environment's. None: all from the environment."""
    if isinstance(settings, WebSettings):
        return settings
    if settings is None:
        return WebSettings()
    carried = {name: getattr(settings, name) for name in WEB_FIELDS if hasattr(settings, name)}
    return WebSettings(**settings.model_dump(), **carried)
