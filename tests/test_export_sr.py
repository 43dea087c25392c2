"""`orapo export sr`: a signed report becomes a DICOM Comprehensive SR that pydicom and highdicom read back, with
FINDINGS and IMPRESSION as text, FactS facts as codes, the reader and the model as observers, the de-identified
image referenced, and no trace of the original's identity."""

from __future__ import annotations

import io
import json
import shutil
import subprocess

import pydicom
import pytest
from pydicom.uid import ComprehensiveSRStorage

from app.cli import main
from orapo_core.imaging.report_sr import FINDING_CODES, CodedFinding, coded_findings, read_report_sr
from tests.support.orthanc import phantom_dicoms

REPORT = (
    "Findings: Mild cardiomegaly. Small left pleural effusion. No pneumothorax. Possible right lower lobe "
    "atelectasis. Endotracheal tube in place. The cardiomediastinal silhouette is enlarged.\n"
    "Impression: Cardiomegaly with a small left effusion."
)


@pytest.fixture
def clinic(data_dir, tmp_path):
    """The CLI's own database (ORAPO_DATA_DIR) with rita, a model version, and what `add_study` stores."""
    from app.runtime import open_database
    from db import ModelVersionRepository, UserRepository
    from orapo_core.config import Settings

    settings = Settings()
    db = open_database(settings)
    rita = UserRepository(db).create("rita", "rita-pass-1")
    version = ModelVersionRepository(db).create("starter-v1", base_model_path="models/starter")

    def add_study(
        data: bytes,
        name: str = "chest.dcm",
        *,
        report: str | None = REPORT,
        signed: bool = True,
        draft: str = "Findings: Clear.\nImpression: Normal.",
        added: tuple[str, ...] = (),
    ) -> int:
        """Ingest one file as an upload would, then a model draft (`added`: the sentences its finding check put in)
        and rita's report."""
        from app.services.reading.ingest import ingest_bytes
        from db import CorrectionRepository, DraftRepository

        outcome = ingest_bytes(data, name, db=db, settings=settings)
        assert outcome.ok, outcome
        draft = DraftRepository(db).create(
            outcome.study_id,
            model_name="starter",
            prompt="p",
            text=draft,
            model_version_id=version.id,
            facts={"flagged": [], "withheld": [], "added": list(added)},
        )
        if report is not None:
            CorrectionRepository(db).create(
                outcome.study_id, author_id=rita.id, text=report, draft_id=draft.id, signed=signed
            )
        return outcome.study_id

    return type(
        "Clinic",
        (),
        dict(db=db, settings=settings, rita=rita, version=version, add_study=add_study, files=tmp_path / "phantoms"),
    )


def _stored_image(clinic, study_id: int) -> pydicom.Dataset:
    from db import StudyRepository

    (image,) = StudyRepository(clinic.db).images(study_id)
    return pydicom.dcmread(clinic.settings.storage_dir / image.dicom_path)


@pytest.mark.slow  # highdicom's first SR takes seconds on a busy machine
def test_a_signed_report_becomes_a_comprehensive_sr_that_reads_back(clinic, tmp_path, capsys):
    import highdicom

    ((original, who),) = phantom_dicoms(clinic.files, 1, seed=4242)
    study_id = clinic.add_study(original)
    out = tmp_path / "export"
    assert main(["export", "sr", str(study_id), str(out)]) == 0, capsys.readouterr().err
    assert "1 DICOM SR file(s) written" in capsys.readouterr().out
    data = (out / f"study-{study_id}.dcm").read_bytes()

    ds = pydicom.dcmread(io.BytesIO(data))
    sr = highdicom.sr.ComprehensiveSR.from_dataset(ds)
    image = _stored_image(clinic, study_id)
    assert ds.SOPClassUID == ComprehensiveSRStorage and ds.Modality == "SR"
    assert (sr.StudyInstanceUID, sr.PatientID, sr.PatientName) == (
        image.StudyInstanceUID,
        image.PatientID,
        image.PatientName,
    )
    assert sr.CompletionFlag == "COMPLETE" and sr.VerificationFlag == "VERIFIED" and sr.PreliminaryFlag == "FINAL"
    assert sr.ContentTemplateSequence[0].TemplateIdentifier == "2000" and sr.PatientIdentityRemoved == "YES"
    # The de-identified (shifted) study date, never the real day of signing, which would give the shift away.
    assert ds.ContentDate == image.StudyDate and ds.VerifyingObserverSequence[0].VerificationDateTime.startswith(
        image.StudyDate
    )
    assert (
        sr.CurrentRequestedProcedureEvidenceSequence[0]
        .ReferencedSeriesSequence[0]
        .ReferencedSOPSequence[0]
        .ReferencedSOPInstanceUID
        == image.SOPInstanceUID
    )

    report = read_report_sr(data)
    assert (
        report.findings.startswith("Mild cardiomegaly.")
        and report.impression == "Cardiomegaly with a small left effusion."
    )
    assert report.reader == "rita" and report.device == f"OraPO model version {clinic.version.id} (starter-v1)"
    assert report.referenced_instances == (image.SOPInstanceUID,) and report.verified and report.final
    assert {(c.scheme, c.value, c.presence, c.laterality) for c in report.coded} == {
        ("SCT", "287272002", "present", None),  # cardiomegaly
        ("SCT", "60046008", "present", "left"),  # pleural effusion
        ("SCT", "36118008", "absent", None),  # pneumothorax
        ("SCT", "46621007", "undetermined", "right"),  # atelectasis
        ("SCT", "26412008", "present", None),  # endotracheal tube
    }  # the enlarged cardiomediastinum has no code and stays in the text

    # Nothing of the original identity: names, ids, dates of birth, accession, institution, UIDs.
    original_ds = pydicom.dcmread(io.BytesIO(original), stop_before_pixels=True)
    for secret in [
        who["PatientName"],
        who["PatientID"],
        who["PatientBirthDate"],
        who["AccessionNumber"],
        who["InstitutionName"],
        who["ReferringPhysicianName"],
        original_ds.StudyInstanceUID,
        original_ds.SOPInstanceUID,
        who["PatientName"].split("^")[0],
    ]:
        assert secret.encode() not in data, secret

    # The same signed report is the same SOP instance (sending it again stores it once).
    assert main(["export", "sr", str(study_id), str(tmp_path / "again")]) == 0
    assert (
        read_report_sr((tmp_path / "again" / f"study-{study_id}.dcm").read_bytes()).sop_instance_uid
        == report.sop_instance_uid
    )


