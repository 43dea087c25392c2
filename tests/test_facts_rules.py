"""Negation, uncertainty, scope and attribute rules of the FactS extractor, on literal sentences."""

from __future__ import annotations

import pytest

from orapo_core.facts import extract_facts, label_report


def polarities(text: str, observation: str) -> list[str]:
    return [f.polarity for f in extract_facts(text).facts if f.observation == observation]


def polarity(text: str, observation: str) -> str:
    found = polarities(text, observation)
    assert found, f"no {observation} fact in {text!r}"
    return found[0]


CASES = [
    # --- plain assertions
    ("Small left pleural effusion.", "Pleural Effusion", "positive"),  # a bare finding is positive
    ("Right lower lobe pneumonia.", "Pneumonia", "positive"),  # diagnosis named outright
    # --- pre-negation
    ("No pneumothorax.", "Pneumothorax", "negative"),  # "no" before the finding
    ("Lungs are clear without consolidation.", "Consolidation", "negative"),  # "without"
    ("The lungs are free of edema.", "Edema", "negative"),  # "free of"
    ("Negative for pneumothorax.", "Pneumothorax", "negative"),  # "negative for"
    ("No evidence of pneumonia.", "Pneumonia", "negative"),  # "no evidence of"
    ("Resolution of the left basilar atelectasis.", "Atelectasis", "negative"),  # "resolution of" denies it now
    (
        "There is no pleural line to suggest pneumothorax.",
        "Pneumothorax",
        "negative",
    ),  # "suggest" under a negation stays negated
    # --- post-negation
    ("Pneumothorax is not seen.", "Pneumothorax", "negative"),  # "not seen" after the finding
    ("The previously noted effusion has resolved.", "Pleural Effusion", "negative"),  # "has resolved"
    ("Focal consolidation is not identified.", "Consolidation", "negative"),  # "not identified"
    # --- pseudo-negation
    ("No change in the mild cardiomegaly.", "Cardiomegaly", "positive"),  # "no change in" is not a denial
    ("Atelectasis, not significantly changed.", "Atelectasis", "positive"),  # "not changed" is not a denial
    # --- uncertainty
    ("This may represent atelectasis.", "Atelectasis", "uncertain"),  # "may"
    ("Possible right lower lobe pneumonia.", "Pneumonia", "uncertain"),  # "possible"
    ("Pneumonia cannot be excluded.", "Pneumonia", "uncertain"),  # "cannot be excluded" after the finding
    (
        "No definite consolidation, although pneumonia cannot be excluded.",
        "Pneumonia",
        "uncertain",
    ),  # hedge beats the earlier "no"
    ("Findings suggestive of pulmonary edema.", "Edema", "uncertain"),  # "suggestive of"
    ("Patchy opacity concerning for pneumonia.", "Pneumonia", "uncertain"),  # "concerning for"
    ("Clinical question: rule out pneumothorax.", "Pneumothorax", "uncertain"),  # "rule out"
    ("Opacity, likely atelectasis.", "Atelectasis", "uncertain"),  # "likely"
    ("Edema is suspected.", "Edema", "uncertain"),  # "is suspected" after the finding
    ("Question edema or atypical infection?", "Edema", "uncertain"),  # "question"
    ("Pulmonary edema difficult to entirely exclude.", "Edema", "uncertain"),  # "difficult to exclude"
    # --- size qualifiers of an organ
    ("Heart size is normal.", "Cardiomegaly", "negative"),  # a normal heart denies cardiomegaly
    ("The heart is not significantly enlarged.", "Cardiomegaly", "negative"),  # "not enlarged"
    ("The cardiac silhouette is enlarged.", "Cardiomegaly", "positive"),  # organ plus "enlarged"
    ("Heart size is upper limits of normal.", "Cardiomegaly", "uncertain"),  # a borderline size is a hedge
    ("Borderline cardiomegaly.", "Cardiomegaly", "positive"),  # "borderline" grades, it does not hedge
    ("The mediastinum is widened.", "Enlarged Cardiomediastinum", "positive"),  # mediastinum plus "widened"
    ("Normal cardiomediastinal silhouette.", "Enlarged Cardiomediastinum", "negative"),  # qualifier before the organ
]


@pytest.mark.parametrize(("text", "observation", "expected"), CASES, ids=[c[0] for c in CASES])
def test_polarity_rule(text, observation, expected):
    assert polarity(text, observation) == expected


def test_versus_hedges_both_alternatives():
    # "A versus B": the radiologist commits to neither.
    text = "Left basilar opacity, atelectasis versus pneumonia."
    assert polarity(text, "Atelectasis") == "uncertain"
    assert polarity(text, "Pneumonia") == "uncertain"
    assert polarity(text, "Lung Opacity") == "positive"  # the opacity itself is seen


def test_negation_covers_a_list():
    # One "no" denies every finding of the list.
    text = "No pleural effusion, pneumothorax or focal consolidation."
    assert polarity(text, "Pleural Effusion") == "negative"
    assert polarity(text, "Pneumothorax") == "negative"
    assert polarity(text, "Consolidation") == "negative"


def test_negation_covers_a_list_with_modifiers():
    # Modifiers inside the list ("large", "suspicious") do not end the denial.
    text = (
        "No focal consolidation, suspicious pulmonary opacity, large pleural effusion, or pneumothorax is identified."
    )
    assert set(polarities(text, "Pneumothorax")) == {"negative"}
    assert set(polarities(text, "Pleural Effusion")) == {"negative"}


