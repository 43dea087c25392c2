"""Does the served model's own likelihood say which unread studies carry a finding it never reports?

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_finding_evidence.py [--model DIR] [--n 150]

The worklist's "most useful first" ordering (app/services/reading_order.py) can
only put studies with a missed finding first if something the model computes
tells them apart. Its drafts do not (the starter never writes pneumothorax, and
its samples almost never do). This checks the next candidate: teacher-forced,
the log-probability the model gives a positive statement of the finding right
after the prompt and image ("FINDINGS: There is a moderate right
pneumothorax", summed over side and size), against a negative one ("FINDINGS:
No pneumothorax"), and their difference, as a ranking score over `--n`
PhantomCXR studies with a moderate or large pneumothorax and `--n` without it.
Prints the AUC of each score (0.5: no better than the oldest-first order).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

POSITIVE = [f"FINDINGS: There is a {size} {side} pneumothorax" for size in ("moderate", "large")
            for side in ("right", "left")]
NEGATIVE = ["FINDINGS: No pneumothorax", "FINDINGS: No pleural effusion or pneumothorax"]
IMPRESSION = ["IMPRESSION: Moderate right pneumothorax", "IMPRESSION: Large left pneumothorax"]


def log_likelihoods(drafter, pictures, continuations, batch: int = 50) -> np.ndarray:
    """(images, continuations): summed log-probability of each continuation's tokens after the prompt and image."""
    import torch

    processor, model = drafter.loaded.processor, drafter.loaded.model
    out = np.zeros((len(pictures), len(continuations)))
    for j, text in enumerate(continuations):
        for b in range(0, len(pictures), batch):
            chunk = pictures[b:b + batch]
            inputs = processor(text=[drafter._prompt_text + text] * len(chunk), images=chunk, return_tensors="pt",
                               padding=True, padding_side="left")
            prompt = processor(text=[drafter._prompt_text], images=chunk[:1], return_tensors="pt")
            n = inputs["input_ids"].shape[1] - prompt["input_ids"].shape[1]
            with torch.inference_mode():
                logits = model(**inputs).logits.float()
            logp = logits[:, -n - 1:-1].log_softmax(-1)
            out[b:b + len(chunk), j] = logp.gather(2, inputs["input_ids"][:, -n:, None])[..., 0].sum(1).numpy()
    return out


def logsumexp(a: np.ndarray) -> np.ndarray:
    top = a.max(axis=1, keepdims=True)
    return (np.log(np.exp(a - top).sum(axis=1, keepdims=True)) + top)[:, 0]


def main() -> int:
    from PIL import Image

    from benchmarks.bench_probe import auc
    from benchmarks.bench_round_story import draw
    from orapo_core.models.draft import Drafter

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "assets" / "starter"))
    parser.add_argument("--n", type=int, default=150)
    args = parser.parse_args()
    drafter = Drafter.from_dir(args.model)
    studies = draw(args.n, 71, "pneumothorax", True, 256) + draw(args.n, 72, "pneumothorax", False, 256)
    labels = np.array([1] * args.n + [0] * args.n)
    pictures = [drafter.prepare(Image.fromarray(np.round(s.image * 255).astype(np.uint8))) for s in studies]
    pos, neg, imp = (logsumexp(log_likelihoods(drafter, pictures, c)) for c in (POSITIVE, NEGATIVE, IMPRESSION))
    print(f"{args.n} studies with a moderate or large pneumothorax, {args.n} without; model {args.model}")
    for name, score in (("positive statement", pos), ("negative statement (lower first)", -neg),
                        ("positive minus negative", pos - neg), ("impression statement", imp),
                        ("impression minus negative", imp - neg)):
        print(f"  AUC {auc(score, labels):.3f}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
