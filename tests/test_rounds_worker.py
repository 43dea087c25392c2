"""The round's evaluation worker: both models on the held-out set, and the candidate once more without its checks."""

from __future__ import annotations

from types import SimpleNamespace

from app.services.rounds.heldout import HeldoutSet, HeldoutStudy
from app.services.rounds.plan import EvaluationSpec, Weights
from app.services.rounds.worker import evaluate_models
from orapo_core.facts.metrics import EvalMetrics


def test_a_candidate_with_finding_checks_is_also_scored_with_them_set_aside(tmp_path, monkeypatch):
    import orapo_core.models.draft as draft
    import orapo_core.models.evaluate as evaluate

    studies = [
        HeldoutStudy(f"s{i}", str(tmp_path / f"{i}.png"), "Findings.", "", {"Pneumothorax": i % 2}) for i in range(4)
    ]
    path = HeldoutSet("holdout_studies", studies, signed=4).write(tmp_path / "heldout.json")
    seen = []

    class FakeDrafter:
        def __init__(self, adapter):
            self.adapter, self.verifier = adapter, (object() if adapter else None)

        @classmethod
        def from_dir(cls, base, adapter, **_):
            return cls(adapter)

    def fake_evaluate(drafter, records, **_):
        said = drafter.verifier is not None  # the checks state the finding everywhere; alone nothing
        seen.append((drafter.adapter, said))
        predictions = [
            {
                "study_id": r.study_id,
                "draft": "x",
                "labels": {"Pneumothorax": int(said)},
                "reference": dict(r.labels),
                "facts_score": 0.5,
            }
            for r in records
        ]
        return SimpleNamespace(predictions=predictions, metrics=EvalMetrics(seconds=1.0))

    monkeypatch.setattr(draft, "Drafter", FakeDrafter)
    monkeypatch.setattr(evaluate, "evaluate_drafter", fake_evaluate)
    spec = EvaluationSpec(path, Weights(tmp_path / "base"), Weights(tmp_path / "base", tmp_path / "adapter"))
    evaluation = evaluate_models(spec)
    assert seen == [(None, False), (tmp_path / "adapter", True), (tmp_path / "adapter", False)]
    assert [r["labels"]["Pneumothorax"] for r in evaluation.candidate.predictions] == [1] * 4
    assert [r["labels"]["Pneumothorax"] for r in evaluation.candidate_alone.predictions] == [0] * 4
    assert type(evaluation).from_dict(evaluation.to_dict()).candidate_alone == evaluation.candidate_alone
    no_checks = evaluate_models(EvaluationSpec(path, Weights(tmp_path / "base"), Weights(tmp_path / "base")))
    assert no_checks.candidate_alone is None
