"""Clinical-efficacy metrics and self-consistency against values computed by hand."""

from __future__ import annotations

import pytest

from orapo_core.facts.consistency import keep_agreed, self_consistency
from orapo_core.facts.metrics import EvalMetrics, clinical_efficacy
from orapo_core.facts.ontology import CHESTXRAY14, CHESTXRAY14_TO_CHEXPERT, CHEXPERT_14, FIVE_OBSERVATIONS


def test_ontology_shapes():
    assert len(CHEXPERT_14) == 14 and CHEXPERT_14[0] == "No Finding" and CHEXPERT_14[-1] == "Support Devices"
    assert len(CHESTXRAY14) == 14 and set(FIVE_OBSERVATIONS) <= set(CHEXPERT_14)
    assert CHESTXRAY14_TO_CHEXPERT["Effusion"] == "Pleural Effusion"
    assert CHESTXRAY14_TO_CHEXPERT["Nodule"] == "Lung Lesion"
    assert CHESTXRAY14_TO_CHEXPERT["Emphysema"] is None


def test_clinical_efficacy_by_hand():
    # Three reports. Uncertain (-1, "-1.0") counts as positive, blanks as negative.
    predicted = [
        {"Cardiomegaly": 1, "Edema": -1},  # TP cardiomegaly, FP edema
        {"Cardiomegaly": 0, "Pleural Effusion": "1.0"},  # FN cardiomegaly, TP effusion
        {"Atelectasis": 1},  # FP atelectasis
    ]
    reference = [
        {"Cardiomegaly": 1},
        {"Cardiomegaly": "-1.0", "Pleural Effusion": 1},
        {"Edema": None},
    ]
    m = clinical_efficacy(predicted, reference, texts=["a b c", "d e", "f"])
    # Counts over all classes: TP 2 (cardiomegaly, effusion), FP 2 (edema, atelectasis), FN 1 (cardiomegaly)
    assert m.micro_precision_14 == pytest.approx(2 / 4)
    assert m.micro_recall_14 == pytest.approx(2 / 3)
    assert m.micro_f1_14 == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))
    # Per class F1: cardiomegaly P=1 R=1/2 -> 2/3; effusion 1; edema 0; atelectasis 0; consolidation 0
    assert m.f1_per_class["Cardiomegaly"] == pytest.approx(2 / 3)
    assert m.f1_per_class["Pleural Effusion"] == 1.0
    assert m.f1_per_class["Edema"] == 0.0
    assert m.macro_f1_5 == pytest.approx((2 / 3 + 1) / 5)
    assert m.macro_f1_14 == pytest.approx((2 / 3 + 1) / 14)
    assert m.macro_precision_5 == pytest.approx((1 + 1) / 5)
    assert m.macro_recall_5 == pytest.approx((0.5 + 1) / 5)
    # The five observations hold all counts here, so micro values agree with the 14.
    assert m.micro_f1_5 == pytest.approx(m.micro_f1_14)
    assert m.mean_report_length == pytest.approx(2.0)
    assert m.support_per_class["Cardiomegaly"] == 2


