"""Which sentences the round's focused oracle NLL leaves out: those of findings the served model cannot see.

Issue 40: a round's corrections added atelectasis (probe AUC 0.70 from the starter's answer state) to 21-26
drafts, and the round learned to write it where it could not see it (false positives 0.7 % -> 4.4 %, which the
gate rejected). `oracle_nll_min_auc` reads each added finding from the served model's state on the round's own
films first and leaves the unreadable ones' sentences out of the NLL.
"""

from __future__ import annotations

import numpy as np
import pytest

from orapo_core.facts import label_report


def test_without_sentences_stating_takes_out_only_the_sentences_that_state_or_hedge_the_finding():
    from orapo_core.train.dataset import without_sentences_stating

    report = (
        "FINDINGS: Small left pneumothorax. Bibasilar atelectasis. No atelectasis on the right? "
        "Possible atelectasis at the left base.\nIMPRESSION: Pneumothorax. Atelectasis."
    )
    out = without_sentences_stating(report, ["Atelectasis"])
    assert label_report(out).get("Atelectasis") not in (1, -1)
    assert label_report(out).get("Pneumothorax") == 1
    assert "Small left pneumothorax." in out and "No atelectasis on the right?" in out  # a negation stays
    assert "Bibasilar" not in out and "Possible" not in out
    assert without_sentences_stating(report, []) == report


def test_kept_tokens_are_those_the_shortened_answer_still_has():
    from orapo_core.train.losses import kept_tokens

    assert kept_tokens([1, 2, 3, 9, 9, 4, 5], [1, 2, 3, 4, 5]) == [1, 1, 1, 0, 0, 1, 1]
    assert kept_tokens([1, 2, 3], [1, 2, 3]) == [1.0, 1.0, 1.0]
    assert kept_tokens([1, 2, 3], []) == [0.0, 0.0, 0.0]


class _Rows:
    """What `unreadable_findings` reads of a round's `datasets.Dataset`: its report columns and its length."""

    def __init__(self, columns: dict[str, list]):
        self.columns = columns
        self.column_names = list(columns)

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def __getitem__(self, name: str) -> list:
        return self.columns[name]


def test_unreadable_findings_are_the_added_ones_the_state_does_not_carry(monkeypatch):
    from orapo_core.models import verifier

    rng = np.random.default_rng(0)
    n = 120
    pneumothorax = rng.random(n) < 0.4
    atelectasis = rng.random(n) < 0.4
    lesion = np.arange(n) < 4  # too few films to tell
    chosen, rejected = [], []
    for p, a, le in zip(pneumothorax, atelectasis, lesion, strict=True):
        sentences = ["FINDINGS: No pleural effusion."]
        sentences += ["Small left pneumothorax."] if p else []
        sentences += ["Bibasilar atelectasis."] if a else []
        sentences += ["Nodule in the right upper lobe."] if le else []
        chosen.append(" ".join(sentences))
        rejected.append("FINDINGS: No pleural effusion.")
    dataset = _Rows(
        {
            "oracle_report": chosen,
            "reference_report": chosen,
            "clinician_chosen": chosen,
            "clinician_rejected": rejected,
        }
    )
    # The state carries pneumothorax (one coordinate) and nothing of atelectasis.
    states = np.c_[pneumothorax + 0.3 * rng.standard_normal(n), rng.standard_normal((n, 7))]
    monkeypatch.setattr(verifier, "_dataset_states", lambda model, processor, ds, prompt: states)
    out = verifier.unreadable_findings(None, None, dataset, min_auc=0.85)
    assert set(out) == {"Atelectasis", "Lung Lesion"}
    assert out["Atelectasis"] < 0.75 and out["Lung Lesion"] is None
    assert verifier.unreadable_findings(None, None, dataset, min_auc=0.85, min_added=200) == {}


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--oracle_nll_min_auc", "1.5", "oracle_nll_min_auc must lie in [0, 1)"),
        ("--oracle_nll_skip_findings", "Atelect", "must name CheXpert observations"),
    ],
)
def test_the_recipe_refuses_a_bad_readability_setting(tmp_path, capsys, option, value, said):
    from pathlib import Path

    from app.cli import main

    smoke = str(Path(__file__).parent.parent / "orapo_core" / "train" / "recipes" / "smoke-cpu.yaml")
    assert main(["train", "--dry-run", "--config", smoke, "--output_dir", str(tmp_path), option, value]) == 2
    err = capsys.readouterr().err
    assert "recipe_invalid" in err and said in err


