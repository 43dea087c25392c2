"""One training round from parsed configs: load the local model, build the dataset, train, save.

This is what `orapo train` runs, what the app launches as a separate process,
and what the ablation benchmark trains each method with; it is kept apart from
the CLI so a Python caller gets the same round. The policy is loaded by
`orapo_core.models.loading.load_for_training`, so a checkpoint whose weights do
not fit its config is refused here as it is when served. A recipe that names no
model trains the model the app serves (`resolve_model_dir`: ORAPO_MODEL_DIR,
else the starter); one that names no data may ask for PhantomCXR studies
(`phantom_studies`), as the smoke recipe does.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from orapo_core.errors import OrapoError
from orapo_core.models.loading import load_for_training, resolve_model_dir

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import ModelConfig

    from orapo_core.facts.reward import RewardFunction
    from orapo_core.train.config import OraPOConfig, OraPOScriptArguments
    from orapo_core.train.trainer import OraPOTrainer

PHANTOM_FOLDER = "phantomcxr"
PHANTOM_SIZE = 128  # px a side: the starter sees 96x96; a smoke run needs no more


def phantom_training_data(script_args: OraPOScriptArguments, training_args: OraPOConfig) -> Path | None:
    """With no train_csv and `phantom_studies` set, the CSV of that many PhantomCXR studies in <output_dir>/phantomcxr.

    Written once and reused while the count and seed match (a second smoke run does not redraw them).
    """
    if script_args.train_csv or not script_args.phantom_studies:
        return None
    from orapo_core.data.phantom import write_dataset  # noqa: PLC0415 -- loads numpy

    assert training_args.output_dir is not None  # TrainingArguments.__post_init__ fills it in
    folder = Path(training_args.output_dir).resolve() / PHANTOM_FOLDER
    wanted = {"n": script_args.phantom_studies, "seed": training_args.seed, "size": PHANTOM_SIZE}
    stamp = folder / "phantom_set.json"
    csv_path = next(iter(sorted(folder.glob("*.csv"))), None) if folder.is_dir() else None
    if csv_path is None or not stamp.is_file() or json.loads(stamp.read_text()) != wanted:
        csv_path = write_dataset(folder, wanted["n"], seed=wanted["seed"], size=PHANTOM_SIZE)
        stamp.write_text(json.dumps(wanted))
    return csv_path


def train_round(
    script_args: OraPOScriptArguments,
    training_args: OraPOConfig,
    model_args: ModelConfig,
    *,
    reward_funcs: list[RewardFunction] | None = None,
    train_dataset: Dataset | None = None,
    callbacks: list[TrainerCallback] | None = None,
    trainer_class: type[OraPOTrainer] | None = None,
) -> Path:
    """Train one round and save the model (or LoRA adapter), processor, miner state and resolved recipe.

    `callbacks` are extra `transformers.TrainerCallback`s (the ablation evaluates at checkpoints with one);
    `trainer_class` a subclass of `OraPOTrainer` to train with (the ablation's, `orapo_core.experimental`).
    """
    from trl import get_peft_config

    from orapo_core.train.dataset import load_round_dataset  # noqa: PLC0415 -- loads numpy
    from orapo_core.train.trainer import MINER_STATE_FILE, OraPOTrainer  # noqa: PLC0415 -- loads trl, peft

    if train_dataset is None:
        phantom_csv = phantom_training_data(script_args, training_args)
        if phantom_csv is not None:
            script_args.train_csv = str(phantom_csv)
    dataset = train_dataset if train_dataset is not None else load_round_dataset(script_args)
    no_step = OrapoError(
        "no_training_steps",
        f"Training would take no optimizer step: {len(dataset)} studies, and one "
        f"step takes {training_args.studies_per_step}. Nothing was saved; add "
        "studies or lower per_device_train_batch_size.",
    )
    if len(dataset) < training_args.studies_per_step:
        raise no_step
    model_dir = resolve_model_dir(model_args.model_name_or_path)
    model_args.model_name_or_path = str(model_dir)  # the resolved recipe records the model actually trained
    policy = load_for_training(model_dir, dtype=model_args.dtype, attn_implementation=model_args.attn_implementation)
    processor = policy.processor
    unread: dict[str, float | None] = {}  # the AUC of each finding read too poorly to teach (None: too few films)
    if (
        training_args.oracle_nll_min_auc > 0
        and not training_args.oracle_nll_skip_findings
        and (
            training_args.oracle_unread_scope == "report"
            or (training_args.oracle_nll_weight and training_args.oracle_nll_focus == "differing")
        )
    ):
        from orapo_core.models.verifier import unreadable_findings  # noqa: PLC0415 -- loads numpy

        unread = unreadable_findings(
            policy.model, processor, dataset, min_auc=training_args.oracle_nll_min_auc, prompt=script_args.prompt_text
        )
        training_args.oracle_nll_skip_findings = sorted(unread)
        said = ", ".join(f"{k} ({'too few films' if v is None else f'AUC {v:.2f}'})" for k, v in sorted(unread.items()))
        print(
            f"oracle NLL: leaves out the sentences of findings the model reads below AUC "
            f"{training_args.oracle_nll_min_auc}: {said or 'none'}",
            flush=True,
        )
    unapplied: dict[str, object] = {}
    if training_args.oracle_unread_scope == "report" and training_args.oracle_nll_skip_findings:
        from orapo_core.train.dataset import without_unread_additions  # noqa: PLC0415 -- loads the labeller

        dataset, changed = without_unread_additions(dataset, training_args.oracle_nll_skip_findings)
        print(
            f"oracle reports: the corrections adding {', '.join(training_args.oracle_nll_skip_findings)} are left "
            f"unapplied on {changed} studies whose draft did not state them",
            flush=True,
        )
        unapplied = {
            "studies": changed,
            "min_auc": training_args.oracle_nll_min_auc,
            "findings": {name: unread.get(name) for name in training_args.oracle_nll_skip_findings},
        }
    trainer = (trainer_class or OraPOTrainer)(
        model=policy.model,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset,
        processing_class=processor,
        peft_config=get_peft_config(model_args),
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    if trainer.state.global_step == 0:
        # transformers can end "successfully" at step 0: a model saved from that would be the untouched base,
        # and a round would count its corrections as trained.
        raise no_step
    assert training_args.output_dir is not None  # TrainingArguments.__post_init__ fills it in
    out = Path(training_args.output_dir)
    trainer.save_model(str(out))
    if trainer.accelerator.is_main_process:
        processor.save_pretrained(str(out))
        trainer.miner.save(out / MINER_STATE_FILE)
        if training_args.finding_verifier:
            from orapo_core.models.verifier import describe, fit_round_verifier  # noqa: PLC0415 -- loads numpy

            verifier = fit_round_verifier(
                trainer.model,
                processor,
                dataset,
                keep=training_args.finding_verifier_keep,
                prompt=script_args.prompt_text,
                add_max_fpr=training_args.finding_verifier_add_max_fpr,
            )
            if verifier is not None:
                verifier.save(out)
            print(
                f"finding verifier: {describe(verifier) or 'none (no finding taught by 10 corrections and read at AUC >= 0.9)'}",
                flush=True,
            )
        resolved: dict[str, object] = {
            "script": asdict(script_args),
            "model": asdict(model_args),
            "training": training_args.to_dict(),
        }
        if unapplied:  # what the round page says of the corrections it did not teach
            resolved["unapplied_corrections"] = unapplied
        (out / "orapo_recipe.json").write_text(json.dumps(resolved, indent=2, default=str))
    return out