@pytest.mark.slow
def test_a_sentence_the_finding_check_added_and_the_reader_kept_is_named_in_the_sr(clinic, tmp_path):
    """The signed text is the reader's, but a sentence the version's finding check put in the model's draft (read on
    the image, not written by the model) and the reader kept is named as such, in a Comment of the Findings."""
    from app.services.archive.export_sr import study_sr
    from orapo_core.imaging.report_sr import ADDED_NOTE

    kept, dropped = "Small left pneumothorax.", "Healing right rib fracture."
    (one, _), (two, _) = phantom_dicoms(clinic.files, 2, seed=4244)
    checked = clinic.add_study(
        one,
        report=REPORT.replace("Impression:", f"{kept}\nImpression:"),
        draft=f"Findings: Clear. {kept} {dropped}\nImpression: {kept}",
        added=(kept, dropped),
    )
    report = read_report_sr(data := study_sr(clinic.db, clinic.settings, checked).data)
    assert report.added == (kept,) and kept in report.findings  # the one the reader deleted is not in the report
    comments = [
        item.TextValue
        for item in pydicom.dcmread(io.BytesIO(data)).ContentSequence[-2].ContentSequence
        if item.ValueType == "TEXT" and item.ConceptNameCodeSequence[0].CodeValue == "121106"
    ]
    assert comments == [ADDED_NOTE + kept] and "not written by the model" in ADDED_NOTE
    assert read_report_sr(study_sr(clinic.db, clinic.settings, clinic.add_study(two)).data).added == ()


@pytest.mark.slow
@pytest.mark.skipif(
    not (shutil.which("dciodvfy") or shutil.which("dsrdump")),
    reason="neither dicom3tools' dciodvfy nor DCMTK's dsrdump is installed (apt-get install dicom3tools dcmtk)",
)
def test_the_sr_passes_the_iod_checkers_of_dicom3tools_and_dcmtk(clinic, tmp_path):
    from app.services.archive.export_sr import study_sr

    ((original, _),) = phantom_dicoms(clinic.files, 1, seed=4243)
    path = tmp_path / "report.dcm"
    path.write_bytes(study_sr(clinic.db, clinic.settings, clinic.add_study(original)).data)
    if shutil.which("dciodvfy"):  # the IOD verifier: errors are "Error - ..." lines
        result = subprocess.run(["dciodvfy", str(path)], capture_output=True, text=True)
        assert "ComprehensiveSR" in result.stderr and "Error" not in result.stderr, result.stderr
    if shutil.which("dsrdump"):  # DCMTK checks the SR's relationship constraints while it reads the tree
        result = subprocess.run(["dsrdump", str(path)], capture_output=True, text=True)
        assert result.returncode == 0 and "E:" not in result.stderr, result.stderr
        assert '<contains CODE:(,,"Finding")=(287272002,SCT,"Cardiomegaly")>' in result.stdout


