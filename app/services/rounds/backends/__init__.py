"""Where a round's child processes run: this machine (`local`), a SLURM cluster (`slurm`) or a Ray cluster (`ray`).

A round's steps start the same commands whatever the backend (`orapo train
...`, `orapo rounds worker evaluate|merge ...`); a backend only decides where
they run and how to ask about them. Four operations, each with plain data:

    submit(JobSpec)          -> JobHandle    kind and id ("local", "4711"; "slurm", "123"; "ray", "raysubmit_...")
    poll(JobHandle)          -> JobState     running, finished (ok or not, and why) or gone
    cancel(JobHandle, grace) -> None         SIGTERM/SIGKILL, `scancel`, `ray job stop`
    log_tail(JobHandle, log) -> str          the job's last lines, for the round's error

The handle is stored with the round (its metrics' `job`), so a restarted app,
or another app server, can find the job again with the backend that started it
even when `ORAPO_ROUND_BACKEND` has changed since.

The documented assumption is one shared data folder: the job writes the
trainer's `metrics.jsonl`, its output and its log into the round's folder,
and the app reads them there as the job runs. The checkout and its virtual
environment must be at the same path on the cluster's nodes (`ORAPO_ROUND_PYTHON`
names another interpreter). Ray copies its job logs into the round's log by
itself, so only the data folder needs sharing there.
"""

from __future__ import annotations

from app.services.rounds.backends.base import (
    BACKENDS,
    JobHandle,
    JobSpec,
    JobState,
    RoundBackend,
    RoundBackendSettings,
    cluster_command,
    job_environment,
    stored_job,
)
from app.services.rounds.backends.local import LocalBackend
from app.services.rounds.backends.ray import RayBackend
from app.services.rounds.backends.slurm import SlurmBackend
from orapo_core.errors import OrapoError

__all__ = [
    "BACKENDS",
    "Backends",
    "JobHandle",
    "JobSpec",
    "JobState",
    "RoundBackend",
    "RoundBackendSettings",
    "cluster_command",
    "job_environment",
    "make_backend",
    "stored_job",
]


def make_backend(kind: str, settings: RoundBackendSettings | None = None) -> RoundBackend:
    """The backend of that kind, configured by `settings` (default: the environment's)."""
    settings = settings or RoundBackendSettings()
    if kind == "local":
        return LocalBackend()
    if kind == "slurm":
        return SlurmBackend(settings)
    if kind == "ray":
        return RayBackend(settings)
    raise OrapoError("invalid_setting", f"ORAPO_ROUND_BACKEND is {kind!r}; it takes one of {', '.join(BACKENDS)}.")


class Backends:
    """The configured backend for new jobs, and one of each kind for jobs already stored with a round."""

    def __init__(self, settings: RoundBackendSettings | None = None, *, current: RoundBackend | None = None):
        self.settings = settings or RoundBackendSettings()
        self._made: dict[str, RoundBackend] = {}
        if current is not None:
            self._made[current.name] = current
        self.current = current or self.of(self.settings.round_backend)

    def of(self, kind: str) -> RoundBackend:
        if kind not in self._made:
            self._made[kind] = make_backend(kind, self.settings)
        return self._made[kind]

    def for_job(self, job: JobHandle) -> RoundBackend:
        return self.of(job.backend)
