"""The test clusters: a one-node SLURM (`.ci/slurm.sh`) and a local Ray head (`.ci/ray.sh`), both on 127.0.0.1.

`make test` sets ORAPO_TEST_SLURM_CONF (the cluster's slurm.conf, handed to
SLURM's commands as SLURM_CONF) in CI or with ORAPO_TEST_SLURM=1, and
ORAPO_TEST_RAY_ADDRESS (the Ray job server, http://127.0.0.1:PORT) in CI or
with ORAPO_TEST_RAY=1; `ORAPO_TEST_SLURM_CONF=$(.ci/slurm.sh)` and
`ORAPO_TEST_RAY_ADDRESS=$(.ci/ray.sh)` do the same by hand. Without them the
tests are skipped with a reason, except in CI, where they fail: there the
clusters are part of the suite.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest


def require_slurm() -> str:
    """The test cluster's slurm.conf, its node answering; skips the caller without one, except in CI."""
    conf = os.environ.get("ORAPO_TEST_SLURM_CONF", "").strip()
    if not conf:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but ORAPO_TEST_SLURM_CONF is not set: `make test` sets it from .ci/slurm.sh.")
        pytest.skip(
            "no test SLURM cluster: set ORAPO_TEST_SLURM_CONF=$(.ci/slurm.sh) (Debian's slurm-wlm and munge, "
            "as root), or run `make test` with ORAPO_TEST_SLURM=1; in CI this test runs."
        )
    shown = subprocess.run(
        ["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=30, env={**os.environ, "SLURM_CONF": conf}
    )
    assert shown.returncode == 0 and shown.stdout.split(), (
        f"ORAPO_TEST_SLURM_CONF={conf} is set but sinfo says: {shown.stderr}"
    )
    return conf


def require_ray() -> str:
    """The test Ray head's job server address, answering; skips the caller without one, except in CI."""
    address = os.environ.get("ORAPO_TEST_RAY_ADDRESS", "").strip()
    if not address:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but ORAPO_TEST_RAY_ADDRESS is not set: `make test` sets it from .ci/ray.sh.")
        pytest.skip(
            "no test Ray cluster: set ORAPO_TEST_RAY_ADDRESS=$(.ci/ray.sh) (installs the pinned `ray` extra), "
            "or run `make test` with ORAPO_TEST_RAY=1; in CI this test runs."
        )
    pytest.importorskip(
        "ray.job_submission", reason="the `ray` extra is not installed: pip install -c constraints.txt '.[ray]'"
    )
    from ray.job_submission import JobSubmissionClient

    JobSubmissionClient(address).list_jobs()  # a set address with no server behind it fails here, loudly
    return address


def processes_with(*parts: str) -> list[int]:
    """Pids of this machine's processes whose command line contains every one of `parts` (a job's own process)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if all(p in cmdline for p in parts) and "/bin/sh" not in cmdline.split(" ", 1)[0]:
            found.append(int(proc.name))
    return found


def wait_for(predicate, timeout: float = 60.0, what: str = "the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
