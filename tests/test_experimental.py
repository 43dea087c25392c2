"""`orapo_core.experimental`: the ablation's oracle modes apart from the product, and the product never importing them.

The product's `OraPOConfig` trains OraPO's DPO term only; `AblationConfig` / `AblationTrainer` add the ablation's
SFT-on-the-oracle and GRPO-alone modes through the trainer's three oracle-term hooks, and in DPO mode train exactly
as the product does.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.training import four_studies, make_trainer

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "orapo_core" / "train" / "recipes"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return four_studies(tmp_path_factory.mktemp("images"))


def _ablation(tiny_model, dataset, out, **overrides):
    from orapo_core.experimental import AblationConfig, AblationTrainer

    return make_trainer(
        tiny_model, dataset, out, config_class=AblationConfig, trainer_class=AblationTrainer, **overrides
    )


def test_no_product_module_imports_the_experiments():
    offenders = []
    for folder in ("app", "db", "orapo_core"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "experimental" in path.relative_to(ROOT).parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                offenders += [
                    f"{path.relative_to(ROOT)}: {n}" for n in names if n.startswith("orapo_core.experimental")
                ]
    assert not offenders, offenders


def test_the_ablation_config_takes_the_ablation_modes_and_refuses_a_pair_without_dpo(tmp_path):
    from orapo_core.experimental import AblationConfig, parse_ablation_recipe
    from orapo_core.train.config import OraPOConfig

    common = dict(output_dir=str(tmp_path), bf16=False, use_cpu=True, report_to="none")
    assert {AblationConfig(oracle_mode=m, **common).oracle_mode for m in ("dpo", "sft", "none")} == {
        "dpo",
        "sft",
        "none",
    }
    with pytest.raises(ValueError, match="use_clinician_pairs needs oracle_mode='dpo'"):
        AblationConfig(oracle_mode="sft", use_clinician_pairs=True, **common)
    with pytest.raises(ValueError, match="oracle_mode must be one of dpo, sft, none"):
        AblationConfig(oracle_mode="ppo", **common)
    # the same recipe, the same settings: one more accepted value, nothing else
    _, grpo, _ = parse_ablation_recipe(
        RECIPES / "round-cpu.yaml",
        ["--output_dir", str(tmp_path), "--oracle_mode", "none", "--use_clinician_pairs", "false"],
    )
    assert isinstance(grpo, AblationConfig) and grpo.oracle_mode == "none"
    from dataclasses import fields

    assert [f.name for f in fields(AblationConfig)] == [f.name for f in fields(OraPOConfig)]


def test_in_dpo_mode_the_ablation_trains_exactly_as_the_product(tiny_model, dataset, tmp_path):
    losses, pairs = [], []
    for name, make in (("product", make_trainer), ("ablation", _ablation)):
        trainer = make(tiny_model, dataset, tmp_path / name, zero_reward_threshold=0.5)
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
        torch.manual_seed(1)
        batch = trainer._generate_and_score_completions([dataset[i] for i in (1, 1, 3, 3)])
        pairs.append(batch["orapo_coef"].tolist())
        losses.append(trainer._compute_loss(trainer.model, batch).item())
    assert any(c > 0 for c in pairs[0])  # the batch carries DPO pairs, so the oracle term is compared too
    assert pairs[0] == pairs[1] and losses[0] == losses[1]


def test_grpo_only_has_no_oracle_term(tiny_model, dataset, tmp_path):
    trainer = _ablation(tiny_model, dataset, tmp_path / "run", oracle_mode="none")
    assert trainer.ref_model is None  # beta = 0 and no DPO: no reference is built
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    batch = trainer._generate_and_score_completions([dataset[i] for i in (0, 0, 1, 1)])
    assert "orapo_chosen_ids" not in batch and batch["orapo_coef"].abs().sum() == 0
    assert trainer._metrics["train"]["orapo/pairs"][-1] == 0.0
    from trl import GRPOTrainer

    assert trainer._compute_loss(trainer.model, batch).item() == pytest.approx(
        GRPOTrainer._compute_loss(trainer, trainer.model, batch).item()
    )


def test_sft_mode_scores_only_the_oracle(tiny_model, dataset, tmp_path):
    sft = _ablation(tiny_model, dataset, tmp_path / "sft", oracle_mode="sft", zero_reward_threshold=0.5)
    assert sft.ref_model is None  # SFT on the oracle needs no reference
    sft.model.train()
    sft.current_gradient_accumulation_steps = 1
    batch = sft._generate_and_score_completions([dataset[i] for i in (1, 1, 3, 3)])
    assert "orapo_rejected_ids" not in batch and (batch["orapo_coef"] > 0).any()
    from trl import GRPOTrainer

    grpo = GRPOTrainer._compute_loss(sft, sft.model, batch).item()
    assert sft._compute_loss(sft.model, batch).item() > grpo  # + w·NLL(oracle) > 0 on a random model
    # the oracle's mean per-token log-prob is logged beside the loss: in SFT mode the loss is exactly its negative
    logged = sft._metrics["train"]
    assert logged["orapo/oracle_logp"][-1] < 0
    assert logged["orapo/oracle_logp"][-1] == pytest.approx(-logged["orapo/sft_loss"][-1], rel=1e-5)
    assert "orapo/dpo_loss" not in logged


def test_the_sft_term_is_the_oracles_negative_mean_log_prob():
    from orapo_core.experimental.ablation import sft_loss

    assert sft_loss(torch.tensor([-0.7])).item() == pytest.approx(0.7)
