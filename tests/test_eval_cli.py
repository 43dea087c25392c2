"""`orapo eval` end to end on a tiny random VLM and a few PhantomCXR studies."""

from __future__ import annotations

import json
from pathlib import Path

from app.cli import main
from orapo_core.facts.metrics import EvalMetrics
from tests.support.tiny_vlms import build_tiny_vlm


def test_eval_reports_clinical_efficacy(tmp_path: Path, data_dir: Path, capsys) -> None:
    from orapo_core.data import write_dataset

    csv_path = write_dataset(tmp_path / "phantom", n=4, seed=3, size=128, formats=("png",))
    model = build_tiny_vlm(tmp_path / "model", family="qwen2_vl")
    out = tmp_path / "eval.json"
    assert (
        main(["eval", "--model", str(model), "--data", str(csv_path), "--max-new-tokens", "12", "--json", str(out)])
        == 0
    )
    printed = capsys.readouterr().out
    assert "14 observations: macro P/R/F1" in printed
    result = json.loads(out.read_text())
    metrics = EvalMetrics.from_dict(result["metrics"])
    assert metrics.to_dict() == result["metrics"]  # the file holds the metrics under their names, nothing else
    assert metrics.n_reports == 4 and len(result["predictions"]) == 4
    for value in (metrics.macro_f1_14, metrics.micro_f1_14, metrics.macro_f1_5, metrics.micro_precision_5):
        assert 0.0 <= value <= 1.0
    assert metrics.mean_report_length > 0
    # References come from the phantom's own labels, so at least one study carries a positive finding.
    assert any(v == 1 for p in result["predictions"] for v in p["reference"].values())


def test_eval_refuses_an_empty_selection(tmp_path: Path, data_dir: Path, capsys) -> None:
    from orapo_core.data import write_dataset

    csv_path = write_dataset(tmp_path / "phantom", n=2, seed=3, size=64, formats=("png",))
    assert main(["eval", "--data", str(csv_path), "--split", "no-such-split"]) == 2
    assert "no_studies:" in capsys.readouterr().err
