"""Does the served model's own likelihood say which unread studies carry a finding it never reports?

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_finding_evidence [--model DIR] [--n 150]

The worklist's "most useful first" ordering (app/services/reading/reading_order.py) can
only put studies with a missed finding first if something the model computes
tells them apart. Its drafts do not (the starter never writes pneumothorax, and
its samples almost never do). This checks the next candidate: teacher-forced,
the log-probability the model gives a positive statement of the finding right
after the prompt and image ("FINDINGS: There is a moderate right
pneumothorax", summed over side and size), against a negative one ("FINDINGS:
No pneumothorax"), and their difference, as a ranking score over `--n`
PhantomCXR studies with a moderate or large pneumothorax and `--n` without it.
Prints the AUC of each score (0.5: no better than the oldest-first order).

With `--exemplars K [K ...]` it also scores the image itself, as an ordering
could from what readers have already signed: each unread study's merged visual
token(s) (what the language model reads) projected on the direction from the
mean token of 100 signed studies without the finding to the mean of K signed
studies whose correction added it (a nearest-centroid score), and its largest
cosine similarity to one of the K (nearest neighbour). The first is the
worklist's own scorer (`app.services.reading.reading_order.finding_resemblance`, whose
probability is monotone in that projection). Exemplars come from
generator streams the scored studies do not use.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import numpy as np  # noqa: TID253 -- this module is heavy; light ones import it lazily
from PIL import Image

from benchmarks.bench_probe import auc
from benchmarks.round_story_common import draw
from orapo_core.models.features import capture_image_features

ROOT = Path(__file__).resolve().parents[1]

POSITIVE = [
    f"FINDINGS: There is a {size} {side} pneumothorax" for size in ("moderate", "large") for side in ("right", "left")
]
NEGATIVE = ["FINDINGS: No pneumothorax", "FINDINGS: No pleural effusion or pneumothorax"]
IMPRESSION = ["IMPRESSION: Moderate right pneumothorax", "IMPRESSION: Large left pneumothorax"]


def log_likelihoods(drafter, pictures, continuations, batch: int = 50) -> np.ndarray:
    """(images, continuations): summed log-probability of each continuation's tokens after the prompt and image."""
    import torch

    processor, model = drafter.loaded.processor, drafter.loaded.model
    out = np.zeros((len(pictures), len(continuations)))
    for j, text in enumerate(continuations):
        for b in range(0, len(pictures), batch):
            chunk = pictures[b : b + batch]
            inputs = processor(
                text=[drafter.prompt_text + text] * len(chunk),
                images=chunk,
                return_tensors="pt",
                padding=True,
                padding_side="left",
            )
            prompt = processor(text=[drafter.prompt_text], images=chunk[:1], return_tensors="pt")
            n = inputs["input_ids"].shape[1] - prompt["input_ids"].shape[1]
            with torch.inference_mode():
                logits = model(**inputs).logits.float()
            logp = logits[:, -n - 1 : -1].log_softmax(-1)
            out[b : b + len(chunk), j] = logp.gather(2, inputs["input_ids"][:, -n:, None])[..., 0].sum(1).numpy()
    return out


def merged_tokens(drafter, pictures, batch: int = 50) -> np.ndarray:
    """(images, features): what drafting stores for each image (`orapo_core.models.features`: the vision merger's
    output, averaged over the image's tokens; the shipped starter has one token)."""
    import torch

    processor, model = drafter.loaded.processor, drafter.loaded.model
    out = []
    for b in range(0, len(pictures), batch):
        chunk = pictures[b : b + batch]
        inputs = processor(
            text=[drafter.prompt_text] * len(chunk),
            images=chunk,
            return_tensors="pt",
            padding=True,
            padding_side="left",
        )
        with torch.inference_mode(), capture_image_features(model, inputs, len(chunk)) as features:
            model(**inputs)
        out.append(np.array(features, dtype=np.float64))
    return np.concatenate(out)


def nearness_scores(unread: np.ndarray, positives: np.ndarray, negatives: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the worklist's own P(finding | image), nearest-neighbour cosine) of each unread feature row: P from
    `reading_order.finding_resemblance` over signed rows whose corrections added the finding to `positives`."""
    from app.services.reading.reading_order import (  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
        finding_resemblance,
    )

    def signed(x, truth):
        return (SimpleNamespace(image_features=list(x), model_version_id=1, model_name="m"), "", truth, set())

    finding = "Pneumothorax"
    odds = finding_resemblance([signed(x, {finding}) for x in positives] + [signed(x, set()) for x in negatives])
    chance = odds[(1, None)].findings[finding]
    centroid = np.array([chance.projection(x) for x in unread])  # P is monotone in it; the projection keeps ties apart
    centre = negatives.mean(axis=0)

    def unit(a):
        a = a - centre
        return a / (np.linalg.norm(a, axis=1, keepdims=True) + 1e-12)

    neighbour = (unit(unread) @ unit(positives).T).max(axis=1)
    return centroid, neighbour


def logsumexp(a: np.ndarray) -> np.ndarray:
    top = a.max(axis=1, keepdims=True)
    return (np.log(np.exp(a - top).sum(axis=1, keepdims=True)) + top)[:, 0]


def main() -> int:
    from orapo_core.models.draft import Drafter  # noqa: PLC0415 -- tests patch Drafter

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "assets" / "starter"))
    parser.add_argument("--n", type=int, default=150)
    parser.add_argument(
        "--exemplars",
        type=int,
        nargs="*",
        default=[],
        help="also score by image nearness to K signed studies with the finding (e.g. 5 10 20 40)",
    )
    parser.add_argument("--skip-likelihood", action="store_true", help="only the image nearness scores")
    args = parser.parse_args()
    drafter = Drafter.from_dir(args.model)
    studies = draw(args.n, 71, "pneumothorax", True, 256) + draw(args.n, 72, "pneumothorax", False, 256)
    labels = np.array([1] * args.n + [0] * args.n)
    pictures = [drafter.prepare(Image.fromarray(np.round(s.image * 255).astype(np.uint8))) for s in studies]
    print(f"{args.n} studies with a moderate or large pneumothorax, {args.n} without; model {args.model}")
    if not args.skip_likelihood:
        pos, neg, imp = (logsumexp(log_likelihoods(drafter, pictures, c)) for c in (POSITIVE, NEGATIVE, IMPRESSION))
        for name, score in (
            ("positive statement", pos),
            ("negative statement (lower first)", -neg),
            ("positive minus negative", pos - neg),
            ("impression statement", imp),
            ("impression minus negative", imp - neg),
        ):
            print(f"  AUC {auc(score, labels):.3f}  {name}")
    if args.exemplars:

        def features(studies):
            return merged_tokens(
                drafter, [drafter.prepare(Image.fromarray(np.round(s.image * 255).astype(np.uint8))) for s in studies]
            )

        unread = features(studies)
        positives_all = features(draw(max(args.exemplars), 73, "pneumothorax", True, 256))
        negatives = features(draw(100, 74, "pneumothorax", False, 256))
        print(f"image nearness (merged visual tokens, {unread.shape[1]} features), 100 signed studies without it:")
        for k in args.exemplars:
            centroid, neighbour = nearness_scores(unread, positives_all[:k], negatives)
            print(
                f"  K={k:>3}: AUC {auc(centroid, labels):.3f} nearest centroid, {auc(neighbour, labels):.3f} nearest neighbour"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
