"""The reference's shared-prompt scoring against the row-by-row one, on every tiny VLM family.

`OraPOTrainer` scores a study's oracle and rejected answers under the reference after one run of the study's
prompt (`orapo_core.train.shared_prompt`); row by row, each (prompt, answer) ran in full. The two must agree to
float rounding, and so must the loss and its gradients. Studies with images of different sizes give prompts of
different lengths (left padding) where the family's processor keeps the size.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
from tests.support.tiers import first_fast  # noqa: E402
from tests.support.tiny_vlms import build_tiny_vlm  # noqa: E402

K = 3


def zero_reward(completions, **kwargs):
    """Every rollout fails, so every row carries a pair (two rollouts and the clinician's draft per study)."""
    return [0.0] * len(completions)


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    from PIL import Image

    from orapo_core.train.dataset import build_training_dataset

    folder = tmp_path_factory.mktemp("images")
    records = []
    for i, size in enumerate([(56, 56), (112, 84)]):
        path = folder / f"{i}.png"
        Image.new("L", size, color=40 + 80 * i).save(path)
        records.append(
            {
                "study_id": f"s{i}",
                "image": str(path),
                "labels": {},
                "reference_report": "Findings: The lungs are clear.",
                "oracle_report": [
                    "Findings: A moderate pleural effusion is present at the right base.",
                    "Findings: No pneumothorax.",
                ][i],
                "clinician_chosen": "Findings: No pleural effusion.",
                "clinician_rejected": "Findings: Small pleural effusion.",
            }
        )
    return build_training_dataset(records)


def _trainer(model_dir: Path, dataset, out: Path):
    from transformers import AutoModelForImageTextToText

    from orapo_core.models.compat import load_processor
    from orapo_core.train.config import OraPOConfig
    from orapo_core.train.trainer import OraPOTrainer

    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    args = OraPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=2 * K,
        num_generations=K,
        max_completion_length=8,
        max_steps=1,
        learning_rate=1e-2,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        seed=0,
        dpo_beta=0.5,
        use_clinician_pairs=True,
        reward_name="tests.unused:reward",
    )
    trainer = OraPOTrainer(
        model=model,
        reward_funcs=zero_reward,
        args=args,
        train_dataset=dataset,
        processing_class=load_processor(model_dir, model.config),
    )
    with torch.no_grad():  # move the policy away from the frozen reference, so the DPO margins are not all 0
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def _loss_and_grads(trainer, batch) -> tuple[float, dict[str, torch.Tensor]]:
    trainer.model.zero_grad()
    loss = trainer._compute_loss(trainer.model, batch)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", first_fast())  # qwen2_vl in the fast tier, every family in `make test`
def test_shared_prompt_reference_matches_row_by_row_scoring(family, studies, tmp_path):
    from orapo_core.train.shared_prompt import supports_shared_prompt

    trainer = _trainer(build_tiny_vlm(tmp_path / "model", family=family), studies, tmp_path / "run")
    assert supports_shared_prompt(trainer.ref_model) and trainer._reference_shares_prompt()
    batch = trainer._generate_and_score_completions([studies[i] for i in (0,) * K + (1,) * K])
    rows = torch.nonzero(batch["orapo_coef"] > 0).flatten()
    assert rows.numel() == 2 * K  # every row has a pair: the failed rollouts and, on a free row, the clinician's draft
    assert not batch["orapo_rejected_is_rollout"].all()  # ... so some rejected answers are texts, not rollouts
    if family == "qwen2_vl":
        assert (batch["prompt_mask"] == 0).any()  # two image sizes: prompts of two lengths, left-padded

    trainer._reference_shares_prompt = lambda: False  # the row-by-row path, as before the shared prompt
    selected = trainer._select_rows(batch, rows)
    chosen, rejected = trainer._reference_pair_logps(selected, torch.ones_like(rows, dtype=torch.bool), rows // K)
    assert batch["orapo_ref_chosen_logps"][rows].tolist() == pytest.approx(chosen.tolist(), abs=1e-4)
    assert batch["orapo_ref_rejected_logps"][rows].tolist() == pytest.approx(rejected.tolist(), abs=1e-4)
    assert len(set(chosen.tolist())) > 1 and len(set(rejected.tolist())) > 2  # real, distinct log-probs

    # The loss and its gradients with either reference column set
    row_by_row = dict(
        batch,
        orapo_ref_chosen_logps=batch["orapo_ref_chosen_logps"].clone(),
        orapo_ref_rejected_logps=batch["orapo_ref_rejected_logps"].clone(),
    )
    row_by_row["orapo_ref_chosen_logps"][rows] = chosen
    row_by_row["orapo_ref_rejected_logps"][rows] = rejected
    shared_loss, shared_grads = _loss_and_grads(trainer, batch)
    plain_loss, plain_grads = _loss_and_grads(trainer, row_by_row)
    assert shared_loss == pytest.approx(plain_loss, abs=1e-5)
    assert shared_grads.keys() == plain_grads.keys() and shared_grads
    for name, grad in shared_grads.items():
        torch.testing.assert_close(grad, plain_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_a_checkpointed_reference_in_training_mode_still_scores_after_the_prompt(studies, tmp_path):
    """A PEFT policy is its own reference, in training mode and often checkpointed: its layers would drop the cache."""
    trainer = _trainer(build_tiny_vlm(tmp_path / "model", family="qwen2_vl"), studies, tmp_path / "run")
    batch = trainer._generate_and_score_completions([studies[i] for i in (0,) * K + (1,) * K])
    rows = torch.nonzero(batch["orapo_coef"] > 0).flatten()
    trainer.ref_model.gradient_checkpointing_enable()
    trainer.ref_model.train()
    selected = trainer._select_rows(batch, rows)
    chosen, rejected = trainer._reference_pair_logps(selected, torch.ones_like(rows, dtype=torch.bool), rows // K)
    assert chosen.tolist() == pytest.approx(batch["orapo_ref_chosen_logps"][rows].tolist(), abs=1e-4)
    assert rejected.tolist() == pytest.approx(batch["orapo_ref_rejected_logps"][rows].tolist(), abs=1e-4)
    assert trainer.ref_model.is_gradient_checkpointing  # turned back on afterwards


def test_a_family_not_listed_is_scored_row_by_row():
    from types import SimpleNamespace

    from orapo_core.train.shared_prompt import supports_shared_prompt

    assert not supports_shared_prompt(SimpleNamespace(config=SimpleNamespace(model_type="paligemma")))
    assert supports_shared_prompt(SimpleNamespace(config=SimpleNamespace(model_type="qwen2_5_vl")))