def test_post_negation_covers_a_list():
    # A trailing "are not seen" denies everything listed before it.
    text = "Pleural effusion or pneumothorax are not seen."
    assert polarity(text, "Pleural Effusion") == "negative"
    assert polarity(text, "Pneumothorax") == "negative"


def test_but_ends_the_negation():
    # "but" opens a new clause: the effusion is present.
    text = "No pneumothorax, but there is a small right pleural effusion."
    assert polarity(text, "Pneumothorax") == "negative"
    assert polarity(text, "Pleural Effusion") == "positive"


def test_there_is_ends_the_negation():
    # A new "there is" asserts afresh, even after a comma.
    assert polarity("No pneumothorax, there is mild cardiomegaly.", "Cardiomegaly") == "positive"


def test_sentence_boundary_ends_the_negation():
    # A full stop closes the scope of "no".
    assert polarity("No pneumothorax. Small effusion.", "Pleural Effusion") == "positive"


def test_finding_before_without_stays_positive():
    # "without" reaches forward only: the emphysema is present.
    text = "Emphysema without focal consolidation."
    assert polarity(text, "Emphysema") == "positive"
    assert polarity(text, "Consolidation") == "negative"


def test_hedge_does_not_reach_backwards():
    # In "opacity may represent atelectasis" the opacity is seen; only its cause is hedged.
    text = "Right basilar opacity may represent atelectasis."
    assert polarity(text, "Lung Opacity") == "positive"
    assert polarity(text, "Atelectasis") == "uncertain"


def test_attributes_laterality_severity_location_change():
    fact = next(
        f
        for f in extract_facts("New small left basilar pleural effusion.").facts
        if f.observation == "Pleural Effusion"
    )
    assert fact.attributes == {"laterality": "left", "location": "lower", "severity": "small", "change": "new"}


def test_unchanged_attribute():
    fact = extract_facts("Stable mild cardiomegaly.").facts[0]
    assert fact.attributes["change"] == "unchanged" and fact.attributes["severity"] == "mild"


def test_spans_point_into_the_original_text():
    text = "FINDINGS: Heart normal.\nIMPRESSION: 1. Large right pneumothorax."
    report = extract_facts(text)
    fact = next(f for f in report.facts if f.observation == "Pneumothorax")
    assert text[fact.start : fact.end] == fact.mention == "pneumothorax"
    sentence = report.sentences[fact.sentence_index]
    assert (
        sentence.section == "impression"
        and text[sentence.start : sentence.end] == sentence.text == "Large right pneumothorax."
    )


def test_indication_is_not_a_finding():
    # The reason for the exam is a question, not a finding on the image.
    report = extract_facts("INDICATION: Pneumonia.\nFINDINGS: Lungs are clear.")
    assert [f.observation for f in report.facts if f.observation == "Pneumonia"] == []


def test_decimal_does_not_split_a_sentence():
    report = extract_facts("There is a 1.5 cm nodule in the right upper lobe. No effusion.")
    assert [s.text for s in report.sentences] == ["There is a 1.5 cm nodule in the right upper lobe.", "No effusion."]


def test_misspelling_and_abbreviation():
    assert polarity("Small right ptx.", "Pneumothorax") == "positive"  # abbreviation
    assert polarity("Mild cardiomegally.", "Cardiomegaly") == "positive"  # common misspelling


def test_soft_tissue_edema_is_not_pulmonary_edema():
    assert polarities("Soft tissue edema of the chest wall.", "Edema") == []


def test_mass_effect_is_not_a_mass():
    assert polarities("No mass effect.", "Mass") == []


def test_label_report_chexpert_values():
    labels = label_report("Mild cardiomegaly. No pleural effusion. Possible pneumonia.")
    assert labels["Cardiomegaly"] == 1
    assert labels["Pleural Effusion"] == 0
    assert labels["Pneumonia"] == -1
    assert labels["Edema"] is None  # not mentioned
    assert labels["No Finding"] is None  # something is abnormal


def test_label_aggregation_positive_beats_negative():
    # CheXpert's rule: a positive mention anywhere wins over a denial elsewhere.
    assert label_report("No effusion on the left. Small right effusion.")["Pleural Effusion"] == 1


def test_no_finding_with_only_devices():
    # Devices alone do not make a study abnormal.
    labels = label_report("Pacemaker in place. No pneumothorax. Heart size is normal.")
    assert labels["Support Devices"] == 1
    assert labels["No Finding"] == 1


def test_chestxray14_schema_projection():
    labels = label_report("Right upper lobe nodule. Small left effusion. Emphysema.", schema="chestxray14")
    assert labels["Nodule"] == 1 and labels["Effusion"] == 1 and labels["Emphysema"] == 1
    assert labels["Mass"] is None
    chexpert = label_report("Right upper lobe nodule.", schema="chexpert")
    assert chexpert["Lung Lesion"] == 1  # a nodule is reported as a Lung Lesion in CheXpert


def test_unknown_schema_is_refused():
    from orapo_core.errors import OrapoError

    with pytest.raises(OrapoError) as exc:
        label_report("No effusion.", schema="radgraph")
    assert exc.value.code == "unknown_schema"
