"""The `ray` backend: each command of a round is one Ray Job on the cluster at ORAPO_RAY_ADDRESS.

Through Ray's own `JobSubmissionClient` (the optional extra `pip install
'.[ray]'`, pinned to the version CI tests): the entrypoint is the same
command line as in the other backends, run from the checkout's folder with the
app's environment (less its secrets) as the job's `env_vars`; a cancel is
`stop_job` (SIGTERM, then SIGKILL after Ray's RAY_JOB_STOP_WAIT_TIME_S); the
state and the exit code are the job's info. Ray keeps a job's output itself:
the backend copies what is new of it into the round's log each time it asks,
so the admin tab shows the log as it grows even when the cluster does not
share the app's disk for logs (the data folder must still be shared, for the
trainer's output and `metrics.jsonl`).
"""

from __future__ import annotations

import shlex
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from app.services.rounds.backends.base import (
    JobHandle,
    JobSpec,
    JobState,
    RoundBackendSettings,
    cluster_command,
    job_environment,
)
from app.services.rounds.processes import REPO_ROOT, describe_exit, tail_text
from orapo_core.errors import OrapoError

#: What the job's environment carries from the app's: the product's settings and the libraries' offline switches.
CARRIED_PREFIXES = (
    "ORAPO_",
    "HF_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "OMP_",
    "MKL_",
    "PYTHON",
    "CUDA_",
    "NCCL_",
    "ACCELERATE_",
    "GRADIO_",
)


def entrypoint(command: list[str]) -> str:
    """The shell line Ray runs: in the checkout's folder, the command itself (exec: Ray's SIGTERM reaches it)."""
    return f"cd {shlex.quote(str(REPO_ROOT))} && exec {shlex.join(command)}"


def job_state(job_id: str, status: str, exit_code: int | None, message: str = "") -> JobState:
    """A Ray job's status as the round sees it."""
    status = str(getattr(status, "value", status) or "")
    if status in ("PENDING", "RUNNING"):
        return JobState("running", reason=status)
    if status == "SUCCEEDED":
        return JobState("finished", 0, status)
    if status == "STOPPED":
        return JobState(
            "finished",
            exit_code if exit_code else -15,
            status,
            f"Ray job {job_id} was stopped outside the app (`ray job stop`?)",
        )

    why = describe_exit(exit_code) if exit_code is not None else (message.strip().splitlines() or ["it failed"])[-1]
    return JobState(
        "finished",
        exit_code if exit_code not in (None, 0) else 1,
        status or "FAILED",
        f"Ray job {job_id} failed: {why}",
    )


class RayBackend:
    name = "ray"

    def __init__(self, settings: RoundBackendSettings | None = None, *, client: Any = None) -> None:
        self.settings = settings or RoundBackendSettings()
        self._client = client
        self._lock = threading.Lock()
        self._copied: dict[str, int] = {}  # job id -> characters of its logs already appended to the round's log
        self._asked: dict[str, tuple[float, JobState]] = {}

    @property
    def poll_s(self) -> float:
        return self.settings.ray_poll_s

    @property
    def client(self) -> Any:  # ray.job_submission.JobSubmissionClient
        if self._client is None:
            if not self.settings.ray_address:
                raise OrapoError(
                    "ray_unavailable",
                    "ORAPO_ROUND_BACKEND=ray needs ORAPO_RAY_ADDRESS, the Ray cluster's "
                    "job server (e.g. http://ray-head:8265).",
                )
            try:
                from ray.job_submission import JobSubmissionClient
            except ImportError:
                raise OrapoError(
                    "ray_unavailable", "Ray is not installed: pip install -c constraints.txt '.[ray]'."
                ) from None
            try:
                self._client = JobSubmissionClient(self.settings.ray_address)
            except Exception as exc:  # ConnectionError, or Ray's RuntimeError for a server that is not Ray's
                raise OrapoError(
                    "ray_unavailable",
                    f"The Ray cluster at {self.settings.ray_address} does not answer: "
                    f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                ) from None
        return self._client

    def submit(self, spec: JobSpec) -> JobHandle:
        command = cluster_command(spec.argv, spec.phase, self.settings)
        env = {k: v for k, v in job_environment(spec.env).items() if k.startswith(CARRIED_PREFIXES)}
        submission_id = f"{spec.name}-{uuid.uuid4().hex[:8]}"
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        with spec.log_path.open("a") as log:
            log.write(f"$ {shlex.join(command)}  (Ray job {submission_id} at {self.settings.ray_address})\n")
        options = {"entrypoint_num_gpus": self.settings.ray_gpus or None, "entrypoint_num_cpus": self.settings.ray_cpus}
        try:
            job_id = self.client.submit_job(
                entrypoint=entrypoint(command),
                submission_id=submission_id,
                runtime_env={"env_vars": env},
                metadata={"orapo_round": str(spec.round_id), "orapo_phase": spec.phase},
                **{k: v for k, v in options.items() if v is not None},
            )
        except OrapoError:
            raise
        except Exception as exc:
            raise OrapoError(
                "ray_submit_failed",
                f"The Ray cluster refused the {spec.phase} job: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
            ) from None
        return JobHandle("ray", job_id, spec.phase, str(spec.log_path))

    def poll(self, job: JobHandle) -> JobState:
        now = time.monotonic()
        with self._lock:
            asked = self._asked.get(job.id)
        if asked is not None and (not asked[1].active or now - asked[0] < self.poll_s):
            return asked[1]
        state = self._ask(job)
        self._copy_logs(job)
        with self._lock:
            self._asked[job.id] = (now, state)
        return state

    def _ask(self, job: JobHandle) -> JobState:
        try:
            info = self.client.get_job_info(job.id)
        except OrapoError as exc:
            return JobState("unknown", detail=exc.message)
        except RuntimeError as exc:  # the job server answered: it does not know this job (404)
            if "404" in str(exc) or "does not exist" in str(exc):
                return JobState("gone", detail=f"Ray job {job.id} is gone: the cluster does not know it (restarted?)")
            return JobState("unknown", detail=f"Ray did not answer about job {job.id}: {exc}")
        except Exception as exc:  # connection refused, timeouts: the head may be restarting
            return JobState("unknown", detail=f"Ray did not answer about job {job.id}: {type(exc).__name__}")
        return job_state(job.id, info.status, getattr(info, "driver_exit_code", None), info.message or "")

    def _copy_logs(self, job: JobHandle) -> None:
        """Append what is new of the job's output to the round's log (Ray keeps the whole of it on the cluster)."""
        if not job.log_path:
            return
        try:
            logs = self.client.get_job_logs(job.id)
        except Exception:
            return
        with self._lock:
            start = self._copied.get(job.id, 0)
            self._copied[job.id] = len(logs)
        if len(logs) > start:
            with Path(job.log_path).open("a") as log:
                log.write(logs[start:])

    def cancel(self, job: JobHandle, *, grace_s: float = 10.0) -> None:
        try:
            self.client.stop_job(job.id)
        except Exception:
            return  # already finished, or the cluster is gone: nothing left to stop
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            with self._lock:
                self._asked.pop(job.id, None)
            if self.poll(job).status != "running":
                return
            time.sleep(0.5)

    def log_tail(self, job: JobHandle, log_path: Path | str | None, lines: int = 15) -> str:
        with self._lock:
            self._asked.pop(job.id, None)
        self._copy_logs(job)
        return tail_text(log_path or job.log_path, lines)
