"""The starter model: size, memory, draft latency, build time and clinical efficacy on held-out phantoms.

Run on two cores, as the targets say (draft in 2 s or less, K=4 in 4 s or less):

    OMP_NUM_THREADS=2 taskset -c 0,1 .venv/bin/python -m benchmarks.bench_starter [--model DIR]

The model is the one given, else `<ORAPO_DATA_DIR>/models/starter`, else the
shipped `assets/starter`. Latencies are medians over `--repeats` drafts of
different studies through `Drafter.draft` (the product's path, image at 512 px).
Build time is the card's (`starter_card.json`), or a fresh build with
`--rebuild`. Clinical efficacy: greedy drafts of `--n-eval` PhantomCXR studies
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

RARE = ("Pneumothorax", "Fracture", "Lung Lesion", "Pleural Other")
COMMON = ("Cardiomegaly", "Pleural Effusion", "Edema", "Consolidation", "Lung Opacity", "Support Devices",
          "No Finding")


def _model_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    from orapo_core.config import Settings
    from orapo_core.models.starter.build import SHIPPED_DIR

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

    from orapo_core.models.draft import to_rgb_image
    from orapo_core.models.prompt import render_prompt

    processor, prompt = loaded.processor, render_prompt(loaded.processor)
    texts = []
    for start in range(0, len(images), batch):
        pictures = [to_rgb_image(img) for img in images[start:start + batch]]
        inputs = processor(text=[prompt] * len(pictures), images=pictures, return_tensors="pt")
        with torch.inference_mode():
            ids = loaded.model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens,
                                        pad_token_id=processor.tokenizer.pad_token_id)
        texts += [t.strip() for t in processor.batch_decode(ids[:, inputs["input_ids"].shape[1]:],
                                                            skip_special_tokens=True)]
    return texts


def efficacy(loaded, n: int, seed: int) -> dict:
    from orapo_core.data.phantom import iter_studies
    from orapo_core.facts import label_report
    from orapo_core.facts.metrics import clinical_efficacy
    from orapo_core.report_layout import report_text

    studies = [s for _, s in iter_studies(n, seed=seed, size=512)]
    drafts = greedy_drafts(loaded, [s.image for s in studies])
    predicted = [label_report(t) for t in drafts]
    reference = [label_report(report_text(s.report_findings, s.report_impression)) for s in studies]
    result = clinical_efficacy(predicted, reference, texts=drafts)
    per_class = result["f1_per_class"]
    result["rare_macro_f1"] = sum(per_class[o] for o in RARE) / len(RARE)
    result["common_macro_f1"] = sum(per_class[o] for o in COMMON) / len(COMMON)
    result["example_draft"] = drafts[0]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="starter folder (default: the built one, else assets/starter)")
    parser.add_argument("--repeats", type=int, default=10, help="drafts per latency median")
    parser.add_argument("--n-eval", type=int, default=500, help="held-out studies for clinical efficacy")
    parser.add_argument("--eval-seed", type=int, default=1000, help="seed of the held-out studies")
    parser.add_argument("--rebuild", metavar="DIR", default=None, help="also time a fresh `build_starter` into DIR")
    parser.add_argument("--skip-efficacy", action="store_true")
    args = parser.parse_args()

    import torch
    from transformers.utils import logging as hf_logging

    from orapo_core.data.phantom import iter_studies
    from orapo_core.models import Drafter
    from orapo_core.models.starter import read_card

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(2)
    print("command:", " ".join([os.path.basename(sys.executable), "-m", "benchmarks.bench_starter", *sys.argv[1:]]))
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs visible, "
          f"torch threads {torch.get_num_threads()}, torch {torch.__version__}")
    if args.rebuild:
        from orapo_core.models.starter import build_starter

        start = time.perf_counter()
        build_starter(args.rebuild, show_progress=False)
        print(f"build (fresh, seed 0): {time.perf_counter() - start:.1f} s")
        model_dir = Path(args.rebuild)
    else:
        model_dir = _model_dir(args.model)
    card = read_card(model_dir) or {}
    print(f"model: {model_dir}")
    if card:
        print(f"build (card): {card['build_seconds']} s total, {card['data_seconds']} s data, "
              f"{card['steps_done']} steps ({card['stopped_by']}), {card['train_seconds']} s training")

    rss_before = _peak_rss_mb()
    drafter = Drafter.from_dir(model_dir)
    params = sum(p.numel() for p in drafter.loaded.model.parameters())
    weights_mb = sum(f.stat().st_size for f in model_dir.glob("*.safetensors")) / 2**20
    print(f"parameters: {params / 1e6:.2f} M, weights on disk {weights_mb:.1f} MiB, "
          f"peak RSS after load {_peak_rss_mb():.0f} MiB (before {rss_before:.0f} MiB)")

    studies = [s for _, s in iter_studies(args.repeats + 1, seed=args.eval_seed + 1, size=512)]
    drafter.draft(studies[0].image, samples=4)  # warm-up
    greedy = latency(drafter, studies[1:], samples=0)
    k4 = latency(drafter, studies[1:], samples=4)
    print(f"draft latency, median of {args.repeats}: greedy {greedy:.2f} s, greedy + K=4 samples {k4:.2f} s "
          f"(peak RSS {_peak_rss_mb():.0f} MiB)")

    if not args.skip_efficacy:
        start = time.perf_counter()
        result = efficacy(drafter.loaded, args.n_eval, args.eval_seed)
        print(f"clinical efficacy on {args.n_eval} held-out phantoms (seed {args.eval_seed}, "
              f"{time.perf_counter() - start:.0f} s):")
        print(f"  macro P/R/F1 (14): {result['macro_precision_14']:.3f} / {result['macro_recall_14']:.3f} / "
              f"{result['macro_f1_14']:.3f}; micro F1 (14) {result['micro_f1_14']:.3f}")
        print(f"  macro F1 common {result['common_macro_f1']:.3f}; rare ({', '.join(RARE)}) "
              f"{result['rare_macro_f1']:.3f}")
        print("  per class F1 (support): " + json.dumps(
            {k: f"{v:.2f} ({result['support_per_class'][k]})" for k, v in result["f1_per_class"].items()}))
        print(f"  mean draft length {result['mean_report_length']:.1f} words; first draft: "
              f"{result['example_draft']!r}")


if __name__ == "__main__":
    main()
