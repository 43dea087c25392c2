"""Where does a finding get lost between the film and the language model? Linear-probe AUC per finding.

For N PhantomCXR studies drawn at a balanced prevalence (every finding about
`--prevalence`, so rare ones have enough positives to probe), it reads four
representations of each film and fits a ridge probe per finding on a train
split, reporting the held-out AUC (labels: the generator's own):

- `pixels`: the film at the model's input size, flattened (what any readout could see);
- `patches`: the vision tower's patch states, before the merger;
- `merged`: the merged visual token(s) the language model receives;
- `prompt`: the language model's last hidden state at the last prompt position (where the answer begins).

A finding decodable from `pixels` but not from `merged` is lost by the tower or
the merger; decodable from `merged` but not from `prompt` is lost by the text
model's reading. The issue's goal: AUC >= 0.90 from `merged` for every finding
whose pixel AUC is >= 0.95.

    .venv/bin/python -m benchmarks.bench_probe --model assets/starter [--n 1000] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np  # noqa: TID253 -- this module is heavy; light ones import it lazily
from PIL import Image

from orapo_core.data.phantom import generate_study
from orapo_core.models.loading import load_model
from orapo_core.models.prompt import render_prompt


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve by ranks (ties averaged); nan when one class is absent."""
    pos, neg = labels > 0.5, labels <= 0.5
    if pos.sum() == 0 or neg.sum() == 0:
        return float("nan")
    order = scores.argsort(kind="mergesort")
    ranks = np.empty(len(scores), dtype=np.float64)
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return float((ranks[pos].sum() - pos.sum() * (pos.sum() + 1) / 2.0) / (pos.sum() * neg.sum()))


def ridge_probe_auc(
    features: np.ndarray, targets: np.ndarray, n_train: int, alphas=(1e-2, 1e-1, 1.0, 10.0, 100.0)
) -> list[float]:
    """Held-out AUC per target column of a ridge probe; alpha chosen per column on a slice of the train split."""
    x = features.astype(np.float64)
    mean, std = x[:n_train].mean(0), x[:n_train].std(0) + 1e-6
    x = (x - mean) / std
    x = np.concatenate([x, np.ones((len(x), 1))], axis=1)
    fit, val = slice(0, int(n_train * 0.8)), slice(int(n_train * 0.8), n_train)
    test = slice(n_train, len(x))
    out = []
    for k in range(targets.shape[1]):
        y = targets[:, k] * 2 - 1
        best, best_alpha = -1.0, alphas[0]
        for alpha in alphas:
            w = _ridge(x[fit], y[fit], alpha)
            score = auc(x[val] @ w, targets[val, k])
            if not np.isnan(score) and score > best:
                best, best_alpha = score, alpha
        w = _ridge(x[:n_train], y[:n_train], best_alpha)
        out.append(auc(x[test] @ w, targets[test, k]))
    return out


def _ridge(x: np.ndarray, y: np.ndarray, alpha: float) -> np.ndarray:
    d = x.shape[1]
    if d <= x.shape[0]:
        return np.linalg.solve(x.T @ x + alpha * x.shape[0] * np.eye(d), x.T @ y)
    # dual form when features outnumber studies
    gram = x @ x.T
    return x.T @ np.linalg.solve(gram + alpha * x.shape[0] * np.eye(len(x)), y)


