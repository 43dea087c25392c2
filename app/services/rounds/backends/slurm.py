"""The `slurm` backend: each command of a round is one batch job, through SLURM's own client commands.

Plain `sbatch`, `scontrol`, `sacct` and `scancel` run as subprocesses, not
`submitit`: a round's jobs are command lines (the same `orapo train ...` a user
types), not pickled Python functions, which is what submitit adds; the client
tools are on every login node of every SLURM site and version, so there is no
dependency to install or keep in step with the cluster; and what the app does
is what the site's staff would type, so they can read it in the job script
kept in the round's folder (`jobs/<phase>.sbatch`) and in `squeue`.

Choices a research-computing team expects:

- Questions to slurmctld are rate-limited (ORAPO_SLURM_POLL_S, 10 s): the
  live metrics come from `metrics.jsonl` in the shared folder, not from SLURM.
- A job is asked about with `scontrol show job` (slurmctld keeps a finished
  job for MinJobAge, 300 s by default), then with `sacct` where the site keeps
  accounting; a job neither knows is gone.
- `--no-requeue`: a pre-empted or node-failed job ends (PREEMPTED, NODE_FAIL)
  and fails the round with its log tail, instead of silently training again
  from the start; the round can be resumed from its last checkpoint.
- Out of memory is SLURM's OUT_OF_MEMORY state (cgroup sites), or a job killed
  by SIGKILL whose log has slurmstepd's "exceeded memory limit" (sites that
  enforce memory by sampling).
"""

from __future__ import annotations

import shlex
import subprocess
import threading
import time
from collections.abc import Callable
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

#: Job states in which the job has not ended yet (squeue's and scontrol's long names).
ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
        "RESV_DEL_HOLD",
    }
)

#: How a job that did not complete ended, as the round's error says it.
ENDINGS = {
    "OUT_OF_MEMORY": "ran out of memory (OUT_OF_MEMORY): ask for more with ORAPO_SLURM_MEM or train smaller batches",
    "TIMEOUT": "reached its time limit (TIMEOUT): raise ORAPO_SLURM_TIME or train fewer steps",
    "PREEMPTED": "was pre-empted by a job of higher priority (PREEMPTED)",
    "NODE_FAIL": "lost its node (NODE_FAIL)",
    "BOOT_FAIL": "could not boot its node (BOOT_FAIL)",
    "DEADLINE": "passed its deadline (DEADLINE)",
    "CANCELLED": "was cancelled outside the app (CANCELLED: scancel by an operator, or the partition's limits?)",
}
MEMORY_MARKERS = ("exceeded memory limit", "exceeded job memory limit", "oom-kill", "out of memory")


def parse_exit_code(text: str) -> int | None:
    """SLURM's `code:signal` as a Popen-style return code: the code, or minus the signal that killed the job."""
    code, _, sig = (text or "").strip().partition(":")
    try:
        code_i, sig_i = int(code or 0), int(sig or 0)
    except ValueError:
        return None
    return -sig_i if sig_i else code_i


def parse_scontrol(text: str) -> dict[str, str]:
    """`scontrol show job -o ID`'s one line as a dict (values never contain spaces, except Command's, unused here)."""
    fields = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def parse_sacct(text: str) -> tuple[str, str, str] | None:
    """The job's own line of `sacct -n -P -X -o State,ExitCode,Reason`, as (state, exit code, reason)."""
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 2 and parts[0]:
            return parts[0].split()[0], parts[1], parts[2] if len(parts) > 2 else ""
    return None


def job_state(job_id: str, state: str, exit_code: str, reason: str = "", log_tail: str = "") -> JobState:
    """A SLURM job's state (as scontrol or sacct say it) as the round sees it: running, or finished and why."""
    state = (state or "").split()[0].rstrip("+") if state else ""
    if state in ACTIVE_STATES:
        return JobState("running", reason=reason if state == "PENDING" else state)
    code = parse_exit_code(exit_code)
    if state == "COMPLETED":
        return JobState(
            "finished", code or 0, state, "" if not code else f"SLURM job {job_id} completed, but {describe_exit(code)}"
        )
    if state == "FAILED" and code == -9 and any(m in log_tail.lower() for m in MEMORY_MARKERS):
        state = "OUT_OF_MEMORY"
    if state in ENDINGS:
        return JobState("finished", code if code else 1, state, f"SLURM job {job_id} {ENDINGS[state]}")
    if state == "FAILED":
        return JobState(
            "finished", code if code else 1, state, f"SLURM job {job_id} failed: {describe_exit(code or 1)}"
        )
    return JobState(
        "finished",
        code if code else 1,
        state or "UNKNOWN",
        f"SLURM job {job_id} ended {state or 'in an unknown state'}",
    )


