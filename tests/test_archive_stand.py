"""The test archive `.ci/orthanc.sh` starts is what the archive tests take it to be: a password-protected
Orthanc with DICOMweb on and a DIMSE port open on 127.0.0.1, started by `make test` in CI."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

from tests.support.orthanc import phantom_dicoms

ROOT = Path(__file__).resolve().parents[1]


def test_make_test_starts_the_archive_in_ci_or_on_request() -> None:
    recipe = re.search(r"^test:.*?\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert "$(.ci/orthanc.sh)" in recipe or "$$(.ci/orthanc.sh)" in recipe
    line = next(line for line in recipe.splitlines() if ".ci/orthanc.sh" in line)
    assert '"$${CI:-}" = "true"' in line and "ORAPO_TEST_ORTHANC" in line
    assert "ORAPO_TEST_ORTHANC_URL=" in recipe and ".ci/postgres.sh" in recipe and ".ci/chromium.sh" in recipe
    script = (ROOT / ".ci" / "orthanc.sh").read_text()
    for setting in ('"AuthenticationEnabled": true', '"RemoteAccessAllowed": false', "libOrthancDicomWeb.so"):
        assert setting in script


def test_the_archive_wants_its_password_and_answers_dicomweb(orthanc, tmp_path) -> None:
    ((data, who),) = phantom_dicoms(tmp_path, 1, seed=9101)
    study_uid = _study_uid(data)
    orthanc.upload(data)
    try:
        status, _ = orthanc.request("GET", f"dicom-web/studies?StudyInstanceUID={study_uid}", auth=False)
        assert status == 401
        status, body = orthanc.request("GET", f"dicom-web/studies?StudyInstanceUID={study_uid}")
        assert status == 200
        (found,) = json.loads(body)
        assert found["0020000D"]["Value"] == [study_uid]
        assert found["00100010"]["Value"][0]["Alphabetic"] == who["PatientName"]  # the archive holds the fake PHI
    finally:
        orthanc.delete_study(study_uid)
    assert orthanc.find_study(study_uid) is None


def test_the_archive_listens_for_dimse_on_localhost(orthanc) -> None:
    host, port, aet = orthanc.dimse
    assert aet == "ORTHANC" and port != int(orthanc.url.rsplit(":", 1)[1].strip("/"))
    with socket.create_connection((host, port), timeout=5):
        pass


def _study_uid(data: bytes) -> str:
    import io

    import pydicom

    return str(pydicom.dcmread(io.BytesIO(data), stop_before_pixels=True).StudyInstanceUID)
