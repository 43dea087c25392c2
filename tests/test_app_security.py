"""The launched app refuses what it must: no session, wrong role, one-time password; and uploads leave no original behind.

These talk to a real server on 127.0.0.1 (a free port) with plain HTTP and with
gradio_client, the way a script or a curious user would, so they test the
routes Gradio exposes, not the buttons the page happens to show.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from tests.support.app import client, launched_app, make_env
from tests.support.dicom import pydicom_data_file

pytestmark = pytest.mark.slow  # a live server

ADMIN_ENDPOINTS = {  # api_name -> arguments
    "/list_users": (),
    "/create_user": ("mallory", "admin"),
    "/disable_user": ("boss",),
    "/enable_user": ("rita",),
    "/reset_password": ("boss",),
    "/audit_log": ("", ""),
    "/set_sr_send": ("on sign",),
    "/send_sr": ("1",),
    "/archive_status": (),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    settings, db = make_env(tmp_path_factory.mktemp("security"))
    with launched_app(settings, db) as (url, demo):
        yield url, settings, db, demo


def test_every_route_refuses_a_request_without_a_session(server):
    import httpx

    url, settings, db, demo = server
    closed = [
        ("GET", "/config"),
        ("GET", "/gradio_api/info"),
        ("GET", "/gradio_api/openapi.json"),
        ("GET", "/gradio_api/heartbeat/abc"),
        ("GET", "/gradio_api/queue/data?session_hash=abc"),
        ("POST", "/gradio_api/queue/join"),
        ("POST", "/gradio_api/call/list_users"),
        ("POST", "/gradio_api/run/list_users"),
        ("POST", "/gradio_api/upload"),
        ("GET", "/gradio_api/upload_progress?upload_id=x"),
        ("GET", f"/gradio_api/file={settings.storage_dir}/x.png"),
        ("GET", "/gradio_api/file/x.png"),
        ("POST", "/gradio_api/cancel"),
        ("GET", "/monitoring"),
        ("POST", "/gradio_api/stream/abc"),
        ("GET", "/gradio_api/user"),
        ("GET", "/gradio_api/token"),
    ]
    with httpx.Client(base_url=url, timeout=10) as http:
        for method, path in closed:
            response = http.request(method, path, cookies={"access-token-unsecure-x": "forged"})
            assert response.status_code == 401, (method, path, response.status_code, response.text[:200])
        page = http.get("/")
        assert page.status_code == 200 and '"auth_required":true' in page.text.replace(" ", "")
        assert "Draft report" not in page.text and "orapo-report" not in page.text  # the sign-in page only
        assert http.post("/login", data={"username": "rita", "password": "wrong-password"}).status_code == 400
        assert http.post("/login", data={"username": "rita", "password": "rita-pass-1"}).status_code == 200
        assert http.get("/config").status_code == 200  # the session cookie now opens it
        assert "Draft report" in http.get("/config").text


def test_a_radiologist_cannot_reach_admin_handlers_by_any_name(server):
    from gradio_client.exceptions import AppError

    from db import AuditRepository, UserRepository

    url, settings, db, demo = server
    rita = client(url, "rita", "rita-pass-1")
    for api_name, args in ADMIN_ENDPOINTS.items():
        with pytest.raises(AppError, match="Only an administrator can do this"):
            rita.predict(*args, api_name=api_name)
    with pytest.raises(AppError, match="Only an administrator"):
        rita.predict("all", "everyone", api_name="/worklist")
    users = {u.username: u for u in UserRepository(db).list()}
    assert set(users) == {"boss", "omar", "rita"} and users["boss"].active and not users["boss"].must_change_password
    assert all(e.actor_name != "rita" for e in AuditRepository(db).query() if not e.action.startswith("auth."))

    boss = client(url, "boss", "admin-pass-1")  # the same handlers work for an administrator
    assert {row[0] for row in boss.predict(api_name="/list_users")["data"]} == {"boss", "omar", "rita"}
    assert boss.predict("", "", api_name="/audit_log")["data"] is not None


def test_one_time_password_allows_only_the_password_change(server):
    from gradio_client.exceptions import AppError

    from db import UserRepository

    url, settings, db, demo = server
    _, password = UserRepository(db).create_with_one_time_password("fresh")
    fresh = client(url, "fresh", password)
    with pytest.raises(AppError, match="one-time password"):
        fresh.predict("all", "mine", api_name="/worklist")
    fresh.predict(password, "fresh-pass-1", "fresh-pass-1", api_name="/change_password")
    assert fresh.predict("all", "mine", api_name="/worklist")["data"] == []


def test_a_disabled_account_loses_its_open_session(server):
    import httpx

    from db import UserRepository

    url, settings, db, demo = server
    UserRepository(db).create("dora", "dora-pass-1")
    dora = client(url, "dora", "dora-pass-1")
    assert dora.predict("all", "mine", api_name="/worklist")["data"] == []
    UserRepository(db).disable("dora")
    with pytest.raises(httpx.HTTPStatusError, match="401 Unauthorized"):  # the session middleware ends it
        dora.predict("all", "mine", api_name="/worklist")


def test_uploads_leave_no_original_in_the_upload_cache(server, tmp_path):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    from app.runtime import server_cache_dir

    url, settings, db, demo = server
    original = tmp_path / "RG1_J2KR.dcm"
    shutil.copy(pydicom_data_file("RG1_J2KR.dcm"), original)
    refused = tmp_path / "notes.png"
    refused.write_bytes(b"this is not an image at all")
    digests = {hashlib.sha256(p.read_bytes()).hexdigest() for p in (original, refused)}

    rita = client(url, "rita", "rita-pass-1")
    result = rita.predict([handle_file(str(original)), handle_file(str(refused))], api_name="/upload_studies")
    summary = result[1]
    assert "Stored **RG1\\_J2KR.dcm**: study" in summary and "Refused **notes.png**: " in summary
    cache = server_cache_dir(settings)
    assert Path(demo.server_app.uploaded_file_dir) == cache  # into this server's folder in the data folder, not /tmp
    left = [p for p in cache.rglob("*") if p.is_file() and hashlib.sha256(p.read_bytes()).hexdigest() in digests]
    assert left == []
    assert not [p for p in cache.rglob("*") if p.name in {"RG1_J2KR.dcm", "notes.png"}]

    study_id = int(summary.split("study ")[1].split()[0].strip("*,"))  # "study 1, new"
    omar = client(url, "omar", "omar-pass-1")
    with pytest.raises(AppError, match="another radiologist"):
        omar.predict(study_id, api_name="/open_study")
    assert any(row[0] == study_id for row in rita.predict("all", "mine", api_name="/worklist")["data"])


def test_exports_leave_nothing_patient_derived_behind(tmp_path):
    """An export is one zip, written into Gradio's cache and served from there as it stands: no working copy
    stays in the data folder, a zip whose download time is up goes at the next export, and closing the
    server leaves none."""
    import os
    import time
    import zipfile

    import httpx

    from app.services.operations.export_downloads import DOWNLOAD_RETENTION_S, downloads_dir
    from db import UserRepository
    from orapo_core.data import load_dataset
    from orapo_core.data.phantom import write_dataset
    from tests.support.rounds import seed_study

    settings, db = make_env(tmp_path)
    write_dataset(tmp_path / "phantom", 1, seed=3, size=64)
    seed_study(db, settings, load_dataset(tmp_path / "phantom")[0], author=UserRepository(db).get_by_username("rita"))
    data = settings.resolved_data_dir

    def files() -> set[Path]:
        return {p for p in data.rglob("*") if p.is_file() and not p.name.startswith("orapo.sqlite3")}

    with launched_app(settings, db) as (url, demo):
        before = files()
        boss = client(url, "boss", "admin-pass-1")
        _, pairs = boss.predict(["trl-dpo", "trl-grpo"], api_name="/export_pairs")
        _, fhir = boss.predict(api_name="/export_fhir")
        pairs_zip, fhir_zip = Path(pairs["path"]), Path(fhir["path"])
        assert files() - before == {pairs_zip, fhir_zip}  # no export folder, no second copy made by Gradio
        assert pairs_zip.parent.parent == fhir_zip.parent.parent == downloads_dir(settings)
        assert pairs_zip.parent != fhir_zip.parent and len(pairs_zip.parent.name) >= 32  # a folder nobody guesses

        with httpx.Client(base_url=url, timeout=30) as http:
            assert http.post("/login", data={"username": "boss", "password": "admin-pass-1"}).status_code == 200
            response = http.get(pairs["url"])
            assert response.status_code == 200 and response.content == pairs_zip.read_bytes()
        with httpx.Client(base_url=url, timeout=30) as http:  # Gradio serves cached files to any session
            assert http.post("/login", data={"username": "rita", "password": "rita-pass-1"}).status_code == 200
            assert http.get(pairs["url"]).status_code == 403
            sneaky = pairs["url"].replace("/exports/", "/exports/../exports/")
            assert http.get(sneaky).status_code == 403
        with zipfile.ZipFile(pairs_zip) as archive:
            assert {"trl-dpo/dataset_info.json", "trl-grpo/dataset_info.json"} <= set(archive.namelist())

        expired = time.time() - DOWNLOAD_RETENTION_S - 60
        for path in (pairs_zip, pairs_zip.parent):
            os.utime(path, (expired, expired))
        _, again = boss.predict(api_name="/export_fhir")
        assert not pairs_zip.parent.exists() and fhir_zip.is_file() and Path(again["path"]).is_file()
    assert not [p for p in downloads_dir(settings).rglob("*") if p.is_file()]  # Gradio's sweep at close


def test_the_api_description_and_call_counts_are_an_administrators(server):
    """D9: the sign-in page described all 36 endpoints (admin ones too) to anyone, and `/monitoring/summary` gave any
    radiologist every function's call counts."""
    import json
    import re

    import httpx

    url, settings, db, demo = server

    def embedded(page: str) -> dict:
        found = re.search(r"window\.gradio_api_info = (.*?);</script>", page, re.S)
        assert found is not None
        return json.loads(found.group(1))

    with httpx.Client(base_url=url, timeout=30) as anonymous:
        assert embedded(anonymous.get("/").text)["named_endpoints"] == {}
    seen = {}
    for name, password in (("rita", "rita-pass-1"), ("boss", "admin-pass-1")):
        with httpx.Client(base_url=url, timeout=30, headers={"Origin": url}) as http:
            assert http.post("/login", data={"username": name, "password": password}).status_code == 200
            info = set(http.get("/gradio_api/info").json()["named_endpoints"])
            assert set(embedded(http.get("/").text)["named_endpoints"]) == info
            seen[name] = (
                info,
                http.get("/monitoring/summary").status_code,
                http.get("/gradio_api/openapi.json").status_code,
            )
    admin_only = set(ADMIN_ENDPOINTS) | {"/start_round", "/promote_version", "/rollback_version"}
    rita, boss = seen["rita"], seen["boss"]
    assert admin_only <= boss[0] and not admin_only & rita[0]
    assert {"/upload_studies", "/draft_report", "/sign_report", "/open_study"} <= rita[0]
    assert rita[1:] == (403, 403) and boss[1] != 403
