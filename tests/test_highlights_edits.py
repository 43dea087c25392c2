"""The Read tab's highlight panel after an edit and before it: a sentence the reader deleted is shown as removed,
never as ✓ entailed (issue 41 §7), and a sentence the finding check added is marked as added, never with a
confidence colour (issue 40)."""

from __future__ import annotations

from datetime import datetime


def _labels(highlights):
    return {text: label for text, label in highlights.spans if label}


def test_a_deleted_sentence_is_removed_not_entailed():
    from app.services.reading.highlights import VERDICT_LABELS, facts_highlights

    draft = "Small left pleural effusion. No pneumothorax. Heart size is normal."
    edited = "Small left pleural effusion. Heart size is normal."  # the reader deleted the pneumothorax sentence
    labels = _labels(facts_highlights(draft, edited))
    assert labels["No pneumothorax."] == VERDICT_LABELS["removed"]
    assert labels["Small left pleural effusion."] == VERDICT_LABELS["entailed"]
    legend = [label for label, _, _ in facts_highlights(draft, edited).legend()]
    assert VERDICT_LABELS["removed"] in legend


def test_a_sentence_the_finding_check_added_is_marked_as_added():
    from app.services.reading.highlights import ADDED_LABEL, confidence_highlights
    from db.records import DraftRecord

    added = "Pleural thickening along the right lateral chest wall."
    draft = DraftRecord(
        id=1,
        study_id=1,
        model_version_id=None,
        model_name="starter",
        prompt="p",
        sampling={},
        text=f"Heart size is normal. {added}",
        latency_ms=5,
        created_by=None,
        created_at=datetime(2026, 1, 1),
        facts={"added": [added]},
        sentence_scores=[{"text": "Heart size is normal.", "confidence": 0.5}, {"text": added, "confidence": 1.0}],
    )
    highlights = confidence_highlights(draft)
    labels = _labels(highlights)
    assert labels[added] == ADDED_LABEL and labels["Heart size is normal."] == "confidence 0.50"
    assert ADDED_LABEL in [label for label, _, _ in highlights.legend()]


def test_a_malpositioned_tube_is_critical_in_the_facts_table():
    from app.services.reading.highlights import sentence_facts

    rows = sentence_facts("Endotracheal tube tip in the right mainstem bronchus.", 0)
    assert rows and rows[0][3].startswith("CRITICAL")
    assert not sentence_facts("Endotracheal tube tip 4 cm above the carina.", 0)[0][3].startswith("CRITICAL")
