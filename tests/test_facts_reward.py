"""The FactS reward called exactly as TRL 1.16's GRPOTrainer._calculate_rewards calls it, and the score behind it."""

from __future__ import annotations

import json
import math

import pytest

from orapo_core.errors import OrapoError
from orapo_core.facts import facts_reward, make_facts_reward, score_report
from orapo_core.facts.score import fbeta


def call_like_trl(reward_func, completions, **columns):
    """What `_calculate_rewards` does: prompts, completions, completion_ids, every other column, and its hooks."""
    logged = {}
    prompts = ["Describe the chest X-ray."] * len(completions)
    completion_ids = [[1, 2, 3]] * len(completions)
    reward_kwargs = {k: v for k, v in columns.items()}
    reward_kwargs["trainer_state"] = object()
    reward_kwargs["log_extra"] = lambda column, values: None
    reward_kwargs["log_metric"] = lambda name, value: logged.__setitem__(name, value)
    out = reward_func(prompts=prompts, completions=completions, completion_ids=completion_ids, **reward_kwargs)
    assert len(out) == len(prompts)
    # TRL turns None into NaN and the rest into float32: both must be possible.
    [float(r) if r is not None else math.nan for r in out]
    return out, logged


def test_plain_string_completions_with_dict_and_json_labels():
    labels = {"Cardiomegaly": 1, "Pleural Effusion": 1}
    out, logged = call_like_trl(
        facts_reward,
        ["Mild cardiomegaly. Small left pleural effusion.", "Mild cardiomegaly. No effusion."],
        labels=[labels, json.dumps(labels)],
        image_id=["a", "b"],  # any other dataset column arrives too and is ignored
    )
    assert out[0] == pytest.approx(1.0)
    # P = 1 (cardiomegaly), R = 1/2; F1 = 2/3; one of two judged sentences contradicted -> x (1 - 0.5 * 1/2)
    assert out[1] == pytest.approx(2 / 3 * 0.75)
    assert set(logged) == {"facts_reward/precision", "facts_reward/recall"}


def test_conversational_completions():
    completions = [
        [{"role": "assistant", "content": "Large right pneumothorax."}],
        [{"role": "assistant", "content": [{"type": "text", "text": "Large right pneumothorax."}]}],
    ]
    out, _ = call_like_trl(facts_reward, completions, labels=[{"Pneumothorax": "1.0"}, {"Pneumothorax": 1.0}])
    assert out == [pytest.approx(1.0), pytest.approx(1.0)]


def test_none_when_nothing_to_score():
    # A row without labels cannot be scored: None, which TRL turns into NaN and ignores.
    out, _ = call_like_trl(facts_reward, ["No pneumothorax."], labels=[None])
    assert out == [None]
    out, _ = call_like_trl(facts_reward, ["No pneumothorax."], labels=[{"Edema": float("nan"), "Fracture": ""}])
    assert out == [None]


def test_reference_report_column_when_labels_are_missing():
    reward = make_facts_reward(reference_text_column="reference_report", precision_aware=False)
    out, _ = call_like_trl(
        reward, ["Small right effusion."], labels=[None], reference_report=["Right pleural effusion."]
    )
    assert out == [pytest.approx(1.0)]


def test_asserting_everything_is_not_rewarded():
    # Listing every finding gets recall 1 but the precision-aware reward falls far below a correct report.
    everything = "Cardiomegaly. Edema. Consolidation. Pneumonia. Atelectasis. Pneumothorax. Pleural effusion. Fracture."
    labels = [{"Cardiomegaly": 1}] * 2
    aware = make_facts_reward(beta=2.0, precision_aware=True)
    plain = make_facts_reward(beta=2.0, precision_aware=False)
    correct = "Cardiomegaly. No pneumothorax."
    (gamed, good), _ = call_like_trl(aware, [everything, correct], labels=labels)
    (gamed_plain, _), _ = call_like_trl(plain, [everything, correct], labels=labels)
    assert good == pytest.approx(1.0)
    assert gamed < gamed_plain < good
    assert gamed < 0.25


def test_factory_names_are_metric_keys():
    assert facts_reward.__name__ == "facts_reward"
    assert make_facts_reward(beta=2.0, precision_aware=False).__name__ == "facts_f2"
    assert make_facts_reward(name="my_facts").__name__ == "my_facts"
    with pytest.raises(OrapoError):
        make_facts_reward(beta=0)


def test_fbeta_formula():
    # (1 + b^2) P R / (b^2 P + R) with P = 0.24, R = 0.83 (the paper's own model), b = 2
    assert fbeta(0.24, 0.83, 2.0) == pytest.approx(5 * 0.24 * 0.83 / (4 * 0.24 + 0.83))
    assert fbeta(0.5, 0.5, 1.0) == pytest.approx(0.5)
    assert fbeta(0.0, 0.0, 1.0) == 0.0


def test_score_report_sentences_and_missed():
    text = "Mild cardiomegaly. No pleural effusion. Right lower lobe pneumonia. Sternotomy."
    score = score_report(text, labels={"Cardiomegaly": "1.0", "Pleural Effusion": 1, "Edema": 0.0})
    # asserted {Cardiomegaly, Pneumonia}, reference {Cardiomegaly, Pleural Effusion}: P = R = 1/2
    assert (score.precision, score.recall, score.facts_score) == pytest.approx((0.5, 0.5, 0.5))
    assert [s.status for s in score.sentences] == ["entailed", "contradicted", "unsupported", "neutral"]
    assert [s.score for s in score.sentences] == [1.0, 0.0, 0.0, 1.0]
    assert score.missed == ["Pleural Effusion"]
    judgement = score.sentences[1].facts[0]
    assert (judgement.label, judgement.reference, judgement.verdict) == ("Pleural Effusion", 1, "contradicted")


def test_score_report_against_a_reference_report_and_beta():
    score = score_report("Cardiomegaly.", reference_text="Cardiomegaly and small left effusion.", beta=2.0)
    # P = 1, R = 1/2, F2 = 5 * 0.5 / (4 + 0.5)
    assert score.facts_score == pytest.approx(5 * 0.5 / 4.5)
    assert score.missed == ["Pleural Effusion"]


def test_denial_of_an_unmentioned_finding_is_entailed():
    score = score_report("No pneumothorax.", labels={"Cardiomegaly": 0})
    assert score.sentences[0].status == "entailed"
    assert score.asserted == ["No Finding"] and score.reference == ["No Finding"] and score.facts_score == 1.0


def test_chestxray14_names_in_reference_labels():
    score = score_report("Small left effusion. Right upper lobe nodule.", labels={"Effusion": 1, "Nodule": "1"})
    assert [s.status for s in score.sentences] == ["entailed", "entailed"]


def test_bad_labels_are_refused():
    with pytest.raises(OrapoError) as exc:
        score_report("No effusion.", labels={"Edema": "maybe"})
    assert exc.value.code == "bad_label"
    with pytest.raises(OrapoError):
        score_report("No effusion.")
