"""Shared test set-up: offline, one thread, a fresh data folder per test."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty ORAPO_DATA_DIR for one test."""
    d = tmp_path / "data"
    d.mkdir()
    monkeypatch.setenv("ORAPO_DATA_DIR", str(d))
    monkeypatch.delenv("ORAPO_DATABASE_URL", raising=False)
    return d


def pydicom_data_file(name: str) -> Path:
    """A file of the `pydicom-data` package (real DICOMs such as RG1_UNCI.dcm), found without any download."""
    import importlib.util

    spec = importlib.util.find_spec("data_store")
    assert spec is not None and spec.origin, "pydicom-data is a test dependency: `make test` installs it"
    path = Path(spec.origin).parent / "data" / name
    assert path.exists(), f"{name} is not in pydicom-data"
    return path
