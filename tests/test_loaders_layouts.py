"""Dataset loaders on tiny folders built in each distributed layout (invented reports, tiny images)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from orapo_core.data import CHEXPERT_14, StudyRecord, detect_layout, load_dataset, write_dataset
from orapo_core.data.loaders import parse_sections
from orapo_core.errors import OrapoError


class FakeLabeler:
    """Stands in for FactS: positive effusion when the word is there, and counts its calls."""

    def __init__(self):
        self.texts: list[str] = []

    def __call__(self, text: str) -> dict:
        self.texts.append(text)
        return {"Pleural Effusion": 1 if "effusion" in text.lower() else 0, "Fracture": None}


def _image(path: Path, fmt: str = "PNG") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 8), 128, dtype=np.uint8)).save(path, fmt)


def _write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)


def _labels_row(**values) -> list[str]:
    return [values.get(name.replace(" ", "_"), "") for name in CHEXPERT_14]


# --- CheXpert Plus ------------------------------------------------------------------------------


def _chexpert_plus(root: Path, with_labels: bool = True) -> Path:
    header = [
        "path_to_image",
        "path_to_dcm",
        "frontal_lateral",
        "ap_pa",
        "deid_patient_id",
        "patient_report_date_order",
        "report",
        "section_findings",
        "section_impression",
        "split",
    ]
    rows = [
        [
            "train/patient00001/study1/view1_frontal.jpg",
            "train/patient00001/study1/view1_frontal.dcm",
            "Frontal",
            "PA",
            "patient00001",
            "1",
            "",
            "Invented text: small left effusion.",
            "Invented: left effusion.",
            "train",
        ],
        [
            "train/patient00001/study1/view2_lateral.jpg",
            "train/patient00001/study1/view2_lateral.dcm",
            "Lateral",
            "",
            "patient00001",
            "1",
            "",
            "Invented text: small left effusion.",
            "Invented: left effusion.",
            "train",
        ],
        [
            "valid/patient00002/study3/view1_frontal.jpg",
            "",
            "Frontal",
            "AP",
            "patient00002",
            "3",
            "",
            "Invented text: clear lungs.",
            "Invented: nothing acute.",
            "valid",
        ],
    ]
    _write_csv(root / "df_chexpert_plus_240401.csv", header, rows)
    for rel in (
        "train/patient00001/study1/view1_frontal.png",
        "train/patient00001/study1/view2_lateral.png",
        "valid/patient00002/study3/view1_frontal.png",
    ):
        _image(root / "PNG" / rel)
    if with_labels:
        (root / "chexbert_labels").mkdir()
        line = {"path_to_image": "train/patient00001/study1/view1_frontal.jpg", **{name: None for name in CHEXPERT_14}}
        line.update({"Pleural Effusion": 1.0, "Cardiomegaly": 0.0, "Edema": -1.0})
        (root / "chexbert_labels" / "impression_fixed.json").write_text(json.dumps(line) + "\n")
    return root


def test_chexpert_plus_groups_images_by_study_and_reads_shipped_labels(tmp_path: Path):
    root = _chexpert_plus(tmp_path / "chexpert_plus")
    labeler = FakeLabeler()
    assert detect_layout(root) == "chexpert_plus"
    records = load_dataset(root, labeler=labeler)
    assert [r.study_id for r in records] == ["train/patient00001/study1", "valid/patient00002/study3"]
    first, second = records
    assert isinstance(first, StudyRecord) and first.source == "chexpert_plus"
    assert [p.name for p in first.image_paths] == ["view1_frontal.png", "view2_lateral.png"]
    assert all(p.is_file() for p in first.image_paths)
    assert first.view == "PA" and first.split == "train" and first.patient_id == "patient00001"
    assert first.findings == "Invented text: small left effusion." and first.impression == "Invented: left effusion."
    assert first.labels["Pleural Effusion"] == 1 and first.labels["Cardiomegaly"] == 0 and first.labels["Edema"] == -1
    assert first.labels["Fracture"] is None and set(first.labels) == set(CHEXPERT_14)
    # The second study has no shipped labels: only it goes to the labeler.
    assert len(labeler.texts) == 1 and "clear lungs" in labeler.texts[0]
    assert second.labels["Pleural Effusion"] == 0 and second.split == "valid" and second.view == "AP"


def test_chexpert_plus_without_label_files_labels_every_report(tmp_path: Path):
    root = _chexpert_plus(tmp_path / "plus", with_labels=False)
    labeler = FakeLabeler()
    records = load_dataset(root, kind="chexpert_plus", labeler=labeler)
    assert len(labeler.texts) == 2
    assert records[0].labels["Pleural Effusion"] == 1 and records[1].labels["Pleural Effusion"] == 0


# --- MIMIC-CXR ----------------------------------------------------------------------------------

REPORT = """                                 FINAL REPORT
 EXAMINATION:  CHEST (PA AND LAT)

 INDICATION:  Invented indication.

 FINDINGS:
 Invented findings sentence one.  There is a small right
 effusion in this made-up text.

 IMPRESSION:
 Invented impression: small right effusion.
