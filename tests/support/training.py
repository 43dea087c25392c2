"""A tiny OraPO training set-up: four studies, a reward a test can recompute, and the trainer over a tiny model."""

from __future__ import annotations

from pathlib import Path

K = 2  # rollouts per study


def parity_reward(completions, completion_ids, **kwargs):
    """Deterministic from the tokens, so a test can recompute it: half the rollouts fail on average."""
    return [float(sum(ids) % 2) for ids in completion_ids]


def four_studies(folder: Path):
    """Four studies with a grey image each; the odd ones have an oracle report besides the reference report."""
    from PIL import Image

    from orapo_core.train.dataset import build_training_dataset

    records = []
    for i in range(4):
        path = folder / f"{i}.png"
        Image.new("L", (56, 56), color=30 + 50 * i).save(path)
        records.append(
            {
                "study_id": f"s{i}",
                "image": str(path),
                "labels": {"Pleural Effusion": 1},
                "reference_report": "Findings: The lungs are clear.",
                "oracle_report": "Findings: A moderate pleural effusion is present at the right base."
                if i % 2
                else None,
            }
        )
    return build_training_dataset(records)


def make_trainer(model_dir: Path, dataset, out: Path, *, config_class=None, trainer_class=None, **overrides):
    """An OraPOTrainer on `model_dir` with the parity reward: 2 studies x K rollouts a step, 6-token answers.

    `config_class` and `trainer_class` replace OraPOConfig and OraPOTrainer (the ablation's, orapo_core.experimental)."""
    import torch
    from transformers import AutoModelForImageTextToText

    from orapo_core.models.compat import load_processor
    from orapo_core.train.config import OraPOConfig
    from orapo_core.train.trainer import OraPOTrainer

    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    settings = dict(
        output_dir=str(out),
        per_device_train_batch_size=2 * K,
        num_generations=K,
        max_completion_length=6,
        max_steps=2,
        logging_steps=1,
        learning_rate=1e-2,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        seed=0,
        dpo_beta=0.5,
        reward_name="tests.unused:reward",
    )
    settings.update(overrides)
    args = (config_class or OraPOConfig)(**settings)
    return (trainer_class or OraPOTrainer)(
        model=model,
        reward_funcs=parity_reward,
        args=args,
        train_dataset=dataset,
        processing_class=load_processor(model_dir, model.config),
    )
