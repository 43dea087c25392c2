"""Contrast pairs: replayed studies without a finding the corrections added, their report over it with the finding."""

from __future__ import annotations

import csv

from app.services.dashboard import stated_findings
from app.services.rounds.data import PhantomReplayStudy, RoundSelection, RoundStudy, contrast_rejections, write_training_csv

DRAFT = "FINDINGS: Heart size is normal. No focal consolidation.\n\nIMPRESSION: No acute cardiopulmonary process."
WITH_PTX = ("FINDINGS: Heart size is normal. There is a moderate right pneumothorax with a visible pleural line. "
            "No focal consolidation.\n\nIMPRESSION: Moderate right pneumothorax.")
WITH_EDEMA = "FINDINGS: Heart size is normal. Moderate pulmonary edema.\n\nIMPRESSION: Pulmonary edema."
NEGATIVE = "FINDINGS: Linear atelectasis at the left base. Heart size is normal.\n\nIMPRESSION: Left basilar atelectasis."
POSITIVE = "FINDINGS: There is a large left pneumothorax.\n\nIMPRESSION: Large left pneumothorax."


def selection() -> RoundSelection:
    new = [RoundStudy(study_id=i, correction_id=i, image_path=f"/x/{i}.png", corrected_report=WITH_PTX, draft_text=DRAFT)
           for i in range(3)]
    new.append(RoundStudy(study_id=3, correction_id=3, image_path="/x/3.png", corrected_report=WITH_EDEMA,
                          draft_text=DRAFT))
    new.append(RoundStudy(study_id=4, correction_id=4, image_path="/x/4.png", corrected_report=WITH_PTX,
                          draft_text=None))  # accepted unchanged: no correction added anything
    replay = [RoundStudy(study_id=10, correction_id=10, image_path="/x/10.png", corrected_report=NEGATIVE,
                         draft_text="FINDINGS: Heart size is normal.", replay=True)]  # has its own pair
    phantom = [PhantomReplayStudy(f"phantom-replay-{i}", f"/p/{i}.png", NEGATIVE) for i in range(6)]
    phantom.append(PhantomReplayStudy("phantom-replay-ptx", "/p/ptx.png", POSITIVE))
    return RoundSelection(new=new, replay=replay, phantom_replay=phantom)


def test_each_added_finding_gets_as_many_contrasts_as_corrections_added_it_on_rows_without_it():
    rejected = contrast_rejections(selection(), seed=3)
    with_ptx = [k for k, text in rejected.items() if "Pneumothorax" in stated_findings(text)]
    with_edema = [k for k, text in rejected.items() if "Edema" in stated_findings(text)]
    assert len(with_ptx) == 3 and len(with_edema) == 1 and len(rejected) == 4  # one contrast per row
    assert "phantom-replay-ptx" not in rejected  # it states the finding: its report is no contrast
    assert "study-10" not in rejected  # it has its own clinician pair
    for key in with_ptx:
        text = rejected[key]
        assert text.startswith("FINDINGS: Linear atelectasis at the left base. Heart size is normal. There is a "
                               "moderate right pneumothorax with a visible pleural line.")
        assert text.endswith("IMPRESSION: Left basilar atelectasis. Moderate right pneumothorax.")
    assert contrast_rejections(selection(), seed=3) == rejected  # seeded


def test_the_training_csv_carries_the_contrast_pairs_it_is_given(tmp_path):
    def rows(**kwargs):
        path = write_training_csv(selection(), tmp_path / f"{len(kwargs)}.csv", **kwargs)
        with path.open(newline="", encoding="utf-8") as handle:
            return {r["id"]: r for r in csv.DictReader(handle)}

    plain, contrasted = rows(), rows(contrasts=contrast_rejections(selection(), seed=3))
    assert all(not plain[f"phantom-replay-{i}"]["clinician_rejected"] for i in range(6))
    paired = [k for k, r in contrasted.items() if k.startswith("phantom-replay-") and r["clinician_rejected"]]
    assert len(paired) == 4
    for key in paired:
        row = contrasted[key]
        assert row["clinician_chosen"] == row["oracle_report"] == NEGATIVE  # chosen: the study's own report
        assert row["clinician_rejected"] == contrast_rejections(selection(), seed=3)[key]
        assert row["Pneumothorax"] in ("", "0", "0.0")  # labels stay the study's own
    assert contrasted["study-0"]["clinician_rejected"] == DRAFT  # the corrections keep their own pairs
