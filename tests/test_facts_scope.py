"""Where a negation or hedge stops, and the organ-level statements radiologists write, on literal sentences."""

from __future__ import annotations

import pytest

from orapo_core.facts import extract_facts, label_report


def polarity(text: str, observation: str) -> str:
    found = [f.polarity for f in extract_facts(text).facts if f.observation == observation]
    assert found, f"no {observation} fact in {text!r}"
    return found[0]


def certainty(text: str, observation: str) -> str | None:
    return next(f.attributes.get("certainty") for f in extract_facts(text).facts if f.observation == observation)


SCOPE_ENDED = [
    # A segment after a comma that carries its own size word is a new finding, not part of the denial.
    ("No pneumothorax, small effusion.", "Pleural Effusion"),
    ("No pneumothorax, small left pleural effusion.", "Pleural Effusion"),
    # Laterality plus finding opens a new assertion.
    ("No pneumothorax, left basilar atelectasis.", "Atelectasis"),
    # A measurement opens one too.
    ("No effusion, 2 cm nodule in the right upper lobe.", "Nodule"),
    # A change word ("stable", "unchanged") reports a finding that is there.
    ("No pneumothorax, stable cardiomegaly.", "Cardiomegaly"),
    # A new subject with its own verb: "the heart is enlarged".
    ("No evidence of pneumothorax, the heart is enlarged.", "Cardiomegaly"),
    # The negation in the middle of a run-on sentence reaches only its own segment.
    ("Heart size within normal limits, no pneumothorax, small right effusion.", "Pleural Effusion"),
    # "and" / "with" followed by a modifier start a new assertion.
    ("No pneumothorax and mild cardiomegaly.", "Cardiomegaly"),
    ("No cardiomegaly with bilateral small pleural effusions.", "Pleural Effusion"),
    # "but", a semicolon and a full stop close the clause.
    ("No pneumothorax but small effusion.", "Pleural Effusion"),
    ("No pneumothorax; small effusion.", "Pleural Effusion"),
    ("Without pneumothorax. Effusion.", "Pleural Effusion"),
    # "otherwise negative for" denies what follows it, not the finding before it.
    ("Minimal subsegmental atelectasis at the left base otherwise negative for focal airspace disease.", "Atelectasis"),
    # A hedge ends at the same boundary: the effusion after "versus ..., small" is seen.
    ("Pneumonia versus atelectasis in the left base, small effusion.", "Pleural Effusion"),
]


@pytest.mark.parametrize(("text", "observation"), SCOPE_ENDED, ids=[c[0] for c in SCOPE_ENDED])
def test_scope_ends_at_a_new_assertion(text, observation):
    assert polarity(text, observation) == "positive"


SCOPE_KEPT = [
    # A plain list: one "no" denies every item.
    ("No effusion, pneumothorax, or consolidation.", ["Pleural Effusion", "Pneumothorax", "Consolidation"]),
    ("No focal consolidation, effusion or pneumothorax.", ["Consolidation", "Pleural Effusion", "Pneumothorax"]),
    # Modified items of a list that goes on to "or" are still denied ("no large effusion" is a denial).
    (
        "No focal consolidation, large pleural effusion, or pneumothorax is identified.",
        ["Pleural Effusion", "Pneumothorax"],
    ),
    (
        "There is no acute pulmonary consolidation, large effusion or pneumothorax.",
        ["Pleural Effusion", "Pneumothorax"],
    ),
    # So are the items after "nor".
    ("No effusion, left pneumothorax nor consolidation.", ["Pneumothorax", "Consolidation"]),
    # "with no ..." is a negation of its own, not a new assertion.
    ("Clear lungs with no focal consolidation.", ["Consolidation"]),
]


@pytest.mark.parametrize(("text", "observations"), SCOPE_KEPT, ids=[c[0] for c in SCOPE_KEPT])
def test_scope_kept_over_a_list(text, observations):
    for observation in observations:
        assert polarity(text, observation) == "negative", observation


def test_differential_list_keeps_its_hedge():
    # A differential is a list too: its modified items stay hedged.
    text = "Focal opacity, differential diagnosis includes subsegmental atelectasis, small infiltrate, scarring."
    assert polarity(text, "Atelectasis") == "uncertain"
    assert polarity(text, "Infiltration") == "uncertain"
    # "... and mild pulmonary edema" at the end of a differential is one more alternative.
    assert polarity("Differential considerations include infiltrates and mild pulmonary edema.", "Edema") == "uncertain"


def test_consistent_with_is_not_a_new_assertion():
    # "compatible with chronic change" continues the hedge that began with "may".
    text = "Interstitial pattern which may be compatible with chronic interstitial change, differential diagnosis is unclear and includes pulmonary edema."
    assert polarity(text, "Edema") == "uncertain"


