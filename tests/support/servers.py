"""`orapo serve` in a child process, as an operator starts it: its own environment, stdout and stderr in files.

Run as a module (`python -m tests.support.servers serve ...`) it is `orapo serve` with one change for tests of
scheduled rounds: the cron's first field counts seconds, not minutes (`*/3 * * * *` fires every 3 s), so a test
sees several firings in seconds; everything else, the election and the jobs included, is the product's code.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.support.app import free_port

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 90


class ServeProcess:
    """One `orapo serve --no-model` on a free port of 127.0.0.1; `env` adds ORAPO_* settings to a clean environment."""

    def __init__(self, root: Path, name: str, env: dict[str, str], *, seconds_cron: bool = False):
        self.root, self.name, self.extra_env, self.seconds_cron = root, name, dict(env), seconds_cron
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> ServeProcess:
        """Start the process (without waiting for it to answer: see `wait_ready`)."""
        self.port = free_port()
        if self.seconds_cron:
            command = [sys.executable, "-m", "tests.support.servers"]
        else:
            orapo = Path(sys.executable).with_name("orapo")
            command = [str(orapo)] if orapo.exists() else [sys.executable, "-m", "app.cli"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORAPO_")}
        env.update(
            GRADIO_ANALYTICS_ENABLED="False",
            HF_HUB_OFFLINE="1",
            HF_HUB_DISABLE_TELEMETRY="1",
            OMP_NUM_THREADS="1",
            **self.extra_env,
        )
        self.out, self.err = self.root / f"{self.name}.out", self.root / f"{self.name}.err"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen(
                [*command, "serve", "--no-model", "--host", "127.0.0.1", "--port", str(self.port)],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=err,
            )
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> str:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"{self.name} exited with {self.proc.returncode}: {self.log()}"
            try:
                if httpx.get(self.url + "/", timeout=2).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"{self.name} did not answer within {timeout} s: {self.log()}")

    def log(self) -> str:
        return self.out.read_text(errors="replace") + self.err.read_text(errors="replace")

    def stop(self, sig: int, timeout: float = 30) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _seconds_cron(cron: str, timezone=None):
    from apscheduler.triggers.cron import CronTrigger

    return CronTrigger(second=cron.split()[0], timezone=timezone)


if __name__ == "__main__":
    from app import cli
    from app.services.rounds import schedule

    schedule.cron_trigger = _seconds_cron
    sys.exit(cli.main(sys.argv[1:]))
