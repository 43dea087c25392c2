"""What a round's steps hand each other, as types: the policy from text, the worker's JSON, the metrics column."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.services.rounds import Decision, Evaluation, EvaluationSpec, ModelScores, RoundMetrics, RoundPolicy
from app.services.rounds.metrics import SCHEMA, HeldoutSummary, Selection
from orapo_core.errors import OrapoError
from orapo_core.facts.metrics import EvalMetrics


def test_a_policy_takes_text_by_each_fields_type_and_names_what_does_not_fit():
    policy = RoundPolicy().updated(
        {"replay_fraction": "0.5", "min_heldout": "3", "evaluate_in_subprocess": "false", "replay_max": None}
    )
    assert (policy.replay_fraction, policy.min_heldout, policy.evaluate_in_subprocess) == (0.5, 3, False)
    assert RoundPolicy().min_heldout == 20  # frozen: updated() made a new one
    for values, said in (
        ({"min_heldout": "three"}, "min_heldout takes a number"),
        ({"evaluate_in_subprocess": "maybe"}, "takes true or false"),
        ({"f1_tolerance": None}, "f1_tolerance takes a number"),
        ({"no_such_thing": 1}, "no_such_thing is not a round setting"),
    ):
        with pytest.raises(OrapoError) as exc:
            RoundPolicy().updated(values)
        assert exc.value.code == "invalid_setting" and said in exc.value.message
    assert RoundPolicy.model_validate(RoundPolicy(poll_s=0.2).model_dump()) == RoundPolicy(poll_s=0.2)


def test_the_evaluation_worker_reads_and_writes_the_shapes_the_round_writes_and_reads(tmp_path):
    from app.services.rounds.plan import Weights

    spec = EvaluationSpec(
        tmp_path / "heldout.json",
        Weights(tmp_path / "base"),
        Weights(tmp_path / "base", tmp_path / "lora"),
        max_new_tokens=8,
    )
    data = spec.to_dict()
    assert data["models"]["candidate"] == {"base": str(tmp_path / "base"), "adapter": str(tmp_path / "lora")}
    assert EvaluationSpec.from_dict(data) == spec and spec.min_agreement == 0.0
    # the app's drafting operating point travels to the worker; a spec written before it had one reads as greedy
    strict = EvaluationSpec(spec.heldout, spec.served, spec.candidate, max_new_tokens=8, min_agreement=0.5)
    assert EvaluationSpec.from_dict(strict.to_dict()) == strict
    assert EvaluationSpec.from_dict({k: v for k, v in strict.to_dict().items() if k != "min_agreement"}) == spec
    evaluation = Evaluation(
        ModelScores(EvalMetrics(macro_f1_14=0.4)), ModelScores(EvalMetrics(macro_f1_14=0.5), [{"study_id": "s"}])
    )
    assert Evaluation.from_dict(evaluation.to_dict()) == evaluation


def test_round_metrics_are_written_typed_and_versioned_and_read_back():
    stored: dict = {}
    stored.update(
        RoundMetrics.update(
            phase="preparing",
            supervisor_pid=12,
            selection=Selection(new_studies=[1, 2]),
            heldout=HeldoutSummary(source="holdout_studies", n=2),
            max_steps=4,
        )
    )
    stored.update(RoundMetrics.update(phase="training", train={"step": 2, "loss": 0.5}))
    decision = Decision(True, "better", EvalMetrics(macro_f1_14=0.5), EvalMetrics(macro_f1_14=0.4))
    stored.update(RoundMetrics.update(phase="finished", gate=decision))
    assert stored["schema"] == SCHEMA and stored["gate"]["reason"] == "better"
    assert stored["gate"]["candidate"] == {"macro_f1_14": 0.5}  # the stored keys are the metrics' names, as ever
    metrics = RoundMetrics.from_json(stored)
    assert metrics.phase == "finished" and metrics.supervisor_pid == 12 and metrics.max_steps == 4
    assert metrics.selection.new_studies == [1, 2] and metrics.heldout.n == 2 and metrics.train["step"] == 2
    assert metrics.gate == decision
    with pytest.raises(TypeError):
        RoundMetrics.update(phasee="typo")


def test_rows_written_before_the_layout_was_versioned_still_read():
    old = {
        "phase": "finished",
        "supervisor_pid": 7,
        "served_version_id": None,
        "max_steps": 3,
        "selection": {
            "new_studies": [4],
            "replayed_studies": [],
            "phantom_replay": 0,
            "correction_ids": [9],
            "pair_ids": [],
            "clinician_pairs": 1,
        },
        "heldout": {"source": "phantomcxr_valid", "n": 200, "signed_heldout": 0, "study_ids": ["phantom-1"]},
        "train": {"step": 3},
        "heldout_metrics": {"served": {}, "candidate": {}},
        "gate": {"promote": False, "reason": "no numbers", "candidate": {}, "served": {}},  # before `hold` existed
        "something_later": 1,
    }
    metrics = RoundMetrics.from_json(old)
    assert (
        metrics.schema == 1 and metrics.selection.correction_ids == [9] and metrics.heldout.source == "phantomcxr_valid"
    )
    assert metrics.gate.hold is False and metrics.gate.reason == "no numbers"
    assert metrics.extra == {"something_later": 1}
    assert RoundMetrics.from_json(None) == RoundMetrics()


def test_one_served_model_for_drafting_and_rounds(tmp_path):
    from app.services.reading import registry, served
    from app.services.rounds import plan

    assert registry.ServedModel is served.ServedModel is plan.ServedModel
    model = served.ServedModel(3, "round-3", tmp_path / "base", tmp_path / "lora")
    assert model.key == "version-3" and served.ServedModel.from_dict(model.to_dict()) == model
    assert served.ServedModel(None, "starter", Path("/m")).key == "dir-/m"


def test_the_worker_is_a_subcommand_of_the_one_cli_but_not_in_its_help(capsys):
    from app.cli import build_parser

    parser = build_parser("rounds")
    args = parser.parse_args(["rounds", "worker", "merge", "b", "a", "o"])
    assert (args.rounds_command, args.worker_command, args.out) == ("worker", "merge", "o")
    with pytest.raises(SystemExit):
        parser.parse_args(["rounds", "--help"])
    listed = [
        line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("    ") and line.split()
    ]
    assert "cancel" in listed and "worker" not in listed
