"""`orapo pacs search|pull` and `orapo export sr --send` against a real archive (Orthanc, .ci/orthanc.sh): studies
come in over WADO-RS de-identified, with no trace of their identity in the data folder, and signed reports go back
over STOW-RS where a QIDO search finds them. Settings and dates are checked without an archive."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pydicom
import pytest

from app.cli import main
from app.services.archive.pacs import archive_settings, dicom_date_range
from orapo_core.errors import OrapoError
from tests.support.app import free_port
from tests.support.orthanc import phantom_dicoms

# --- without an archive ----------------------------------------------------------------------------------------


def test_archive_settings_come_from_the_environment() -> None:
    assert archive_settings({}) is None
    s = archive_settings({"ORAPO_DICOMWEB_URL": "https://ann:pw@pacs.example.org:8443/dicom-web/"})
    assert (s.url, s.user, s.password, s.token) == ("https://pacs.example.org:8443/dicom-web", "ann", "pw", None)
    assert "pw" not in repr(s)
    s = archive_settings(
        {
            "ORAPO_DICOMWEB_URL": "http://pacs/dicom-web",
            "ORAPO_DICOMWEB_USER": "u",
            "ORAPO_DICOMWEB_PASSWORD": "p",
            "ORAPO_DICOMWEB_TOKEN": "t0k",
        }
    )
    assert (s.url, s.user, s.password, s.token) == ("http://pacs/dicom-web", "u", "p", "t0k")
    with pytest.raises(OrapoError) as exc:
        archive_settings({"ORAPO_DICOMWEB_URL": "dicom://pacs:104"})
    assert exc.value.code == "invalid_archive_url"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2024-05-31", "20240531"),
        ("20240531", "20240531"),
        ("2024-05-01..2024-05-31", "20240501-20240531"),
        ("20240501-20240531", "20240501-20240531"),
        ("2024-05-01..", "20240501-"),
        ("..2024-05-31", "-20240531"),
    ],
)
def test_dates_become_qido_dates(text, expected) -> None:
    assert dicom_date_range(text) == expected


@pytest.mark.parametrize("text", ["yesterday", "2024-13-01", "2024-05-31..2024-05-01", "..", "2024-05-01..x.."])
def test_bad_dates_are_refused(text) -> None:
    with pytest.raises(OrapoError) as exc:
        dicom_date_range(text)
    assert exc.value.code == "invalid_date"


def test_pacs_commands_say_what_is_missing(data_dir, monkeypatch, capsys) -> None:
    monkeypatch.delenv("ORAPO_DICOMWEB_URL", raising=False)
    assert main(["pacs", "search"]) == 2 and "no_archive" in capsys.readouterr().err
    monkeypatch.setenv("ORAPO_DICOMWEB_URL", f"http://127.0.0.1:{free_port()}/dicom-web")  # nothing listens there
    monkeypatch.setenv("ORAPO_DICOMWEB_ATTEMPTS", "1")  # not four more tries over 30 s
    assert main(["pacs", "search"]) == 2 and "archive_unreachable" in capsys.readouterr().err
    assert main(["pacs", "pull"]) == 2 and "study_or_since" in capsys.readouterr().err


# --- with the archive ------------------------------------------------------------------------------------------


@pytest.fixture
def archive(orthanc, data_dir, monkeypatch, tmp_path):
    """The test archive as ORAPO_DICOMWEB_URL, holding two phantom studies with fake identities (removed after)."""
    monkeypatch.setenv("ORAPO_DICOMWEB_URL", orthanc.dicomweb_url)
    monkeypatch.setenv("ORAPO_DICOMWEB_USER", orthanc.user)
    monkeypatch.setenv("ORAPO_DICOMWEB_PASSWORD", orthanc.password)
    studies = []
    for data, who in phantom_dicoms(tmp_path / "phantoms", 2, seed=7301):
        ds = pydicom.dcmread(io.BytesIO(data), stop_before_pixels=True)
        orthanc.upload(data)
        studies.append(
            type(
                "ArchivedStudy",
                (),
                dict(
                    uid=str(ds.StudyInstanceUID),
                    who=who,
                    date=str(ds.StudyDate),
                    sop=str(ds.SOPInstanceUID),
                    original=data,
                ),
            )
        )
    removed = [s.uid for s in studies]
    yield type("Archive", (), dict(orthanc=orthanc, studies=studies, data_dir=data_dir, removed=removed))
    for uid in removed:
        orthanc.delete_study(uid)


def _search(capsys, *args) -> dict[str, dict]:
    capsys.readouterr()
    assert main(["pacs", "search", "--json", *args]) == 0, capsys.readouterr().err
    return {row["study_uid"]: row for row in map(json.loads, capsys.readouterr().out.splitlines())}


def _phi(study) -> list[str]:
    who = study.who
    return [
        who["PatientName"],
        who["PatientName"].split("^")[0],
        who["PatientID"],
        who["PatientBirthDate"],
        who["AccessionNumber"],
        who["InstitutionName"],
        who["InstitutionAddress"],
        who["ReferringPhysicianName"],
        who["OperatorsName"],
        who["StationName"],
        study.uid,
        study.sop,
    ]


def _data_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


@pytest.mark.slow
def test_studies_are_pulled_de_identified_and_known_as_imported(archive, capsys) -> None:
    first, second = archive.studies
    listed = _search(capsys)
    assert {first.uid, second.uid} <= set(listed)
    row = listed[first.uid]
    assert row["modalities"] == ["CR"] and row["date"] == first.date and row["imported_study_id"] is None
    assert row["accession"] == first.who["AccessionNumber"] and row["instances"] == 1
    assert set(_search(capsys, "--accession", second.who["AccessionNumber"])) == {second.uid}
    assert first.uid not in _search(capsys, "--modality", "DX")

    assert main(["pacs", "pull", first.uid, "--json"]) == 0, capsys.readouterr().err
    (line,) = capsys.readouterr().out.splitlines()
    pulled = json.loads(line)
    assert pulled["ok"] and pulled["archive_study"] == first.uid and pulled["study_id"]
    assert _search(capsys)[first.uid]["imported_study_id"] == pulled["study_id"]
    assert main(["pacs", "pull", first.uid]) == 0 and "(already stored)" in capsys.readouterr().out

    later = max(first.date, second.date)
    assert main(["pacs", "pull", "--since", f"{later[:4]}-{later[4:6]}-{later[6:]}"]) == 0, capsys.readouterr().err
    assert all(_search(capsys)[s.uid]["imported_study_id"] for s in archive.studies if s.date >= later)

    stored = _data_bytes(archive.data_dir)
    assert b"DICM" in stored and b"ANON^" in stored  # the de-identified studies are there, under their pseudonyms
    for study in archive.studies:
        for secret in _phi(study):
            assert secret.encode() in study.original  # what the archive holds, so the grep below can find it
            assert secret.encode() not in stored, f"{secret!r} reached the data folder"


@pytest.mark.slow
def test_a_signed_report_goes_back_into_the_archives_own_study(archive, tmp_path, capsys) -> None:
    """A study pulled from the archive: its SR is filed in the archive's study, beside the images it was read from,
    under the patient's real identity; what is written to disk stays the de-identified SR."""
    from app.runtime import open_database
    from db import CorrectionRepository, DraftRepository, StudyRepository, UserRepository
    from orapo_core.config import Settings
    from orapo_core.imaging.report_sr import read_report_sr

    study = archive.studies[0]
    assert main(["pacs", "pull", study.uid]) == 0, capsys.readouterr().err
    db = open_database(Settings())
    ((overview,),) = [StudyRepository(db).list(limit=10)]
    rita = UserRepository(db).create("rita", "rita-pass-1")
    draft = DraftRepository(db).create(
        overview.study.id, model_name="starter", prompt="p", text="Findings: Clear.\nImpression: Normal."
    )
    CorrectionRepository(db).create(
        overview.study.id,
        author_id=rita.id,
        draft_id=draft.id,
        signed=True,
        text="Findings: Small right pleural effusion.\nImpression: Right effusion.",
    )
    deid_uid = overview.study.study_uid_hash
    archive.removed.append(deid_uid)

    out = tmp_path / "sr"
    assert main(["export", "sr", str(overview.study.id), str(out), "--send"]) == 0, capsys.readouterr().err
    assert "1 stored in" in capsys.readouterr().out
    written = read_report_sr((out / f"study-{overview.study.id}.dcm").read_bytes())
    written_bytes = (out / f"study-{overview.study.id}.dcm").read_bytes()
    for secret in _phi(study):
        assert secret.encode() not in written_bytes, f"{secret!r} reached the SR written to disk"

    # The archive's own QIDO-RS (read here with plain HTTP, not the product's client) finds it in the
    # archive's study, and nothing in a study of the de-identified UID.
    orthanc = archive.orthanc
    status, body = orthanc.request("GET", f"dicom-web/studies/{study.uid}/series?Modality=SR")
    assert status == 200, body
    (series,) = json.loads(body)
    series_uid = series["0020000E"]["Value"][0]
    status, body = orthanc.request("GET", f"dicom-web/studies/{study.uid}/series/{series_uid}/instances")
    (instance,) = json.loads(body)
    sop = instance["00080018"]["Value"][0]
    assert sop != written.sop_instance_uid  # the de-identified SR on disk is another document
    assert orthanc.find_study(deid_uid) is None
    status, body = orthanc.request("GET", f"dicom-web/studies/{study.uid}/series/{series_uid}/instances/{sop}")
    assert status == 200
    stored = pydicom.dcmread(io.BytesIO(body[body.index(b"DICM") - 128 :]))
    assert str(stored.PatientID) == study.who["PatientID"] and str(stored.PatientName) == study.who["PatientName"]
    assert str(stored.AccessionNumber) == study.who["AccessionNumber"]
    assert "PatientIdentityRemoved" not in stored
    sent = read_report_sr(body[body.index(b"DICM") - 128 :])
    assert sent.findings == "Small right pleural effusion." and sent.referenced_instances == (study.sop,)

    # Sending the same signed report again stores it once; and the data folder still holds no identity.
    assert main(["export", "sr", str(overview.study.id), str(tmp_path / "again"), "--send"]) == 0
    status, body = orthanc.request("GET", f"dicom-web/studies/{study.uid}/series/{series_uid}/instances")
    assert len(json.loads(body)) == 1
    stored_here = _data_bytes(archive.data_dir) + _data_bytes(out)
    for secret in _phi(study):
        assert secret.encode() not in stored_here, f"{secret!r} reached the disk"


