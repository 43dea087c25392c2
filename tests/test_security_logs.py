"""The server's log holds no patient data: after PHI-laden uploads and refused calls, no file name, header value or
traceback is in it, and each refusal is one line with its code.

Before, a refused concurrent upload logged its original file name inside a traceback, and refused calls of a script
(gradio_client) wrote a full traceback each (Gradio prints one for every `gr.Error` unless told not to).
"""

from __future__ import annotations

import logging
import threading

import pytest

from tests.support.app import client, launched_app, make_env
from tests.support.dicom import dicom_bytes, image_dataset, set_raw

pytestmark = pytest.mark.slow  # a live server

PHI = ["Quackenbush", "Philomena", "MRN-7731904", "ACC-44012", "19290314", "Zanzibar Ward", "Lighthouse Clinic"]


def phi_file(folder, name: str, *, broken: bool = False):
    ds = image_dataset()
    ds.PatientName, ds.PatientID, ds.PatientBirthDate = "Quackenbush^Philomena", "MRN-7731904", "19290314"
    ds.AccessionNumber, ds.InstitutionName = "ACC-44012", "Lighthouse Clinic"
    ds.StudyDescription, ds.InstitutionalDepartmentName = "Chest for Quackenbush", "Zanzibar Ward"
    set_raw(ds, "StudyTime", "Quackenbush")  # against its VR: pydicom used to warn quoting it
    set_raw(ds, "PatientAge", "MRN-7731904")
    set_raw(ds, "SeriesNumber", "Zanzibar Ward")  # an IS pydicom quoted in a warning and its log
    data = dicom_bytes(ds)
    path = folder / name
    path.write_bytes(data[: len(data) // 2] if broken else data)  # cut short: refused after its header is read
    return path


def test_phi_laden_uploads_and_refusals_leave_no_patient_data_in_the_log(tmp_path, capfd, caplog, recwarn):
    from gradio_client import handle_file

    caplog.set_level(logging.INFO)
    settings, db = make_env(tmp_path)
    names = ["Quackenbush_Philomena_MRN-7731904.dcm", "Zanzibar_Ward_ACC-44012.dcm"]
    good = phi_file(tmp_path, names[0])
    broken = phi_file(tmp_path, names[1], broken=True)
    text = tmp_path / "Lighthouse_Clinic_19290314.png"
    text.write_bytes(b"not an image, whatever its name says")
    capfd.readouterr()  # what writing the test files said (pydicom warns, quoting a value it is asked to write)
    caplog.clear()
    recwarn.clear()
    with launched_app(settings, db) as (url, demo):
        rita = client(url, "rita", "rita-pass-1")
        summary = rita.predict(
            [handle_file(str(good)), handle_file(str(broken)), handle_file(str(text))], api_name="/upload_studies"
        )[1]
        assert "Stored" in summary and summary.count("Refused") == 2, summary  # the reader is told, by name

        # the same PHI-laden file from four clients at once (the race that used to log a traceback)
        readers = [client(url, "rita", "rita-pass-1") for _ in range(4)]
        threads = [
            threading.Thread(target=r.predict, args=([handle_file(str(good))],), kwargs={"api_name": "/upload_studies"})
            for r in readers
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)

        # refused calls of a script: an admin call, and a study that does not exist
        for api_name, args in (("/create_user", ("mallory", "admin")), ("/open_study", ("99999",))):
            with pytest.raises(Exception):  # noqa: B017 - whatever the client raises for a refused call
                rita.predict(*args, api_name=api_name)
    out, err = capfd.readouterr()
    # a Python warning reaches a server's stderr (pytest collects them instead, so they are read here)
    logged = "\n".join([out, err, caplog.text, *(str(w.message) for w in recwarn)])
    assert [s for s in PHI + names + [text.name] if s in logged] == []
    assert "Traceback" not in logged
    refusals = [r.getMessage() for r in caplog.records if "refused:" in r.getMessage()]
    assert len(refusals) >= 2 and all("\n" not in line for line in refusals), refusals  # one line each, with its code
