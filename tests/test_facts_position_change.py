"""A device's tip position and a finding's temporal change as FactS attributes: extraction, the critical flag of
a malposition, and the hold-out pairs in tests/data/facts_position_change_pairs.jsonl in both directions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orapo_core.facts import extract_facts, label_report, score_report
from orapo_core.facts.devices import positions_agree

PAIRS = [
    json.loads(line)
    for line in (Path(__file__).parent / "data" / "facts_position_change_pairs.jsonl").read_text().splitlines()
]


def judged(draft: str, reference: str):
    return [(j.verdict, j.reason) for s in score_report(draft, reference_text=reference).sentences for j in s.facts]


def device(text: str):
    return next(f for f in extract_facts(text).facts if f.observation == "Support Devices")


def test_the_issue_examples():
    assert judged(
        "Endotracheal tube tip 4 cm above the carina.", "Endotracheal tube tip in the right mainstem bronchus."
    ) == [("contradicted", "position: trachea in the draft, right mainstem bronchus in the report")]
    assert judged("Left effusion, increased since the prior.", "Left effusion, decreased since the prior.") == [
        ("contradicted", "change: increased in the draft, decreased in the report")
    ]
    assert judged("ETT tip 4 cm above the carina.", "Endotracheal tube terminates in the mid trachea.") == [
        ("entailed", None)
    ]


@pytest.mark.parametrize(
    "text, position, critical",
    [
        ("Endotracheal tube tip 4 cm above the carina.", "trachea", False),
        ("Endotracheal tube terminates in the mid trachea.", "trachea", False),
        ("Endotracheal tube tip in the right mainstem bronchus.", "right mainstem bronchus", True),
        ("ETT tip 2 cm below the carina in the left mainstem bronchus.", "left mainstem bronchus", True),
        ("The endotracheal tube is in the esophagus.", "esophagus", True),
        ("ETT in satisfactory position.", "satisfactory", False),
        ("Nasogastric tube coiled in the esophagus.", "esophagus", True),
        ("Feeding tube tip in the right lower lobe bronchus.", "right mainstem bronchus", True),
        ("NG tube courses through the esophagus into the stomach.", "stomach", False),  # the esophagus is its path
        ("Enteric tube courses below the diaphragm with the tip in the stomach.", "stomach", False),
        ("Right IJ central line with tip in the mid SVC.", "superior vena cava", False),
        ("Left PICC ends at the cavoatrial junction.", "cavoatrial junction", False),
        ("Right IJ central line with tip in the right atrium.", "right atrium", True),
        ("Right subclavian catheter is directed into the right internal jugular vein.", "internal jugular vein", True),
        (
            "Right IJ dialysis catheter with tip in the right atrium.",
            "right atrium",
            False,
        ),  # where a dialysis line belongs
        # a recommendation says where it should be, not where it is
        (
            "ETT tip in the right mainstem bronchus, should be withdrawn to 4 cm above the carina.",
            "right mainstem bronchus",
            True,
        ),
        ("The endotracheal tube should be retracted 2 cm.", "malpositioned", True),
        ("The ETT has been advanced and now lies 4 cm above the carina.", "trachea", False),
    ],
)
def test_tip_position_and_critical_flag(text, position, critical):
    fact = device(text)
    assert (fact.attributes.get("position"), fact.critical) == (position, critical)


def test_no_position_no_flag_and_other_findings_are_never_critical():
    assert "position" not in device("Endotracheal tube in place.").attributes
    assert not device("Endotracheal tube in place.").critical
    assert (
        "position" not in device("Left chest wall pacemaker with leads in the right atrium.").attributes
    )  # a lead, not a tip
    assert not any(f.critical for f in extract_facts("Large right pneumothorax. Small left effusion.").facts)
    # a denied device is no malposition
    assert not device("No endotracheal tube in the right mainstem bronchus.").critical


def test_a_midline_device_has_no_side_its_position_has_it():
    assert device("Endotracheal tube tip in the right mainstem bronchus.").attributes == {
        "device": "endotracheal tube",
        "position": "right mainstem bronchus",
    }
    assert device("Right IJ central line.").attributes["laterality"] == "right"  # a line keeps its side


def test_positions_agree_only_within_one_placement():
    assert positions_agree("endotracheal tube", "trachea", "satisfactory")
    assert not positions_agree("endotracheal tube", "trachea", "carina")  # the carina is too low for a tube
    assert positions_agree("enteric tube", "trachea", "airway")  # both wrong for an enteric tube
    assert not positions_agree("central line", "cavoatrial junction", "right atrium")
    assert positions_agree("central line", "superior vena cava", "cavoatrial junction")


@pytest.mark.parametrize(
    "text, change",
    [
        ("New small left pleural effusion.", "new"),
        ("Interval development of right basilar opacity.", "new"),
        ("Left pleural effusion has increased since the prior.", "increased"),
        ("Worsening pulmonary edema.", "increased"),
        ("Left pleural effusion, decreased since the prior.", "decreased"),
        ("Partially resolved right lower lobe pneumonia.", "decreased"),
        ("Stable mild cardiomegaly.", "unchanged"),
        ("No significant change in the small left pleural effusion.", "unchanged"),
        ("Right basilar opacity is unchanged.", "unchanged"),
        ("Persistent right pleural effusion.", "persistent"),
        ("The left pleural effusion has resolved.", "resolved"),
    ],
)
def test_temporal_change(text, change):
    assert extract_facts(text).facts[0].attributes.get("change") == change


def test_no_temporal_words_no_change_and_no_change_is_not_new():
    for text in (
        "Small left pleural effusion.",
        "Increased interstitial markings.",
        "No new effusion.",
        "Effusions, right larger than left.",
    ):
        assert "change" not in extract_facts(text).facts[0].attributes, text
    # the change of one finding does not cross to the next
    facts = {
        f.observation: f.attributes for f in extract_facts("Increased right effusion with stable atelectasis.").facts
    }
    assert facts["Pleural Effusion"]["change"] == "increased" and facts["Atelectasis"]["change"] == "unchanged"
    assert "change" not in extract_facts("Left effusion, increased opacity.").facts[0].attributes


def test_a_resolved_finding_is_judged_by_polarity():
    assert judged("The left pleural effusion has resolved.", "Left pleural effusion has decreased.") == [
        ("contradicted", None)
    ]
    assert judged("Left pleural effusion has decreased.", "The left pleural effusion has resolved.") == [
        ("contradicted", None)
    ]


def test_the_hold_out_pairs_cover_position_change_and_matches():
    kinds = {k for p in PAIRS for k in p["kind"].split("+")}
    assert len(PAIRS) >= 40 and {"position", "change", "match"} <= kinds
    assert sum(p["verdict"] == "entailed" for p in PAIRS) >= 15
    assert (
        sum("position" in p["attributes"] for p in PAIRS) >= 10
        and sum("change" in p["attributes"] for p in PAIRS) >= 10
    )


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
