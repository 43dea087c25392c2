"""De-identification at ingest: no PHI string survives, and pseudonyms, UIDs and dates stay consistent."""

from __future__ import annotations

import datetime as dt
import io

import pydicom
import pytest
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence

from orapo_core.imaging import deidentify, ingest_bytes
from orapo_core.imaging.deid import NONCONFORMANT_NOTE, conforms
from tests.support.dicom import dicom_bytes, image_dataset, set_raw

SECRET = "test-secret"
STUDY_UID = "1.2.826.0.1.3680043.8.498.111"
SERIES_UID = "1.2.826.0.1.3680043.8.498.222"
INSTANCE_UID = "1.2.826.0.1.3680043.8.498.333"
FRAME_UID = "1.2.826.0.1.3680043.8.498.444"

PHI = [
    "Smith^Johnathan",
    "Johnathan",
    "MRN-998877",
    "ALT-112233",
    "SEQ-445566",
    "19510704",
    "Harbour Lane",
    "ACC-5544",
    "St Elsewhere",
    "Hospital Road",
    "Radiology West Wing",
    "XRAY-ROOM-7",
    "SN-42424242",
    "House^Gregory",
    "Cuddy",
    "Chase",
    "Wilson^James",
    "fell at home",
    "private note",
    "20240115",
    "20240116",
    STUDY_UID,
    SERIES_UID,
    INSTANCE_UID,
    FRAME_UID,
    "ROOM7AE",
    "555-0199",
]


def phi_dataset(patient_id: str = "MRN-998877", study_date: str = "20240115") -> Dataset:
    ds = image_dataset()
    ds.file_meta.MediaStorageSOPInstanceUID = INSTANCE_UID
    ds.file_meta.SourceApplicationEntityTitle = "ROOM7AE"
    ds.SOPInstanceUID, ds.StudyInstanceUID, ds.SeriesInstanceUID = INSTANCE_UID, STUDY_UID, SERIES_UID
    ds.FrameOfReferenceUID = FRAME_UID
    ds.PatientName, ds.PatientID, ds.PatientBirthDate = "Smith^Johnathan", patient_id, "19510704"
    ds.OtherPatientIDs = "ALT-112233"
    other = Dataset()
    other.PatientID, other.TypeOfPatientID = "SEQ-445566", "TEXT"
    ds.OtherPatientIDsSequence = Sequence([other])
    ds.PatientAddress, ds.PatientTelephoneNumbers = "4 Harbour Lane", "555-0199"
    ds.PatientSex, ds.PatientAge = "M", "094Y"
    ds.AccessionNumber, ds.StudyID = "ACC-5544", "ACC-5544"
    ds.InstitutionName, ds.InstitutionAddress = "St Elsewhere Hospital", "1 Hospital Road"
    ds.InstitutionalDepartmentName, ds.StationName = "Radiology West Wing", "XRAY-ROOM-7"
    ds.DeviceSerialNumber, ds.Manufacturer = "SN-42424242", "Acme Imaging"
    ds.ReferringPhysicianName, ds.OperatorsName = "House^Gregory", "Wilson^James"
    procedure = Dataset()  # a person name and a UID nested where no list looks
    procedure.CodeValue, procedure.CodingSchemeDesignator, procedure.CodeMeaning = "36643-5", "LN", "XR Chest 2V"
    procedure.ReferringPhysicianName = "Chase^Robert"
    procedure.VerifyingObserverName = "Cuddy^Lisa"  # on no list: only the every-PN rule catches it
    procedure.ReferencedSOPInstanceUID = INSTANCE_UID
    procedure.ContentDate = "20240116"
    ds.ProcedureCodeSequence = Sequence([procedure])
    ds.StudyDate = ds.SeriesDate = study_date
    ds.AcquisitionDate = ds.ContentDate = "20240116"
    ds.AcquisitionDateTime = "20240116093112"
    ds.StudyTime = "0931"  # times of day are kept: with shifted dates they identify no one
    ds.ImageComments = "Patient fell at home"
    ds.StudyDescription = "CHEST Smith^Johnathan"
    ds.AdditionalPatientHistory = "Johnathan smokes"
    ds.ViewPosition, ds.BodyPartExamined, ds.Modality = "PA", "CHEST", "DX"
    ds.BurnedInAnnotation = "YES"
    block = ds.private_block(0x0009, "ACME PHI", create=True)
    block.add_new(0x01, "LO", "private note about Johnathan")
    block.add_new(0x02, "UI", "1.2.826.0.1.3680043.8.498.999")
    return ds


