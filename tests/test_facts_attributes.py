"""Side, severity and device type against a reference report: verdicts on literal sentences, the
hold-out pairs in tests/data/facts_attribute_pairs.jsonl in both directions, and the reward switch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orapo_core.facts import extract_facts, label_report, make_facts_reward, score_report

PAIRS = [
    json.loads(line)
    for line in (Path(__file__).parent / "data" / "facts_attribute_pairs.jsonl").read_text().splitlines()
]


def judged(draft: str, reference: str):
    """(verdict, reason) of every fact of the draft judged against the reference report."""
    return [(j.verdict, j.reason) for s in score_report(draft, reference_text=reference).sentences for j in s.facts]


def test_the_reading_room_examples():
    assert judged("Small left pleural effusion.", "Large right pleural effusion.") == [
        (
            "contradicted",
            "side: left in the draft, right in the report; severity: small in the draft, large in the report",
        )
    ]
    assert judged("Right IJ central line.", "Endotracheal tube terminates 4 cm above the carina.") == [
        ("contradicted", "device: central line in the draft, endotracheal tube in the report")
    ]
    assert judged("Small left effusion.", "Small left pleural effusion.") == [("entailed", None)]
    assert judged("Mild cardiomegaly.", "Mildly enlarged heart.") == [("entailed", None)]


def test_adjacent_severity_grades_agree_and_two_grades_apart_disagree():
    for near in (
        "Moderate left pleural effusion.",
        "Small to moderate left pleural effusion.",
        "Trace left pleural effusion.",
    ):
        assert judged("Small left pleural effusion.", near) == [("entailed", None)], near
    assert judged("Moderate cardiomegaly.", "Severe cardiomegaly.") == [("entailed", None)]
    assert judged("Mild cardiomegaly.", "The heart is severely enlarged.") == [
        ("contradicted", "severity: mild in the draft, severe in the report")
    ]
    assert judged("Mild to moderate pulmonary edema.", "Severe pulmonary edema.") == [("entailed", None)]


def test_bilateral_against_one_side_is_contradicted():
    assert judged("Bilateral pleural effusions.", "Small left pleural effusion.") == [
        ("contradicted", "side: bilateral in the draft, left in the report")
    ]
    assert judged("Effusions, right greater than left.", "Bilateral pleural effusions.") == [("entailed", None)]


def test_an_impression_restating_a_finding_without_its_side_neither_vouches_nor_hides():
    reference = "FINDINGS: There is severe cardiomegaly. Patchy opacity in the left lung base.\nIMPRESSION: Cardiomegaly. Opacity."
    assert judged("Mild cardiomegaly.", reference) == [
        ("contradicted", "severity: mild in the draft, severe in the report")
    ]
    assert judged("Hazy opacity at the right lung base.", reference)[-1] == (
        "contradicted",
        "side: right in the draft, left in the report",
    )
    assert judged("Cardiomegaly.", reference) == [("entailed", None)]  # states nothing the report could contradict


def test_two_findings_of_one_observation_are_paired_not_pooled():
    reference = "Small left pleural effusion. Large right pleural effusion."
    assert judged("Small left pleural effusion.", reference) == [("entailed", None)]
    assert judged("Large right pleural effusion.", reference) == [("entailed", None)]
    verdict, reason = judged("Large left pleural effusion.", reference)[0]
    assert verdict == "contradicted" and reason == "severity: large in the draft, small in the report"


def test_devices_are_compared_with_devices_of_their_own_type():
    reference = "Endotracheal tube 4 cm above the carina. Left upper extremity PICC terminates in the SVC."
    assert judged("ETT in place.", reference) == [("entailed", None)]
    assert judged("Left PICC line.", reference) == [("entailed", None)]
    assert judged("Right PICC line.", reference) == [("contradicted", "side: right in the draft, left in the report")]
    assert judged("A nasogastric tube extends into the stomach.", reference) == [
        ("contradicted", "device: enteric tube in the draft, central line and endotracheal tube in the report")
    ]
    assert judged("Right IJ central line.", "Support devices in place.") == [("entailed", None)]  # a generic mention


def test_denials_and_unsupported_findings_are_not_attribute_checked():
    assert judged("No left pleural effusion.", "No right pleural effusion.") == [("entailed", None)]
    assert judged("Small left pneumothorax.", "Large right pleural effusion.") == [("unsupported", None)]
    assert judged("No pleural effusion.", "Small left pleural effusion.") == [("contradicted", None)]


def test_against_labels_alone_the_judgement_stays_per_observation():
    labels = label_report("Large right pleural effusion.")
    score = score_report("Small left pleural effusion.", labels=labels)
    assert [(j.verdict, j.reason) for j in score.sentences[0].facts] == [("entailed", None)]
    # and a reference report can be told to judge per observation too
    off = score_report(
        "Small left pleural effusion.", reference_text="Large right pleural effusion.", attribute_check=False
    )
    assert off.sentences[0].status == "entailed"


def test_sentence_status_and_precision_aware_score_follow_the_check():
    reference = "Large right pleural effusion. No pneumothorax."
    draft = "Small left pleural effusion. No pneumothorax."
    on = score_report(draft, reference_text=reference, precision_aware=True)
    off = score_report(draft, reference_text=reference, precision_aware=True, attribute_check=False)
    assert [s.status for s in on.sentences] == ["contradicted", "entailed"]
    assert [s.status for s in off.sentences] == ["entailed", "entailed"]
    # precision and recall stay per observation; one of two judged sentences is charged half
    assert (on.precision, on.recall, on.fbeta) == (off.precision, off.recall, off.fbeta) == (1.0, 1.0, 1.0)
    assert off.facts_score == pytest.approx(1.0) and on.facts_score == pytest.approx(0.75)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Right IJ central line with tip in the mid SVC.", {"laterality": "right", "device": "central line"}),
        ("Left chest wall pacemaker with leads in the right atrium.", {"laterality": "left", "device": "pacemaker"}),
        ("Left effusion without significant change.", {"laterality": "left"}),  # "significant" is no severity here
        ("Moderate-sized left pleural effusion.", {"laterality": "left", "severity": "moderate"}),
        ("Right-sided pleural effusion.", {"laterality": "right"}),
        (
            "Small to moderate bilateral effusions, right greater than left.",
            {"laterality": "bilateral", "severity": "small to moderate"},
        ),
        ("ETT in place.", {"device": "endotracheal tube"}),
        ("NGT in the stomach.", {"device": "enteric tube"}),
        ("Consolidation in the lingula.", {"laterality": "left"}),
    ],
)
def test_attribute_extraction(text, expected):
    fact = extract_facts(text).facts[0]
    assert {k: v for k, v in fact.attributes.items() if k in ("laterality", "severity", "device")} == expected


def test_a_side_or_size_never_crosses_another_finding():
    facts = {f.observation: f.attributes for f in extract_facts("Large right pleural effusion with atelectasis.").facts}
    assert facts["Pleural Effusion"] == {"laterality": "right", "severity": "large"}
    assert "laterality" not in facts["Atelectasis"] and "severity" not in facts["Atelectasis"]


def test_the_hold_out_pairs_cover_side_size_device_and_matches():
    kinds = {k for p in PAIRS for k in p["kind"].split("+")}
    assert len(PAIRS) >= 40 and {"side", "severity", "device", "match"} <= kinds
    assert sum(p["verdict"] == "entailed" for p in PAIRS) >= 10


@pytest.mark.parametrize("swapped", [False, True], ids=["draft-vs-report", "swapped"])
@pytest.mark.parametrize("pair", PAIRS, ids=[f"{p['kind']}:{p['draft'][:40]}" for p in PAIRS])
def test_hold_out_pair(pair, swapped):
    draft, reference = (pair["reference"], pair["draft"]) if swapped else (pair["draft"], pair["reference"])
    score = score_report(draft, reference_text=reference)
    assert {s.status for s in score.sentences if s.status != "neutral"} == {pair["verdict"]}
    reasons = {
        part.split(":")[0] for s in score.sentences for j in s.facts if j.reason for part in j.reason.split("; ")
    }
    assert reasons == set(pair["attributes"])
    # against the reference's labels alone every pair is entailed: the check needs the report
    labels = score_report(draft, labels=label_report(reference))
    assert {s.status for s in labels.sentences if s.status != "neutral"} == {"entailed"}


# ------------------------------------------------------------------------------------------ the reward switch


def call_like_trl(reward, completions, **columns):
    return reward(
        prompts=["Describe."] * len(completions),
        completions=completions,
        completion_ids=[[1]] * len(completions),
        trainer_state=None,
        log_extra=None,
        log_metric=None,
        **columns,
    )


def test_reward_switch_reads_the_reference_report_column():
    reference = "Large right pleural effusion. No pneumothorax."
    completions = ["Small left pleural effusion. No pneumothorax.", "Large right pleural effusion. No pneumothorax."]
    columns = dict(labels=[label_report(reference)] * 2, reference_report=[reference] * 2)
    on = call_like_trl(make_facts_reward(attribute_check=True), completions, **columns)
    off = call_like_trl(make_facts_reward(attribute_check=False), completions, **columns)
    assert off == [pytest.approx(1.0), pytest.approx(1.0)]
    assert on == [pytest.approx(0.75), pytest.approx(1.0)]  # the wrong side is charged as a contradicted sentence
    # a row without a reference report is judged per observation, as against labels
    assert call_like_trl(
        make_facts_reward(attribute_check=True), completions[:1], labels=columns["labels"][:1], reference_report=[""]
    ) == [pytest.approx(1.0)]
    # the check acts through the precision-aware penalty only
    plain = make_facts_reward(precision_aware=False, attribute_check=True)
    assert call_like_trl(plain, completions, **columns) == [pytest.approx(1.0), pytest.approx(1.0)]
    # another column can hold the reference; the metric key does not change with the switch
    other = make_facts_reward(attribute_check=True, reference_text_column="oracle_report")
    assert call_like_trl(other, completions[:1], labels=columns["labels"][:1], oracle_report=[reference]) == [
        pytest.approx(0.75)
    ]
    assert (
        make_facts_reward(attribute_check=False).__name__
        == make_facts_reward(attribute_check=True).__name__
        == "facts_reward"
    )


def test_config_switch_reaches_the_reward():
    pytest.importorskip("trl")
    from dataclasses import fields

    from orapo_core.facts.reward import ATTRIBUTE_CHECK_DEFAULT
    from orapo_core.train.config import OraPOConfig
    from orapo_core.train.rewards import RewardSettings, get_reward

    field = next(f for f in fields(OraPOConfig) if f.name == "facts_attribute_check")
    assert field.default is ATTRIBUTE_CHECK_DEFAULT is True and "reference_report" in field.metadata["help"]
    completions = ["Small left pleural effusion. No pneumothorax."]
    columns = dict(
        labels=[{"Pleural Effusion": 1, "Pneumothorax": 0}],
        reference_report=["Large right pleural effusion. No pneumothorax."],
    )
    assert call_like_trl(get_reward("facts", RewardSettings(attribute_check=False)), completions, **columns) == [
        pytest.approx(1.0)
    ]
    assert call_like_trl(get_reward("facts", RewardSettings(attribute_check=True)), completions, **columns) == [
        pytest.approx(0.75)
    ]
    assert call_like_trl(get_reward("facts"), completions, **columns) == [pytest.approx(0.75)]  # FactS's default


def test_trainer_builds_the_reward_from_the_config(tmp_path):
    """The reward OraPOTrainer makes from `reward_name: facts`, called as TRL calls it."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    from PIL import Image
    from transformers import AutoModelForImageTextToText

    from orapo_core.models.compat import load_processor
    from orapo_core.train.config import OraPOConfig
    from orapo_core.train.dataset import build_training_dataset
    from orapo_core.train.trainer import OraPOTrainer
    from tests.support.tiny_vlms import build_tiny_vlm

    vlm = build_tiny_vlm(tmp_path / "model", family="qwen2_vl")
    Image.new("L", (56, 56), color=90).save(tmp_path / "0.png")
    dataset = build_training_dataset(
        [
            {
                "study_id": "s0",
                "image": str(tmp_path / "0.png"),
                "labels": {"Pleural Effusion": 1},
                "reference_report": "Large right pleural effusion.",
            }
        ]
        * 2
    )
    completions = ["Small left pleural effusion. No pneumothorax."]
    columns = dict(
        labels=[{"Pleural Effusion": 1, "Pneumothorax": 0}],
        reference_report=["Large right pleural effusion. No pneumothorax."],
    )
    got = {}
    for check in (False, True):
        torch.manual_seed(0)
        model = AutoModelForImageTextToText.from_pretrained(vlm)
        args = OraPOConfig(
            output_dir=str(tmp_path / f"out{check}"),
            per_device_train_batch_size=2,
            num_generations=2,
            max_completion_length=4,
            max_steps=1,
            bf16=False,
            report_to="none",
            save_strategy="no",
            facts_attribute_check=check,
        )
        trainer = OraPOTrainer(
            model=model, args=args, train_dataset=dataset, processing_class=load_processor(vlm, model.config)
        )
        got[check] = call_like_trl(trainer.reward_funcs[0], completions, **columns)
    assert got == {False: [pytest.approx(1.0)], True: [pytest.approx(0.75)]}


@pytest.mark.slow  # a measurement over 150 PhantomCXR studies
def test_the_measurement_finds_no_false_contradiction_on_rephrased_phantom_reports():
    from tests.measure_facts_attributes import measure

    result = measure(studies=150, seed=1)
    assert result["rephrased"]["changed"] == 0
    redrawn = result["redrawn"]
    assert redrawn["same_attributes_changed"] == 0 and redrawn["clearly_differ"] > 30
    assert redrawn["clearly_differ_dropped"] >= 0.9 * redrawn["clearly_differ"]
