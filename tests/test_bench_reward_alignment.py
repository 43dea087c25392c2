"""`benchmarks/bench_reward_alignment.py`: where a reward's GRPO step moves macro-F1, read from the model's own samples."""

from __future__ import annotations

import json
import math

import pytest


def test_weights_are_grpo_advantages_turned_into_a_distribution():
    from benchmarks.bench_reward_alignment import weights

    assert weights([0.2, 0.2, 0.2, 0.2], 1.0) == pytest.approx([0.25] * 4)  # no spread: no preference
    assert weights([0.1, 0.9, 0.5, 0.5], 0.0) == pytest.approx([0.25] * 4)  # eta 0: the samples as drawn
    soft = weights([0.1, 0.9, 0.5, 0.5], 1.0)
    assert sum(soft) == pytest.approx(1.0) and soft[2] == pytest.approx(soft[3])
    assert soft[1] > soft[2] > soft[0]
    assert weights([0.1, 0.9, 0.9, 0.5], math.inf) == pytest.approx([0.0, 0.5, 0.5, 0.0])  # best of K, ties share
    # scale-free as GRPO's advantages are: the same ranking at a tenth of the reward gives the same weights
    assert weights([0.01, 0.09, 0.05, 0.05], 1.0) == pytest.approx(soft, rel=1e-2)


def test_macro_f1_from_expected_counts_matches_the_evaluator_on_hard_labels():
    from benchmarks.bench_reward_alignment import macro_f1, per_study_counts, summed
    from orapo_core.facts.metrics import clinical_efficacy
    from orapo_core.facts.ontology import CHEXPERT_14

    names = list(CHEXPERT_14)
    predicted = [{"Cardiomegaly": 1, "Edema": 1}, {"Cardiomegaly": 0, "Pneumothorax": -1}, {"No Finding": 1}]
    reference = [{"Cardiomegaly": 1}, {"Cardiomegaly": 1, "Pneumothorax": 1}, {"No Finding": 1, "Edema": 0}]
    rows = [per_study_counts([p], r, [1.0], names) for p, r in zip(predicted, reference, strict=True)]
    assert macro_f1(summed(rows, [0, 1, 2])) == pytest.approx(clinical_efficacy(predicted, reference).macro_f1_14)
    # two samples at half weight each count half: one right and one wrong call of a finding is F1 0.5
    half = per_study_counts([{"Edema": 1}, {}], {"Edema": 1}, [0.5, 0.5], names)
    assert half[names.index("Edema")] == [0.5, 0.0, 0.5]


@pytest.mark.slow
def test_a_tiny_model_gets_every_reward_compared_on_its_own_samples(tmp_path):
    from benchmarks.bench_reward_alignment import main, rewards_to_compare
    from tests.support.tiny_vlms import build_tiny_vlm

    model = build_tiny_vlm(tmp_path / "model", family="qwen2_vl")
    out = tmp_path / "alignment.json"
    assert (
        main(
            [
                "--model",
                str(model),
                "--studies",
                "6",
                "--k",
                "3",
                "--bootstrap",
                "20",
                "--data-dir",
                str(tmp_path / "pool"),
                "--json",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert result["studies"] == 6 and result["k"] == 3
    assert set(rewards_to_compare()) < set(result["rewards"])
    for row in result["rewards"].values():
        low, high = row["ci95_eta_inf"]
        assert low <= high and 0.0 <= row["macro_f1_at_eta_0"] <= 1.0
        assert len(row["per_class_f1_samples"]) == 14
    assert 0.0 <= result["share_of_studies_a_sample_beats_greedy"] <= 1.0
    assert len(result["greedy_per_class_f1"]) == 14


def test_the_label_f1_rewards_score_what_the_evaluator_reads_and_the_seen_one_ignores_the_unseen_findings():
    from benchmarks.bench_reward_alignment import UNSEEN, label_f1_all, label_f1_seen
    from orapo_core.train.rewards import get_reward

    labels = json.dumps({"Cardiomegaly": 1, "Atelectasis": 1, "Edema": 0})
    texts = [
        "The heart is enlarged. Atelectasis at the left base.",  # both right
        "The heart is enlarged.",  # misses atelectasis
        "The heart is enlarged. Pulmonary edema.",
    ]  # misses atelectasis and calls edema wrongly
    assert label_f1_all(texts, labels=[labels] * 3) == pytest.approx([1.0, 2 / 3, 0.5])
    assert "Atelectasis" in UNSEEN
    assert label_f1_seen(texts, labels=[labels] * 3) == pytest.approx([1.0, 1.0, 2 / 3])  # atelectasis not counted
    assert label_f1_all(texts[:1], labels=None) == [None]  # no labels, no reward (as FactS)
    # the registry finds them by dotted path, as `bench_learning.py --reward` and a recipe's reward_funcs do
    assert get_reward("benchmarks.bench_reward_alignment:label_f1_seen") is label_f1_seen