def shift(before: str, after: str) -> int:
    return (dt.datetime.strptime(after, "%Y%m%d") - dt.datetime.strptime(before, "%Y%m%d")).days


def test_no_phi_string_survives_in_the_written_file():
    image = ingest_bytes(dicom_bytes(phi_dataset()), "chest.dcm", secret=SECRET)
    written = image.to_dicom_bytes()
    found = [text for text in PHI if text.encode() in written or text.upper().encode() in written]
    assert found == []
    rows = " ".join(f"{k}={v}" for k, v in image.header_items())
    assert [text for text in PHI if text in rows] == []
    assert [text for text in PHI if text in repr(image.meta)] == []


def test_preamble_and_file_meta_are_written_fresh():
    """Bytes 0-127 of a Part 10 file and the meta's free-text elements are the sender's to fill:
    some modalities write the patient there, so none of them reaches the stored file."""
    ds = phi_dataset()
    ds.file_meta.ImplementationVersionName = "JOHNDOE_1931"
    ds.file_meta.PrivateInformationCreatorUID = "1.2.826.0.1.3680043.8.498.777"
    ds.file_meta.PrivateInformation = b"MRN 123-45-6789 JOHN^DOE"
    ds.file_meta.SourceApplicationEntityTitle = "ROOM7AE"
    sent = bytearray(dicom_bytes(ds))
    preamble = b"JOHN^DOE 123-45-6789 born 1931-07-17".ljust(128, b" ")
    sent[:128] = preamble

    written = ingest_bytes(bytes(sent), "chest.dcm", secret=SECRET).to_dicom_bytes()

    assert written[:128] == b"\x00" * 128 and written[128:132] == b"DICM"
    for text in (b"JOHN^DOE", b"123-45-6789", b"1931", b"JOHNDOE_1931", b"ROOM7AE", b"1.2.826.0.1.3680043.8.498.777"):
        assert text not in written, text
    meta = pydicom.dcmread(io.BytesIO(written)).file_meta
    assert {elem.keyword for elem in meta} <= {
        "FileMetaInformationGroupLength",
        "FileMetaInformationVersion",
        "MediaStorageSOPClassUID",
        "MediaStorageSOPInstanceUID",
        "TransferSyntaxUID",
        "ImplementationClassUID",
        "ImplementationVersionName",
    }
    assert meta.ImplementationVersionName != "JOHNDOE_1931"


def test_marks_pseudonym_and_what_is_kept():
    image = ingest_bytes(dicom_bytes(phi_dataset()), "chest.dcm", secret=SECRET)
    back = pydicom.dcmread(io.BytesIO(image.to_dicom_bytes()))
    assert back.PatientIdentityRemoved == "YES" and back.DeidentificationMethod
    codes = {item.CodeValue for item in back.DeidentificationMethodCodeSequence}
    assert {"113100", "113107"} <= codes
    assert back.PatientID == image.meta["patient_pseudonym"] and back.PatientName == "ANON^" + back.PatientID[:8]
    assert not [elem for elem in back if elem.tag.is_private]
    assert back.ProcedureCodeSequence[0].ReferringPhysicianName in (None, "")
    assert back.ProcedureCodeSequence[0].VerifyingObserverName in (None, "")
    assert back.ProcedureCodeSequence[0].CodeMeaning == "XR Chest 2V"
    assert (back.ViewPosition, back.BodyPartExamined, back.Manufacturer, back.PatientSex) == (
        "PA",
        "CHEST",
        "Acme Imaging",
        "M",
    )
    assert back.PatientAge == "090Y"  # ages over 89 are identifying
    assert back.pixel_array.shape == (back.Rows, back.Columns)
    assert any("burned into its pixels" in warning for warning in image.warnings)


