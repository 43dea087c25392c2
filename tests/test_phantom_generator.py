"""PhantomCXR: determinism, prevalence, the CLI."""

from __future__ import annotations

import csv
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from orapo_core.data.phantom import (
    DEFAULT_PREVALENCE,
    FINDING_KINDS,
    generate_study,
    resolve_prevalence,
    sample_findings,
    write_dataset,
)
from orapo_core.data.records import CHEXPERT_14
from orapo_core.errors import OrapoError

ROOT = Path(__file__).resolve().parents[1]


def _digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_same_seed_same_study_and_different_seed_different_study():
    a, b, c = generate_study(7, size=96), generate_study(7, size=96), generate_study(8, size=96)
    assert a.image.dtype == np.float32 and a.image.shape == (96, 96)
    assert 0.0 <= a.image.min() and a.image.max() <= 1.0
    assert np.array_equal(a.image, b.image)
    assert (a.findings, a.report_findings, a.report_impression, a.labels) == (
        b.findings,
        b.report_findings,
        b.report_impression,
        b.labels,
    )
    assert not np.array_equal(a.image, c.image)


def test_write_dataset_is_byte_identical_for_a_seed(tmp_path: Path):
    first = write_dataset(tmp_path / "a", 6, seed=11, size=80, formats=("png", "dicom"))
    write_dataset(tmp_path / "b", 6, seed=11, size=80, formats=("png", "dicom"))
    write_dataset(tmp_path / "c", 6, seed=12, size=80, formats=("png", "dicom"))
    assert first.name == "phantom_cxr.csv"
    da, db, dc = _digests(tmp_path / "a"), _digests(tmp_path / "b"), _digests(tmp_path / "c")
    assert len([k for k in da if k.endswith(".png")]) == 6 and len([k for k in da if k.endswith(".dcm")]) == 6
    assert da == db
    assert da["phantom_cxr.csv"] != dc["phantom_cxr.csv"]


def test_csv_has_the_chexpert_plus_columns_and_paths_that_exist(tmp_path: Path):
    calls = []
    csv_path = write_dataset(
        tmp_path, 12, seed=3, size=64, formats=("png",), progress=lambda done, total: calls.append((done, total))
    )
    assert calls[-1] == (12, 12) and len(calls) == 12
    rows = list(csv.DictReader(csv_path.open()))
    assert len(rows) == 12
    for column in (
        "id",
        "path_to_image",
        "path_to_dcm",
        "section_findings",
        "section_impression",
        "split",
        *CHEXPERT_14,
    ):
        assert column in rows[0]
    for row in rows:
        assert (tmp_path / row["path_to_image"]).is_file()
        assert row["path_to_dcm"] == ""
        assert row["split"] in ("train", "valid", "test") and row["path_to_image"].startswith(row["split"] + "/")
        assert {row[name] for name in CHEXPERT_14} <= {"", "1.0", "0.0", "-1.0"}


def test_prevalence_is_respected_over_400_draws():
    counts = dict.fromkeys(FINDING_KINDS, 0)
    normal = 0
    n = 400
    for i in range(n):
        kinds = {f.kind for f in sample_findings(np.random.default_rng([5, i]), DEFAULT_PREVALENCE)}
        for kind in kinds:
            counts[kind] += 1
        normal += not (kinds - {"support_devices"})
    for kind, p in DEFAULT_PREVALENCE.items():
        sigma = (p * (1 - p) / n) ** 0.5
        assert abs(counts[kind] / n - p) < 4 * sigma + 0.005, (kind, counts[kind] / n, p)
    # Rare findings are rare, and about a third of studies are normal.
    for kind in ("pneumothorax", "fracture", "lung_lesion", "pleural_other"):
        assert DEFAULT_PREVALENCE[kind] <= 0.05
    assert 0.25 < normal / n < 0.42


def test_prevalence_overrides_accept_chexpert_names_and_refuse_nonsense():
    p = resolve_prevalence({"Pleural Effusion": 0.9, "ptx": 0.0})
    assert (
        p["pleural_effusion"] == 0.9
        and p["pneumothorax"] == 0.0
        and p["cardiomegaly"] == DEFAULT_PREVALENCE["cardiomegaly"]
    )
    hits = sum("pleural_effusion" in {f.kind for f in sample_findings(np.random.default_rng(i), p)} for i in range(200))
    assert hits > 160
    with pytest.raises(OrapoError) as exc:
        resolve_prevalence({"dragon": 0.1})
    assert exc.value.code == "unknown_finding"
    with pytest.raises(OrapoError):
        resolve_prevalence({"edema": 1.5})
    with pytest.raises(OrapoError):
        write_dataset("/nonexistent-never", 1, formats=("gif",))


def test_cli_in_process(tmp_path: Path, capsys):
    from app.cli import main

    out = tmp_path / "out"
    assert (
        main(
            [
                "phantom",
                "--n",
                "5",
                "--out",
                str(out),
                "--seed",
                "1",
                "--size",
                "64",
                "--format",
                "both",
                "--prevalence",
                "pneumothorax=0.5",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.strip() == str(out / "phantom_cxr.csv")
    rows = list(csv.DictReader((out / "phantom_cxr.csv").open()))
    assert len(rows) == 5
    assert all((out / r["path_to_image"]).is_file() and (out / r["path_to_dcm"]).is_file() for r in rows)
    assert main(["phantom", "--n", "1", "--out", str(tmp_path / "x"), "--prevalence", "unicorn=0.2"]) == 2
    assert "unknown_finding" in capsys.readouterr().err


@pytest.mark.slow  # the `orapo` command in a subprocess
def test_cli_subprocess_matches_the_python_api(tmp_path: Path):
    exe = Path(sys.executable).parent / "orapo"
    if not exe.exists():
        exe = ROOT / ".venv" / "bin" / "orapo"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [str(exe), "phantom", "--n", "5", "--out", str(tmp_path / "cli"), "--seed", "1", "--size", "64", "--quiet"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    write_dataset(tmp_path / "api", 5, seed=1, size=64)
    assert _digests(tmp_path / "cli") == _digests(tmp_path / "api")


def test_conspicuity_changes_how_small_findings_look_never_which_findings_or_reports():
    import numpy as np

    from orapo_core.data.phantom import generate_study
    from orapo_core.errors import OrapoError

    for kind in ("fracture", "lung_lesion", "pleural_other"):
        clear = generate_study(np.random.default_rng([31, 2]), size=128, prevalence={kind: 1.0})
        subtle = generate_study(np.random.default_rng([31, 2]), size=128, prevalence={kind: 1.0}, conspicuity="subtle")
        assert clear.findings == subtle.findings and clear.report_findings == subtle.report_findings
        assert clear.labels == subtle.labels
        assert np.abs(clear.image - subtle.image).max() > 0.05, kind  # drawn visibly differently
    normal = {k: 0.0 for k in ("fracture", "lung_lesion", "pleural_other")}
    a = generate_study(np.random.default_rng([31, 3]), size=128, prevalence=normal)
    b = generate_study(np.random.default_rng([31, 3]), size=128, prevalence=normal, conspicuity="subtle")
    if not (a.kinds & {"fracture", "lung_lesion", "pleural_other"}):
        assert np.array_equal(a.image, b.image)  # nothing small to draw: the same film
    with pytest.raises(OrapoError) as exc:
        generate_study(1, size=64, conspicuity="loud")
    assert exc.value.code == "bad_conspicuity"
