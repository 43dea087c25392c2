"""PhantomCXR reports: the labels say exactly what the sentences say."""

from __future__ import annotations

import re

import numpy as np
import pytest

from orapo_core.data.phantom import DEFAULT_PREVALENCE, FINDING_KINDS, Finding, sample_findings
from orapo_core.data.phantom_reports import merge_labels, write_report
from orapo_core.data.records import CHEXPERT_14

# Words that name each observation in the reports; a label may be set only if one of them is in the text.
WORDS = {
    "Enlarged Cardiomediastinum": r"mediastin",
    "Cardiomegaly": r"cardiomegaly|heart",
    "Lung Opacity": r"opacit|haziness|lungs are clear",
    "Lung Lesion": r"nodule|mass",
    "Edema": r"edema",
    "Consolidation": r"consolidation",
    "Pneumonia": r"pneumonia",
    "Atelectasis": r"atelectasis",
    "Pneumothorax": r"pneumothorax",
    "Pleural Effusion": r"effusion",
    "Pleural Other": r"pleural thickening|pleural plaques",
    "Fracture": r"fracture",
    "Support Devices": r"tube|catheter|line|picc|pacemaker",
}
HEDGES = r"possibl|may represent|cannot (?:be )?exclude"


def _reports(n: int, prevalence=DEFAULT_PREVALENCE):
    for i in range(n):
        rng = np.random.default_rng([21, i])
        findings = sample_findings(rng, prevalence)
        text, impression, labels = write_report(findings, rng, "PA")
        yield findings, text, impression, labels


def test_every_label_is_backed_by_the_text_and_every_finding_is_labelled():
    for findings, text, impression, labels in _reports(400):
        report = f"{text} {impression}".lower()
        assert set(labels) == set(CHEXPERT_14)
        for obs, value in labels.items():
            if obs != "No Finding" and value is not None:
                assert re.search(WORDS[obs], report), (obs, value, report)
            if obs in ("Pneumothorax", "Pleural Effusion", "Edema", "Fracture", "Lung Lesion") and value is None:
                assert not re.search(WORDS[obs], report), (obs, report)
        for f in findings:
            obs = FINDING_KINDS[f.kind]
            expected = 1 if f.certain else -1
            if f.kind == "pneumonia":  # seen as an opacity, named pneumonia in the impression
                assert labels["Lung Opacity"] == 1 and labels["Pneumonia"] == expected
            else:
                assert labels[obs] == expected, (f, labels, report)
            if not f.certain:
                assert re.search(HEDGES, report), report


def test_effusion_studies_say_effusion_and_are_labelled_positive():
    prevalence = dict.fromkeys(FINDING_KINDS, 0.0) | {"pleural_effusion": 1.0}
    for findings, text, impression, labels in _reports(60, prevalence):
        (f,) = findings
        assert "effusion" in text.lower() and "effusion" in impression.lower()
        assert labels["Pleural Effusion"] == (1 if f.certain else -1)
        assert (f.side in text) or (f.side == "bilateral" and "bilateral" in text)
        assert labels["No Finding"] is None


def test_normals_have_no_finding_pertinent_negatives_and_a_normal_impression():
    prevalence = dict.fromkeys(FINDING_KINDS, 0.0)
    for _, text, impression, labels in _reports(30, prevalence):
        assert labels["No Finding"] == 1
        assert labels["Pleural Effusion"] == 0 and labels["Pneumothorax"] == 0 and labels["Cardiomegaly"] == 0
        assert re.search(r"no acute|normal chest", impression.lower())
        assert "No pleural effusion or pneumothorax." in text or "No pneumothorax or pleural effusion." in text
        assert all(v in (0, None) for k, v in labels.items() if k != "No Finding")


def test_support_devices_alone_keep_no_finding():
    prevalence = dict.fromkeys(FINDING_KINDS, 0.0) | {"support_devices": 1.0}
    for _, text, _impression, labels in _reports(20, prevalence):
        assert labels["Support Devices"] == 1 and labels["No Finding"] == 1
        assert re.search(WORDS["Support Devices"], text.lower())


def test_merge_follows_chexpert_precedence():
    labels = merge_labels([{"Edema": 0}, {"Edema": -1}, {"Cardiomegaly": 0}, {"Pneumothorax": -1}, {"Pneumothorax": 1}])
    assert labels["Edema"] == -1 and labels["Pneumothorax"] == 1 and labels["Cardiomegaly"] == 0
    assert labels["No Finding"] is None and labels["Fracture"] is None
    assert merge_labels([{"Support Devices": 1}, {"Cardiomegaly": 0}])["No Finding"] == 1


def test_phrasing_varies():
    seen = {
        text.split(".")[0] for _, text, _, _ in _reports(100, dict.fromkeys(FINDING_KINDS, 0.0) | {"pneumothorax": 1.0})
    }
    assert len(seen) >= 4


@pytest.mark.parametrize("finding", [Finding("pneumothorax", side="left", severity="small", certain=False)])
def test_uncertain_findings_are_hedged_and_minus_one(finding):
    text, impression, labels = write_report([finding], np.random.default_rng(0), "PA")
    assert labels["Pneumothorax"] == -1 and re.search(HEDGES, (text + impression).lower())
    assert labels["No Finding"] is None


# --- needs the FactS labeler (orapo_core.facts) ---------------------------------------------------


def test_facts_labeler_agrees_with_phantom_ground_truth():
    """FactS, reading the phantom reports, gives back the labels PhantomCXR wrote them with."""
    facts = pytest.importorskip("orapo_core.facts")
    from orapo_core.facts.ontology import CHEXPERT_14 as FACTS_SCHEMA

    assert tuple(FACTS_SCHEMA) == CHEXPERT_14
    n, exact, cells, agree = 300, 0, 0, 0
    for _, text, impression, labels in _reports(n):
        got = facts.label_report(f"{text}\n{impression}", schema="chexpert")
        same = [got.get(name) == labels[name] for name in CHEXPERT_14]
        exact += all(same)
        cells += len(same)
        agree += sum(same)
    assert agree / cells > 0.99 and exact / n > 0.95, (agree / cells, exact / n)


def test_a_finding_without_what_its_kind_needs_is_refused_rather_than_written_as_none():
    """The report writer and the renderer read a finding's side, place and size only where its kind has them
    (`sample_findings` sets them); a finding made without one is refused by name, never reported as "None"."""
    from orapo_core.data.phantom_render import render

    sideless = Finding("lung_opacity", location="upper", variant="patchy")
    with pytest.raises(ValueError, match="no side"):
        write_report([sideless], np.random.default_rng(0), "PA")
    with pytest.raises(ValueError, match="no side"):
        render([sideless], np.random.default_rng(0), 64)
    with pytest.raises(ValueError, match="no size"):
        write_report(
            [Finding("lung_lesion", side="left", location="upper", variant="nodule")], np.random.default_rng(0), "PA"
        )
