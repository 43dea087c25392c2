"""The round's dataset: studies through `load_dataset` plus a CSV's corrections, oracle precedence, class-balanced selection."""

from __future__ import annotations

import json

import pytest

from orapo_core.errors import OrapoError
from orapo_core.train.dataset import build_training_dataset, load_training_records, oracle_for, select_studies
from tests.support.data import write_chexpert_csv


def test_oracle_is_the_correction_else_the_reference():
    assert oracle_for({"oracle_report": " fixed ", "reference_report": "ref"}) == "fixed"
    assert oracle_for({"oracle_report": "", "reference_report": "ref"}) == "ref"
    assert oracle_for({"oracle_report": None, "reference_report": None}) == ""


def test_csv_rows_become_training_rows(tmp_path):
    path = write_chexpert_csv(
        tmp_path,
        [
            {"findings": "Small right effusion.", "impression": "Effusion.", "positive": ["Pleural Effusion"]},
            {"findings": "Clear lungs.", "impression": "Normal.", "positive": ["No Finding"], "oracle": "Corrected."},
        ],
    )
    records = load_training_records(path)
    assert [r.study_id for r in records] == ["train/patient00000/study1", "train/patient00001/study1"]
    assert records[0].labels["Pleural Effusion"] == 1 and records[0].labels["Edema"] is None
    assert records[1].extra["oracle_report"] == "Corrected." and "oracle_report" not in records[0].extra
    ds = build_training_dataset(records, prompt_text="Describe.")
    assert set(ds.column_names) >= {"prompt", "image", "study_id", "labels", "oracle_report", "reference_report"}
    assert "clinician_chosen" not in ds.column_names
    row = ds[0]
    assert row["prompt"] == [{"role": "user", "content": "Describe."}]
    assert row["image"].size == (56, 56)  # decoded lazily to PIL, as TRL expects
    assert row["oracle_report"] == "FINDINGS: Small right effusion.\n\nIMPRESSION: Effusion."
    assert ds[1]["oracle_report"] == "Corrected."
    assert json.loads(row["labels"])["Pleural Effusion"] == 1


def test_bad_inputs_are_refused_with_a_code(tmp_path):
    with pytest.raises(OrapoError) as info:
        load_training_records(tmp_path / "missing.csv")
    assert info.value.code == "data_missing"
    bad = tmp_path / "bad.csv"
    bad.write_text("path_to_image,report\nx.png,text\n")
    with pytest.raises(OrapoError, match="section_findings"):
        load_training_records(bad)
    with pytest.raises(OrapoError) as info:
        build_training_dataset([])
    assert info.value.code == "no_studies"


def test_class_balanced_selection_covers_the_rare_observation():
    records = [{"study_id": f"e{i}", "labels": {"Pleural Effusion": 1}} for i in range(20)]
    records += [{"study_id": "fx", "labels": {"Fracture": 1}}]
    chosen = select_studies(records, max_studies=3, class_balanced=True, seed=1)
    assert len(chosen) == 3 and "fx" in {r["study_id"] for r in chosen}
    plain = select_studies(records, max_studies=3, class_balanced=False, seed=1)
    assert len(plain) == 3
    assert len(select_studies(records, max_studies=None, class_balanced=True)) == 21


def test_phantom_folder_reads_through_load_dataset_with_split_and_image_root(tmp_path):
    from orapo_core.data import write_dataset

    write_dataset(tmp_path / "phantom", 12, seed=3, size=64)
    records = load_training_records(tmp_path / "phantom")
    assert len(records) == 12 and all(r.source == "phantom" and r.image_paths[0].is_file() for r in records)
    train = load_training_records(tmp_path / "phantom", split="train")
    assert 0 < len(train) < 12 and {r.split for r in train} == {"train"}
    alone = tmp_path / "csv-only"
    alone.mkdir()
    (alone / "phantom_cxr.csv").write_bytes((tmp_path / "phantom" / "phantom_cxr.csv").read_bytes())
    rerooted = load_training_records(alone / "phantom_cxr.csv", image_root=tmp_path / "phantom")
    assert [r.study_id for r in rerooted] == [r.study_id for r in records]
    assert all(p.is_file() and p.is_relative_to(tmp_path / "phantom") for r in rerooted for p in r.image_paths)
    ds = build_training_dataset(select_studies(records, max_studies=5, class_balanced=True, seed=0))
    assert len(ds) == 5 and ds[0]["reference_report"].startswith("FINDINGS:")