ORGAN_AND_HEDGE_RULES = [
    ("Heart size is normal.", "Cardiomegaly", "negative"),  # a normal heart denies cardiomegaly
    ("Cardiomediastinal silhouette is within normal limits.", "Enlarged Cardiomediastinum", "negative"),
    # "Lungs are clear" denies a parenchymal opacity (CheXpert's Lung Opacity), and nothing finer.
    ("The lungs are clear.", "Lung Opacity", "negative"),
    ("Lungs are otherwise clear.", "Lung Opacity", "negative"),
    ("Clear lungs.", "Lung Opacity", "negative"),
    # "top normal" is the same borderline size as "upper limits of normal": a hedge, not a denial.
    ("The heart is top normal in size.", "Cardiomegaly", "uncertain"),
    ("Stable cardiomegaly.", "Cardiomegaly", "positive"),  # stable findings are present
    ("Unchanged cardiomegaly.", "Cardiomegaly", "positive"),
    ("Resolved pneumothorax.", "Pneumothorax", "negative"),  # what resolved is gone
    ("Interval resolution of the effusion.", "Pleural Effusion", "negative"),
    ("The lungs are free of consolidation.", "Consolidation", "negative"),
    ("Pneumothorax is not seen.", "Pneumothorax", "negative"),
    ("Rule out pneumonia.", "Pneumonia", "uncertain"),
    ("Pneumonia cannot be excluded.", "Pneumonia", "uncertain"),
    ("Please correlate clinically for pneumonia.", "Pneumonia", "uncertain"),  # a request to check, not a finding
    ("Maybe due to pulmonary fibrosis.", "Fibrosis", "uncertain"),  # "maybe" in one word hedges like "may be"
    # "without significant interval change" is not a denial, however many modifiers it has.
    ("Redemonstration without significant interval change of mild atelectasis.", "Atelectasis", "positive"),
    # A differential after the finding does not weaken "most suggestive of".
    (
        "Opacities most suggestive of atelectasis, differential diagnosis includes atypical infection.",
        "Atelectasis",
        "uncertain",
    ),
]


@pytest.mark.parametrize(
    ("text", "observation", "expected"), ORGAN_AND_HEDGE_RULES, ids=[c[0] for c in ORGAN_AND_HEDGE_RULES]
)
def test_organ_and_hedge_rules(text, observation, expected):
    assert polarity(text, observation) == expected


def test_lungs_clear_does_not_hide_a_finding():
    # An organ-level denial loses to a finding stated elsewhere (CheXpert aggregation).
    labels = label_report("Lungs are clear except for left basilar opacity.")
    assert labels["Lung Opacity"] == 1


def test_no_acute_process_is_no_finding():
    labels = label_report("No acute cardiopulmonary process.")
    assert labels["No Finding"] == 1
    assert label_report("No acute cardiopulmonary process. Mild cardiomegaly.")["No Finding"] is None


def test_certainty_of_hedges():
    # "most suggestive of" leans to present even with a differential after it.
    assert (
        certainty(
            "Opacities most suggestive of atelectasis, differential diagnosis includes atypical infection.",
            "Atelectasis",
        )
        == "probable"
    )
    # "A versus B": both alternatives, neither chosen.
    assert certainty("Atelectasis versus pneumonia.", "Atelectasis") == "alternative"
    assert certainty("Atelectasis versus pneumonia.", "Pneumonia") == "alternative"
    # "either A or B" names alternatives the same way.
    assert certainty("Bibasilar airspace disease, either atelectasis or infiltrate.", "Infiltration") == "alternative"
    # "likely A versus B" leans to present.
    assert certainty("Likely atelectasis versus pneumonia.", "Atelectasis") == "probable"
    assert certainty("Pneumonia cannot be excluded.", "Pneumonia") == "possible"


def test_vs_abbreviation_does_not_end_the_sentence():
    report = extract_facts("Atelectasis vs. scarring. No effusion.")
    assert [s.text for s in report.sentences] == ["Atelectasis vs. scarring.", "No effusion."]
    assert polarity("Atelectasis vs. scarring.", "Lung Opacity") == "uncertain"  # the scarring is the other alternative


def test_enumerator_is_stripped_but_not_a_decimal():
    from orapo_core.facts.text import split_sentences

    assert [s.text for s in split_sentences("IMPRESSION: 1) Large right pneumothorax. 2) Small effusion.")] == [
        "Large right pneumothorax.",
        "Small effusion.",
    ]
    assert [s.text for s in split_sentences("1.5 cm nodule.")] == ["1.5 cm nodule."]


def test_label_report_matches_extract_facts():
    # label_report skips attributes for speed; its labels must equal those of the full extraction.
    from orapo_core.facts import labels_from_facts

    text = "No pneumothorax, small left effusion. Likely atelectasis versus pneumonia. Heart size is top normal. Lungs otherwise clear."
    for schema in ("chexpert", "chestxray14"):
        assert label_report(text, schema) == labels_from_facts(extract_facts(text).facts, schema)
