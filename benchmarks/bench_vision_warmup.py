"""What can the starter's vision tower learn to see? The vision warm-up alone, per finding, on held-out films.

The starter build first trains the vision tower and a linear probe over the
merged visual tokens on the findings (`WarmStart.pretrain_vision`, every finding
at 0.3 prevalence), then the report run. This benchmark runs only that first
stage, with the build's own code, for one variant of its data, steps and tower
size, and scores it on films it never saw (another seed's stream, every finding
at `--eval-prevalence`):

- `head`: AUC of the warm-up's own probe (the readout the build trained);
- `ridge`: AUC of a fresh ridge probe on the merged tokens (fitted on 65 % of the
  held-out films, scored on the rest), the `merged` column of `bench_probe.py`.

No text model is trained, so a variant costs minutes, and a row says whether
more films, more steps, a wider or deeper tower or more visual tokens let the
tower see a rare finding at all, before any report or round is trained on it.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_vision_warmup [--vision-n-train N] [--vision-steps N]
        [--vision-depth D] [--vision-embed-dim E] [--image-side PX] [--patch-size PX] --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np  # noqa: TID253 -- this module is heavy; light ones import it lazily
from PIL import Image

from benchmarks.bench_probe import auc, ridge_probe_auc  # noqa: E402
from orapo_core.data.phantom import FINDING_KINDS
from orapo_core.models.starter.architecture import StarterArchitecture, build_config, build_processor, visual_tokens
from orapo_core.models.starter.sft import WarmStart, WarmStartPlan, make_vision_set
from orapo_core.models.starter.tokenizer import train_report_tokenizer


def merged_tokens(warm_start, images: np.ndarray, batch: int = 64) -> np.ndarray:
    """The merged visual tokens of each film, flattened in grid order (what the warm-up's probe reads)."""
    import torch

    visual = warm_start.model.model.visual
    visual.eval()
    out = []
    with torch.no_grad():
        for start in range(0, len(images), batch):
            pictures = [Image.fromarray(a).convert("RGB") for a in images[start : start + batch]]
            vision = warm_start.processor.image_processor(images=pictures, return_tensors="pt")
            warm_start.visual.clear()
            visual(vision["pixel_values"], grid_thw=vision["image_grid_thw"])
            out.append(warm_start.visual[0].reshape(len(pictures), -1).numpy())
    return np.concatenate(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vision-n-train", type=int, default=None, help="warm-up films (default: the build's)")
    parser.add_argument("--vision-steps", type=int, default=None, help="warm-up steps (default: the build's)")
    parser.add_argument("--vision-batch", type=int, default=None)
    parser.add_argument("--vision-lr", type=float, default=None, help="warm-up peak learning rate")
    parser.add_argument("--vision-depth", type=int, default=None)
    parser.add_argument("--vision-embed-dim", type=int, default=None)
    parser.add_argument("--image-side", type=int, default=None)
    parser.add_argument("--patch-size", type=int, default=None)
    parser.add_argument("--n-eval", type=int, default=1000)
    parser.add_argument("--eval-prevalence", type=float, default=0.3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    import torch
    from transformers import Qwen2VLForConditionalGeneration

    kinds = list(FINDING_KINDS)
    plan = WarmStartPlan(seed=args.seed, threads=1)
    plan = replace(
        plan,
        **{
            k: v
            for k, v in {
                "vision_n_train": args.vision_n_train,
                "vision_steps": args.vision_steps,
                "vision_batch": args.vision_batch,
                "vision_pretrain_lr": args.vision_lr,
            }.items()
            if v is not None
        },
    )
    arch = StarterArchitecture()
    arch = replace(
        arch,
        **{
            k: v
            for k, v in {
                "vision_depth": args.vision_depth,
                "vision_embed_dim": args.vision_embed_dim,
                "image_side": args.image_side,
            }.items()
            if v is not None
        },
    )
    arch = replace(arch, patch_size=args.patch_size or arch.image_side // 2)
    torch.set_num_threads(1)
    started = time.perf_counter()
    torch.manual_seed(plan.seed)
    tokenizer = train_report_tokenizer(seed=plan.seed)
    model = Qwen2VLForConditionalGeneration(build_config(arch, tokenizer))
    processor = build_processor(arch, tokenizer)
    train = make_vision_set(plan, arch.image_side)
    # Held-out films: the same generator, another seed's stream, never seen by the warm-up.
    held_out = make_vision_set(
        replace(plan, seed=plan.seed + 1000, vision_n_train=args.n_eval, vision_prevalence=args.eval_prevalence),
        arch.image_side,
    )
    data_s = time.perf_counter() - started
    torch.manual_seed(plan.seed)
    warm = WarmStart(model, processor, plan, n_kinds=len(kinds), side=arch.image_side, n_tokens=visual_tokens(arch))
    result = warm.pretrain_vision(train)
    tokens = merged_tokens(warm, held_out.images)
    with torch.no_grad():
        head = warm.probe["visual"](torch.from_numpy(tokens)).numpy()
    n_fit = int(len(tokens) * 0.65)
    table = {
        "head": [auc(head[:, j], held_out.targets[:, j]) for j in range(len(kinds))],
        "ridge": ridge_probe_auc(tokens, held_out.targets, n_fit),
    }
    tower = sum(p.numel() for p in model.model.visual.parameters())
    label = (
        f"{plan.vision_n_train} films, {result['vision_steps_done']} steps x {plan.vision_batch}, "
        f"tower depth {arch.vision_depth} width {arch.vision_embed_dim} ({tower / 1e6:.2f} M), "
        f"{arch.image_side} px, {visual_tokens(arch)} token(s)"
    )
    print(
        f"# vision warm-up: {label}; final train loss {result['final_vision_loss']}; "
        f"{result['vision_seconds']:.0f} s training, {data_s:.0f} s data"
    )
    print(f"{'finding':28s} {'head':>7s} {'ridge':>7s}")
    for j, kind in enumerate(kinds):
        print(f"{kind:28s} {table['head'][j]:7.3f} {table['ridge'][j]:7.3f}")
    print(
        "command: OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_vision_warmup "
        + " ".join(argv if argv is not None else sys.argv[1:])
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "label": label,
                    "plan": plan.to_dict(),
                    "architecture": arch.to_dict(),
                    "tower_parameters": tower,
                    "findings": kinds,
                    "auc": table,
                    "n_eval": args.n_eval,
                    "eval_prevalence": args.eval_prevalence,
                    "data_seconds": round(data_s, 1),
                    **result,
                },
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
