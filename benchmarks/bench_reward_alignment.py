"""Does a GRPO step on a reward raise 14-observation macro-F1? Measured on the starting model's own samples, no training.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_reward_alignment --model assets/starter --studies 600 --k 8 --json OUT

GRPO moves the policy toward the samples its reward ranks above their group's mean. Whether that raises the
metric the table reports (macro-F1 over the 14 observations, across studies) depends on the reward, and it can
be read before any training: the starting model draws K samples for each of N training-pool studies (PhantomCXR
generator seed 101, the ablation's pool; the round recipe's temperature, top_p and max_completion_length). For
each reward, each group's GRPO advantages A = (r − mean) / (std + 1e-4) reweight its samples, w ∝ exp(η·A):

- η = 0 is the samples as drawn;
- small η is what one small GRPO step on that reward makes of them (the first-order direction);
- η = ∞ is the best of K by the reward (ties share), what GRPO converges toward on these samples.

The macro-F1 of the reweighted samples (expected counts of true and false positives per observation, against
the references) at each η, minus its value at η = 0, says whether the reward pulls macro-F1 up or down, and by
how much; 95 % intervals bootstrap the studies. Macro-F1 is not a sum over studies, so no per-study reward is
it exactly; the row "per-study F1 over the 14" (each sample's F1 over the observations against its study's labels,
no sentences, no penalty) is the label-only reward closest to it. The greedy draft's macro-F1 is printed beside
them, and the greedy draft replaced by the best sample wherever the recipe's FactS ranks one above it (what a
self-critical baseline would move the greedy draft toward).

The references are the studies' labels; FactS reads each sample as the evaluator does (`label_report`).

`label_f1_all` and `label_f1_seen` are that per-study F1 as TRL rewards, for `bench_learning --reward`: the
second leaves out the findings the starter cannot see (`UNSEEN`), to test whether the reward on those is what
makes GRPO drift.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.ablation import DEFAULT_RECIPE, macro_f1_from_counts, phantom_split
from orapo_core.facts import label_report
from orapo_core.facts.metrics import is_positive
from orapo_core.facts.ontology import CHEXPERT_14
from orapo_core.facts.reward import completion_text, make_facts_reward
from orapo_core.models.evaluate import load_study_image
from orapo_core.train.rewards import rouge_l_reward

ROOT = Path(__file__).resolve().parents[1]

ETAS = (0.0, 0.5, 1.0, 2.0, math.inf)
#: The findings the shipped starter's prompt state reads at linear-probe AUC below 0.7
#: (`benchmarks/results/probe-2026-12-01/probe.json`: atelectasis 0.59, lung opacity 0.60, fracture 0.52,
#: lung lesion 0.66): what it cannot see on the film.
UNSEEN = ("Atelectasis", "Lung Opacity", "Fracture", "Lung Lesion")


def label_f1(completions, observations, *, labels=None) -> list[float | None]:
    """Per completion, its F1 over `observations` against its study's labels, read as the evaluator reads a draft
    (`label_report`; uncertain counts as positive); 1.0 when neither side states any of them; None without labels."""
    labels = list(labels) if labels is not None else [None] * len(completions)
    scores: list[float | None] = []
    for completion, reference in zip(completions, labels, strict=True):
        if reference is None:
            scores.append(None)
            continue
        reference = json.loads(reference) if isinstance(reference, str) else reference
        scores.append(study_f1(label_report(completion_text(completion)), reference, observations))
    return scores


def study_f1(said: dict, reference: dict, observations) -> float:
    """One report's F1 over `observations` against its study's labels (uncertain counts as positive); 1.0 when
    neither side states any of them."""
    tp = sum(is_positive(said, n) and is_positive(reference, n) for n in observations)
    fp = sum(is_positive(said, n) and not is_positive(reference, n) for n in observations)
    fn = sum(is_positive(reference, n) and not is_positive(said, n) for n in observations)
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 1.0


def label_f1_all(completions, *, labels=None, **kwargs) -> list[float | None]:
    """A diagnostic reward (`bench_learning --reward benchmarks.bench_reward_alignment:label_f1_all`): F1 over
    the 14 labels, which this benchmark measures as aligned with macro-F1 as FactS is."""
    return label_f1(completions, CHEXPERT_14, labels=labels)


def label_f1_seen(completions, *, labels=None, **kwargs) -> list[float | None]:
    """The same without the findings the starter cannot see (`UNSEEN`): whether the reward on those is what makes
    GRPO drift."""
    return label_f1(completions, [n for n in CHEXPERT_14 if n not in UNSEEN], labels=labels)


def rewards_to_compare() -> dict:
    """name -> reward function (TRL's signature), the recipe's FactS first."""
    return {
        "facts (recipe: beta 1, precision-aware, attributes)": make_facts_reward(beta=1.0, precision_aware=True),
        "facts beta 2 (recall), precision-aware": make_facts_reward(beta=2.0, precision_aware=True),
        "facts beta 2, plain": make_facts_reward(beta=2.0, precision_aware=False),
        "facts beta 1, plain": make_facts_reward(beta=1.0, precision_aware=False),
        "facts beta 0.5 (precision), precision-aware": make_facts_reward(beta=0.5, precision_aware=True),
        "facts + form guard": make_facts_reward(beta=1.0, precision_aware=True, form_guard=True),
        "rouge_l": rouge_l_reward,
    }


def weights(rewards: list[float], eta: float) -> list[float]:
    """GRPO's group-normalised advantages turned into sample weights exp(eta * A), normalised; eta = inf: argmax."""
    k = len(rewards)
    mean = sum(rewards) / k
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / max(k - 1, 1))
    adv = [(r - mean) / (std + 1e-4) for r in rewards]
    if eta == math.inf:
        best = max(adv)
        top = [1.0 if a >= best - 1e-9 else 0.0 for a in adv]
    else:
        top = [math.exp(eta * a) for a in adv]
    total = sum(top)
    return [t / total for t in top]


