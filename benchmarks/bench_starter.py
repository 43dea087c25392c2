"""The starter model: size, memory, draft latency, build time and clinical efficacy on held-out phantoms.

Run on two cores, as the targets say (draft in 2 s or less, K=4 in 4 s or less):

    OMP_NUM_THREADS=2 taskset -c 0,1 .venv/bin/python -m benchmarks.bench_starter [--model DIR]

The model is the one given, else `<ORAPO_DATA_DIR>/models/starter`, else the
shipped `assets/starter`. Latencies are medians over `--repeats` drafts of
different studies through `Drafter.draft` (the product's path, image at 512 px).
Build time is the card's (`starter_card.json`), or a fresh build with
`--rebuild DIR`, which also builds the architecture experiments `orapo starter
build` leaves out (`--image-side`, `--patch-size`, `--vision-n-train`,
`--vision-steps`, `--perception-batch`, `--rare-fraction`; through
`orapo_core.experimental.starter`); `--build-only` stops after the build:

    OMP_NUM_THREADS=2 .venv/bin/python -m benchmarks.bench_starter --build-only --rebuild DIR --minutes 90 \
        --vision-n-train 2000 --vision-steps 1000 --perception-batch 0 --rare-fraction 0.25

(that one is the starter shipped until 2026-12-07; the defaults are today's).
 Clinical efficacy: greedy drafts of `--n-eval` PhantomCXR studies
at the default (natural) prevalences from a seed the build never uses, labelled
by FactS on both sides (draft and reference report), 14 CheXpert observations;
the drafts are decoded in batches of identical prompts, which is greedy
decoding all the same, only faster to measure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

from orapo_core.facts import label_report
from orapo_core.facts.metrics import clinical_efficacy
from orapo_core.models.picture import to_rgb_image
from orapo_core.models.prompt import render_prompt
from orapo_core.report_layout import report_text

RARE = ("Pneumothorax", "Fracture", "Lung Lesion", "Pleural Other")
COMMON = ("Cardiomegaly", "Pleural Effusion", "Edema", "Consolidation", "Lung Opacity", "Support Devices", "No Finding")


def _model_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    from orapo_core.config import Settings  # noqa: PLC0415 -- loads pydantic_settings, pydantic
    from orapo_core.models.starter.build import SHIPPED_DIR  # noqa: PLC0415 -- loads numpy

    built = Settings().models_dir / "starter"
    return built if (built / "config.json").is_file() else SHIPPED_DIR


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def latency(drafter, studies, samples: int) -> float:
    times = []
    for study in studies:
        start = time.perf_counter()
        drafter.draft(study.image, samples=samples, seed=0)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def greedy_drafts(loaded, images, batch: int = 25, max_new_tokens: int = 160) -> list[str]:
    import torch

    processor, prompt = loaded.processor, render_prompt(loaded.processor)
    texts = []
    for start in range(0, len(images), batch):
        pictures = [to_rgb_image(img) for img in images[start : start + batch]]
        inputs = processor(text=[prompt] * len(pictures), images=pictures, return_tensors="pt")
        with torch.inference_mode():
            ids = loaded.model.generate(
                **inputs, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=processor.tokenizer.pad_token_id
            )
        texts += [
            t.strip() for t in processor.batch_decode(ids[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        ]
    return texts


def efficacy(loaded, n: int, seed: int):
    """Greedy drafts of `n` held-out phantoms scored: their `EvalMetrics`, and the rare and common findings' macro-F1
    with the first draft."""
    from orapo_core.data.phantom import iter_studies  # noqa: PLC0415 -- loads numpy

    studies = [s for _, s in iter_studies(n, seed=seed, size=512)]
    drafts = greedy_drafts(loaded, [s.image for s in studies])
    predicted = [label_report(t) for t in drafts]
    reference = [label_report(report_text(s.report_findings, s.report_impression)) for s in studies]
    metrics = clinical_efficacy(predicted, reference, texts=drafts)
    per_class = metrics.f1_per_class
    return metrics, {
        "rare_macro_f1": sum(per_class[o] for o in RARE) / len(RARE),
        "common_macro_f1": sum(per_class[o] for o in COMMON) / len(COMMON),
        "example_draft": drafts[0],
    }


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="starter folder (default: the built one, else assets/starter)")
    parser.add_argument("--repeats", type=int, default=10, help="drafts per latency median")
    parser.add_argument("--n-eval", type=int, default=500, help="held-out studies for clinical efficacy")
    parser.add_argument("--eval-seed", type=int, default=1000, help="seed of the held-out studies")
    parser.add_argument("--rebuild", metavar="DIR", default=None, help="also time a fresh `build_starter` into DIR")
    parser.add_argument("--build-only", action="store_true", help="stop after the --rebuild build")
    parser.add_argument("--skip-efficacy", action="store_true")
    build = parser.add_argument_group("the --rebuild build (default: the shipped starter's)")
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--n-train", type=int, default=None, metavar="N", help="PhantomCXR studies of the report run")
    build.add_argument("--steps", type=int, default=None, metavar="N", help="report training steps")
    build.add_argument("--minutes", type=float, default=None, metavar="M", help="cap on the whole build")
    build.add_argument("--image-side", type=int, default=None, metavar="PX", help="input side in pixels (96)")
    build.add_argument(
        "--patch-size",
        type=int,
        default=None,
        metavar="PX",
        help="vision patch side (half the image side: one visual token; a quarter: four)",
    )
    build.add_argument(
        "--vision-n-train",
        type=int,
        default=None,
        metavar="N",
        help="films for the vision warm-up, every finding at 0.3 (8000)",
    )
    build.add_argument("--vision-steps", type=int, default=None, metavar="N", help="vision warm-up steps (3000)")
    build.add_argument(
        "--perception-batch",
        type=int,
        default=None,
        metavar="N",
        help="films read through the prompt at each report step (16; 0: off, the build shipped until 2026-12-07)",
    )
    build.add_argument(
        "--rare-fraction",
        type=float,
        default=None,
        metavar="F",
        help="the rare findings' share of their PhantomCXR prevalence in the report studies (0.5)",
    )
    return parser


def rebuild(args: argparse.Namespace) -> Path:
    """The --rebuild build: the shipped starter, or the variant the build options ask for, into `args.rebuild`."""
    from orapo_core.experimental.starter import starter_variant  # noqa: PLC0415 -- loads numpy
    from orapo_core.models.starter import build_starter  # noqa: PLC0415 -- loads numpy

    plan, arch = starter_variant(
        seed=args.seed,
        rare_fraction=args.rare_fraction,
        image_side=args.image_side,
        patch_size=args.patch_size,
        n_train=args.n_train,
        steps=args.steps,
        max_minutes=args.minutes,
        vision_n_train=args.vision_n_train,
        vision_steps=args.vision_steps,
        perception_batch=args.perception_batch,
    )
    return build_starter(args.rebuild, plan, arch, show_progress=False)


def main(argv: list[str] | None = None) -> None:
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.build_only and not args.rebuild:
        parser.error("--build-only builds into --rebuild DIR: give it")

    import torch
    from transformers.utils import logging as hf_logging

    from orapo_core.data.phantom import iter_studies  # noqa: PLC0415 -- loads numpy
    from orapo_core.models import Drafter  # noqa: PLC0415 -- loads numpy
    from orapo_core.models.starter import read_card  # noqa: PLC0415 -- loads numpy

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(2)
    print(
        "command:",
        " ".join(
            [
                os.path.basename(sys.executable),
                "-m",
                "benchmarks.bench_starter",
                *(sys.argv[1:] if argv is None else argv),
            ]
        ),
    )
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs visible, "
        f"torch threads {torch.get_num_threads()}, torch {torch.__version__}"
    )
    if args.rebuild:
        start = time.perf_counter()
        model_dir = rebuild(args)
        print(f"build (fresh, seed {args.seed}): {time.perf_counter() - start:.1f} s")
        if args.build_only:
            print(model_dir)
            return
    else:
        model_dir = _model_dir(args.model)
    card = read_card(model_dir) or {}
    print(f"model: {model_dir}")
    if card:
        print(
            f"build (card): {card['build_seconds']} s total, {card['data_seconds']} s data, "
            f"{card['steps_done']} steps ({card['stopped_by']}), {card['train_seconds']} s training"
        )

    rss_before = _peak_rss_mb()
    drafter = Drafter.from_dir(model_dir)
    params = sum(p.numel() for p in drafter.loaded.model.parameters())
    weights_mb = sum(f.stat().st_size for f in model_dir.glob("*.safetensors")) / 2**20
    print(
        f"parameters: {params / 1e6:.2f} M, weights on disk {weights_mb:.1f} MiB, "
        f"peak RSS after load {_peak_rss_mb():.0f} MiB (before {rss_before:.0f} MiB)"
    )

    studies = [s for _, s in iter_studies(args.repeats + 1, seed=args.eval_seed + 1, size=512)]
    drafter.draft(studies[0].image, samples=4)  # warm-up
    greedy = latency(drafter, studies[1:], samples=0)
    k4 = latency(drafter, studies[1:], samples=4)
    print(
        f"draft latency, median of {args.repeats}: greedy {greedy:.2f} s, greedy + K=4 samples {k4:.2f} s "
        f"(peak RSS {_peak_rss_mb():.0f} MiB)"
    )

    if not args.skip_efficacy:
        start = time.perf_counter()
        m, result = efficacy(drafter.loaded, args.n_eval, args.eval_seed)
        print(
            f"clinical efficacy on {args.n_eval} held-out phantoms (seed {args.eval_seed}, "
            f"{time.perf_counter() - start:.0f} s):"
        )
        print(
            f"  macro P/R/F1 (14): {m.macro_precision_14:.3f} / {m.macro_recall_14:.3f} / "
            f"{m.macro_f1_14:.3f}; micro F1 (14) {m.micro_f1_14:.3f}"
        )
        print(
            f"  macro F1 common {result['common_macro_f1']:.3f}; rare ({', '.join(RARE)}) {result['rare_macro_f1']:.3f}"
        )
        print(
            "  per class F1 (support): "
            + json.dumps({k: f"{v:.2f} ({m.support_per_class[k]})" for k, v in m.f1_per_class.items()})
        )
        print(f"  mean draft length {m.mean_report_length:.1f} words; first draft: {result['example_draft']!r}")


if __name__ == "__main__":
    main()
