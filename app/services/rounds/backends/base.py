"""What every round backend shares: its settings, the job spec and handle, the job's state, the job's environment."""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import Field  # noqa: TID253 -- this module is heavy; light ones import it lazily
from pydantic_settings import (  # noqa: TID253 -- this module is heavy; light ones import it lazily
    BaseSettings,
    SettingsConfigDict,
)

from app.services.rounds.processes import REPO_ROOT, describe_exit

if TYPE_CHECKING:
    from db.records import RoundRecord

BACKENDS = ("local", "slurm", "ray")

#: Variables a job on a cluster never receives: it reads and writes files, it never opens the database or the archive.
SECRET_VARIABLES = frozenset(
    {"ORAPO_DATABASE_URL", "ORAPO_DEID_SECRET", "ORAPO_DICOMWEB_PASSWORD", "ORAPO_DICOMWEB_TOKEN"}
)


class RoundBackendSettings(BaseSettings):
    """Where rounds run, from `ORAPO_*` environment variables (read when a round service is built)."""

    model_config = SettingsConfigDict(env_prefix="ORAPO_", extra="ignore")

    round_backend: Literal["local", "slurm", "ray"] = Field(
        default="local",
        description="Where a round's training and evaluation run: `local` (child processes of the app, the default), `slurm` (batch jobs) or `ray` (Ray Jobs).",
    )
    round_launcher: str | None = Field(
        default=None,
        description="A prefix for the training command on a cluster, e.g. `accelerate launch --config_file orapo_core/train/recipes/accelerate_zero2.yaml --num_processes 1`; the round then runs `<prefix> -m app.cli train ...`.",
    )
    round_python: str | None = Field(
        default=None,
        description="The Python interpreter a cluster job runs (default: the app's own, which must then exist at the same path on the nodes).",
    )
    slurm_partition: str | None = Field(
        default=None, description="`sbatch --partition`; default the cluster's default partition."
    )
    slurm_gpus: int = Field(
        default=0, ge=0, description="GPUs per training job (`--gres=gpu:N`); evaluation and merging ask for the same."
    )
    slurm_cpus: int | None = Field(default=None, ge=1, description="`--cpus-per-task`; default the partition's.")
    slurm_mem: str | None = Field(default=None, description="`--mem`, e.g. `64G`; default the partition's.")
    slurm_time: str | None = Field(
        default=None, description="`--time` for each job, e.g. `04:00:00`; default the partition's limit."
    )
    slurm_args: str | None = Field(
        default=None,
        description="More `sbatch` options, as on a command line, e.g. `--account=radiology --qos=normal`.",
    )
    slurm_poll_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds between two questions to slurmctld about a job (metrics are read from the shared folder in between).",
    )
    ray_address: str | None = Field(
        default=None, description="The Ray cluster's job server, e.g. `http://ray-head:8265`."
    )
    ray_gpus: float = Field(
        default=0, ge=0, description="GPUs reserved for each job's entrypoint (`entrypoint_num_gpus`)."
    )
    ray_cpus: float | None = Field(
        default=None, ge=0, description="CPUs reserved for each job's entrypoint (`entrypoint_num_cpus`)."
    )
    ray_poll_s: float = Field(
        default=2.0, gt=0, description="Seconds between two questions to the Ray job server about a job."
    )


@dataclass(frozen=True)
class JobSpec:
    """One command of a round to run: what, where its output goes, and which step it is."""

    argv: list[str]
    log_path: Path
    phase: str  # merging, training, evaluating
    round_id: int
    env: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"orapo-round-{self.round_id}-{self.phase}"


@dataclass(frozen=True)
class JobHandle:
    """A submitted job, as the round stores it: which backend started it and that backend's id for it."""

    backend: str
    id: str
    phase: str = ""
    log_path: str = ""

    @property
    def pid(self) -> int | None:
        """The process id of a local job (the round row's `pid`), None on a cluster."""
        return int(self.id) if self.backend == "local" else None

    def describe(self) -> str:
        return {"local": f"worker pid {self.id}", "slurm": f"SLURM job {self.id}", "ray": f"Ray job {self.id}"}.get(
            self.backend, f"{self.backend} job {self.id}"
        )

    def to_dict(self) -> dict[str, str]:
        return {"backend": self.backend, "id": self.id, "phase": self.phase, "log_path": self.log_path}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> JobHandle | None:
        if not data or not data.get("backend") or not data.get("id"):
            return None
        return cls(str(data["backend"]), str(data["id"]), str(data.get("phase") or ""), str(data.get("log_path") or ""))


@dataclass(frozen=True)
class JobState:
    """What a backend knows about a job now. `finished` carries whether it succeeded and, if not, why."""

    status: Literal["running", "finished", "gone", "unknown"]
    exit_code: int | None = None
    reason: str = ""  # the engine's word for how it ended or why it waits (OUT_OF_MEMORY, PREEMPTED, Resources...)
    detail: str = ""  # one sentence for the round's error

    @property
    def active(self) -> bool:
        return self.status in ("running", "unknown")

    @property
    def ok(self) -> bool:
        return self.status == "finished" and self.exit_code == 0

    def describe(self) -> str:
        if self.detail:
            return self.detail
        if self.status == "gone":
            return "the job is gone (its machine or the cluster restarted?)"

        return describe_exit(self.exit_code)


class RoundBackend(Protocol):
    """What a round asks of the place its commands run; each implementation is one module of this package."""

    name: str

    def submit(self, spec: JobSpec) -> JobHandle: ...

    def poll(self, job: JobHandle) -> JobState: ...

    def cancel(self, job: JobHandle, *, grace_s: float = 10.0) -> None: ...

    def log_tail(self, job: JobHandle, log_path: Path | str | None, lines: int = 15) -> str: ...

    @property
    def poll_s(self) -> float: ...


def stored_job(record: RoundRecord) -> JobHandle | None:
    """The job a round row records: a cluster job from its metrics' `job` (the last one submitted, kept after it
    ends so a restarted app can go on from it), a local one from its `pid` (cleared when the child ends, so a
    reused pid is never signalled)."""
    job = JobHandle.from_dict((getattr(record, "metrics", None) or {}).get("job"))
    if job is not None and job.backend != "local":
        return job
    pid = getattr(record, "pid", None)
    if not pid:
        return None
    return JobHandle("local", str(pid), job.phase if job else "", job.log_path if job else "")


def cluster_command(argv: list[str], phase: str, settings: RoundBackendSettings) -> list[str]:
    """`argv` as a cluster node runs it: its Python interpreter, and the launcher before a training command.

    The steps build `python -m app.cli ...`; a launcher (`accelerate launch ...`) takes the module the same way
    (`accelerate launch ... -m app.cli train ...`), so one command line works in every backend."""
    argv = [str(a) for a in argv]
    python = settings.round_python
    if argv and argv[0] == sys.executable:
        if phase == "training" and settings.round_launcher:
            return [*shlex.split(settings.round_launcher), *argv[1:]]
        if python:
            return [python, *argv[1:]]
    return argv


def job_environment(extra: dict[str, str] | None = None, *, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a cluster job gets: the app's, less its secrets, plus what a round's child always has."""
    environ = dict(os.environ if environ is None else environ)
    env = {k: v for k, v in environ.items() if k not in SECRET_VARIABLES}
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env
