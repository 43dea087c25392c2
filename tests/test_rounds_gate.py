"""The promotion gate on literal numbers, and where the held-out set comes from."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.services.rounds import GatePolicy, decide
from orapo_core.facts.metrics import EvalMetrics

SERVED = EvalMetrics(macro_f1_14=0.40, facts_reward_mean=0.50, n_reports=20)


@pytest.mark.parametrize(
    ("candidate", "promote", "because"),
    [
        (EvalMetrics(macro_f1_14=0.41, facts_reward_mean=0.55), True, "FactS reward 0.5500 > 0.5000"),
        (EvalMetrics(macro_f1_14=0.39, facts_reward_mean=0.55), True, "tolerance 0.02"),  # within the tolerance
        (EvalMetrics(macro_f1_14=0.37, facts_reward_mean=0.55), False, "worse than the served model's 0.4000"),
        (EvalMetrics(macro_f1_14=0.45, facts_reward_mean=0.50), False, "not better"),  # equal reward is not better
        (EvalMetrics(macro_f1_14=0.45, facts_reward_mean=None), False, "no macro-F1 or FactS reward"),
    ],
)
def test_gate(candidate, promote, because):
    decision = decide(candidate, SERVED, GatePolicy(f1_tolerance=0.02))
    assert decision.promote is promote and because in decision.reason
    assert decision.served.macro_f1_14 == 0.40


def test_gate_margin_and_both_reasons():
    decision = decide(EvalMetrics(macro_f1_14=0.1, facts_reward_mean=0.52), SERVED, GatePolicy(reward_margin=0.05))
    assert not decision.promote and "macro-F1" in decision.reason and "+ 0.05" in decision.reason


def test_heldout_falls_back_to_phantom_validation_and_never_uses_training_studies(tmp_path):
    from app.runtime import open_database
    from app.services.rounds.data import select_heldout
    from orapo_core.config import Settings

    settings = Settings(data_dir=tmp_path / "data", deid_secret="t")
    db = open_database(settings)
    heldout = select_heldout(db, settings, min_heldout=5, phantom_studies=30, phantom_size=64)
    assert heldout.source == "phantomcxr_valid" and heldout.studies
    assert all(s.study_id.startswith("phantom-") and Path(s.image_path).is_file() for s in heldout.studies)
    assert "/valid/" in heldout.studies[0].image_path
    again = select_heldout(db, settings, min_heldout=5, phantom_studies=30, phantom_size=64)  # generated once, reused
    assert [s.study_id for s in again.studies] == [s.study_id for s in heldout.studies]
    record = heldout.records()[0]
    assert record.image_paths[0].is_file() and record.split == "holdout"


def test_an_untrusted_heldout_set_holds_the_candidate_for_an_administrator():
    better = EvalMetrics(macro_f1_14=0.9, facts_reward_mean=0.9)
    decision = decide(better, SERVED, GatePolicy(), untrusted="only 3 signed held-out studies")
    assert not decision.promote and decision.hold
    assert "promote by hand" in decision.reason and "only 3 signed" in decision.reason
    assert decision.candidate.macro_f1_14 == 0.9  # the numbers are still shown
    assert not decide(better, SERVED, GatePolicy()).hold


def test_phantom_stands_in_for_the_gate_only_for_the_phantomcxr_starter(tmp_path):
    import json as _json

    from app.services.rounds.data import HeldoutSet
    from app.services.rounds.steps import untrusted_heldout
    from app.services.reading.served import ServedModel

    starter = tmp_path / "starter"
    starter.mkdir()
    (starter / "starter_card.json").write_text(_json.dumps({"name": "orapo-starter"}))
    other = tmp_path / "hospital-model"
    other.mkdir()
    phantom = HeldoutSet("phantomcxr_valid", [], signed=3)
    own = HeldoutSet("holdout_studies", [], signed=25)
    assert untrusted_heldout(phantom, ServedModel(None, "starter", starter), 20) is None
    assert untrusted_heldout(own, ServedModel(4, "v4", other), 20) is None
    for served in (ServedModel(None, "hospital-model", other), ServedModel(2, "v2", starter, tmp_path / "adapter")):
        reason = untrusted_heldout(phantom, served, 20)
        assert reason and "only 3 signed held-out studies" in reason and "min_heldout=20" in reason
