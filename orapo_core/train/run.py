"""One training round from parsed configs: load the local model, build the dataset, train, save.

This is what `orapo train` runs, and what the app launches as a separate
process; it is kept apart from the CLI so a Python caller gets the same round.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from orapo_core.errors import OrapoError


def load_policy(model_args):
    """The local image-text-to-text checkpoint named by `model_name_or_path`, and its processor."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from orapo_core.models.compat import load_processor
    from orapo_core.models.loading import check_model_dir

    if not model_args.model_name_or_path:
        raise OrapoError("model_not_found", "The recipe names no model: set model_name_or_path to a local checkpoint folder.")
    path = check_model_dir(model_args.model_name_or_path)
    dtype = model_args.dtype
    if dtype not in (None, "auto"):
        dtype = getattr(torch, dtype)
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    model = AutoModelForImageTextToText.from_pretrained(
        path, config=config, dtype=dtype, local_files_only=True, attn_implementation=model_args.attn_implementation
    )
    return model, load_processor(path, config)


def train_round(script_args, training_args, model_args, *, reward_funcs=None, train_dataset=None) -> Path:
    """Train one round and save the model (or LoRA adapter), processor, miner state and resolved recipe."""
    from trl import get_peft_config

    from orapo_core.train.dataset import load_round_dataset
    from orapo_core.train.trainer import MINER_STATE_FILE, OraPOTrainer

    dataset = train_dataset if train_dataset is not None else load_round_dataset(script_args)
    per_step = training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps
    studies_per_step = max(1, per_step // max(1, training_args.num_generations))
    no_step = OrapoError("no_training_steps", f"Training would take no optimizer step: {len(dataset)} studies, and one "
                                              f"step takes {studies_per_step}. Nothing was saved; add studies or lower "
                                              "per_device_train_batch_size.")
    if len(dataset) < studies_per_step:
        raise no_step
    model, processor = load_policy(model_args)
    trainer = OraPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset,
        processing_class=processor,
        peft_config=get_peft_config(model_args),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    if trainer.state.global_step == 0:
        # transformers can end "successfully" at step 0: a model saved from that would be the untouched base,
        # and a round would count its corrections as trained.
        raise no_step
    out = Path(training_args.output_dir)
    trainer.save_model(str(out))
    if trainer.accelerator.is_main_process:
        processor.save_pretrained(str(out))
        trainer.miner.save(out / MINER_STATE_FILE)
        resolved = {"script": asdict(script_args), "model": asdict(model_args), "training": training_args.to_dict()}
        (out / "orapo_recipe.json").write_text(json.dumps(resolved, indent=2, default=str))
    return out
