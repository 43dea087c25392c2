"""Signed reports back to the archive as SRs, by the admin's setting (off / on sign / manual): signing sends in the
background and never waits for or fails because of the archive; every send is audited and the last one is shown.
Against the test Orthanc (.ci/orthanc.sh): sign, and the archive's QIDO finds the SR."""

from __future__ import annotations

import json
import threading

import pytest

from orapo_core.errors import OrapoError
from tests.support.app import free_port
from tests.support.orthanc import phantom_dicoms

REPORT = "Findings: Small right pleural effusion.\nImpression: Right effusion."


@pytest.fixture
def clinic(data_dir, tmp_path, monkeypatch):
    """The app's database in ORAPO_DATA_DIR, an admin and a radiologist, and one ingested phantom study."""
    from app.runtime import open_database
    from app.services.reading.ingest import ingest_bytes
    from db import DraftRepository, UserRepository
    from orapo_core.config import Settings

    monkeypatch.delenv("ORAPO_DICOMWEB_URL", raising=False)
    settings = Settings()
    db = open_database(settings)
    boss = UserRepository(db).create("boss", "boss-pass-1", role="admin")
    rita = UserRepository(db).create("rita", "rita-pass-1")
    ((data, _who),) = phantom_dicoms(tmp_path / "phantoms", 1, seed=5151)
    outcome = ingest_bytes(data, "chest.dcm", db=db, settings=settings, user=rita)
    assert outcome.ok, outcome
    draft = DraftRepository(db).create(
        outcome.study_id, model_name="starter", prompt="p", text="Findings: Clear.\nImpression: Normal."
    )
    return type(
        "Clinic",
        (),
        dict(
            db=db, settings=settings, boss=boss, rita=rita, study_id=outcome.study_id, draft_id=draft.id, original=data
        ),
    )


def _sign(clinic):
    """As the Read tab signs: the confirmation's pending report, stored with the app's settings."""
    from app.services.reading.reports import prepare_report, store_report

    pending = prepare_report(clinic.db, clinic.rita, clinic.study_id, clinic.draft_id, REPORT, sign=True)
    return store_report(clinic.db, clinic.rita, pending, REPORT, settings=clinic.settings)


def _join_sends(study_id: int, timeout: float = 120) -> int:
    sends = [t for t in threading.enumerate() if t.name == f"orapo-sr-send-{study_id}"]
    for thread in sends:
        thread.join(timeout)
        assert not thread.is_alive()
    return len(sends)


def test_the_setting_is_an_admins_and_starts_off(clinic) -> None:
    from app.services.archive import sr_send
    from db import AuditRepository

    assert sr_send.sr_send_mode(clinic.db) == "off"
    with pytest.raises(OrapoError) as exc:
        sr_send.set_sr_send_mode(clinic.db, clinic.rita, "on_sign")
    assert exc.value.code == "forbidden"
    with pytest.raises(OrapoError) as exc:
        sr_send.set_sr_send_mode(clinic.db, clinic.boss, "sometimes")
    assert exc.value.code == "invalid_sr_send"
    assert sr_send.set_sr_send_mode(clinic.db, clinic.boss, "on sign") == "on_sign"  # the page's label
    assert sr_send.sr_send_mode(clinic.db) == "on_sign"
    (entry,) = AuditRepository(clinic.db).query(action="archive.update")
    assert entry.actor_name == "boss" and entry.details == {"sr_send": "on_sign"}
    assert "No archive is configured" in sr_send.status_markdown(clinic.db)
    assert "none yet" in sr_send.status_markdown(clinic.db)


@pytest.mark.parametrize("mode", ["off", "manual", "on_sign"])
def test_signing_without_an_archive_or_with_another_mode_sends_nothing(clinic, mode) -> None:
    from app.services.archive import sr_send

    sr_send.set_sr_send_mode(clinic.db, clinic.boss, mode)
    record = _sign(clinic)
    assert record.signed_at is not None
    assert _join_sends(clinic.study_id) == 0 and sr_send.last_send(clinic.db) is None