@pytest.mark.slow
def test_a_study_gone_from_the_archive_is_not_sent_and_says_why(archive, tmp_path, capsys) -> None:
    from app.runtime import open_database
    from db import CorrectionRepository, StudyRepository, UserRepository
    from orapo_core.config import Settings

    study = archive.studies[1]
    assert main(["pacs", "pull", study.uid]) == 0, capsys.readouterr().err
    db = open_database(Settings())
    ((overview,),) = [StudyRepository(db).list(limit=10)]
    rita = UserRepository(db).create("rita", "rita-pass-1")
    CorrectionRepository(db).create(
        overview.study.id, author_id=rita.id, signed=True, text="Findings: Clear lungs.\nImpression: Normal."
    )
    archive.orthanc.delete_study(study.uid)
    capsys.readouterr()
    assert main(["export", "sr", str(overview.study.id), str(tmp_path / "sr"), "--send"]) == 1
    out = capsys.readouterr().out
    assert "1 DICOM SR file(s) written" in out and "0 stored in" in out
    assert "archive_study_not_found" in out and "no longer has the study" in out


@pytest.mark.slow
def test_a_wrong_password_is_said_plainly(archive, monkeypatch, capsys) -> None:
    monkeypatch.setenv("ORAPO_DICOMWEB_PASSWORD", "not-the-password")
    assert main(["pacs", "search"]) == 2
    err = capsys.readouterr().err
    assert "archive_auth" in err and "not-the-password" not in err
