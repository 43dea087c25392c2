"""What the steps of a round share: its folder, the worker command, and `RoundWatch`.

A step that returns None has already recorded why on the round (a failed or
cancelled job); `RoundWatch` is what the steps share for that: the round's log,
its cancel flag and its jobs, which run through the configured backend
(`app.services.rounds.backends`: child processes, SLURM or Ray).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from app.services.rounds.backends import Backends, JobHandle, JobSpec, JobState
from app.services.rounds.metrics import RoundMetrics
from app.services.rounds.plan import RunningRound, write_plan
from app.services.rounds.processes import python_command, tail_text
from db import RoundRepository
from orapo_core.errors import OrapoError

if TYPE_CHECKING:
    from db import Database
    from orapo_core.config import Settings

#: How long a cluster that does not answer (a restarting Ray head, slurmctld failing over) is waited for.
LOST_AFTER_S = 300.0


def round_folder(settings: Settings, round_id: int) -> Path:
    """`<data>/rounds/<id>/`: the round's data, logs and trainer output."""
    return settings.rounds_dir / str(round_id)


def worker_command(*args: object) -> list[str]:
    """`orapo rounds worker ...` as a child process runs it (the one entry point of a round's helper processes)."""
    return python_command("-m", "app.cli", "rounds", "worker", *map(str, args))


class RoundWatch:
    """The round's log, its cancel flag and its jobs, as every step uses them."""

    def __init__(self, database: Database, backends: Backends | None = None) -> None:
        self.db = database
        self.backends = backends or Backends()

    def log(self, round_id: int, line: str, *, progress: float | None = None, metrics: dict | None = None) -> bool:
        """Append an event to the round's log; False when the round is no longer running (cancelled meanwhile)."""
        rounds = RoundRepository(self.db)
        try:
            current = rounds.get(round_id)
            rounds.update_progress(
                round_id,
                current.progress if progress is None else progress,
                log_append=f"[{datetime.now(UTC):%H:%M:%S}] {line}\n",
                metrics=metrics,
            )
            return True
        except OrapoError:
            return False

    def stopped(self, run: RunningRound) -> bool:
        return run.cancel.is_set() or RoundRepository(self.db).get(run.plan.round_id).status != "running"

    def fail(self, run: RunningRound, code: str, message: str) -> None:
        if run.cancel.is_set():
            return
        try:
            RoundRepository(self.db).transition(run.plan.round_id, "failed", error=f"{code}: {message}", actor="rounds")
        except OrapoError:
            pass  # cancelled or finished meanwhile

    def child(
        self,
        run: RunningRound,
        argv: list[str],
        log_path: Path,
        *,
        phase: str,
        on_poll: Callable[[], None] | None = None,
    ) -> JobState | None:
        """Run one command of the round to its end through the backend; None when the round was cancelled meanwhile."""
        backend = self.backends.current
        write_plan(run.plan)  # what a restarted app needs to watch the job on (see `RoundService.recover`)
        job = backend.submit(JobSpec(list(map(str, argv)), log_path, phase, run.plan.round_id))
        run.job = job
        RoundRepository(self.db).set_process(run.plan.round_id, pid=job.pid)
        self.log(
            run.plan.round_id, f"{phase}: {job.describe()}", metrics=RoundMetrics.update(phase=phase, job=job.to_dict())
        )
        return self.follow(run, job, on_poll=on_poll)

    def follow(
        self, run: RunningRound, job: JobHandle, *, on_poll: Callable[[], None] | None = None
    ) -> JobState | None:
        """Watch a submitted job to its end (streaming with `on_poll`), stopping it if the round is cancelled."""
        backend = self.backends.for_job(job)
        run.job = job
        lost_since = None
        while True:
            state = backend.poll(job)
            if not state.active:
                break
            if state.status == "unknown":  # the cluster does not answer: a restarting head is given a while
                lost_since = lost_since or time.monotonic()
                if time.monotonic() - lost_since > LOST_AFTER_S:
                    state = JobState("gone", detail=f"{state.detail} (for {LOST_AFTER_S:.0f} s)")
                    break
            else:
                lost_since = None
            if on_poll is not None:
                on_poll()
            if run.detach.is_set():
                return None  # the app is going away; a cluster job goes on, and the next start watches it again
            if self.stopped(run):
                backend.cancel(job, grace_s=run.plan.policy.cancel_grace_s)
                return None
            time.sleep(run.plan.policy.poll_s)
        if on_poll is not None:
            on_poll()
        try:
            RoundRepository(self.db).set_process(run.plan.round_id, pid=None)
        except OrapoError:
            pass
        return None if self.stopped(run) else state

    def failure(self, job: JobHandle | None, state: JobState, log_path: Path, lines: int = 15) -> str:
        """How a job ended, with the last lines of its log (from the backend: Ray keeps the log on the cluster)."""
        tail = (
            self.backends.for_job(job).log_tail(job, log_path, lines) if job is not None else tail_text(log_path, lines)
        )
        return f"{state.describe()}. Last lines of {log_path.name}:\n{tail}"
