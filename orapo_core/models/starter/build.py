"""Building the starter folder: tokenizer, model, warm start, save, card.

The folder is written beside its destination and renamed into place only when
complete, so an interrupted build never leaves a half-written model that
`load_model` would then refuse (or worse, serve). `starter_card.json` records
what made it: seed, plan, architecture, data counts, timings, versions.
"""

from __future__ import annotations

import json
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from orapo_core.data.phantom import FINDING_KINDS
from orapo_core.models.starter.architecture import (
    StarterArchitecture,
    build_config,
    build_generation_config,
    build_processor,
    visual_tokens,
)
from orapo_core.models.starter.sft import (
    WarmStart,
    WarmStartPlan,
    make_training_set,
    make_vision_set,
    training_prevalence,
)
from orapo_core.models.starter.tokenizer import train_report_tokenizer

if TYPE_CHECKING:
    from orapo_core.config import Settings

CARD_NAME = "starter_card.json"
# The folder the repository ships the default build in (what `orapo starter build --seed 0` makes).
SHIPPED_DIR = Path(__file__).resolve().parents[3] / "assets" / "starter"
# Plan fields that do not change a build that finished all its steps.
_NOT_IN_RESULT = ("max_minutes", "threads", "prevalence")
_DEFAULT_PLAN = WarmStartPlan()
# What a card written before a plan field existed was built with, where that is not today's default.
_BEFORE_THE_FIELD = {"perception_batch": 0}