def test_metrics_are_stored_with_their_names_and_read_back_from_any_stored_result():
    m = clinical_efficacy([{"Edema": 1}], [{"Edema": 1}], observations=("Edema", "Fracture"))
    stored = m.to_dict()
    # the stored layout (the keys of every recorded result) is pinned here; what nothing computed is left out, as
    # the dicts of older code left it out: no report length without texts, no "_5" group without one of the five
    assert stored == {
        "n_reports": 1,
        "micro_precision_14": 1.0,
        "micro_recall_14": 1.0,
        "micro_f1_14": 1.0,
        "macro_precision_14": 0.5,
        "macro_recall_14": 0.5,
        "macro_f1_14": 0.5,
        "micro_precision_5": 1.0,
        "micro_recall_5": 1.0,
        "micro_f1_5": 1.0,
        "macro_precision_5": 1.0,
        "macro_recall_5": 1.0,
        "macro_f1_5": 1.0,
        "f1_per_class": {"Edema": 1.0, "Fracture": 0.0},
        "support_per_class": {"Edema": 1, "Fracture": 0},
    }
    assert EvalMetrics.from_dict(stored) == m
    rare = clinical_efficacy([{"Fracture": 1}], [{"Fracture": 1}], observations=("Fracture",))
    assert rare.macro_f1_5 is None and not any(key.endswith("_5") for key in rare.to_dict())
    # a benchmark's row keeps its own numbers beside the metrics; they are not metrics and are left out
    assert EvalMetrics.from_dict({**stored, "rare_f1": 0.3, "example_draft": "x"}) == m
    assert EvalMetrics.from_dict(None) == EvalMetrics() and EvalMetrics().to_dict() == {}
    assert m.with_values(facts_reward_mean=0.25).to_dict()["facts_reward_mean"] == 0.25
    assert m.headline() == {"macro_f1_14": 0.5, "macro_precision_14": 0.5, "macro_recall_14": 0.5}


def test_clinical_efficacy_shape_mismatch():
    from orapo_core.errors import OrapoError

    with pytest.raises(OrapoError):
        clinical_efficacy([{}], [])


def test_self_consistency_by_hand():
    greedy = "Mild cardiomegaly. No pleural effusion. Possible pneumonia. Sternotomy wires."
    samples = [
        "Cardiomegaly. No effusion. Pneumonia. Sternotomy wires.",  # agrees with all
        "Cardiomegaly. Small effusion.",  # disagrees on effusion and pneumonia and the wires
        "Normal heart size. Clear lungs.",  # disagrees on cardiomegaly, pneumonia, wires; agrees on no effusion
        "Enlarged heart. Lungs clear. Sternotomy wires.",  # disagrees only on pneumonia
    ]
    result = self_consistency(greedy, samples)
    assert result.n_samples == 4
    assert [s.confidence for s in result.sentences] == [0.75, 0.75, 0.25, 0.5]
    assert [f.fact.observation for f in result.flagged] == [
        "Pneumonia",
        "Support Devices",
        "Cardiomegaly",
        "Pleural Effusion",
    ]
    assert result.flagged[0].agreement == 0.25


def test_self_consistency_without_samples():
    result = self_consistency("No pneumothorax.", [])
    assert result.sentences[0].confidence == 1.0 and result.flagged == []


def test_keep_agreed_leaves_out_the_findings_too_few_samples_assert():
    greedy = (
        "FINDINGS: Heart size is normal. No pneumothorax. Small left pleural effusion.\n\n"
        "IMPRESSION: Moderate right pneumothorax."
    )
    samples = [
        "FINDINGS: Small left pleural effusion.",
        "FINDINGS: No pneumothorax. Left effusion.",
        "IMPRESSION: Right pneumothorax.",
        "FINDINGS: Normal.",
    ]  # effusion asserted by 2 of 4, pneumothorax by 1 of 4
    assert keep_agreed(greedy, samples, 0.25) == greedy
    assert keep_agreed(greedy, samples, 0.5) == (  # an impression left with no sentence is kept, pointing back
        "FINDINGS: Heart size is normal. No pneumothorax. Small left pleural effusion.\n\nIMPRESSION: See findings."
    )
    # denials stay whatever the samples say; the layout stays the reference one
    assert keep_agreed(greedy, samples, 0.75) == (
        "FINDINGS: Heart size is normal. No pneumothorax.\n\nIMPRESSION: See findings."
    )
    assert keep_agreed(greedy, [], 1.0) == greedy and keep_agreed(greedy, samples, 0) == greedy
    assert keep_agreed("Moderate right pneumothorax. Clear lungs.", ["Clear lungs."], 0.5) == "Clear lungs."
