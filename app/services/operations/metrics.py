"""What hospital IT watches: Prometheus metrics of one app, and the health checks of `/healthz` and `/readyz`.

`build_app` makes one `AppMetrics` per app (its own `CollectorRegistry`, never prometheus_client's global one, so
two apps in one process, as tests build them, count apart) and keeps it on the `AppContext`. The event counters
are counted where the event happens, through the `count_*` functions below, which do nothing when no metrics
object is configured (a service used from the CLI or a test): a draft where it is stored (`drafting.draft_study`,
through the model registry), a failed sign-in where the guard refuses it (`SignInGuard`), a refused upload where
the Read tab gets its outcome. What is a state rather than an event (the draft queue, the rounds in each status,
the served version) is read when Prometheus scrapes, from the batchers and the database.

The app serves the text at `/metrics` to administrators (`app.ops_routes`); with `ORAPO_METRICS_PORT` set, also on
that port of 127.0.0.1 only, for a Prometheus or an agent on the same host (`AppMetrics.start`, in the server's
lifespan). Documented in docs/pages/deploy/operations.md. Labels carry codes, statuses and model names only: never a user, an
address, a study or a path.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from db import RoundRepository

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from app.services.reading.ingest import IngestOutcome
    from app.services.reading.served import ServedModel
    from db.database import Database
    from orapo_core.config import Settings

log = logging.getLogger("orapo.metrics")

HEALTH_PATHS = frozenset({"/healthz", "/readyz"})  # answered without a session (app.web_security.PUBLIC_PATHS)
METRICS_PATH = "/metrics"
#: Draft latency buckets, in seconds: a draft takes about a second on a GPU and tens of seconds on a busy CPU.
DRAFT_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)


class AppMetrics:
    """One app's metrics: its own registry, the event counters, and the values read at scrape time from
    `database` and `models` (the app's `ModelRegistry`)."""

    def __init__(self, settings: Settings, database: Database, models: Any) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector

        self.port = getattr(settings, "metrics_port", None)
        self.prometheus = CollectorRegistry()
        self.drafts = Counter(
            "orapo_drafts",
            "Drafts stored, by the model version that drafted them.",
            ["version"],
            registry=self.prometheus,
        )
        self.draft_seconds = Histogram(
            "orapo_draft_seconds",
            "Seconds from asking a draft to getting it, waiting for the batch included.",
            buckets=DRAFT_BUCKETS,
            registry=self.prometheus,
        )
        self.sign_in_failures = Counter(
            "orapo_sign_in_failures",
            "Failed sign-ins, by reason (bad_credentials, user_disabled, locked_out).",
            ["reason"],
            registry=self.prometheus,
        )
        self.uploads_refused = Counter(
            "orapo_uploads_refused", "Uploaded files refused, by error code.", ["code"], registry=self.prometheus
        )
        self.prometheus.register(_ScrapeTime(database, models))
        ProcessCollector(registry=self.prometheus)  # process_*: this server's memory, CPU time and open files
        self._server: tuple[Any, threading.Thread] | None = None

    def watch(self, *services: Any) -> None:
        """Count the events of these services (the model registry, the sign-in guard) here: each has a `metrics`
        attribute, None until an app's metrics count for it."""
        for service in services:
            if service is not None and getattr(service, "metrics", False) is None:
                service.metrics = self

    def text(self) -> tuple[bytes, str]:
        """The exposition text and its content type (queries the database: call it off the event loop)."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.prometheus), CONTENT_TYPE_LATEST

    # -- the separate port -------------------------------------------------------------------------------------

    def start(self) -> int | None:
        """With `ORAPO_METRICS_PORT`: serve the metrics on that port of 127.0.0.1 (a thread of its own); the port it
        listens on, or None. A port that cannot be bound is reported, not raised: the app serves its readers
        anyway, and the metrics stay at `/metrics` for administrators."""
        from prometheus_client import start_http_server

        if self.port is None or self._server is not None:
            return None
        try:
            self._server = start_http_server(self.port, addr="127.0.0.1", registry=self.prometheus)
        except OSError as exc:
            print(
                f"orapo: the metrics port {self.port} could not be opened ({exc.strerror or exc}); "
                "the metrics are still at /metrics for administrators",
                file=sys.stderr,
                flush=True,
            )
            return None
        return self._server[0].server_address[1]

    def stop(self) -> None:
        """Close the port and end its thread (the server's lifespan calls this at shutdown)."""
        server, self._server = self._server, None
        if server is not None:
            httpd, thread = server
            httpd.shutdown()
            httpd.server_close()
            thread.join(timeout=5)


class _ScrapeTime:
    """A collector of what is read at each scrape: the draft queue, the rounds by status, the served version. A
    part that cannot be read (the database down) is left out of this scrape, not failed: `/readyz` says why."""

    def __init__(self, database: Database, models: Any) -> None:
        self._db = database
        self._models = models  # the app's ModelRegistry, read by what it has (None: no models)

    def describe(self) -> list[Metric]:
        return []  # no fixed description: the registry calls `collect` only at scrape time

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily

        depth = getattr(self._models, "queue_depth", None)
        if depth is not None:
            yield GaugeMetricFamily(
                "orapo_draft_queue_depth",
                "Drafts asked and not answered yet: waiting for the model or drafting.",
                value=depth(),
            )
        try:
            counts = RoundRepository(self._db).count_by_status()
        except Exception as exc:  # noqa: BLE001 - left out of this scrape; /readyz reports the database
            log.warning("orapo: rounds not counted for the metrics: %s", type(exc).__name__)
        else:
            rounds = GaugeMetricFamily("orapo_rounds", "Training rounds in each status.", labels=["status"])
            for status, count in counts.items():
                rounds.add_metric([status], count)
            yield rounds
        served = getattr(self._models, "served", None)
        try:
            model = served() if served is not None else None
        except Exception as exc:  # noqa: BLE001 - no served model (none configured, the database down)
            log.debug("orapo: the served version is not in the metrics: %s", type(exc).__name__)
            model = None
        if model is not None:
            yield InfoMetricFamily(
                "orapo_served_version",
                "The model version drafting now: its name, and its "
                'version id ("configured" for the configured or starter model).',
                value={"name": model.name, "version": _version(model)},
            )


def _version(model: ServedModel) -> str:
    return str(model.version_id) if model.version_id is not None else "configured"


# -- counting, where the events happen: nothing without metrics ----------------------------------------------


def count_draft(metrics: AppMetrics | None, version: str, seconds: float) -> None:
    """A draft was stored: drafted by `version` in `seconds`."""
    if metrics is not None:
        metrics.drafts.labels(version=version or "unknown").inc()
        metrics.draft_seconds.observe(max(0.0, float(seconds)))


def count_sign_in_failure(metrics: AppMetrics | None, reason: str) -> None:
    """A sign-in failed or was refused during a lockout; `reason` is a code, never the name tried."""
    if metrics is not None:
        metrics.sign_in_failures.labels(reason=reason or "unknown").inc()


def count_uploads(metrics: AppMetrics | None, outcomes: Iterable[IngestOutcome]) -> None:
    """The outcomes of an upload (`IngestOutcome`s): each refused one is counted by its error code."""
    if metrics is not None:
        for outcome in outcomes:
            if not outcome.ok:
                metrics.uploads_refused.labels(code=outcome.error or "unknown").inc()


# -- health ----------------------------------------------------------------------------------------------------


def readiness_checks(database: Database, models: Any) -> dict[str, str]:
    """One word per check, "ok" when it passes: the database answers a trivial query; the served model is loaded.
    No message, no path: the answer goes to whoever asks, signed in or not."""
    try:
        database.ping()
        checks = {"database": "ok"}
    except Exception:  # noqa: BLE001 - which failure is for the logs, not for an unauthenticated caller
        checks = {"database": "unreachable"}
    checks["model"] = _model_state(models, database_ok=checks["database"] == "ok")
    return checks


def _model_state(models: Any, *, database_ok: bool) -> str:
    """ "ok" once the served model is loaded (warmed at start-up, or loaded by a draft); else the warm-up's state:
    "loading", "failed", or "not_loaded" when nothing has loaded it yet (an app started without warming)."""
    if models is None:
        return "not_loaded"
    readiness = getattr(models, "readiness", None)
    state = readiness().state if readiness is not None else "idle"
    if state == "ready":
        return "ok"
    if database_ok and hasattr(models, "is_loaded"):
        try:
            if models.is_loaded(models.served()):  # never waits for a load under way
                return "ok"
        except Exception:  # noqa: BLE001 - no served model to find: the warm-up's state says the rest
            pass
    return {"idle": "not_loaded"}.get(state, state)