def collect(model_dir: str, n: int, seed: int, prevalence: float, batch: int = 32, conspicuity: str | None = None):
    import torch

    from orapo_core.data.phantom import FINDING_KINDS  # noqa: PLC0415 -- `FINDING_KINDS` is also a local name

    FINDING_KINDS = list(FINDING_KINDS)

    loaded = load_model(model_dir, device="cpu", dtype=torch.float32)
    model, processor = loaded.model, loaded.processor
    side = int(round(processor.image_processor.size["longest_edge"] ** 0.5))
    prevalence_map = {k: prevalence for k in FINDING_KINDS}
    kwargs = {"conspicuity": conspicuity} if conspicuity else {}
    images, targets = [], np.zeros((n, len(FINDING_KINDS)), dtype=np.float32)
    for i in range(n):
        study = generate_study(np.random.default_rng([seed, 7, i]), size=side, prevalence=prevalence_map, **kwargs)
        images.append(np.round(study.image * 255).astype(np.uint8))
        for kind in study.kinds:
            targets[i, FINDING_KINDS.index(kind)] = 1.0

    visual = model.model.visual if hasattr(model.model, "visual") else model.visual
    captured: dict[str, list] = {"patches": [], "merged": []}

    def keep(_module, inputs, output):
        captured["patches"].append(inputs[0].detach())
        captured["merged"].append(output.detach())

    h1 = visual.merger.register_forward_hook(keep)
    prompt = render_prompt(processor)
    feats = {"pixels": [], "patches": [], "merged": [], "prompt": []}

    with torch.no_grad():
        for start in range(0, n, batch):
            chunk = images[start : start + batch]
            pictures = [Image.fromarray(a).convert("RGB") for a in chunk]
            inputs = processor(text=[prompt] * len(chunk), images=pictures, return_tensors="pt", padding=True)
            captured["patches"].clear(), captured["merged"].clear()
            out = model(**inputs, output_hidden_states=True)
            feats["pixels"].append(np.stack([a.reshape(-1) for a in chunk]).astype(np.float32))
            feats["patches"].append(captured["patches"][0].reshape(len(chunk), -1).numpy())
            feats["merged"].append(captured["merged"][0].reshape(len(chunk), -1).numpy())
            last = (
                inputs["attention_mask"].sum(1) - 1
                if processor.tokenizer.padding_side == "right"
                else torch.full((len(chunk),), inputs["input_ids"].shape[1] - 1)
            )
            feats["prompt"].append(out.hidden_states[-1][torch.arange(len(chunk)), last].numpy())
    h1.remove()
    return {k: np.concatenate(v) for k, v in feats.items()}, targets, side


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="assets/starter")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--train-frac", type=float, default=0.65)
    parser.add_argument("--prevalence", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=4242)
    parser.add_argument("--conspicuity", default=None, help="PhantomCXR conspicuity (default: the generator's)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from orapo_core.data.phantom import FINDING_KINDS  # noqa: PLC0415 -- `FINDING_KINDS` is also a local name

    FINDING_KINDS = list(FINDING_KINDS)

    started = time.perf_counter()
    feats, targets, side = collect(args.model, args.n, args.seed, args.prevalence, conspicuity=args.conspicuity)
    n_train = int(args.n * args.train_frac)
    table = {name: ridge_probe_auc(x, targets, n_train) for name, x in feats.items()}
    print(
        f"# linear-probe AUC, {args.n} studies ({n_train} train / {args.n - n_train} held out), {side} px, "
        f"prevalence {args.prevalence}, model {args.model}"
    )
    print(f"{'finding':28s} " + " ".join(f"{k:>8s}" for k in table))
    for j, kind in enumerate(FINDING_KINDS):
        print(f"{kind:28s} " + " ".join(f"{table[k][j]:8.3f}" for k in table))
    goal = [kind for j, kind in enumerate(FINDING_KINDS) if table["pixels"][j] >= 0.95]
    misses = [kind for j, kind in enumerate(FINDING_KINDS) if table["pixels"][j] >= 0.95 and table["merged"][j] < 0.90]
    print(
        f"goal (merged >= 0.90 where pixels >= 0.95): {len(goal) - len(misses)}/{len(goal)} met"
        + (f"; missed: {', '.join(misses)}" if misses else "")
    )
    print(
        f"({time.perf_counter() - started:.0f} s) command: .venv/bin/python -m benchmarks.bench_probe "
        + " ".join(argv if argv is not None else sys.argv[1:])
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "findings": list(FINDING_KINDS),
                    "auc": table,
                    "n": args.n,
                    "side": side,
                    "model": args.model,
                    "goal_met": not misses,
                    "goal_missed": misses,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
