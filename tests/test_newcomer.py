"""A newcomer's first commands on a fresh clone and a fresh data folder, with the real shipped starter.

`orapo draft IMAGE`, `orapo eval --data CSV` and `orapo train --config smoke-cpu.yaml` as the README writes
them: no --model, no ORAPO_MODEL_DIR, no data prepared. Each must use the starter shipped in assets/starter
(copied into the data folder, as `orapo serve` does) instead of failing with model_not_found, and the smoke
recipe must train on PhantomCXR studies it generates. The starter has ~6M parameters: seconds per command.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from orapo_core.models.starter.build import SHIPPED_DIR

pytestmark = pytest.mark.skipif(
    not (SHIPPED_DIR / "config.json").is_file(), reason=f"no starter shipped under {SHIPPED_DIR}"
)
SMOKE = Path(__file__).resolve().parents[1] / "orapo_core" / "train" / "recipes" / "smoke-cpu.yaml"


@pytest.fixture
def fresh(data_dir, monkeypatch):
    monkeypatch.delenv("ORAPO_MODEL_DIR", raising=False)
    assert not (data_dir / "models").exists()
    return data_dir


def test_draft_on_a_fresh_data_folder_uses_the_shipped_starter(fresh, tmp_path, capsys):
    from PIL import Image

    from app.cli import main
    from orapo_core.data.phantom import generate_study

    png = tmp_path / "chest.png"
    Image.fromarray(np.round(generate_study(11, size=256).image * 255).astype(np.uint8)).save(png)
    assert main(["draft", str(png), "--samples", "0", "--max-new-tokens", "48", "--json"]) == 0, capsys.readouterr().err
    draft = json.loads(capsys.readouterr().out)
    assert draft["text"] and draft["model_name"] == "starter"
    starter = fresh.resolve() / "models" / "starter"
    assert (starter / "model.safetensors").read_bytes() == (SHIPPED_DIR / "model.safetensors").read_bytes()


def test_eval_on_a_fresh_data_folder_uses_the_shipped_starter(fresh, tmp_path, capsys):
    from app.cli import main
    from orapo_core.data import write_dataset

    csv_path = write_dataset(tmp_path / "phantom", n=3, seed=5, size=128)
    assert main(["eval", "--data", str(csv_path), "--max-new-tokens", "32"]) == 0, capsys.readouterr().err
    assert "studies: 3" in capsys.readouterr().out
    assert (fresh.resolve() / "models" / "starter" / "config.json").is_file()


@pytest.mark.slow
def test_the_smoke_recipe_runs_as_written(fresh, tmp_path, monkeypatch, capsys):
    """`orapo train --config orapo_core/train/recipes/smoke-cpu.yaml`, nothing else: the starter, generated phantoms."""
    from app.cli import main

    monkeypatch.chdir(tmp_path)  # the recipe's output_dir (runs/smoke) is relative
    assert main(["train", "--config", str(SMOKE)]) == 0, capsys.readouterr().err
    out = tmp_path / "runs" / "smoke"
    assert (out / "phantomcxr" / "phantom_set.json").is_file() and len(list((out / "phantomcxr").glob("*.csv"))) == 1
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert sum("orapo/zero_reward_frac" in s for s in steps) == 2  # max_steps: 2
    resolved = json.loads((out / "orapo_recipe.json").read_text())
    assert resolved["model"]["model_name_or_path"] == str(fresh.resolve() / "models" / "starter")
    assert resolved["script"]["train_csv"].startswith(str(out / "phantomcxr"))
    assert (out / "model.safetensors").is_file()  # the smoke recipe fine-tunes the whole (tiny) starter
