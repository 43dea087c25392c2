"""`orapo ingest` end to end: real files in, de-identified studies out, refusals reported per file."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pydicom
import pytest
from pydicom.dataset import Dataset

from app.cli import main
from tests.support.dicom import pydicom_data_file, set_raw

PHI = {
    "PatientName": "Quimby^Harriet^Rose",
    "PatientID": "MRN7731904",
    "PatientBirthDate": "19470312",
    "AccessionNumber": "ACC55512399",
    "InstitutionName": "St Elsewhere Memorial Hospital",
    "ReferringPhysicianName": "Okonkwo^Desmond",
    "OperatorsName": "Tech^Wilhelmina",
    "StationName": "XRAYROOM7SOUTH",
    "StudyDate": "20240229",
    "StudyID": "STUDYID4411",
}


def _phi_dicom(tmp_path: Path) -> tuple[Path, list[str]]:
    """RG1_UNCI.dcm (a real chest radiograph) carrying identifying values everywhere PS3.15 names."""
    ds = pydicom.dcmread(pydicom_data_file("RG1_UNCI.dcm"))
    for keyword, value in PHI.items():
        setattr(ds, keyword, value)
    physician = Dataset()
    physician.PersonName = "Vantablack^Ophelia"
    ds.PhysiciansOfRecordIdentificationSequence = [physician]
    ds.add_new(0x00091010, "LO", "PrivatePHI-Zanzibar")  # private tags must go
    ds.add_new(0x00090010, "LO", "ACME PRIVATE")
    secrets = [*PHI.values(), "Vantablack", "Zanzibar", str(ds.StudyInstanceUID), str(ds.SOPInstanceUID)]
    out = tmp_path / "phi.dcm"
    ds.save_as(out, enforce_file_format=True)
    return out, secrets


def _every_stored_byte(data_dir: Path) -> bytes:
    db_file = data_dir / "orapo.sqlite3"
    with sqlite3.connect(db_file) as con:  # fold the WAL into the main file so no text hides in it
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return b"".join(p.read_bytes() for p in sorted(data_dir.rglob("*")) if p.is_file())


def test_no_phi_reaches_database_or_storage(data_dir: Path, tmp_path: Path, capsys) -> None:
    source, secrets = _phi_dicom(tmp_path)
    original = source.read_bytes()
    assert all(s.encode() in original for s in ("Quimby", "MRN7731904", "Zanzibar"))  # the test file does carry PHI
    assert main(["ingest", str(source), "--json"]) == 0
    line = json.loads(capsys.readouterr().out.strip())
    assert line["ok"] is True and isinstance(line["study_id"], int)
    stored = _every_stored_byte(data_dir)
    assert b"DICM" in stored  # the de-identified DICOM is there
    for secret in secrets:
        for variant in {secret, secret.upper(), secret.replace("^", " ")}:
            assert variant.encode() not in stored, f"PHI {variant!r} reached the data folder"
    assert source.read_bytes() == original  # the user's own archive is never modified


def test_values_against_their_vr_reach_neither_the_file_nor_the_database(
    data_dir: Path, tmp_path: Path, capsys
) -> None:
    """A time, an age, a weight and a code holding words: the image goes in, those values nowhere."""
    from app.runtime import open_database
    from db import StudyRepository
    from orapo_core.config import Settings
    from orapo_core.imaging.deid import NONCONFORMANT_NOTE

    ds = pydicom.dcmread(pydicom_data_file("RG1_UNCI.dcm"))
    bad = {
        "StudyTime": "QZXTIME",
        "PatientAge": "old",
        "PatientWeight": "heavyQZX",
        "BodyPartExamined": "Chest_of_Quimby",
    }
    for keyword, text in bad.items():
        set_raw(ds, keyword, text)
    source = tmp_path / "odd.dcm"
    ds.save_as(source, enforce_file_format=True)
    assert main(["ingest", str(source), "--json"]) == 0
    line = json.loads(capsys.readouterr().out.strip())
    assert line["ok"] is True and NONCONFORMANT_NOTE in line["warnings"]

    stored = _every_stored_byte(data_dir)
    for text in ("QZXTIME", "heavyQZX", "Chest_of_Quimby", "Quimby"):
        assert text.encode() not in stored, text
    (image,) = StudyRepository(open_database(Settings())).images(line["study_id"])
    assert image.header["StudyTime"] == "" and not {"PatientAge", "PatientWeight", "BodyPartExamined"} & set(
        image.header
    )
    back = pydicom.dcmread(Settings().storage_dir / image.dicom_path)
    assert back.StudyTime == "" and [k for k in bad if k != "StudyTime" and k in back] == []


def test_mixed_folder_reports_each_file_and_exits_1(data_dir: Path, tmp_path: Path, capsys) -> None:
    folder = tmp_path / "archive"
    folder.mkdir()
    (folder / "a.dcm").write_bytes(pydicom_data_file("RG1_UNCI.dcm").read_bytes())
    (folder / "b.dcm").write_bytes(pydicom_data_file("RG1_J2KR.dcm").read_bytes())
    (folder / "empty.dcm").write_bytes(b"")
    (folder / "notes.png").write_bytes(b"this is not a picture at all")
    (folder / "readme.txt").write_text("skipped: not an image suffix")
    assert main(["ingest", str(folder), "--json"]) == 1
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    by_name = {Path(x["file"]).name: x for x in lines}
    assert set(by_name) == {"a.dcm", "b.dcm", "empty.dcm", "notes.png"}
    assert by_name["a.dcm"]["ok"] and by_name["b.dcm"]["ok"]
    # The two encodings of one radiograph belong to one study.
    assert by_name["a.dcm"]["study_id"] == by_name["b.dcm"]["study_id"]
    assert by_name["empty.dcm"] == {
        "file": str(folder / "empty.dcm"),
        "ok": False,
        "error": "empty_file",
        "message": by_name["empty.dcm"]["message"],
    }
    assert not by_name["notes.png"]["ok"] and by_name["notes.png"]["error"]
    # Nothing of a refused file is stored: exactly two images (DICOM + PNG each).
    stored = sorted(p.suffix for p in (data_dir / "images").rglob("*") if p.is_file())
    assert stored == [".dcm", ".dcm", ".png", ".png"]


def test_second_ingest_of_same_instance_is_a_duplicate(data_dir: Path, capsys) -> None:
    path = str(pydicom_data_file("RG1_UNCI.dcm"))
    assert main(["ingest", path, "--json"]) == 0
    assert main(["ingest", path, "--json"]) == 0
    first, second = (json.loads(x) for x in capsys.readouterr().out.splitlines())
    assert second["duplicate"] is True and second["image_id"] == first["image_id"]


@pytest.mark.slow  # the `orapo` command in a subprocess
def test_cli_subprocess_prints_codes_not_tracebacks(data_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "truncated.dcm"
    bad.write_bytes(pydicom_data_file("RG1_UNCI.dcm").read_bytes()[:5000])
    orapo = Path(sys.executable).with_name("orapo")
    result = subprocess.run(
        [str(orapo), "ingest", str(bad), str(tmp_path / "missing.dcm")], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr
    assert "refused" in result.stdout and "file_not_found" in result.stdout
    assert "0 ingested, 2 refused" in result.stdout


@pytest.mark.parametrize("name", ["scan.png", "scan.jpg"])
def test_png_and_jpeg_ingest(data_dir: Path, tmp_path: Path, name: str, capsys) -> None:
    import numpy as np
    from PIL import Image

    ramp = (np.add.outer(np.arange(64), np.arange(48)) * 2).astype(np.uint8)
    Image.fromarray(ramp).save(tmp_path / name)
    assert main(["ingest", str(tmp_path / name), "--json"]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["ok"] and line["study_id"]