def batch_script(spec: JobSpec, command: list[str], settings: RoundBackendSettings) -> str:
    """The job script kept in the round folder: the resources as #SBATCH lines, then the one command."""
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={spec.name}",
        f"#SBATCH --output={spec.log_path}",
        "#SBATCH --open-mode=append",
        f"#SBATCH --chdir={REPO_ROOT}",
        "#SBATCH --no-requeue",
    ]
    if settings.slurm_partition:
        lines.append(f"#SBATCH --partition={settings.slurm_partition}")
    if settings.slurm_gpus:
        lines.append(f"#SBATCH --gres=gpu:{settings.slurm_gpus}")
    if settings.slurm_cpus:
        lines.append(f"#SBATCH --cpus-per-task={settings.slurm_cpus}")
    if settings.slurm_mem:
        lines.append(f"#SBATCH --mem={settings.slurm_mem}")
    if settings.slurm_time:
        lines.append(f"#SBATCH --time={settings.slurm_time}")
    shown = shlex.join(command)
    lines += [
        "",
        f'echo {shlex.quote("$ " + shown)} "  (SLURM job $SLURM_JOB_ID on $(hostname -s))"',
        f"exec {shown}",
        "",
    ]
    return "\n".join(lines)


class SlurmBackend:
    name = "slurm"

    def __init__(
        self,
        settings: RoundBackendSettings | None = None,
        *,
        run: Callable[..., Any] = subprocess.run,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings or RoundBackendSettings()
        self._run, self._clock = run, clock  # seams for the tests' fake cluster
        self._lock = threading.Lock()
        self._asked: dict[str, tuple[float, JobState]] = {}  # job id -> (when, what slurmctld said)

    @property
    def poll_s(self) -> float:
        return self.settings.slurm_poll_s

    def _command(self, argv: list[str], *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        try:
            return self._run(argv, capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise OrapoError(
                "slurm_unavailable",
                f"`{argv[0]}` is not installed here: ORAPO_ROUND_BACKEND=slurm needs "
                f"SLURM's client commands on the app's machine.",
            ) from None
        except subprocess.TimeoutExpired:
            raise OrapoError(
                "slurm_unavailable", f"`{argv[0]}` did not answer within 60 s (is slurmctld up?)."
            ) from None

    def submit(self, spec: JobSpec) -> JobHandle:
        command = cluster_command(spec.argv, spec.phase, self.settings)
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        script = spec.log_path.parent / "jobs" / f"{spec.phase}.sbatch"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(batch_script(spec, command, self.settings))
        argv = ["sbatch", "--parsable", *shlex.split(self.settings.slurm_args or ""), str(script)]
        done = self._command(argv, env=job_environment(spec.env))
        job_id = done.stdout.strip().split(";")[0] if done.returncode == 0 else ""
        if not job_id.isdigit():
            said = (done.stderr or done.stdout).strip().splitlines()
            raise OrapoError(
                "slurm_submit_failed",
                f"sbatch refused the {spec.phase} job: {said[-1] if said else f'exit status {done.returncode}'}",
            )
        return JobHandle("slurm", job_id, spec.phase, str(spec.log_path))

    def poll(self, job: JobHandle, *, fresh: bool = False) -> JobState:
        now = self._clock()
        with self._lock:
            asked = self._asked.get(job.id)
        if asked is not None and not fresh and (not asked[1].active or now - asked[0] < self.poll_s):
            return asked[1]
        state = self._ask(job)
        with self._lock:
            self._asked[job.id] = (now, state)
        return state

    def _ask(self, job: JobHandle) -> JobState:
        try:
            shown = self._command(["scontrol", "show", "job", "-o", job.id])
            if shown.returncode == 0 and "JobState=" in shown.stdout:
                fields = parse_scontrol(shown.stdout)
                state = fields.get("JobState", "")
                tail = tail_text(job.log_path, 20) if state == "FAILED" else ""
                return job_state(job.id, state, fields.get("ExitCode", ""), fields.get("Reason", ""), tail)
            accounted = self._command(["sacct", "-n", "-P", "-X", "-j", job.id, "-o", "State,ExitCode,Reason"])
            found = parse_sacct(accounted.stdout) if accounted.returncode == 0 else None
            if found is not None:
                tail = tail_text(job.log_path, 20) if found[0] == "FAILED" else ""
                return job_state(job.id, *found, log_tail=tail)
            if "Invalid job id" in (shown.stderr or ""):
                return JobState("gone", detail=f"SLURM job {job.id} is gone: neither slurmctld nor accounting knows it")
            return JobState(
                "unknown", detail=f"SLURM did not answer about job {job.id}: {(shown.stderr or '').strip()}"
            )
        except OrapoError as exc:
            return JobState("unknown", detail=exc.message)

    def cancel(self, job: JobHandle, *, grace_s: float = 10.0) -> None:
        """`scancel` (SIGTERM to the job's processes, SIGKILL after the site's KillWait); waits up to `grace_s`."""
        self._command(["scancel", job.id])
        deadline = self._clock() + grace_s
        while self._clock() < deadline and self.poll(job, fresh=True).status == "running":
            time.sleep(0.5)

    def log_tail(self, job: JobHandle, log_path: Path | str | None, lines: int = 15) -> str:
        return tail_text(log_path or job.log_path, lines)
