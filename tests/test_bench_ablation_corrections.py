"""The ablation's corrected pool (`benchmarks.ablation.corrected_pool`): the pool as the app's readers leave it.

Each study the starting model drafts wrongly gets the clinician pair a round trains on (the reference report over
the draft); a study it drafts right gets none; the round's loader reads the pairs back from the CSV.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest


class ScriptedDrafter:
    """Drafts in order from a list of texts, the way `evaluate_drafter` calls a `Drafter`."""

    def __init__(self, texts: list[str], model_dir: Path):
        import torch

        self.texts, self.calls = list(texts), 0
        self.loaded = SimpleNamespace(model=torch.nn.Linear(1, 1), model_dir=model_dir)

    def draft_many(self, pictures, *, samples=0, max_new_tokens=128):
        self.calls += 1
        out, self.texts = self.texts[: len(pictures)], self.texts[len(pictures) :]
        return [SimpleNamespace(text=t, samples=[]) for t in out]


@pytest.fixture()
def pool(tmp_path):
    from benchmarks.ablation import phantom_split

    return phantom_split(tmp_path / "pool", 6, seed=3, size=64, prevalence={"pneumothorax": 1.0})


def test_wrong_drafts_become_the_pairs_a_round_trains_on_and_right_ones_do_not(pool, tmp_path):
    from benchmarks.ablation import corrected_pool
    from orapo_core.train.dataset import build_training_dataset, load_training_records

    csv_path, records = pool
    assert all(r.labels["Pneumothorax"] == 1 for r in records)
    wrong = "FINDINGS: The heart is normal in size. No pneumothorax.\n\nIMPRESSION: No acute process."
    texts = [records[0].report] + [wrong] * (len(records) - 1)  # the first draft is exactly the reference
    drafter = ScriptedDrafter(texts, tmp_path / "model")
    out, summary = corrected_pool(csv_path, records, drafter, threshold=0.99, batch=4)
    assert (
        summary["corrected"] == len(records) - 1 and summary["rare_findings_added"]["Pneumothorax"] == len(records) - 1
    )
    assert out.parent == csv_path.parent  # beside the pool's CSV: its relative image paths still resolve

    read = {r.study_id: r for r in load_training_records(out, kind="phantom")}
    assert set(read) == {r.study_id for r in records}
    first = read[records[0].study_id]
    assert "clinician_chosen" not in first.extra and "clinician_rejected" not in first.extra
    for record in records[1:]:
        extra = read[record.study_id].extra
        assert extra["clinician_chosen"] == record.report and extra["clinician_rejected"] == wrong
    dataset = build_training_dataset(list(read.values()))
    assert sum(bool(x) for x in dataset["clinician_rejected"]) == len(records) - 1
    # The pool's own CSV is untouched and still the one the other methods train on.
    assert "clinician_chosen" not in csv_path.read_text()


def test_the_corrections_are_drafted_once_per_starting_model(pool, tmp_path):
    from benchmarks.ablation import corrected_pool

    csv_path, records = pool
    wrong = "FINDINGS: No pneumothorax."
    first = ScriptedDrafter([wrong] * len(records), tmp_path / "model")
    out, summary = corrected_pool(csv_path, records, first, threshold=0.99, batch=8)
    again = ScriptedDrafter([], tmp_path / "model")
    assert corrected_pool(csv_path, records, again, threshold=0.99, batch=8) == (out, summary) and again.calls == 0
    other = ScriptedDrafter([r.report for r in records], tmp_path / "other-model")
    _, redrafted = corrected_pool(csv_path, records, other, threshold=0.99, batch=8)
    assert other.calls == 1 and redrafted["corrected"] == 0
    assert json.loads(out.with_suffix(".json").read_text())["wanted"]["model"].endswith("other-model")
