"""`orapo label` end to end: CSV in, CheXpert-style CSV out, without importing torch."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_reports(path: Path, column: str = "report") -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", column])
        w.writerow(["s1", "FINDINGS: Mild cardiomegaly. No pleural effusion.\nIMPRESSION: Possible pneumonia."])
        w.writerow(["s2", "Heart size is normal. Lungs are clear. Pacemaker in place."])
        w.writerow(["s3", "Right upper lobe nodule. Emphysema."])


def test_label_runs_without_torch_and_writes_chexpert_values(tmp_path):
    src, dst = tmp_path / "reports.csv", tmp_path / "labels.csv"
    write_reports(src)
    # Run the real command in a fresh interpreter and report which heavy modules it loaded.
    code = (
        "import sys; from app.cli import main; rc = main(sys.argv[1:]); "
        "print('HEAVY', sorted(m for m in ('torch', 'numpy', 'gradio', 'sqlalchemy', 'transformers') if m in sys.modules)); "
        "sys.exit(rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "label", str(src), "-o", str(dst)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout
    rows = list(csv.DictReader(open(dst, newline="")))
    assert [r["id"] for r in rows] == ["s1", "s2", "s3"]
    assert list(rows[0])[1:15] == [
        "No Finding",
        "Enlarged Cardiomediastinum",
        "Cardiomegaly",
        "Lung Opacity",
        "Lung Lesion",
        "Edema",
        "Consolidation",
        "Pneumonia",
        "Atelectasis",
        "Pneumothorax",
        "Pleural Effusion",
        "Pleural Other",
        "Fracture",
        "Support Devices",
    ]
    s1, s2, s3 = rows
    assert (s1["Cardiomegaly"], s1["Pleural Effusion"], s1["Pneumonia"], s1["Edema"], s1["No Finding"]) == (
        "1",
        "0",
        "-1",
        "",
        "",
    )
    assert (s2["Cardiomegaly"], s2["Support Devices"], s2["No Finding"]) == ("0", "1", "1")
    assert s3["Lung Lesion"] == "1"


def test_label_chestxray14_schema_and_text_column(tmp_path):
    src, dst = tmp_path / "reports.csv", tmp_path / "labels.csv"
    write_reports(src, column="text")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.cli",
            "label",
            str(src),
            "-o",
            str(dst),
            "--schema",
            "chestxray14",
            "--text-column",
            "text",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {r["id"]: r for r in csv.DictReader(open(dst, newline=""))}
    assert rows["s3"]["Nodule"] == "1" and rows["s3"]["Emphysema"] == "1" and rows["s1"]["Effusion"] == "0"
    assert "Pleural_Thickening" in rows["s1"]


def test_label_missing_column_is_a_plain_refusal(tmp_path):
    src = tmp_path / "reports.csv"
    write_reports(src, column="text")
    proc = subprocess.run(
        [sys.executable, "-m", "app.cli", "label", str(src), "-o", str(tmp_path / "o.csv")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("missing_column:") and "--text-column" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_facts_package_imports_only_the_standard_library():
    # Nothing under orapo_core.facts may pull numpy, torch, gradio, sqlalchemy, app or db.
    code = (
        "import sys, orapo_core.facts, orapo_core.facts.metrics, orapo_core.facts.llm; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'gradio', 'sqlalchemy', 'app', 'db')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
