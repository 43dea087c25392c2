"""The reading-order benchmark scores a candidate as the app drafts it, or alone (its finding checks set aside)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from benchmarks import bench_reading_order as bench
from orapo_core.data.phantom import generate_study


def test_score_sets_the_finding_checks_aside_only_when_asked(monkeypatch, tmp_path):
    import orapo_core.models.draft as draft
    import orapo_core.models.evaluate as evaluate

    studies = [generate_study(np.random.default_rng([7, i]), size=64) for i in range(2)]
    kinds = [{"pneumothorax", "fracture", "lung_lesion", "pleural_other"}, set()]
    drafters = []

    class FakeDrafter:
        verifier = "checks"

        @classmethod
        def from_dir(cls, *model):
            drafters.append(cls())
            return drafters[-1]

    def fake_evaluate(drafter, records):
        # with its checks the drafter states pneumothorax on both films; alone, on neither
        said = {"Pneumothorax": 1} if drafter.verifier else {}
        metrics = SimpleNamespace(headline=lambda: {"macro_f1_14": 0.5})
        return SimpleNamespace(predictions=[{"labels": dict(said)} for _ in records], metrics=metrics)

    monkeypatch.setattr(draft, "Drafter", FakeDrafter)
    monkeypatch.setattr(evaluate, "evaluate_drafter", fake_evaluate)
    with_checks = bench.score(("base", "adapter"), studies, kinds, tmp_path)
    alone = bench.score(("base", "adapter"), studies, kinds, tmp_path, checks=False)
    assert drafters[0].verifier == "checks" and drafters[1].verifier is None
    assert with_checks["recall"]["pneumothorax"] == 1.0 and with_checks["rare_false_positive_rate"] == 1.0
    assert alone["recall"]["pneumothorax"] == 0.0 and alone["rare_false_positive_rate"] == 0.0


def test_alone_is_an_option_of_the_rescore():
    import pytest

    with pytest.raises(SystemExit):
        bench.main(["--rescore", "--alone"])  # needs the run's data folder and arms, as --rescore does