def test_uids_are_replaced_consistently():
    first, _ = deidentify(phi_dataset(), secret=SECRET)
    again, _ = deidentify(phi_dataset(), secret=SECRET)
    other, _ = deidentify(phi_dataset(), secret="another-secret")
    for keyword in ("StudyInstanceUID", "SeriesInstanceUID", "SOPInstanceUID", "FrameOfReferenceUID"):
        value = str(first[keyword].value)
        assert value.startswith("2.25.") and len(value) <= 64
        assert value == str(again[keyword].value) != str(other[keyword].value)
    assert len({first.StudyInstanceUID, first.SeriesInstanceUID, first.SOPInstanceUID, first.FrameOfReferenceUID}) == 4
    # References follow the instance they point at; class UIDs are not touched.
    assert first.ProcedureCodeSequence[0].ReferencedSOPInstanceUID == first.SOPInstanceUID
    assert first.file_meta.MediaStorageSOPInstanceUID == first.SOPInstanceUID
    assert first.SOPClassUID == phi_dataset().SOPClassUID
    assert first.PatientID == again.PatientID != other.PatientID


def test_dates_of_one_patient_shift_by_one_offset():
    original = phi_dataset()
    first, _ = deidentify(original, secret=SECRET)
    later_visit = phi_dataset(study_date="20250301")
    later_visit.StudyInstanceUID = "1.2.826.0.1.3680043.8.498.555"
    second, _ = deidentify(later_visit, secret=SECRET)
    offset = shift("20240115", first.StudyDate)
    assert offset != 0
    assert shift("20240116", first.AcquisitionDate) == shift("20240116", first.ContentDate) == offset
    assert shift("20240116", first.ProcedureCodeSequence[0].ContentDate) == offset
    assert (
        first.AcquisitionDateTime
        == (dt.datetime(2024, 1, 16) + dt.timedelta(days=offset)).strftime("%Y%m%d") + "093112"
    )
    assert shift("20250301", second.StudyDate) == offset and second.PatientID == first.PatientID
    assert second.StudyInstanceUID != first.StudyInstanceUID
    stranger, _ = deidentify(phi_dataset(patient_id="MRN-000001"), secret=SECRET)
    assert stranger.PatientID != first.PatientID
    assert original.PatientName == "Smith^Johnathan"  # the input is left untouched
    assert first.PatientBirthDate in (None, "") and first.LongitudinalTemporalInformationModified == "MODIFIED"


def test_deidentify_alone_on_a_header_without_pixels():
    ds = phi_dataset()
    del ds.PixelData
    clean, notes = deidentify(ds, secret=SECRET)
    buffer = io.BytesIO()
    pydicom.dcmwrite(buffer, clean, enforce_file_format=True)
    written = buffer.getvalue()
    assert [text for text in PHI if text.encode() in written] == []
    assert pydicom.dcmread(io.BytesIO(written)).PatientIdentityRemoved == "YES"
    assert notes and "burned" in notes[0]


def test_the_archive_link_is_sealed_and_opens_only_with_the_secret():
    from orapo_core.errors import OrapoError
    from orapo_core.imaging.deid import seal_archive_uid, unseal_archive_uid

    uid = "1.2.826.0.1.3680043.8.498.12345678901234567890"
    first, second = seal_archive_uid(SECRET, uid), seal_archive_uid(SECRET, uid)
    assert uid not in first and "12345678901234567890" not in first
    assert first != second  # a fresh IV each time: two studies' tokens cannot be compared
    assert unseal_archive_uid(SECRET, first) == unseal_archive_uid(SECRET, second) == uid
    for token, secret in ((first, "another secret"), (first[:-4] + "AAAA", SECRET), ("not a token", SECRET)):
        with pytest.raises(OrapoError) as exc:
            unseal_archive_uid(secret, token)
        assert exc.value.code == "archive_link_invalid"


