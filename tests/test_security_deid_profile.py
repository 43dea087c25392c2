"""Every attribute of DICOM PS3.15 Table E.1-1 is protected at ingest, not only a hand-kept list.

A real chest radiograph (pydicom-data's RG1_UNCI.dcm) gets a distinctive,
PHI-like value in every attribute of the table as shipped by dicom-anonymizer
(the table `orapo_core.imaging.deid` uses), then goes through the project's
ingest; no value may survive in the stored DICOM or the display PNG, nor in
the data folder after `orapo ingest`.

What the chosen options keep is left out on purpose: the patient
characteristics of the Retain Patient Characteristics Option, and times of
day (the Retain Longitudinal Temporal Information with Modified Dates Option
shifts dates by whole days, so a time keeps its value; the date it belongs to
is checked).
"""

from __future__ import annotations

import io
import json
import pkgutil
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pydicom
import pytest
from pydicom import datadict
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence
from pydicom.tag import Tag

from app.cli import main
from orapo_core.imaging import deid, ingest_bytes
from tests.support.dicom import pydicom_data_file

SECRET = "profile-test-secret"
PHI_DATE = "19370521"  # every date of the table gets this one; a shift of 1 to 3650 days never maps it onto itself
UID_ROOT = "1.2.826.0.1.3680043.8.498.1937052177."

# Retained by the Retain Patient Characteristics Option as this project applies it.
RETAINED = {
    "PatientSex",
    "PatientAge",
    "PatientSize",
    "PatientWeight",
    "PatientSexNeutered",
    "PregnancyStatus",
    "SmokingStatus",
}

# The attributes the security issue found passing through unchanged (the last is not in Table E.1-1
# at all; the project removes it too).
REPORTED = [
    "AcquisitionDeviceProcessingDescription",
    "ConfidentialityConstraintOnPatientDataDescription",
    "ReasonForTheImagingServiceRequest",
    "PatientTransportArrangements",
    "RequestedProcedureLocation",
    "PersonTelephoneNumbers",
    "VerifyingOrganization",
    "RequestedContrastAgent",
    "ContrastBolusAgent",
    "SoftwareVersions",
]

_BINARY = ("OB", "OW", "OD", "OF", "OL", "OV", "UN")
_NUMBERS = ("US", "SS", "UL", "SL", "FL", "FD", "SV", "UV", "AT")


def _table_tags() -> list[int]:
    """Every exact tag of Table E.1-1 in the edition the de-identifier uses (masked curve/overlay rows aside)."""
    from dicomanonymizer.dicomfields_selector import dicom_anonymization_database_selector

    rows = dicom_anonymization_database_selector(deid.TABLE_EDITION)["ALL_TAGS"]
    return sorted({(row[0] << 16) | row[1] for row in rows if len(row) == 2})


def _poison(ds: Dataset, tag: int, index: int) -> tuple[str, str | None] | None:
    """Write a distinctive value into `tag`; return (keyword, the text to look for) or None if skipped."""
    token = f"PHI{index:04d}Q"
    if not datadict.dictionary_has_tag(tag):  # newer than pydicom's dictionary: written as LO, must be dropped
        ds.add_new(tag, "LO", token)
        return f"({Tag(tag).group:04X},{Tag(tag).element:04X})", token
    keyword = datadict.keyword_for_tag(tag)
    vr = datadict.dictionary_VR(tag).split(" or ")[0]
    if keyword in RETAINED or (vr == "TM" and keyword != "PatientBirthTime") or Tag(tag).group in (0x0000, 0x0002):
        return None  # kept by an option, a time of day, or not a data set element (command, file meta)
    if vr == "SQ":
        item = Dataset()
        item.CodeMeaning = f"{token} seq item"
        value, needle = Sequence([item]), token
    elif vr == "DA":
        value, needle = PHI_DATE, PHI_DATE
    elif vr == "TM":  # only the birth time gets here
        value = needle = "235917.731942"
    elif vr == "DT":
        value, needle = PHI_DATE + "101112", PHI_DATE
    elif vr == "UI":
        value = needle = f"{UID_ROOT}{index}"
    elif vr == "PN":
        value, needle = f"{token}^Harriet", token
    elif vr in ("DS", "IS"):
        value = needle = f"7319{index:04d}"
    elif vr == "AS":
        value, needle = "077Y", None  # four characters cannot be distinctive: only the structural check
    elif vr == "UR":
        value, needle = f"https://{token}.example/", token
    elif vr in _BINARY:
        value, needle = token.encode(), token
    elif vr in _NUMBERS:
        value, needle = 7319, None  # binary numbers: only the structural check
    else:  # AE CS LO SH LT ST UT UC
        value = needle = token
    ds.add_new(tag, vr, value)
    return keyword, needle