"""


def _mimic(root: Path) -> Path:
    files = root / "files"
    _image(files / "p10/p10000032/s50414267/aaaa-1111.jpg", "JPEG")
    _image(files / "p10/p10000032/s50414267/bbbb-2222.jpg", "JPEG")
    (files / "p10/p10000032/s50414267.txt").write_text(REPORT)
    _image(files / "p11/p11000011/s51000001/cccc-3333.jpg", "JPEG")
    (files / "p11/p11000011/s51000001.txt").write_text(
        " FINDINGS: Invented clear lungs.\n IMPRESSION: Invented, no acute process.\n"
    )
    _image(files / "p12/p12000012/s52000002/dddd-4444.jpg", "JPEG")  # no report, no labels: skipped
    _write_csv(
        root / "mimic-cxr-2.0.0-chexpert.csv",
        ["subject_id", "study_id", *CHEXPERT_14],
        [["10000032", "50414267", *_labels_row(Pleural_Effusion="1.0", Pneumothorax="0.0", Edema="-1.0")]],
    )
    _write_csv(
        root / "mimic-cxr-2.0.0-metadata.csv",
        ["dicom_id", "subject_id", "study_id", "ViewPosition"],
        [
            ["aaaa-1111", "10000032", "50414267", "LATERAL"],
            ["bbbb-2222", "10000032", "50414267", "PA"],
            ["cccc-3333", "11000011", "51000001", "AP"],
        ],
    )
    _write_csv(
        root / "mimic-cxr-2.0.0-split.csv",
        ["dicom_id", "study_id", "subject_id", "split"],
        [["aaaa-1111", "50414267", "10000032", "validate"], ["bbbb-2222", "50414267", "10000032", "validate"]],
    )
    return root


def test_mimic_reads_reports_labels_views_and_splits(tmp_path: Path):
    root = _mimic(tmp_path / "mimic")
    labeler = FakeLabeler()
    assert detect_layout(root) == "mimic_cxr"
    records = {r.study_id: r for r in load_dataset(root, labeler=labeler)}
    assert set(records) == {"s50414267", "s51000001"}
    a, b = records["s50414267"], records["s51000001"]
    assert a.source == "mimic_cxr" and a.patient_id == "p10000032"
    assert [p.name for p in a.image_paths] == ["aaaa-1111.jpg", "bbbb-2222.jpg"]
    assert a.view == "PA" and a.split == "valid"
    assert a.findings == "Invented findings sentence one. There is a small right effusion in this made-up text."
    assert a.impression == "Invented impression: small right effusion."
    assert (
        a.labels["Pleural Effusion"] == 1
        and a.labels["Pneumothorax"] == 0
        and a.labels["Edema"] == -1
        and a.labels["Fracture"] is None
    )
    # No label row: FactS's stand-in labels it; no split row: a deterministic split.
    assert len(labeler.texts) == 1 and b.labels["Pleural Effusion"] == 0
    assert b.view == "AP" and b.split in ("train", "valid", "test")
    # Pointing at files/ itself works too.
    assert {r.study_id for r in load_dataset(root / "files", labeler=FakeLabeler())} == set(records)


def test_parse_sections_keeps_only_section_text():
    sections = parse_sections(REPORT)
    assert sections["INDICATION"] == "Invented indication."
    assert set(sections) >= {"EXAMINATION", "FINDINGS", "IMPRESSION"}


# --- IU X-ray (Open-i) --------------------------------------------------------------------------

IU_XML = """<?xml version="1.0" encoding="utf-8"?>
<eCitation>
  <meta type="rr"/>
  <uId id="CXR{n}"/>
  <MedlineCitation Owner="Invented" Status="Test">
    <Article PubModel="Electronic">
      <Abstract>
        <AbstractText Label="COMPARISON">None.</AbstractText>
        <AbstractText Label="INDICATION">Invented indication.</AbstractText>
        <AbstractText Label="FINDINGS">{findings}</AbstractText>
        <AbstractText Label="IMPRESSION">{impression}</AbstractText>
      </Abstract>
    </Article>
  </MedlineCitation>
  <MeSH><major>normal</major></MeSH>
  {images}