def macro_f1(counts: list[list[float]]) -> float:
    """Macro-F1 from one (tp, fp, fn) of expected counts per observation (`ablation.macro_f1_from_counts`)."""
    return macro_f1_from_counts(*zip(*counts, strict=True))


def per_study_counts(
    sample_labels: list[dict], reference: dict, sample_weights: list[float], names
) -> list[list[float]]:
    out = []
    for name in names:
        yr = is_positive(reference, name)
        tp = fp = fn = 0.0
        for labels, w in zip(sample_labels, sample_weights, strict=True):
            yp = is_positive(labels, name)
            tp += w * (yp and yr)
            fp += w * (yp and not yr)
            fn += w * (yr and not yp)
        out.append([tp, fp, fn])
    return out


def summed(rows: list[list[list[float]]], index: list[int]) -> list[list[float]]:
    total = [[0.0, 0.0, 0.0] for _ in rows[0]]
    for i in index:
        for c, (tp, fp, fn) in enumerate(rows[i]):
            total[c][0] += tp
            total[c][1] += fp
            total[c][2] += fn
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(ROOT / "assets" / "starter"))
    parser.add_argument("--studies", type=int, default=600)
    parser.add_argument(
        "--k", type=int, default=8, help="samples per study (the recipe's K is 4; more gives a steadier estimate)"
    )
    parser.add_argument("--pool-seed", type=int, default=101)
    parser.add_argument(
        "--data-dir", default=None, help="where the pool's films are written (default: a temporary folder)"
    )
    parser.add_argument("--bootstrap", type=int, default=400)
    parser.add_argument("--json", default=None)
    opts = parser.parse_args(argv)

    import torch

    from orapo_core.models.draft import Drafter  # noqa: PLC0415 -- loads numpy

    torch.manual_seed(0)
    recipe = yaml.safe_load(Path(DEFAULT_RECIPE).read_text())
    temperature = float(recipe.get("temperature", 1.0))
    top_p = float(recipe.get("top_p", 1.0))
    max_new = int(recipe.get("max_completion_length", 96))
    started = time.perf_counter()
    folder = Path(opts.data_dir or tempfile.mkdtemp(prefix="orapo-align-"))
    folder.mkdir(parents=True, exist_ok=True)
    _, records = phantom_split(folder, opts.studies, opts.pool_seed, 224)
    drafter = Drafter.from_dir(opts.model)
    names = list(CHEXPERT_14)
    samples, greedy = [], []
    for start in range(0, len(records), 16):
        chunk = records[start : start + 16]
        drafts = drafter.draft_many(
            [load_study_image(r.image_paths[0]) for r in chunk],
            samples=opts.k,
            max_new_tokens=max_new,
            temperature=temperature,
            top_p=top_p,
            seed=start,
        )
        for d in drafts:
            samples.append(list(d.samples))
            greedy.append(d.text)
        print(f"drafted {len(samples)}/{len(records)}", flush=True)
    draft_s = time.perf_counter() - started
    references = [r.labels for r in records]
    sample_labels = [[label_report(t) for t in group] for group in samples]

    def table_for(reward_rows: list[list[float]]) -> dict:
        per_eta = {}
        for eta in ETAS:
            per_eta[eta] = [
                per_study_counts(sample_labels[i], references[i], weights(reward_rows[i], eta), names)
                for i in range(len(records))
            ]
        everyone = list(range(len(records)))
        base = macro_f1(summed(per_eta[0.0], everyone))
        rng = random.Random(0)
        boots = [[rng.randrange(len(records)) for _ in everyone] for _ in range(opts.bootstrap)]
        out = {"macro_f1_at_eta_0": base}
        for eta in ETAS[1:]:
            value = macro_f1(summed(per_eta[eta], everyone))
            diffs = sorted(macro_f1(summed(per_eta[eta], b)) - macro_f1(summed(per_eta[0.0], b)) for b in boots)
            lo, hi = diffs[int(0.025 * len(diffs))], diffs[int(0.975 * len(diffs)) - 1]
            key = "inf" if eta == math.inf else f"{eta:g}"
            out[f"delta_eta_{key}"] = value - base
            out[f"ci95_eta_{key}"] = [lo, hi]
            if eta == math.inf:
                total = summed(per_eta[eta], everyone)
                zero = summed(per_eta[0.0], everyone)
                out["per_class_delta_f1_best_of_k"] = {
                    n: macro_f1([total[c]]) - macro_f1([zero[c]]) for c, n in enumerate(names)
                }
                out["per_class_f1_samples"] = {n: macro_f1([zero[c]]) for c, n in enumerate(names)}
        return out

    results = {}
    for name, reward in rewards_to_compare().items():
        rows = []
        for record, group in zip(records, samples, strict=True):
            values = reward(
                group, labels=[json.dumps(record.labels)] * len(group), reference_report=[record.report] * len(group)
            )
            rows.append([0.0 if v is None else float(v) for v in values])
        results[name] = table_for(rows)
        print(
            f"{name}: " + ", ".join(f"{k} {v:+.4f}" for k, v in results[name].items() if k.startswith("delta")),
            flush=True,
        )

    # the label-only reward closest to macro-F1: each sample's own F1 over the 14 against its study's labels
    results["per-study F1 over the 14 (a label-only reward)"] = table_for(
        [[study_f1(lab, references[i], names) for lab in sample_labels[i]] for i in range(len(records))]
    )
    greedy_counts = [
        per_study_counts([label_report(greedy[i])], references[i], [1.0], names) for i in range(len(records))
    ]
    # what the samples hold for the greedy draft itself: the greedy draft, replaced by the best sample wherever the
    # recipe's FactS ranks that sample above it (SCST's target), and how often that happens
    recipe_reward = next(iter(rewards_to_compare().values()))
    better, replaced = [], 0
    for i, record in enumerate(records):
        group = [greedy[i], *samples[i]]
        values = [
            0.0 if v is None else float(v)
            for v in recipe_reward(
                group, labels=[json.dumps(record.labels)] * len(group), reference_report=[record.report] * len(group)
            )
        ]
        best = max(range(len(group)), key=lambda j: (values[j], j == 0))
        replaced += best != 0
        better.append(per_study_counts([label_report(group[best])], references[i], [1.0], names))
    out = {
        "command": "OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_reward_alignment " + " ".join(sys.argv[1:]),
        "model": opts.model,
        "studies": len(records),
        "k": opts.k,
        "pool_seed": opts.pool_seed,
        "temperature": temperature,
        "top_p": top_p,
        "max_new_tokens": max_new,
        "greedy_macro_f1": macro_f1(summed(greedy_counts, list(range(len(records))))),
        "greedy_or_better_sample_macro_f1": macro_f1(summed(better, list(range(len(records))))),
        "greedy_per_class_f1": {
            n: macro_f1([c]) for n, c in zip(names, summed(greedy_counts, list(range(len(records)))), strict=True)
        },
        "share_of_studies_a_sample_beats_greedy": replaced / len(records),
        "rewards": results,
        "draft_seconds": draft_s,
        "wall_seconds": time.perf_counter() - started,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}",
    }
    print(json.dumps(out, indent=1))
    if opts.json:
        Path(opts.json).parent.mkdir(parents=True, exist_ok=True)
        Path(opts.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