# Values a sender wrote against their VR (PS3.5 6.2): a word where a time, an age, a number or a code belongs.
NONCONFORMANT = {
    "StudyTime": "QZXTIME",
    "PatientAge": "old",
    "PatientWeight": "heavy",
    "PatientSize": "tallQZX",
    "BodyPartExamined": "ch@st!",
    "ViewPosition": "lateral",
    "SeriesNumber": "x7Q",
}


def nonconformant_dicom() -> bytes:
    ds = image_dataset()
    for keyword, text in NONCONFORMANT.items():
        set_raw(ds, keyword, text)
    ds.PatientSex, ds.ImageType, ds.InstanceNumber = "F", ["ORIGINAL", "PRIMARY"], 3  # these conform and stay
    data = dicom_bytes(ds)
    assert all(text.encode() in data for text in NONCONFORMANT.values())
    return data


def test_values_that_do_not_conform_to_their_vr_are_dropped():
    """Such a value is free text in disguise (it may be a name) and stops any reader that parses it: it goes,
    the image is still accepted, and the reader is told that values went, not which."""
    image = ingest_bytes(nonconformant_dicom(), "chest.dcm", secret=SECRET)
    written = image.to_dicom_bytes()
    back = pydicom.dcmread(io.BytesIO(written))
    rows = dict(image.header_items())
    for keyword, text in NONCONFORMANT.items():
        assert text.encode() not in written, keyword
        assert rows.get(keyword, "") == "" and back.get(keyword, "") in ("", None), keyword
    # Type 2 attributes every image carries are emptied (present, unknown); the others are removed.
    assert back.StudyTime == "" and back.SeriesNumber is None and "StudyTime" in rows
    assert [
        k for k in ("PatientAge", "PatientWeight", "PatientSize", "BodyPartExamined", "ViewPosition") if k in back
    ] == []
    assert (back.PatientSex, list(back.ImageType), back.InstanceNumber) == ("F", ["ORIGINAL", "PRIMARY"], 3)
    assert (image.meta["patient_age"], image.meta["body_part"], image.meta["view_position"]) == (None, None, None)
    assert NONCONFORMANT_NOTE in image.warnings
    assert not any(text in " ".join(image.warnings) for text in NONCONFORMANT.values())
    assert back.pixel_array.shape == (back.Rows, back.Columns)
    # A conformant header gets no such note.
    assert NONCONFORMANT_NOTE not in ingest_bytes(dicom_bytes(phi_dataset()), "chest.dcm", secret=SECRET).warnings


@pytest.mark.parametrize(
    "vr, good, bad",
    [
        (
            "TM",
            ["09", "0931", "093112", "235960.123456", " 0931 "],
            ["QZXTIME", "2400", "0960", "09:31", "093112.1234567"],
        ),
        ("DA", ["20240229"], ["20230229", "2024.01.15", "202401", "2024011"]),
        ("DT", ["2024", "202401", "20240115093112.5+0100"], ["202413", "20240115246000", "2024-01-15"]),
        ("AS", ["042Y", "003D"], ["old", "42Y", "042y"]),
        ("DS", ["70", "-1.5e3", ".5", " 1.70 "], ["heavy", "nan", "1e999", "1.234567890123456", "1,5"]),
        ("IS", ["-12", "2147483647"], ["1.0", "2147483648", "x7"]),
        ("CS", ["ORIGINAL", "LEFT_SIDE 2", ""], ["chest", "P@", "ABCDEFGHIJKLMNOPQ"]),
        ("UI", ["1.2.840.10008.1.2.1", "2.25.0"], ["1.02.3", "abc", "1..2", "1." + "2" * 63]),
    ],
)
def test_what_conforms_to_each_vr(vr, good, bad):
    assert [v for v in good if not conforms(vr, v)] == []
    assert [v for v in bad if conforms(vr, v)] == []
