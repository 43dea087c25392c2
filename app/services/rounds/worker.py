"""The work a round hands to child processes besides training: evaluating the two models, merging an adapter.

A round runs them as `orapo rounds worker evaluate SPEC OUT` and `orapo rounds
worker merge BASE ADAPTER OUT` (hidden subcommands of the one CLI, as training
is `orapo train`), in their own session, so loading two more models cannot
push the app out of memory and a cancel can kill them. The functions are
plain, so a round may also evaluate in its own process
(`evaluate_in_subprocess: false`).
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.services.rounds.evidence import judged_metrics
from app.services.rounds.plan import Evaluation, EvaluationSpec, ModelScores, Weights
from orapo_core.models.loading import load_model

if TYPE_CHECKING:
    from orapo_core.data.records import StudyRecord


def evaluate_models(spec: EvaluationSpec, progress: Callable[[str, int, int], None] | None = None) -> Evaluation:
    """The served model's and the candidate's drafts on the held-out set, scored by `evaluate_drafter`: greedy, with
    the findings too few samples assert left out when the spec's `min_agreement` (the app's) asks for it. Each
    model's metrics are over the studies the gate judges macro-F1 on (`evidence.judged_metrics`: not the top-up
    negatives), and its per-study rows go with them, for the gate's paired intervals and per-finding rates. A
    candidate with finding checks is drafted a second time with them set aside (`candidate_alone`): what the
    model writes by itself, which the round page shows first."""
    from app.services.rounds.heldout import HeldoutSet  # noqa: PLC0415 -- loads numpy
    from orapo_core.models.draft import Drafter  # noqa: PLC0415 -- loads numpy
    from orapo_core.models.evaluate import evaluate_drafter  # noqa: PLC0415 -- tests patch evaluate_drafter

    records = HeldoutSet.read(spec.heldout).records()
    scores: dict[str, ModelScores] = {}
    models: dict[str, Weights] = {"served": spec.served, "candidate": spec.candidate}
    for name, weights in models.items():
        drafter = Drafter.from_dir(weights.base, weights.adapter, model_version=name, min_agreement=spec.min_agreement)
        runs = [name] + (["candidate_alone"] if name == "candidate" and drafter.verifier is not None else [])
        for run in runs:
            if run == "candidate_alone":  # what the model writes by itself: its finding checks set aside
                drafter.verifier = None
            result = evaluate_drafter(
                drafter,
                records,
                max_new_tokens=spec.max_new_tokens,
                batch_size=spec.batch_size,
                progress=partial(progress, run) if progress else None,
            )
            rows = prediction_rows(result.predictions, records)
            scores[run] = ModelScores(judged_metrics(rows).with_values(seconds=result.metrics.seconds), rows)
        del drafter
        gc.collect()
    return Evaluation(
        served=scores["served"], candidate=scores["candidate"], candidate_alone=scores.get("candidate_alone")
    )


def prediction_rows(predictions: list[dict[str, Any]], records: Sequence[StudyRecord]) -> list[dict[str, Any]]:
    """What the gate reads of each study's prediction (`app.services.rounds.evidence`): the draft, its labels, the
    study's labels, the FactS reward, and where the study came from (a top-up negative counts for false positives only)."""
    return [
        {**{k: p[k] for k in ("study_id", "draft", "labels", "reference", "facts_score")}, "source": r.source}
        for p, r in zip(predictions, records, strict=True)
    ]


def merge_adapter(base: str | Path, adapter: str | Path, out: str | Path) -> Path:
    """Fold a served LoRA adapter into its base, so the next round starts from the served weights."""
    loaded = load_model(base, adapter, device="cpu")
    merged = loaded.model.merge_and_unload()
    target = Path(out)
    tmp = target.with_name(target.name + ".part")
    merged.save_pretrained(tmp)
    loaded.processor.save_pretrained(tmp)
    tmp.rename(target)
    return target


def run_evaluate(spec_path: str | Path, out_path: str | Path) -> Path:
    """`orapo rounds worker evaluate`: the spec's evaluation written to `out_path` (complete or not at all)."""
    spec = EvaluationSpec.from_dict(json.loads(Path(spec_path).read_text()))

    def progress(name: str, done: int, total: int) -> None:
        print(f"eval {name} {done}/{total}", flush=True)

    evaluation = evaluate_models(spec, progress)
    out = Path(out_path)
    tmp = out.with_suffix(".part")
    tmp.write_text(json.dumps(evaluation.to_dict(), indent=1, default=str))
    tmp.rename(out)
    return out
