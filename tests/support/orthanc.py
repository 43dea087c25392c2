"""The test archive: a real Orthanc (DICOMweb and DIMSE) that `.ci/orthanc.sh` starts on 127.0.0.1.

`make test` sets ORAPO_TEST_ORTHANC_URL (`http://user:password@127.0.0.1:port/`)
in CI (CI=true) or with ORAPO_TEST_ORTHANC=1; `ORAPO_TEST_ORTHANC_URL=$(.ci/orthanc.sh)`
does the same by hand. Tests that use the `orthanc` fixture (tests/conftest.py)
are skipped with a reason without it, except in CI, where they fail: there the
archive is part of the suite. A set URL with no server behind it fails loudly,
never as a skip.

Orthanc's own REST API (not DICOMweb) is how a test puts studies into the archive
and takes them out again, so the product's DICOMweb code is never its own witness.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

ORTHANC_URL = os.environ.get("ORAPO_TEST_ORTHANC_URL", "").strip()


@dataclass(frozen=True)
class Orthanc:
    """One running Orthanc: its base URL without credentials, the credentials, and its DIMSE address."""

    url: str  # http://127.0.0.1:PORT/
    user: str
    password: str

    @classmethod
    def from_url(cls, url_with_credentials: str) -> Orthanc:
        parts = urlsplit(url_with_credentials)
        netloc = f"{parts.hostname}:{parts.port}"
        base = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + "/", "", ""))
        return cls(base, parts.username or "", parts.password or "")

    @property
    def dicomweb_url(self) -> str:
        return self.url + "dicom-web"

    def request(
        self, method: str, path: str, body: bytes | None = None, *, content_type: str | None = None, auth: bool = True
    ) -> tuple[int, bytes]:
        """(status, body) of one REST call; HTTP errors are returned, not raised."""
        req = urllib.request.Request(self.url + path.lstrip("/"), data=body, method=method)
        if auth:
            token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        if content_type:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=30) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def json(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        status, payload = self.request(method, path, data, content_type="application/json" if data else None)
        assert 200 <= status < 300, f"Orthanc {method} {path}: HTTP {status} {payload[:300]!r}"
        return json.loads(payload) if payload else None

    def system(self) -> dict[str, Any]:
        return self.json("GET", "system")

    @property
    def dimse(self) -> tuple[str, int, str]:
        """(host, port, AE title) of Orthanc's DICOM server."""
        system = self.system()
        return "127.0.0.1", int(system["DicomPort"]), str(system["DicomAet"])

    def upload(self, dicom: bytes) -> dict[str, Any]:
        """Store one DICOM file through Orthanc's REST API; its answer (ID, ParentStudy, ...)."""
        status, payload = self.request("POST", "instances", dicom, content_type="application/dicom")
        assert status == 200, f"Orthanc refused the upload: HTTP {status} {payload[:300]!r}"
        return json.loads(payload)

    def find_study(self, study_uid: str) -> str | None:
        """Orthanc's id of the study with this StudyInstanceUID, or None."""
        status, payload = self.request("POST", "tools/lookup", study_uid.encode(), content_type="text/plain")
        assert status == 200, payload
        found = [item["ID"] for item in json.loads(payload) if item["Type"] == "Study"]
        return found[0] if found else None

    def delete_study(self, study_uid: str) -> None:
        orthanc_id = self.find_study(study_uid)
        if orthanc_id is not None:
            self.json("DELETE", f"studies/{orthanc_id}")


def require_orthanc() -> Orthanc:
    """The configured Orthanc, answering; skips the caller without one, except in CI (CI=true)."""
    if not ORTHANC_URL:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but ORAPO_TEST_ORTHANC_URL is not set: `make test` sets it from .ci/orthanc.sh.")
        pytest.skip(
            "no test archive: set ORAPO_TEST_ORTHANC_URL=$(.ci/orthanc.sh) (Debian's orthanc and "
            "orthanc-dicomweb), or run `make test` with ORAPO_TEST_ORTHANC=1; in CI this test runs."
        )
    orthanc = Orthanc.from_url(ORTHANC_URL)
    status, payload = orthanc.request("GET", "system")  # a URL with no server behind it fails here, loudly
    assert status == 200, f"ORAPO_TEST_ORTHANC_URL is set but Orthanc answered HTTP {status}: {payload[:200]!r}"
    return orthanc


def phantom_dicoms(folder, count: int, *, seed: int, size: int = 96) -> list[tuple[bytes, dict[str, str]]]:
    """`count` PhantomCXR CR files with their obviously fake identities (PHI for the de-identification to strip)."""
    from pathlib import Path

    import numpy as np

    from orapo_core.data.phantom_io import write_dicom

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    made = []
    for index in range(count):
        path = folder / f"phantom-{seed}-{index}.dcm"
        who = write_dicom(path, np.random.default_rng([seed, index]).random((size, size)), "PA", seed=seed, index=index)
        made.append((path.read_bytes(), who))
        path.unlink()  # the originals carry (fake) PHI: they live in memory only, like an archive's
    return made