def _phi_radiograph() -> tuple[bytes, dict[str, str | None], dict[str, object]]:
    """RG1_UNCI.dcm with PHI in every attribute of the table; also {keyword: needle} and {keyword: value}."""
    ds = pydicom.dcmread(pydicom_data_file("RG1_UNCI.dcm"))
    needles: dict[str, str | None] = {}
    for index, tag in enumerate(_table_tags()):
        written = _poison(ds, tag, index)
        if written:
            needles[written[0]] = written[1]
    ds.SoftwareVersions = "PHI9999Q-build"  # reported with the others, though not in Table E.1-1
    needles["SoftwareVersions"] = "PHI9999Q"
    # Media Storage SOP Instance UID, the table's one file-meta attribute, is written as the poisoned SOP Instance UID.
    values = {keyword: ds[_key(keyword)].value for keyword in needles}
    buffer = io.BytesIO()
    ds.save_as(buffer, enforce_file_format=True)
    return buffer.getvalue(), needles, values


def _key(name: str) -> str | int:
    """A keyword, or the tag of an attribute pydicom has no keyword for, written '(gggg,eeee)'."""
    return int(name[1:5] + name[6:10], 16) if name.startswith("(") else name


# Every needle _poison writes, in lower case: one pass over a 7 MB file instead of 600 searches.
_HITS = re.compile(rb"phi\d{4}q|19370521|1\.2\.826\.0\.1\.3680043\.8\.498\.1937052177\.\d+|7319\d{4}|235917\.731942")


def _survivors(needles: dict[str, str | None], blob: bytes) -> list[str]:
    """The needles found in `blob`, in any letter case."""
    hits = {hit.decode() for hit in _HITS.findall(blob.lower())}
    return sorted(f"{k}={n}" for k, n in needles.items() if n and any(n.lower() in hit for hit in hits))


def test_the_table_is_the_newest_edition_shipped_and_complete():
    from dicomanonymizer import dicom_anonymization_databases

    editions = sorted(m.name for m in pkgutil.iter_modules(dicom_anonymization_databases.__path__))
    assert deid.TABLE_EDITION == editions[-1], "dicom-anonymizer ships a newer edition of Table E.1-1: use it"
    tags = _table_tags()
    assert len(tags) > 600
    # The attributes the security issue reported are in the table (Software Versions is not, and is removed anyway).
    reported = {datadict.tag_for_keyword(k) for k in REPORTED[:-1]}
    assert reported <= set(tags)


def test_phi_in_every_attribute_of_the_table_survives_nowhere():
    data, needles, values = _phi_radiograph()
    assert set(REPORTED) <= set(needles)
    assert len(needles) > 580, f"only {len(needles)} attributes poisoned"
    assert all(_HITS.fullmatch(n.lower().encode()) for n in needles.values() if n)
    assert not _HITS.search(pydicom_data_file("RG1_UNCI.dcm").read_bytes().lower())  # nothing found by chance
    assert len(_survivors(needles, data)) == sum(1 for n in needles.values() if n)  # the input carries every value

    image = ingest_bytes(data, "chest.dcm", secret=SECRET)
    written, png = image.to_dicom_bytes(), image.display_png_bytes()
    assert _survivors(needles, written) == []
    assert _survivors(needles, png) == []
    rows = " ".join(f"{k}={v}" for k, v in image.header_items()).encode()
    assert _survivors(needles, rows) == []
    assert _survivors(needles, repr(image.meta).encode()) == []

    # Structurally too (this covers binary numbers and ages): each one is gone, empty or replaced.
    back = pydicom.dcmread(io.BytesIO(written))
    unchanged = []
    for keyword, original in values.items():
        key = _key(keyword)
        elem = back[key] if key in back else None
        if elem is not None and elem.value not in (None, "", b"", []) and elem.value == original:
            unchanged.append(keyword)
    assert unchanged == []
    assert back.file_meta.MediaStorageSOPInstanceUID == back.SOPInstanceUID != values["SOPInstanceUID"]
    assert back.PatientIdentityRemoved == "YES"
    assert (back.Modality, back.BodyPartExamined, back.ViewPosition) == ("CR", "CHEST", "PA")
    assert back.pixel_array.shape == (back.Rows, back.Columns)


def test_the_ten_reported_attributes_are_gone():
    data, _, _ = _phi_radiograph()
    clean, _ = deid.deidentify(pydicom.dcmread(io.BytesIO(data)), secret=SECRET)
    assert [k for k in REPORTED if k in clean and clean[k].value not in (None, "")] == []


def _every_stored_byte(data_dir: Path) -> bytes:
    with sqlite3.connect(data_dir / "orapo.sqlite3") as con:  # fold the WAL into the main file
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return b"".join(p.read_bytes() for p in sorted(data_dir.rglob("*")) if p.is_file())