def build_starter(
    out_dir: str | Path,
    plan: WarmStartPlan | None = None,
    arch: StarterArchitecture | None = None,
    *,
    show_progress: bool = True,
) -> Path:
    """Build the starter into `out_dir` (replacing what is there) and return the folder."""
    import torch
    import transformers
    from tqdm.auto import tqdm
    from transformers import Qwen2VLForConditionalGeneration

    plan = plan or WarmStartPlan()
    arch = arch or StarterArchitecture()
    if not plan.prevalence:
        plan = WarmStartPlan(
            **{**plan.to_dict(), "prevalence": training_prevalence(plan.rare_fraction, plan.common_prevalence)}
        )
    out = Path(out_dir).expanduser()
    started = time.perf_counter()
    threads_before = torch.get_num_threads()
    torch.set_num_threads(plan.threads)
    try:
        torch.manual_seed(plan.seed)
        tokenizer = train_report_tokenizer(seed=plan.seed)
        model = Qwen2VLForConditionalGeneration(build_config(arch, tokenizer))
        processor = build_processor(arch, tokenizer)

        with tqdm(total=plan.n_train, desc="starter: studies", unit="study", disable=not show_progress) as bar:
            data = make_training_set(plan, tokenizer, arch.image_side, progress=lambda done, _n: bar.update(1))
        vision_data = data
        if plan.vision_steps and plan.vision_prevalence > 0:
            with tqdm(total=plan.vision_n_train, desc="starter: films", unit="film", disable=not show_progress) as bar:
                vision_data = make_vision_set(plan, arch.image_side, progress=lambda done, _n: bar.update(1))
        prepared = time.perf_counter()
        torch.manual_seed(plan.seed)  # the probe's weights do not depend on how long data preparation took
        warm_start = WarmStart(
            model, processor, plan, n_kinds=len(FINDING_KINDS), side=arch.image_side, n_tokens=visual_tokens(arch)
        )
        deadline = started + plan.max_minutes * 60  # the cap is on the whole build
        vision_result = {}
        if plan.vision_steps:
            with tqdm(total=plan.vision_steps, desc="starter: vision", unit="step", disable=not show_progress) as bar:

                def on_vision_step(_step: int, record: dict) -> None:
                    bar.set_postfix(findings=f"{record['vision_loss']:.3f}", refresh=False)
                    bar.update(1)

                vision_result = warm_start.pretrain_vision(vision_data, deadline=deadline, on_step=on_vision_step)
        with tqdm(total=plan.steps, desc="starter: training", unit="step", disable=not show_progress) as bar:

            def on_step(_step: int, record: dict) -> None:
                bar.set_postfix(
                    report=f"{record['report_loss']:.3f}", probe=f"{record['probe_loss']:.3f}", refresh=False
                )
                bar.update(1)

            # The cap is on the whole build, so data preparation on a slow machine shortens training.
            result = {
                **vision_result,
                **warm_start.run(data, deadline=deadline, on_step=on_step, perception=vision_data),
            }

        staging = out.with_name(out.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        model.save_pretrained(staging)
        processor.save_pretrained(staging)
        build_generation_config(tokenizer).save_pretrained(staging)
        card = {
            "name": "orapo-starter",
            "command": build_command(out, plan, arch),
            "plan": plan.to_dict(),
            "architecture": arch.to_dict(),
            "parameters": sum(p.numel() for p in model.parameters()),
            "vocab_size": len(tokenizer),
            "train_findings": data.counts,
            "vision_findings": vision_data.counts,
            "data_seconds": round(prepared - started, 1),
            **result,
            "build_seconds": round(time.perf_counter() - started, 1),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
        }
        (staging / CARD_NAME).write_text(json.dumps(card, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
        return out
    finally:
        torch.set_num_threads(threads_before)


def build_command(out: Path, plan: WarmStartPlan, arch: StarterArchitecture) -> str:
    """The command that makes this build: `orapo starter build`, or for a variant with the architecture
    experiments (`orapo_core.experimental.starter`) the benchmark that builds those."""
    experiments = "".join(
        f" --{name.replace('_', '-')} {getattr(plan, name)}"
        for name in ("vision_n_train", "vision_steps", "perception_batch", "rare_fraction")
        if getattr(plan, name) != getattr(_DEFAULT_PLAN, name)
    )
    if arch != StarterArchitecture():
        experiments += f" --image-side {arch.image_side} --patch-size {arch.patch_size}"
    head = f"python -m benchmarks.bench_starter --build-only --rebuild {out}" if experiments else "orapo starter build"
    return f"{head} --seed {plan.seed} --n-train {plan.n_train} --steps {plan.steps}{experiments}"


def read_card(model_dir: str | Path) -> dict | None:
    """The build card of a starter folder, or None for any other checkpoint."""
    path = Path(model_dir) / CARD_NAME
    return json.loads(path.read_text()) if path.is_file() else None


def copy_shipped_starter(
    out_dir: str | Path, plan: WarmStartPlan | None = None, shipped_dir: Path = SHIPPED_DIR
) -> Path | None:
    """Copy the shipped starter into `out_dir` if it was built, to the last step, with `plan`; else None."""
    plan = plan or WarmStartPlan()
    card = read_card(shipped_dir) if shipped_dir.is_dir() else None
    if card is None or card.get("stopped_by") != "steps" or card.get("vision_stopped_by", "steps") != "steps":
        return None
    wanted = {k: v for k, v in plan.to_dict().items() if k not in _NOT_IN_RESULT}
    # A field newer than the card: its build ran without what the field turns on (`_BEFORE_THE_FIELD`), else with
    # the default.
    defaults = {**_DEFAULT_PLAN.to_dict(), **_BEFORE_THE_FIELD}
    if any(card["plan"].get(k, defaults[k]) != v for k, v in wanted.items()):
        return None
    if card.get("architecture") != StarterArchitecture().to_dict():
        return None
    out = Path(out_dir).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    # A staging folder of its own: two first requests of a new data folder may copy at once (one used to fail
    # with FileExistsError on a shared ".partial"); whichever finishes second keeps the first one's copy.
    staging = Path(tempfile.mkdtemp(prefix=out.name + ".partial-", dir=out.parent))
    try:
        shutil.copytree(shipped_dir, staging, dirs_exist_ok=True)
        if (out / "config.json").is_file():
            return out  # another copy finished first
        if out.exists():
            shutil.rmtree(out)  # a half-written folder of an interrupted copy
        try:
            staging.rename(out)
        except OSError:
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def ensure_starter(out_dir: str | Path, *, show_progress: bool = True) -> Path:
    """The default starter in `out_dir`: left alone if there, else copied from the shipped asset, else built."""
    out = Path(out_dir).expanduser()
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    return copy_shipped_starter(out) or build_starter(out, show_progress=show_progress)


def find_starter(settings: Settings | None = None) -> Path | None:
    """The starter a benchmark should use by default: the data folder's, else the shipped one, else None."""
    from orapo_core.config import Settings  # noqa: PLC0415 -- loads pydantic_settings, pydantic

    for folder in ((settings or Settings()).models_dir / "starter", SHIPPED_DIR):
        if (folder / "config.json").is_file():
            return folder
    return None