@pytest.mark.slow
def test_export_all_skips_what_cannot_be_an_sr_and_says_why(clinic, tmp_path, capsys):
    from db import StudyRepository
    from tests.support.app import phantom_png

    (first, _), (second, _) = phantom_dicoms(clinic.files, 2, seed=4244)
    signed = clinic.add_study(first)
    unsigned = clinic.add_study(second, signed=False)
    png = clinic.add_study(phantom_png(tmp_path / "chest.png", seed=5).read_bytes(), "chest.png")
    no_dicom = StudyRepository(clinic.db).create("2.25.1234", "ANON-X").id  # an image row without its DICOM
    StudyRepository(clinic.db).add_image(no_dicom, display_path="seed/x.png", width=8, height=8, source_format="png")
    from db import CorrectionRepository

    CorrectionRepository(clinic.db).create(no_dicom, author_id=clinic.rita.id, text=REPORT, signed=True)

    out = tmp_path / "all"
    assert main(["export", "sr", "--all", str(out)]) == 1, capsys.readouterr().err  # 1: a study was skipped
    assert sorted(p.name for p in out.glob("*.dcm")) == sorted([f"study-{signed}.dcm", f"study-{png}.dcm"])
    skipped = json.loads((out / "skipped-sr.json").read_text())
    assert [(s["study_id"], s["error"]) for s in skipped] == [(no_dicom, "no_dicom_image")]
    assert "1 study(ies) skipped" in capsys.readouterr().out
    # A PNG upload's secondary capture is referenced too; it has no date to shift, so the SR has the signing day.
    back = read_report_sr((out / f"study-{png}.dcm").read_bytes())
    assert back.referenced_instances == (_stored_image(clinic, png).SOPInstanceUID,)

    assert main(["export", "sr", str(unsigned), str(tmp_path / "one")]) == 2
    assert "no_signed_report" in capsys.readouterr().err
    assert main(["export", "sr", str(tmp_path / "x")]) == 2 and "study_or_all" in capsys.readouterr().err


@pytest.mark.slow
def test_one_study_with_a_header_value_against_its_vr_does_not_stop_the_others(clinic, tmp_path, capsys):
    """A study stored before ingest checked header values (its file holds StudyTime 'QZXTIME', as an old database's
    may) is reported by code and id, never by value or traceback; the others are written and the exit status is 1."""
    from db import StudyRepository
    from tests.support.dicom import set_raw

    studies = [clinic.add_study(data) for data, _ in phantom_dicoms(clinic.files, 3, seed=4246)]
    odd = studies[1]
    (image,) = StudyRepository(clinic.db).images(odd)
    path = clinic.settings.storage_dir / image.dicom_path
    ds = pydicom.dcmread(path)
    set_raw(ds, "StudyTime", "QZXTIME")
    ds.save_as(path, enforce_file_format=True)
    assert b"QZXTIME" in path.read_bytes()

    out = tmp_path / "all"
    assert main(["export", "sr", "--all", str(out)]) == 1
    printed = capsys.readouterr()
    assert sorted(p.name for p in out.glob("*.dcm")) == sorted(f"study-{s}.dcm" for s in studies if s != odd)
    assert [(s["study_id"], s["error"]) for s in json.loads((out / "skipped-sr.json").read_text())] == [
        (odd, "sr_unwritable")
    ]
    assert "2 DICOM SR file(s) written" in printed.out
    assert [line for line in printed.out.splitlines() if "sr_unwritable" in line] == [
        line for line in printed.out.splitlines() if line.startswith(f"  study {odd}: sr_unwritable: ")
    ]
    assert "QZXTIME" not in printed.out + printed.err + (out / "skipped-sr.json").read_text()
    assert "Traceback" not in printed.out + printed.err


def test_coded_findings_follow_the_labelers_aggregation() -> None:
    text = (
        "Findings: No pleural effusion on the right. A small left effusion. Possible pneumonia. "
        "Right IJ central line. Support devices unchanged. No fracture.\nImpression: Small left effusion."
    )
    assert coded_findings(text) == [
        CodedFinding("Pleural Effusion", "SCT", "60046008", "Pleural effusion", "present", "left"),
        CodedFinding("Pneumonia", "SCT", "233604007", "Pneumonia", "undetermined", None),
        CodedFinding("Support Devices", "DCM", "112174", "Central line", "present", "right"),
        CodedFinding("Fracture", "SCT", "125605004", "Fracture of bone", "absent", None),
    ]  # "support devices" names no kind, so it has no code of its own


def test_codes_said_to_come_from_ps3_16_are_in_pydicoms_dictionary() -> None:
    from pydicom.sr._concepts_dict import concepts

    from orapo_core.imaging import report_sr

    ps316 = [(s, v, m) for s, v, m, source in FINDING_CODES.values() if source == report_sr._PS316]
    ps316 += list(report_sr._DEVICE_CODES.values()) + list(report_sr._LATERALITY.values())
    known = {(scheme, value) for scheme, names in concepts.items() for entry in names.values() for value in entry}
    assert len(ps316) > 15
    for scheme, value, _ in ps316:
        assert (scheme, value) in known, (scheme, value)
    assert all((s, v) not in known for s, v, _, source in FINDING_CODES.values() if source != report_sr._PS316)
