"""Child processes of a round: starting them in their own session, watching them, and stopping them.

A round's training and evaluation run as separate processes (`orapo train ...`
and `orapo rounds worker evaluate ...`) in a new session, so an
out-of-memory kill or a crash takes only the child, and a cancel can signal the
whole process group (data-loader workers included). Output goes to a log file
in the round folder, not to a pipe, so a child never blocks on a full pipe when
nobody reads it, and the log survives the app.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[3]


def python_command(*args: str) -> list[str]:
    return [sys.executable, *args]


def override_argv(overrides: dict[str, Any]) -> list[str]:
    """Recipe overrides as `orapo train` arguments (lists become several values, booleans lower case)."""
    argv: list[str] = []
    for key, value in overrides.items():
        if value is None:
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        argv += [f"--{key}", *(str(v).lower() if isinstance(v, bool) else str(v) for v in values)]
    return argv


def train_command(recipe: str | Path, overrides: dict[str, Any]) -> list[str]:
    """The `orapo train` command line a user could type for the same round."""
    return python_command("-m", "app.cli", "train", "--config", str(recipe), *override_argv(overrides))


def launch(argv: Sequence[str], log_path: Path, *, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start `argv` in a new session with stdout and stderr appended to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    child_env = {**os.environ, **(env or {})}
    child_env.setdefault("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), child_env.get("PYTHONPATH", "")) if p)
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    with log_path.open("ab") as log:
        log.write(f"$ {' '.join(map(str, argv))}\n".encode())
        log.flush()
        return subprocess.Popen(
            list(map(str, argv)),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=str(REPO_ROOT),
            env=child_env,
            start_new_session=True,
        )


def pid_alive(pid: int | None) -> bool:
    """True while `pid` exists and is not a zombie (a child nobody has waited for yet)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the child leads its own session, so its pid is its group id
    except ProcessLookupError:
        pass
    except PermissionError:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def stop_process(pid: int | None, *, process: subprocess.Popen | None = None, grace_s: float = 10.0) -> str:
    """SIGTERM the group, SIGKILL it after `grace_s`; returns how it ended ("gone", "terminated", "killed")."""
    if not pid or not pid_alive(pid):
        return "gone"
    signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            return "terminated"
        if process is None and not pid_alive(pid):
            return "terminated"
        time.sleep(0.1)
    signal_group(pid, signal.SIGKILL)
    if process is not None:
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    return "killed"


def describe_exit(code: int | None) -> str:
    if code is None:
        return "the worker process disappeared"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (out of memory, or killed by an operator?)" if -code == signal.SIGKILL else ""
        return f"the worker was killed by {name}{hint}"
    return f"the worker exited with status {code}"


class JsonlTail:
    """New complete lines of a JSONL file that another process appends to (a half-written line waits)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._offset = 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self._offset += end + 1
        records = []
        for line in chunk[: end + 1].splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
        return records


def tail_text(path: Path | str | None, lines: int = 40, max_bytes: int = 64_000) -> str:
    """The last `lines` lines of a log file ('' if there is none)."""
    if not path:
        return ""
    try:
        with Path(path).open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    # progress bars rewrite one line with carriage returns; keep only what a terminal would show
    shown = [line.rsplit("\r", 1)[-1] for line in data.splitlines()]
    return "\n".join(shown[-lines:])
