"""How `orapo label` writes hedged findings in each schema, and the labeler rules the Open-i development split
asked for (docs: FactS, "Uncertain mentions in the CSV")."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from orapo_core.facts import extract_facts, label_report

ROOT = Path(__file__).resolve().parents[1]

HEDGES = [
    # (report, CheXpert label, ChestX-ray14 label): probable and "A versus B" are coded in ChestX-ray14, possible is not
    ("Opacity, likely atelectasis.", ("Atelectasis", -1), ("Atelectasis", 1)),
    ("Probable small left effusion.", ("Pleural Effusion", -1), ("Effusion", 1)),
    ("Basilar opacity, atelectasis versus pneumonia.", ("Pneumonia", -1), ("Pneumonia", 1)),
    ("This may represent early pneumonia.", ("Pneumonia", -1), ("Pneumonia", -1)),
    ("Pneumothorax cannot be excluded.", ("Pneumothorax", -1), ("Pneumothorax", -1)),
    ("Small left effusion.", ("Pleural Effusion", 1), ("Effusion", 1)),
    ("No pneumothorax.", ("Pneumothorax", 0), ("Pneumothorax", 0)),
]


@pytest.mark.parametrize("text, chexpert, chestxray14", HEDGES)
def test_each_schema_writes_hedges_as_its_own_labels_do(text, chexpert, chestxray14):
    assert label_report(text, "chexpert")[chexpert[0]] == chexpert[1]
    assert label_report(text, "chestxray14")[chestxray14[0]] == chestxray14[1]


def test_a_positive_mention_still_beats_a_possible_one():
    labels = label_report("Possible right pneumonia. Left lower lobe pneumonia.", "chestxray14")
    assert labels["Pneumonia"] == 1
    assert label_report("Possible pneumonia. No pneumonia on the left.", "chestxray14")["Pneumonia"] == -1


def test_the_csv_of_orapo_label_in_both_schemas(tmp_path):
    src = tmp_path / "reports.csv"
    with open(src, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "report"])
        w.writerow(["r1", "FINDINGS: Opacity, likely atelectasis. This may represent early pneumonia. No effusion."])
    values = {}
    for schema in ("chexpert", "chestxray14"):
        dst = tmp_path / f"{schema}.csv"
        proc = subprocess.run(
            [sys.executable, "-m", "app.cli", "label", str(src), "-o", str(dst), "--schema", schema],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        values[schema] = next(csv.DictReader(open(dst, newline="")))
    assert (
        values["chexpert"]["Atelectasis"],
        values["chexpert"]["Pneumonia"],
        values["chexpert"]["Pleural Effusion"],
    ) == ("-1", "-1", "0")
    assert (
        values["chestxray14"]["Atelectasis"],
        values["chestxray14"]["Pneumonia"],
        values["chestxray14"]["Effusion"],
    ) == ("1", "-1", "0")


@pytest.mark.parametrize(
    "text, observation, polarity",
    [
        ("Partial collapse of the left upper and lower lobes.", "Atelectasis", "positive"),
        ("Large pneumothorax with collapse of a substantial portion of the left lung.", "Atelectasis", "positive"),
        ("Recommend CT to rule-out an underlying pulmonary nodule.", "Nodule", "uncertain"),
        ("Partially resolved right lower lobe pneumonia.", "Pneumonia", "positive"),
        ("The left effusion has not completely resolved.", "Pleural Effusion", "positive"),
        ("The left effusion has resolved.", "Pleural Effusion", "negative"),
    ],
)
def test_rules_from_the_development_split(text, observation, polarity):
    assert [f.polarity for f in extract_facts(text).facts if f.observation == observation] == [polarity]
