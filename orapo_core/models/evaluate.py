"""Clinical-efficacy evaluation of a model's greedy drafts against reference labels.

The same function serves `orapo eval`, the rounds' held-out gate and the
benchmarks, so a number in the admin tab and a number in the README mean the
same thing: greedy drafts (no samples), labelled by the FactS labeler, against
each study's reference labels (given by the dataset, or FactS labels of its
reference report), uncertain counted as positive.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass
class EvaluationResult:
    metrics: dict
    predictions: list[dict] = field(default_factory=list)  # study_id, draft, labels, reference labels

    def to_dict(self) -> dict:
        return {"metrics": self.metrics, "predictions": self.predictions}


def load_study_image(path):
    """The display rendering of one study image, decoded the way the app decodes uploads (nothing stored)."""
    from orapo_core.imaging import ingest_path

    return ingest_path(path, secret=secrets.token_hex(8)).display


def evaluate_drafter(
    drafter,
    records: Sequence,
    *,
    max_new_tokens: int = 160,
    facts_beta: float = 1.0,
    progress: Callable[[int, int], None] | None = None,
) -> EvaluationResult:
    """Draft each record's first image greedily and score the drafts (14 and 5 observations, FactS reward)."""
    from orapo_core.facts import label_report, score_report
    from orapo_core.facts.metrics import clinical_efficacy

    predicted, reference, texts, rewards, rows = [], [], [], [], []
    started = time.perf_counter()
    for i, record in enumerate(records):
        image = load_study_image(record.image_paths[0])
        draft = drafter.draft(image, samples=0, max_new_tokens=max_new_tokens)
        labels = label_report(draft.text)
        ref = record.labels if any(v is not None for v in record.labels.values()) else label_report(record.report)
        score = score_report(draft.text, labels=ref, beta=facts_beta)
        predicted.append(labels)
        reference.append(ref)
        texts.append(draft.text)
        rewards.append(score.facts_score)
        rows.append({"study_id": record.study_id, "draft": draft.text, "labels": labels, "reference": ref,
                     "facts_score": score.facts_score})
        if progress:
            progress(i + 1, len(records))
    metrics = clinical_efficacy(predicted, reference, texts=texts)
    scored = [r for r in rewards if r is not None]
    metrics["facts_reward_mean"] = sum(scored) / len(scored) if scored else None
    metrics["seconds"] = time.perf_counter() - started
    return EvaluationResult(metrics=metrics, predictions=rows)
