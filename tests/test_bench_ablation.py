"""The ablation driver end to end on a tiny random VLM: two trained methods, one step each, a handful of phantoms."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
sys.path.insert(0, str(Path(__file__).parent))

from tiny_vlms import build_tiny_vlm  # noqa: E402


def test_two_methods_write_results_table_and_plots(tmp_path):
    from orapo_core.train.ablation import REPORTED, AblationPlan, run_ablation

    model_dir = build_tiny_vlm(tmp_path / "model", family="qwen2_vl")
    plan = AblationPlan(
        model_dir=str(model_dir), out_dir=str(tmp_path / "out"), methods=("starter", "grpo_facts", "orapo_400"),
        seeds=(0,), steps=2, prompts_per_step=2, num_generations=2, max_completion_length=8, checkpoints=2,
        n_eval=4, pool_studies=6, image_size=64, eval_batch=4, eval_max_new_tokens=8,
    )
    results = run_ablation(plan, log=lambda line: None)

    out = tmp_path / "out"
    saved = json.loads((out / "results.json").read_text())
    assert set(saved["methods"]) == {"starter", "grpo_facts", "orapo_400"}
    for name, row in saved["methods"].items():
        assert set(row["mean"]) == set(REPORTED) and set(row["std"]) == set(REPORTED)
        assert all(0.0 <= row["mean"][k] <= 1.0 for k in ("macro_f1_14", "macro_precision_14", "macro_recall_14", "rare_f1"))
        assert len(row["f1_per_class"]) == 14
    orapo = saved["methods"]["orapo_400"]
    assert orapo["oracle_mode"] == "dpo" and saved["methods"]["grpo_facts"]["oracle_mode"] == "none"
    run = orapo["runs"][0]
    assert run["train_studies"] == 6  # asks for 400, the pool holds 6
    assert [p["step"] for p in run["curve"]] == [0, 1, 2]  # the starting point, then the checkpoints
    assert [p["studies_seen"] for p in run["curve"]] == [0, 2, 4]
    logged = [json.loads(line) for line in Path(run["metrics_jsonl"]).read_text().splitlines()]
    assert sum("orapo/all_zero_group_frac" in line for line in logged) == 2
    table = (out / "results.md").read_text()
    assert "| OraPO + FactS (400 studies) |" in table and "Macro-F1 (14)" in table and "Rare-finding F1" in table
    assert (out / "macro_f1_vs_studies.html").stat().st_size > 0 and (out / "all_zero_groups.html").stat().st_size > 0
    assert results["checkpoint_steps"] == [1, 2]
    # held-out and training studies come from different generator seeds: no study (or image) is in both
    from orapo_core.train.dataset import load_training_records

    pool, held = (load_training_records(d) for d in sorted((out / "data").iterdir()) if d.is_dir())
    assert len(held) + len(pool) == 10 and not {r.study_id for r in pool} & {r.study_id for r in held}
    assert not {p.read_bytes() for r in pool for p in r.image_paths} & {p.read_bytes() for r in held for p in r.image_paths}
