"""The viewer's routes over HTTP: the 16-bit pixels go to the study's reader only, the script to a session.

rita uploads RG1_UNCI.dcm; omar, another radiologist, asks for its pixels and its server rendering by their
addresses and is refused; boss, an administrator, may read it; without a session nothing answers but 401.
"""

from __future__ import annotations

import contextlib
import json
import shutil

import numpy as np
import pytest

from tests.support.app import launched_app, make_env
from tests.support.dicom import pydicom_data_file


@contextlib.contextmanager
def http_as(url: str, username: str | None = None, password: str | None = None):
    """An HTTP client signed in as `username` (or with no session at all)."""
    import httpx

    with httpx.Client(base_url=url, timeout=30) as http:
        if username:
            assert http.post("/login", data={"username": username, "password": password}).status_code == 200
        yield http


@pytest.mark.parametrize(
    "values,dtype",
    [
        (np.array([[0, 4095], [31964, 17]], dtype=np.uint16), "uint16"),
        (np.array([[0, 4095], [31964, 17]], dtype=np.int32), "uint16"),  # a modality LUT's int32, still 16-bit values
        (np.array([[-1024, 3071], [0, 17]], dtype=np.int32), "int16"),  # CT-like, rescaled below zero
        (np.array([[-1, 70000], [0, 17]], dtype=np.int32), "float32"),  # beyond 16 bits: exact as float32 still
        (np.array([[0, 255], [7, 17]], dtype=np.uint8), "uint8"),
        (np.array([[0.5, 2.25], [-3.0, 17.0]], dtype=np.float64), "float32"),  # a rescale slope of 0.5
    ],
)
def test_the_wire_type_holds_every_value_exactly(values, dtype):
    from app.services.reading.viewer import _wire_array

    wire = _wire_array(values)
    assert wire.dtype.name == dtype and wire.dtype.byteorder in "<|="
    assert np.array_equal(wire.astype(np.float64), values.astype(np.float64))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from app.services.reading import drafting
    from db import UserRepository

    tmp = tmp_path_factory.mktemp("viewer-routes")
    settings, db = make_env(tmp)
    upload = tmp / "upload" / "RG1_UNCI.dcm"
    upload.parent.mkdir()
    shutil.copy(pydicom_data_file("RG1_UNCI.dcm"), upload)
    outcome = drafting.ingest_upload(db, settings, UserRepository(db).get_by_username("rita"), upload)
    assert outcome.ok, outcome.message
    image = drafting.first_image(drafting.open_study(db, UserRepository(db).get_by_username("rita"), outcome.study_id))
    with launched_app(settings, db) as (url, _):
        yield url, settings, outcome.study_id, image.id


@pytest.mark.slow  # a live server
def test_the_reader_gets_the_full_bit_depth_pixels(served):
    from app.viewer_routes import pixels_url

    url, settings, study_id, image_id = served
    with http_as(url, "rita", "rita-pass-1") as rita:
        response = rita.get(pixels_url(study_id, image_id))
    assert response.status_code == 200 and response.headers["cache-control"] == "no-store"
    meta = json.loads(response.headers["x-orapo-image"])
    pixels = np.frombuffer(response.content, dtype="<u2").reshape(meta["rows"], meta["columns"])
    assert (meta["dtype"], pixels.shape, meta["bits_stored"]) == ("uint16", (1955, 1841), 15)
    assert pixels.max() > 4095 and [pixels.min(), pixels.max()] == meta["range"]  # 15-bit values, untouched
    assert meta["window"] == [17768.0, 30000.0]  # the file's own window
    assert set(meta["presets"]) == {"lung", "mediastinum", "bone", "default", "full"}


@pytest.mark.slow  # a live server
def test_another_radiologist_cannot_fetch_the_image(served):
    from app.viewer_routes import PREFIX, pixels_url

    url, settings, study_id, image_id = served
    addresses = [
        pixels_url(study_id, image_id),
        f"{PREFIX}/studies/{study_id}/pixels",
        f"{PREFIX}/studies/{study_id}/render.png?preset=lung",
    ]
    with http_as(url, "omar", "omar-pass-1") as omar:
        for address in addresses:
            refused = omar.get(address)
            assert refused.status_code == 403, (address, refused.status_code)
            assert refused.json()["detail"]["error"] == "forbidden" and len(refused.content) < 500
        assert omar.get(f"{PREFIX}/studies/{study_id + 100}/pixels").status_code == 404
    with http_as(url) as anonymous:
        for address in addresses:
            assert anonymous.get(address).status_code == 401
        assert anonymous.get(f"{PREFIX}/assets/orapo-viewer.js").status_code == 401
    with http_as(url, "rita", "rita-pass-1") as rita:
        assert rita.get(pixels_url(study_id, image_id + 1)).status_code == 404  # not this study's image
        assert rita.get(f"{PREFIX}/studies/{study_id}/pixels?image=x").status_code == 404
        png = rita.get(f"{PREFIX}/studies/{study_id}/render.png?preset=bone")
        assert png.status_code == 200 and png.content[:8] == b"\x89PNG\r\n\x1a\n"
        assert rita.get(f"{PREFIX}/studies/{study_id}/render.png?preset=nope").status_code == 404
    with http_as(url, "boss", "admin-pass-1") as boss:  # an administrator reads any study
        assert boss.get(pixels_url(study_id, image_id)).status_code == 200


@pytest.mark.slow  # a live server
def test_the_script_and_its_licences_are_served_to_a_session(served):
    from app.viewer_routes import PREFIX, script_url

    url, *_ = served
    with http_as(url, "omar", "omar-pass-1") as omar:
        script = omar.get(script_url())
        assert script.status_code == 200 and "immutable" in script.headers["cache-control"]
        assert "OrapoViewer" in script.text
        licences = omar.get(f"{PREFIX}/assets/THIRD_PARTY_LICENSES.txt")
        assert licences.status_code == 200 and "@cornerstonejs/core@" in licences.text
        assert omar.get(f"{PREFIX}/assets/package.json").status_code == 404  # nothing but the built assets
        assert omar.get(f"{PREFIX}/assets/..%2F..%2Fserver.py").status_code == 404