def _round_rows():
    """A round's training rows, as `build_training_dataset` makes them: three corrected studies and a replayed one."""
    from PIL import Image

    from orapo_core.train.dataset import build_training_dataset

    film = Image.new("L", (32, 32), color=40)
    rows = [
        # The correction added atelectasis (unreadable) and pleural other (readable) to the draft.
        (
            "FINDINGS: Pleural thickening along the right lateral chest wall. Bibasilar atelectasis.",
            "FINDINGS: No pleural effusion.",
        ),
        # The correction only added atelectasis: its pair then says nothing the draft did not. Its negation of
        # pneumonia (also unreadable here) stays, with its label.
        ("FINDINGS: No pneumonia. Bibasilar atelectasis.", "FINDINGS: No pneumonia."),
        # The draft stated atelectasis and the reader removed it: a removal still applies.
        ("FINDINGS: Small right pneumothorax.", "FINDINGS: Small right pneumothorax. Bibasilar atelectasis."),
    ]
    records = [
        {
            "study_id": f"s{i}",
            "image": film,
            "reference_report": oracle,
            "oracle_report": oracle,
            "clinician_chosen": oracle,
            "clinician_rejected": draft,
            "labels": label_report(oracle),
        }
        for i, (oracle, draft) in enumerate(rows)
    ]
    replay = "FINDINGS: Left basilar atelectasis."
    records.append({"study_id": "r", "image": film, "reference_report": replay, "labels": label_report(replay)})
    return build_training_dataset(records)


def test_a_report_scope_round_leaves_the_corrections_adding_an_unreadable_finding_unapplied():
    import json

    from orapo_core.train.dataset import without_unread_additions

    before = _round_rows()
    after, changed = without_unread_additions(before, ["Atelectasis", "Pneumonia"])
    assert changed == 2 and len(after) == len(before)
    by_id = {row["study_id"]: row for row in after}
    first = by_id["s0"]
    for text in (first["oracle_report"], first["clinician_chosen"]):
        assert label_report(text).get("Atelectasis") not in (1, -1)
        assert label_report(text).get("Pleural Other") == 1  # the readable correction still applies
    assert "Atelectasis" not in json.loads(first["labels"]) and json.loads(first["labels"])["Pleural Other"] == 1
    # Only atelectasis was corrected: the chosen answer is the draft again, so the pair miner drops the pair.
    assert by_id["s1"]["clinician_chosen"] == by_id["s1"]["clinician_rejected"]
    assert label_report(by_id["s1"]["oracle_report"]).get("Atelectasis") not in (1, -1)
    kept = json.loads(by_id["s1"]["labels"])
    assert kept["Pneumonia"] == 0 and "Atelectasis" not in kept
    # A removal and a replayed study are as they were.
    for key in ("s2", "r"):
        old = next(row for row in before if row["study_id"] == key)
        assert {k: by_id[key][k] for k in ("oracle_report", "labels")} == {
            k: old[k] for k in ("oracle_report", "labels")
        }
    assert without_unread_additions(before, []) == (before, 0)


def test_the_recipe_refuses_an_unknown_unread_scope(tmp_path, capsys):
    from pathlib import Path

    from app.cli import main

    smoke = str(Path(__file__).parent.parent / "orapo_core" / "train" / "recipes" / "smoke-cpu.yaml")
    args = ["train", "--dry-run", "--config", smoke, "--output_dir", str(tmp_path), "--oracle_unread_scope", "pairs"]
    assert main(args) == 2
    assert "oracle_unread_scope must be 'nll' or 'report'" in capsys.readouterr().err


def test_the_round_says_which_corrections_it_did_not_teach(tmp_path):
    import json

    from app.services.rounds.job_steps import unapplied_line

    assert unapplied_line(tmp_path) is None  # no resolved recipe yet
    recipe = tmp_path / "orapo_recipe.json"
    recipe.write_text(json.dumps({"training": {}}))
    assert unapplied_line(tmp_path) is None  # a round that left nothing out
    recipe.write_text(
        json.dumps(
            {
                "training": {},
                "unapplied_corrections": {
                    "studies": 23,
                    "min_auc": 0.85,
                    "findings": {"Atelectasis": 0.7712, "Fracture": None},
                },
            }
        )
    )
    line = unapplied_line(tmp_path)
    assert line is not None and "Atelectasis (AUC 0.77)" in line and "Fracture (too few films to tell)" in line
    assert "23 studies" in line and "0.85" in line
    recipe.write_text("{not json")
    assert unapplied_line(tmp_path) is None