def test_orapo_ingest_stores_none_of_it(data_dir: Path, tmp_path: Path, capsys) -> None:
    data, needles, _ = _phi_radiograph()
    source = tmp_path / "phi.dcm"
    source.write_bytes(data)
    assert main(["ingest", str(source), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip())["ok"] is True
    stored = _every_stored_byte(data_dir)
    assert b"DICM" in stored and b"\x89PNG" in stored
    assert _survivors(needles, stored) == []


def test_importing_the_imaging_package_leaves_the_table_unloaded():
    code = "import sys, orapo_core.imaging; assert 'dicomanonymizer' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("keyword", ["PatientSex", "PatientAge", "StudyTime"])
def test_what_the_options_keep_is_kept(keyword):
    data, _, _ = _phi_radiograph()
    ds = pydicom.dcmread(io.BytesIO(data))
    ds.PatientSex, ds.PatientAge, ds.StudyTime = "F", "042Y", "093112"
    clean, _ = deid.deidentify(ds, secret=SECRET)
    assert clean[keyword].value == ds[keyword].value


# Issue 42: attributes that no edition of Table E.1-1 dicom-anonymizer ships (2023, 2024b, 2026c) lists, yet
# that identify a patient: a birth or death date in an alternative calendar, and the retired order numbers.
# The table's silence is no licence: the de-identifier removes every attribute of their kind the table omits.
OUTSIDE_THE_TABLE = [
    "PatientBirthDateInAlternativeCalendar",
    "PatientDeathDateInAlternativeCalendar",
    "PlacerOrderNumberProcedure",
    "FillerOrderNumberProcedure",
    "PlacerOrderNumberImagingServiceRequestRetired",
    "FillerOrderNumberImagingServiceRequestRetired",
]
_TEXT_VRS = ("AE", "AS", "CS", "DA", "DS", "DT", "IS", "LO", "LT", "PN", "SH", "ST", "TM", "UC", "UI", "UR", "UT")


def _identifying_outside_the_table() -> list[int]:
    """Every tag of pydicom's dictionary (retired ones too) the table omits whose keyword names a birth or death date
    or time, an accession, placer or filler (order) number, or that is a textual "...Number" of group 0040."""
    from pydicom._dicom_dict import DicomDictionary

    found = []
    for tag, (vr, _vm, _name, _retired, keyword) in DicomDictionary.items():
        if deid.basic_action(tag) is not None or not keyword:
            continue
        if (
            (re.search(r"Birth|Death", keyword) and re.search(r"Date|Time", keyword))
            or re.search(r"Accession|Placer|Filler", keyword)
            or (tag >> 16 == 0x0040 and keyword.endswith("Number") and vr.split(" or ")[0] in _TEXT_VRS)
        ):
            found.append(tag)
    return sorted(found)


def test_identifying_attributes_the_table_omits_are_removed_too():
    tags = _identifying_outside_the_table()
    keywords = [datadict.keyword_for_tag(tag) for tag in tags]
    # The edition in use does not list the reported ones: only the rule on their kind removes them.
    assert [k for k in OUTSIDE_THE_TABLE if deid.basic_action(datadict.tag_for_keyword(k)) is not None] == []
    assert set(OUTSIDE_THE_TABLE) <= set(keywords)
    ds = pydicom.dcmread(pydicom_data_file("RG1_UNCI.dcm"))
    tokens = {}
    for index, tag in enumerate(tags):
        token = f"D3PHI{index:03d}Q"
        vr = datadict.dictionary_VR(tag).split(" or ")[0]
        if vr == "SQ":  # an item whose code would survive in any sequence kept
            item = Dataset()
            item.CodeValue, item.CodingSchemeDesignator = token, "99PHI"
            ds.add_new(tag, vr, Sequence([item]))
        else:
            ds.add_new(tag, vr, token)
        tokens[datadict.keyword_for_tag(tag)] = token
    kept = Dataset()  # the control: the same item in a sequence outside the class does survive
    kept.CodeValue, kept.CodingSchemeDesignator = "D3KEPTQ", "99PHI"
    ds.AnatomicRegionSequence = Sequence([kept])
    buffer = io.BytesIO()
    ds.save_as(buffer, enforce_file_format=True)
    assert all(t.encode() in buffer.getvalue() for t in tokens.values())

    image = ingest_bytes(buffer.getvalue(), "chest.dcm", secret=SECRET)
    written = image.to_dicom_bytes()
    rows = " ".join(f"{k}={v}" for k, v in image.header_items())
    assert [k for k, t in tokens.items() if t.encode() in written or t in rows] == []
    back = pydicom.dcmread(io.BytesIO(written))
    assert [k for k in tokens if k in back] == []
    assert b"D3KEPTQ" in written
