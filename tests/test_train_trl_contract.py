"""The TRL contract `OraPOTrainer` relies on, in one file: a TRL upgrade that changes it fails here, by name.

The trainer overrides GRPOTrainer's private hooks (their names and parameters),
calls its forward helper with image keywords, reads its attributes, patches the
copy of a model TRL's fused head has wrapped, and assumes TRL lays out each
prompt's K rollouts as contiguous rows (`RepeatSampler`), both for the groups it
mines and for the prompt a reference forward shares. Each of those is checked
here against the installed TRL, on a tiny model where a trainer is needed.
"""

from __future__ import annotations

import inspect
import re

import pytest

from tests.support.training import K, four_studies, make_trainer

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")

# GRPOTrainer (or transformers.Trainer) method -> the parameters OraPOTrainer's override receives or its call passes.
HOOKS = {
    "_calculate_rewards": ("inputs", "prompts", "completions", "completion_ids_list"),
    "_generate_and_score_completions": ("inputs",),
    "_compute_loss": ("model", "inputs"),
    "_get_per_token_logps_and_entropies": ("model", "input_ids", "attention_mask", "logits_to_keep", "batch_size"),
    "_save_checkpoint": ("model", "trial"),
    "_load_optimizer_and_scheduler": ("checkpoint",),
    "_get_output_dir": ("trial",),
    "create_optimizer": ("model",),
}
# What the trainer reads off a constructed GRPOTrainer.
ATTRIBUTES = (
    "num_generations",
    "num_generations_eval",
    "reward_weights",
    "ref_model",
    "_metrics",
    "temperature",
    "eos_token_ids",
    "max_completion_length",
    "_tokenizer",
    "accelerator",
    "reward_funcs",
)


def _parameters(function) -> list[str]:
    return [p for p in inspect.signature(function).parameters if p != "self"]


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_the_hooks_keep_their_names_and_parameters(name):
    from trl import GRPOTrainer

    from orapo_core.train.trainer import OraPOTrainer

    upstream = getattr(GRPOTrainer, name)
    assert _parameters(upstream)[: len(HOOKS[name])] == list(HOOKS[name]), (
        f"TRL changed {name}{inspect.signature(upstream)}"
    )
    if name in vars(OraPOTrainer) and name != "_get_per_token_logps_and_entropies":  # overridden: same call shape
        assert _parameters(getattr(OraPOTrainer, name)) == _parameters(upstream)


def test_the_forward_helper_takes_every_image_keyword_the_trainer_passes():
    from trl import GRPOTrainer

    from orapo_core.train.trainer import _FORWARD_KEYS

    accepted = set(_parameters(GRPOTrainer._get_per_token_logps_and_entropies))
    assert set(_FORWARD_KEYS) | {"token_type_ids", "mm_token_type_ids", "batch_size"} <= accepted


def test_the_helpers_the_trainer_imports_exist():
    from trl.models import prepare_deepspeed  # noqa: F401
    from trl.models.utils import disable_gradient_checkpointing  # noqa: F401
    from trl.trainer.utils import (  # noqa: F401
        RepeatSampler,
        add_fused_lm_head,
        pad,
        split_pixel_values_by_grid,
        unsplit_pixel_values_by_grid,
        use_adapter,
    )


def test_repeat_sampler_keeps_a_prompts_rollouts_contiguous():
    from trl.trainer.utils import RepeatSampler

    indices = list(
        RepeatSampler(list(range(6)), mini_repeat_count=K, batch_size=3, repeat_count=1, shuffle=True, seed=0)
    )
    groups = [indices[i : i + K] for i in range(0, len(indices), K)]
    assert all(len(set(g)) == 1 for g in groups) and sorted(g[0] for g in groups) == list(range(6))


@pytest.fixture(scope="module")
def trainer(tiny_model, tmp_path_factory):
    return make_trainer(tiny_model, four_studies(tmp_path_factory.mktemp("studies")), tmp_path_factory.mktemp("run"))


def test_the_trainer_reads_attributes_trl_sets(trainer):
    missing = [name for name in ATTRIBUTES if not hasattr(trainer, name)]
    assert not missing, f"GRPOTrainer no longer sets {missing}"
    # and the state it hands between hooks is declared before any hook runs
    assert trainer._last_rewards_per_func is None and trainer._rollout_logps is None
    assert trainer._capture_rollout_logps is False


def test_the_batch_the_trainer_receives_has_each_studys_rollouts_contiguous(trainer):
    batch = next(iter(trainer.get_train_dataloader()))
    studies = [row["study_id"] for row in batch] if isinstance(batch, list) else list(batch["study_id"])
    assert len(studies) % K == 0 and len(studies) >= 2 * K
    assert all(len(set(studies[i : i + K])) == 1 for i in range(0, len(studies), K)), studies


def test_a_generation_returns_the_keys_the_oracle_rows_read(trainer):
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    rows = [trainer.train_dataset[i] for i in (0, 0, 1, 1)]
    out = trainer._generate_and_score_completions(rows)
    assert {"advantages", "completion_ids", "completion_mask", "prompt_ids", "prompt_mask"} <= set(out)
    assert out["advantages"].shape[0] == len(rows) and trainer._last_rewards_per_func.shape == (len(rows), 1)
    assert {"orapo_coef", "orapo_chosen_ids", "orapo_ref_chosen_logps"} <= set(out)  # the trainer's own, per row


def test_trls_fused_head_is_an_instance_forward_a_copy_must_drop(tiny_model):
    """`OraPOTrainer._frozen_copy` removes `forward` from the copy's instance dict and patches the copy afresh."""
    from transformers import AutoModelForImageTextToText
    from trl.trainer.utils import add_fused_lm_head

    model = AutoModelForImageTextToText.from_pretrained(tiny_model)
    assert "forward" not in vars(model)
    add_fused_lm_head(model)
    assert "forward" in vars(model), (
        "TRL's fused head no longer patches the instance: revisit OraPOTrainer._frozen_copy"
    )


def test_the_loss_types_the_config_accepts_are_the_ones_trl_computes():
    from trl import GRPOTrainer

    from orapo_core.train.config import TRL_LOSS_TYPES

    source = inspect.getsource(GRPOTrainer._compute_loss)
    named = {
        name for line in source.splitlines() if "self.loss_type" in line for name in re.findall(r'"([a-z_]+)"', line)
    }
    assert named == set(TRL_LOSS_TYPES), f"TRL computes {sorted(named)}, the config accepts {sorted(TRL_LOSS_TYPES)}"