def test_an_unreachable_archive_never_fails_the_signing_and_the_admin_sees_why(clinic, monkeypatch) -> None:
    from app.services.archive import sr_send
    from db import StudyRepository

    monkeypatch.setenv("ORAPO_DICOMWEB_URL", f"http://127.0.0.1:{free_port()}/dicom-web")  # nothing listens there
    monkeypatch.setenv("ORAPO_DICOMWEB_ATTEMPTS", "1")  # not four more tries over 30 s
    sr_send.set_sr_send_mode(clinic.db, clinic.boss, "on_sign")
    record = _sign(clinic)
    assert (
        record.signed_at is not None and StudyRepository(clinic.db).overview(clinic.study_id).study.status == "signed"
    )
    assert _join_sends(clinic.study_id) == 1
    last = sr_send.last_send(clinic.db)
    assert last.action == "sr.send_failed" and last.details["error"] == "archive_unreachable"
    assert last.object_id == str(clinic.study_id) and last.actor_name == "rita"
    status = sr_send.status_markdown(clinic.db)
    assert "**failed**" in status and "archive_unreachable" in status and "on sign" in status

    # A wrong archive URL is audited too, and still never undoes a signature.
    monkeypatch.setenv("ORAPO_DICOMWEB_URL", "dicom://pacs:104")
    from app.services.reading.reports import save_report

    save_report(clinic.db, clinic.rita, clinic.study_id, clinic.draft_id, REPORT + " Stable.", sign=True)
    assert sr_send.last_send(clinic.db).details["error"] == "invalid_archive_url"


def test_send_now_is_for_admins_and_needs_an_archive(clinic) -> None:
    from app.services.archive import sr_send

    with pytest.raises(OrapoError) as exc:
        sr_send.send_now(clinic.db, clinic.settings, clinic.rita, clinic.study_id)
    assert exc.value.code == "forbidden"
    with pytest.raises(OrapoError) as exc:
        sr_send.send_now(clinic.db, clinic.settings, clinic.boss, clinic.study_id)
    assert exc.value.code == "no_archive"


@pytest.mark.slow
def test_signing_sends_the_sr_and_the_archive_finds_it(clinic, orthanc, monkeypatch) -> None:
    from app.services.archive import sr_send
    from db import StudyRepository
    from orapo_core.imaging.report_sr import read_report_sr

    monkeypatch.setenv("ORAPO_DICOMWEB_URL", orthanc.dicomweb_url)
    monkeypatch.setenv("ORAPO_DICOMWEB_USER", orthanc.user)
    monkeypatch.setenv("ORAPO_DICOMWEB_PASSWORD", orthanc.password)
    deid_uid = StudyRepository(clinic.db).overview(clinic.study_id).study.study_uid_hash
    try:
        sr_send.set_sr_send_mode(clinic.db, clinic.boss, "on_sign")
        _sign(clinic)
        assert _join_sends(clinic.study_id) == 1
        last = sr_send.last_send(clinic.db)
        assert last.action == "sr.sent", last.details
        # An uploaded study has no archive study to go back to: its SR is the de-identified one, and says so.
        assert last.details["filed_in"] == "de-identified study"
        assert "as a de-identified study" in sr_send.status_markdown(clinic.db)

        # The archive's own QIDO-RS, read with plain HTTP, finds the SR in the de-identified study.
        status, body = orthanc.request("GET", f"dicom-web/studies/{deid_uid}/series?Modality=SR")
        assert status == 200, body
        (series,) = json.loads(body)
        series_uid = series["0020000E"]["Value"][0]
        status, body = orthanc.request("GET", f"dicom-web/studies/{deid_uid}/series/{series_uid}/instances")
        assert [i["00080018"]["Value"][0] for i in json.loads(body)] == [last.details["sop_instance_uid"]]
        status, body = orthanc.request(
            "GET", f"dicom-web/studies/{deid_uid}/series/{series_uid}/instances/{last.details['sop_instance_uid']}"
        )
        assert (
            status == 200
            and read_report_sr(body[body.index(b"DICM") - 128 :]).findings == "Small right pleural effusion."
        )

        # The manual button sends the same report again: the archive keeps it once.
        assert sr_send.send_now(clinic.db, clinic.settings, clinic.boss, clinic.study_id).ok
        status, body = orthanc.request("GET", f"dicom-web/studies/{deid_uid}/series/{series_uid}/instances")
        assert len(json.loads(body)) == 1
    finally:
        orthanc.delete_study(deid_uid)
