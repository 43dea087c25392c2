"""`orapo train` end to end: a recipe, overrides, a CSV, a tiny VLM with LoRA and the real FactS reward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

from app.cli import main  # noqa: E402
from tests.support.data import write_chexpert_csv

SMOKE = str(Path(__file__).parent.parent / "orapo_core" / "train" / "recipes" / "smoke-cpu.yaml")


def test_dry_run_prints_the_resolved_recipe(tmp_path, capsys):
    assert main(["train", "--dry-run", "--config", SMOKE, "--output_dir", str(tmp_path), "--dpo_beta", "0.25"]) == 0
    resolved = json.loads(capsys.readouterr().out)
    assert resolved["training"]["dpo_beta"] == 0.25 and resolved["training"]["num_generations"] == 2


def test_bad_recipe_is_a_code_and_a_sentence(tmp_path, capsys):
    assert main(["train", "--dry-run", "--config", SMOKE, "--output_dir", str(tmp_path), "--dpo_beta", "-1"]) == 2
    assert "recipe_invalid" in capsys.readouterr().err
    assert main(["train", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "recipe_missing" in capsys.readouterr().err


@pytest.mark.slow
def test_train_round_from_csv_with_lora_and_facts(tmp_path, capsys, monkeypatch):
    from orapo_core.models import verifier
    from tests.support.tiny_vlms import build_tiny_vlm

    # `oracle_nll_min_auc`: the round reads the added findings from the served model before training (a tiny
    # random model reads nothing, so the reading is stubbed here; tests/test_oracle_nll_skip.py tests it).
    read = []

    def unreadable(model, processor, dataset, *, min_auc, prompt=None):
        read.append((len(dataset), min_auc))
        return {"Atelectasis": 0.61, "Lung Lesion": None}

    monkeypatch.setattr(verifier, "unreadable_findings", unreadable)

    model_dir = build_tiny_vlm(tmp_path / "model", family="qwen2_vl")
    csv_path = write_chexpert_csv(
        tmp_path / "data",
        [
            {"findings": "Small right pleural effusion.", "impression": "Effusion.", "positive": ["Pleural Effusion"]},
            {"findings": "The lungs are clear.", "impression": "No acute process.", "positive": ["No Finding"]},
            {
                "findings": "Heart is enlarged.",
                "impression": "Cardiomegaly.",
                "positive": ["Cardiomegaly"],
                "oracle": "FINDINGS: Cardiomegaly.\n\nIMPRESSION: Enlarged heart.",
            },
            {
                "findings": "Right pneumothorax.",
                "impression": "Pneumothorax.",
                "positive": ["Pneumothorax", "Atelectasis"],
                # The reader added atelectasis, which the served model does not read (the stub above): with
                # `oracle_unread_scope: report` that correction is left unapplied.
                "oracle": "FINDINGS: Right pneumothorax. Bibasilar atelectasis.\n\nIMPRESSION: Pneumothorax.",
                "draft": "FINDINGS: Right pneumothorax.\n\nIMPRESSION: Pneumothorax.",
            },
        ],
    )
    out = tmp_path / "round"
    code = main(
        [
            "train",
            "--config",
            SMOKE,
            "--model_name_or_path",
            str(model_dir),
            "--train_csv",
            str(csv_path),
            "--output_dir",
            str(out),
            "--max_completion_length",
            "8",
            "--use_peft",
            "true",
            "--lora_r",
            "4",
            "--lora_alpha",
            "8",
            "--lora_target_modules",
            "q_proj",
            "v_proj",
            "--save_strategy",
            "steps",
            "--save_steps",
            "2",
            "--oracle_nll_weight",
            "1.0",
            "--oracle_nll_focus",
            "differing",
            "--oracle_nll_min_auc",
            "0.85",
            "--oracle_unread_scope",
            "report",
        ]
    )
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert read == [(4, 0.85)]
    assert "leaves out the sentences of findings the model reads below AUC 0.85: Atelectasis (AUC 0.61)" in printed.out
    assert "corrections adding Atelectasis, Lung Lesion are left unapplied on 1 studies" in printed.out
    resolved = json.loads((out / "orapo_recipe.json").read_text())
    assert resolved["training"]["oracle_nll_skip_findings"] == ["Atelectasis", "Lung Lesion"]
    assert resolved["unapplied_corrections"] == {
        "studies": 1,
        "min_auc": 0.85,
        "findings": {"Atelectasis": 0.61, "Lung Lesion": None},
    }
    assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
    assert json.loads((out / "orapo_miner_state.json").read_text())["ema"]["studies"]
    assert (out / "checkpoint-2" / "orapo_miner_state.json").is_file()
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("rewards/facts_reward/mean" in s and "orapo/dpo_weight" in s for s in steps)
    from safetensors.torch import load_file

    lora_b = [t for k, t in load_file(out / "adapter_model.safetensors").items() if "lora_B" in k]
    assert lora_b and any(t.abs().sum() > 0 for t in lora_b), "LoRA B starts at zero: training must have moved it"


def test_a_run_that_takes_no_optimizer_step_fails_and_saves_nothing(tmp_path, capsys):
    """transformers ends 'successfully' at step 0 when one study cannot fill a batch; `orapo train` must not."""
    from tests.support.tiny_vlms import build_tiny_vlm

    model_dir = build_tiny_vlm(tmp_path / "model", family="qwen2_vl")
    csv_path = write_chexpert_csv(
        tmp_path / "data",
        [
            {"findings": "Right pneumothorax.", "impression": "Pneumothorax.", "positive": ["Pneumothorax"]},
        ],
    )
    out = tmp_path / "round"
    code = main(
        [
            "train",
            "--config",
            SMOKE,
            "--model_name_or_path",
            str(model_dir),
            "--train_csv",
            str(csv_path),
            "--output_dir",
            str(out),
            "--max_steps",
            "-1",
            "--num_train_epochs",
            "1",
            "--per_device_train_batch_size",
            "8",
            "--num_generations",
            "2",
            "--max_completion_length",
            "4",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "no_training_steps" in err, err
    assert not (out / "config.json").exists() and not (out / "adapter_config.json").exists()