</eCitation>
"""


def _iu(root: Path) -> Path:
    studies = {
        1: ("Invented: lungs clear.", "Invented: normal chest.", ["CXR1_1_IM-0001-3001", "CXR1_1_IM-0001-4001"]),
        2: ("Invented: small left effusion.", "Invented: effusion.", ["CXR2_IM-0652-1001"]),
    }
    (root / "reports_xml").mkdir(parents=True)
    for n, (findings, impression, images) in studies.items():
        tags = "\n  ".join(
            f'<parentImage id="{i}"><figureId>F{k}</figureId></parentImage>' for k, i in enumerate(images, 1)
        )
        (root / "reports_xml" / f"{n}.xml").write_text(
            IU_XML.format(n=n, findings=findings, impression=impression, images=tags)
        )
        for image_id in images[:1] if n == 1 else images:
            _image(root / "images_png" / f"{image_id}.png")
    (root / "reports_xml" / "broken.xml").write_text("<not closed")
    return root


def test_iu_xray_reads_xml_reports_and_finds_images_by_parent_image_id(tmp_path: Path):
    root = _iu(tmp_path / "iu")
    labeler = FakeLabeler()
    assert detect_layout(root) == "iu_xray"
    records = {r.study_id: r for r in load_dataset(root, labeler=labeler)}
    assert set(records) == {"CXR1", "CXR2"}
    one, two = records["CXR1"], records["CXR2"]
    assert [p.name for p in one.image_paths] == ["CXR1_1_IM-0001-3001.png"]  # the lateral image is missing on disk
    assert [p.name for p in two.image_paths] == ["CXR2_IM-0652-1001.png"]
    assert one.findings == "Invented: lungs clear." and one.impression == "Invented: normal chest."
    assert two.labels["Pleural Effusion"] == 1 and one.labels["Pleural Effusion"] == 0
    assert len(labeler.texts) == 2 and all(r.source == "iu_xray" for r in records.values())
    assert one.split == load_dataset(root, labeler=FakeLabeler())[0].split


# --- PhantomCXR and errors ----------------------------------------------------------------------


def test_phantom_csv_loads_with_its_own_labels_and_never_calls_the_labeler(tmp_path: Path):
    from orapo_core.data.phantom import generate_study

    write_dataset(tmp_path / "ph", 4, seed=5, size=64, formats=("png",))
    labeler = FakeLabeler()
    assert detect_layout(tmp_path / "ph") == "phantom"
    records = load_dataset(tmp_path / "ph", labeler=labeler)
    assert labeler.texts == [] and len(records) == 4
    for i, record in enumerate(records):
        study = generate_study(np.random.default_rng([5, i]), size=64)
        assert record.source == "phantom" and record.study_id == f"phantom-5-{i:06d}"
        assert record.labels == study.labels
        assert record.findings == study.report_findings and record.impression == study.report_impression
        assert record.view == study.view and record.image_paths[0].is_file()
    # The same CSV read as plain CheXpert Plus.
    assert [r.labels for r in load_dataset(tmp_path / "ph" / "phantom_cxr.csv", kind="chexpert_plus")] == [
        r.labels for r in records
    ]


def test_unknown_layouts_and_kinds_are_refused(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("nothing here")
    with pytest.raises(OrapoError) as exc:
        load_dataset(tmp_path / "empty")
    assert exc.value.code == "dataset_layout_unknown"
    with pytest.raises(OrapoError) as exc:
        load_dataset(tmp_path / "missing")
    assert exc.value.code == "dataset_not_found"
    with pytest.raises(OrapoError) as exc:
        load_dataset(tmp_path / "empty", kind="padchest")
    assert exc.value.code == "unknown_dataset_kind"


def test_without_a_labeler_argument_reports_are_labelled_by_facts(tmp_path: Path):
    """Needs the FactS labeler (orapo_core.facts)."""
    pytest.importorskip("orapo_core.facts")
    records = {r.study_id: r for r in load_dataset(_iu(tmp_path / "iu"))}
    assert records["CXR2"].labels["Pleural Effusion"] == 1
    assert records["CXR1"].labels["Pleural Effusion"] is None and set(records["CXR1"].labels) == set(CHEXPERT_14)
