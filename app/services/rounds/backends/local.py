"""The `local` backend: a round's commands as child processes of the app, in their own session (the default).

What rounds always did (`app.services.rounds.processes`): output appended to
the step's log in the round folder, a cancel signals the whole process group
(TERM, then KILL after the grace period). The `Popen` objects of the jobs this
process started are kept here, so their exit status is known; a job found
again after a restart is only a pid, alive or gone.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

from app.services.rounds.backends.base import JobHandle, JobSpec, JobState
from app.services.rounds.processes import launch, pid_alive, stop_process, tail_text


class LocalBackend:
    name = "local"
    poll_s = 0.0  # a child's status is a system call: ask it as often as the round polls

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._children: dict[int, subprocess.Popen] = {}

    def submit(self, spec: JobSpec) -> JobHandle:
        process = launch(spec.argv, spec.log_path, env=spec.env or None)
        with self._lock:
            self._children[process.pid] = process
        return JobHandle("local", str(process.pid), spec.phase, str(spec.log_path))

    def _child(self, job: JobHandle) -> subprocess.Popen | None:
        with self._lock:
            return self._children.get(job.pid or 0)

    def poll(self, job: JobHandle) -> JobState:
        process = self._child(job)
        if process is None:
            return JobState("running") if pid_alive(job.pid) else JobState("gone")
        code = process.poll()
        if code is None:
            return JobState("running")
        with self._lock:
            self._children.pop(process.pid, None)
        return JobState("finished", code)

    def cancel(self, job: JobHandle, *, grace_s: float = 10.0) -> None:
        stop_process(job.pid, process=self._child(job), grace_s=grace_s)

    def log_tail(self, job: JobHandle, log_path: Path | str | None, lines: int = 15) -> str:
        return tail_text(log_path or job.log_path, lines)
