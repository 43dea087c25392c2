"""Clinical-efficacy evaluation of a model's greedy drafts against reference labels.

The same function serves `orapo eval`, the rounds' held-out gate and the
benchmarks (the ablation included), so a number in the admin tab and a number
in the docs mean the same thing: greedy drafts, labelled by the FactS
labeler, against each study's reference labels (given by the dataset, or FactS
labels of its reference report), uncertain counted as positive. A drafter with
a `min_agreement` (the app's ORAPO_DRAFT_MIN_AGREEMENT, which the gate and
`orapo eval` pass on) also draws the app's 4 samples per draft and leaves out
the findings too few of them state, as the app's drafts do; the ablation
drafts greedily (its drafters have none), to compare training methods.

Drafts are decoded `batch_size` images at a time through
`Drafter.draft_many(samples=0)` (one running batch: left-padded prompts with
their attention mask, each row leaving at its EOS), so each greedy text is the
one the image gets alone (a test holds the two equal), at a fraction of the
cost on a CPU, where a decoding step of many rows costs far less than that many
steps of one (on the starter, median of 5: 8 greedy drafts together 0.29 s,
one alone 0.14 s). The model is put in eval mode while it drafts (a model
under training has dropout on) and given back as it was. The numbers are an
`EvalMetrics` (`orapo_core.facts.metrics`), read by attribute and stored with
its `to_dict()`.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orapo_core.facts import label_report, score_report
from orapo_core.facts.metrics import EvalMetrics, clinical_efficacy

if TYPE_CHECKING:
    import numpy as np

    from orapo_core.models.draft import Drafter

__all__ = ["EvalMetrics", "EvaluationResult", "evaluate_drafter", "load_study_image", "rescore"]


@dataclass
class EvaluationResult:
    metrics: EvalMetrics
    predictions: list[dict] = field(default_factory=list)  # study_id, draft, labels, reference labels

    def to_dict(self) -> dict:
        return {"metrics": self.metrics.to_dict(), "predictions": self.predictions}


def load_study_image(path: str | Path) -> np.ndarray:
    """The display rendering of one study image, decoded the way the app decodes uploads (nothing stored)."""
    from orapo_core.imaging import ingest_path  # noqa: PLC0415 -- loads pydicom, requests

    return ingest_path(path, secret=secrets.token_hex(8)).display


def evaluate_drafter(
    drafter: Drafter,
    records: Sequence,
    *,
    batch_size: int = 8,
    max_new_tokens: int = 160,
    facts_beta: float = 1.0,
    images: Sequence | None = None,
    progress: Callable[[int, int], None] | None = None,
    samples: int = 0,
) -> EvaluationResult:
    """Draft each record's first image greedily and score the drafts (14 and 5 observations, FactS reward).

    `batch_size` images share one `generate` (1: one by one; the texts are the same). `images`, if given, are
    the records' first images already decoded by `load_study_image`, for a caller that evaluates the same
    studies again and again (the ablation, at every checkpoint). `samples` > 0 also draws that many sampled
    drafts per image (the app's drafting settings, seed 0) and keeps them in each prediction row as
    `samples`; a drafter without a `min_agreement` still scores its greedy drafts (`rescore` scores the same
    decoding another way, e.g. `keep_agreed`). A drafter with one drafts as the app does with
    `ORAPO_DRAFT_MIN_AGREEMENT`: with the app's 4 samples unless `samples` says how many, and the text scored
    is the greedy draft with the findings too few of them assert left out.
    """
    if getattr(drafter, "min_agreement", 0.0) and not samples:
        from orapo_core.models.draft import DRAFT_SAMPLES  # noqa: PLC0415 -- loads numpy

        samples = DRAFT_SAMPLES
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    records = list(records)
    if images is not None and len(images) != len(records):
        raise ValueError(f"{len(images)} images for {len(records)} records")
    started = time.perf_counter()
    drafted: list[tuple] = []
    with _eval_mode(drafter.loaded.model):
        for start in range(0, len(records), batch_size):
            chunk = records[start : start + batch_size]
            pictures = (
                list(images[start : start + batch_size])
                if images is not None
                else [load_study_image(r.image_paths[0]) for r in chunk]
            )
            drafts = drafter.draft_many(pictures, samples=samples, max_new_tokens=max_new_tokens)
            drafted.extend((record, draft.text, draft.samples) for record, draft in zip(chunk, drafts, strict=True))
            if progress:
                progress(len(drafted), len(records))
    result = _score([(record, text) for record, text, _ in drafted], facts_beta)
    if samples:
        for row, (_, _, sampled) in zip(result.predictions, drafted, strict=True):
            row["samples"] = list(sampled)
    result.metrics = result.metrics.with_values(seconds=time.perf_counter() - started)
    return result


def rescore(
    result: EvaluationResult, records: Sequence, text_of: Callable[[dict], str], *, facts_beta: float = 1.0
) -> EvaluationResult:
    """`result`'s studies scored again, each draft replaced by `text_of(its prediction row)`.

    The same scoring as `evaluate_drafter`, for another reading of the same decoding: e.g. the greedy drafts
    with the findings too few samples repeat left out (`orapo_core.facts.keep_agreed`), at several thresholds,
    from one drafting pass. `records` are the ones `result` was made from, in order.
    """
    records = list(records)
    if len(records) != len(result.predictions):
        raise ValueError(f"{len(records)} records for {len(result.predictions)} predictions")
    return _score([(record, text_of(row)) for record, row in zip(records, result.predictions, strict=True)], facts_beta)


def _score(drafts: Sequence[tuple], facts_beta: float) -> EvaluationResult:
    """(record, draft text) pairs labelled by FactS against each record's reference: metrics and rows."""
    predicted, reference, texts, rewards, rows = [], [], [], [], []
    for record, text in drafts:
        labels = label_report(text)
        ref = record.labels if any(v is not None for v in record.labels.values()) else label_report(record.report)
        score = score_report(text, labels=ref, beta=facts_beta)
        predicted.append(labels)
        reference.append(ref)
        texts.append(text)
        rewards.append(score.facts_score)
        rows.append(
            {
                "study_id": record.study_id,
                "draft": text,
                "labels": labels,
                "reference": ref,
                "facts_score": score.facts_score,
            }
        )
    scored = [r for r in rewards if r is not None]
    metrics = clinical_efficacy(predicted, reference, texts=texts).with_values(
        facts_reward_mean=sum(scored) / len(scored) if scored else None
    )
    return EvaluationResult(metrics=metrics, predictions=rows)


@contextlib.contextmanager
def _eval_mode(model: Any) -> Iterator[None]:
    training = bool(getattr(model, "training", False))
    if training:
        model.eval()
    try:
        yield
    finally:
        if training:
            model.train()
