"""What each route hands out, and to whom, against a live server on 127.0.0.1.

The server here runs as behind a TLS proxy (`secure_cookies`) with a 1 MB upload
limit. Its session cookie is Secure, which httpx would not send back over plain
HTTP, so `signed_in` copies the cookie into a fresh client the way gradio_client
does.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from tests.support.app import client, launched_app

pytestmark = pytest.mark.slow  # a live server

MAX_UPLOAD_MB = 1


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from app.runtime import open_database
    from app.settings import WebSettings
    from db import UserRepository

    root = tmp_path_factory.mktemp("routes")
    settings = WebSettings(
        data_dir=root / "data", deid_secret="test-secret", max_upload_mb=MAX_UPLOAD_MB, secure_cookies=True
    )
    db = open_database(settings)
    users = UserRepository(db)
    users.create("boss", "admin-pass-1", role="admin")
    users.create("rita", "rita-pass-1")
    users.create("omar", "omar-pass-1")
    with launched_app(settings, db) as (url, demo):
        yield url, settings, db, demo


def signed_in(url: str, username: str, password: str) -> httpx.Client:
    with httpx.Client(base_url=url, timeout=30) as login:
        response = login.post("/login", data={"username": username, "password": password})
    assert response.status_code == 200, response.text
    http = httpx.Client(base_url=url, timeout=30, headers={"Origin": url})  # as the app's own page sends
    for name, value in response.cookies.items():
        http.cookies.set(name, value)
    return http


def route_templates(routes) -> list[str]:
    """Every path template of the app, walking included routers through the router they wrap."""
    found = []
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            found += route_templates(inner.routes)
        elif hasattr(route, "routes") and not hasattr(route, "endpoint"):
            found += [getattr(route, "path", "") + t for t in route_templates(route.routes)]
        elif getattr(route, "path", None):
            found.append(route.path)
    return sorted(set(found))


def spellings(target: Path) -> list[str]:
    """Ways to write the path of `target` in a URL that Gradio's file route resolves to the same file (dots are
    percent-encoded: httpx would remove dot segments itself, and the server decodes them before routing)."""
    text = str(target)
    parent, name = target.parent, target.name
    return [
        text,
        "/" + text,  # the `file//...` form
        text.replace("/", "//"),
        f"{parent}/%2E/{name}",
        f"{parent}/%2E%2E/{parent.name}/{name}",
        quote(text, safe=""),  # every slash percent-encoded
        os.path.relpath(target, os.getcwd()).replace("..", "%2E%2E"),  # relative to the server's working folder
    ]


def test_session_cookie_is_secure_httponly_and_lax_behind_a_tls_proxy(server):
    url, settings, db, demo = server
    with httpx.Client(base_url=url, timeout=30) as http:
        response = http.post("/login", data={"username": "rita", "password": "rita-pass-1"})
    cookies = response.headers.get_list("set-cookie")
    assert response.status_code == 200 and len(cookies) == 1, cookies
    attributes = {part.strip().split("=")[0].lower() for part in cookies[0].split(";")[1:]}
    assert {"secure", "httponly", "samesite"} <= attributes and "samesite=lax" in cookies[0].lower()
    assert response.headers["Strict-Transport-Security"].startswith("max-age=")
    http = signed_in(url, "rita", "rita-pass-1")
    token = next(iter(http.cookies.values()))
    exposed = http.get("/gradio_api/token")  # Gradio's route hands the HttpOnly cookie's token to page scripts
    assert exposed.status_code == 404 and token not in exposed.text
    http.close()


def test_the_page_runs_the_unsaved_changes_guard_before_any_of_gradios_scripts(server):
    # Gradio adds its connection-closing beforeunload listener from its own modules, and a window runs its listeners
    # in the order they were added: the guard must come first in <head> of the HTML itself (app.page_scripts).
    import re

    from app.page_scripts import EARLY_HEAD

    url, settings, db, demo = server
    http = signed_in(url, "rita", "rita-pass-1")
    with httpx.Client(base_url=url, timeout=30) as signed_out:
        sign_in_page = signed_out.get("/")
    assert sign_in_page.status_code == 200 and EARLY_HEAD not in sign_in_page.text  # the sign-in page needs none
    pages = [http.get("/"), http.get("/gradio_api/runs")]
    http.close()
    for response in pages:
        assert response.status_code == 200 and response.text.count(EARLY_HEAD) == 1
        head = re.search(r"<head[^>]*>", response.text)
        assert head and response.text[head.end() :].startswith(EARLY_HEAD)
        assert int(response.headers["content-length"]) == len(response.content)
        assert response.headers["X-Frame-Options"] == "DENY"
        assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]


def test_a_policy_with_its_own_script_src_gets_the_guards_hash():
    import base64

    from app.page_scripts import EARLY_HEAD
    from app.web_requests import _allow_script

    source = EARLY_HEAD.removeprefix("<script>").removesuffix("</script>")
    digest = base64.b64encode(hashlib.sha256(source.encode()).digest()).decode()
    assert _allow_script("script-src 'self'; img-src 'self'", EARLY_HEAD) == (
        f"script-src 'self' 'sha256-{digest}'; img-src 'self'"
    )
    assert _allow_script("script-src 'self' 'unsafe-inline'", EARLY_HEAD) == "script-src 'self' 'unsafe-inline'"
    assert _allow_script("frame-ancestors 'none'", EARLY_HEAD) == "frame-ancestors 'none'"


def test_no_file_route_serves_an_export_to_a_radiologist(server, tmp_path):
    from db import UserRepository
    from orapo_core.data import load_dataset
    from orapo_core.data.phantom import write_dataset
    from tests.support.rounds import seed_study

    url, settings, db, demo = server
    write_dataset(tmp_path / "phantom", 1, seed=3, size=64)
    seed_study(db, settings, load_dataset(tmp_path / "phantom")[0], author=UserRepository(db).get_by_username("rita"))
    boss_client = client(url, "boss", "admin-pass-1")
    _, pairs = boss_client.predict(["trl-dpo"], api_name="/export_pairs")
    export = Path(pairs["path"])
    secret = export.read_bytes()

    templates = route_templates(demo.server_app.routes)
    file_routes = [t for t in templates if ":path}" in t or "file" in t.lower()]
    assert {"/gradio_api/file={path_or_url:path}", "/gradio_api/file/{path:path}"} <= set(file_routes)
    assert "/static/{path:path}" in file_routes and "/svelte/{path:path}" in file_routes
    urls = []
    for template in [*file_routes, "/file={path}", "/file/{path}"]:  # and the forms without the API prefix
        head, _, rest = template.partition("{")
        tail = rest.partition("}")[2]
        for spelling in spellings(export):
            urls.append(head + spelling + tail.replace("{", "").replace("}", ""))

    boss, rita = signed_in(url, "boss", "admin-pass-1"), signed_in(url, "rita", "rita-pass-1")
    served_to_boss = set()
    for target in urls:
        for method in ("GET", "HEAD"):
            refused = rita.request(method, target)
            assert refused.status_code != 200 and secret not in refused.content, (method, target, refused.status_code)
        answer = boss.get(target)
        if answer.status_code == 200 and answer.content == secret:
            served_to_boss.add(target)
    # each spelling but those starting with '//' (which Gradio refuses itself) reaches the file through both of
    # Gradio's file routes, `file/` included: the attacks refused above were real ones
    reachable = [s for s in spellings(export) if not s.startswith("//")]
    assert len(reachable) == 5
    for spelling in reachable:
        assert f"/gradio_api/file={spelling}" in served_to_boss and f"/gradio_api/file/{spelling}" in served_to_boss
    assert rita.get(f"/gradio_api/file={export}").json()["detail"]["message"] == "Exports are for administrators."
    boss.close()
    rita.close()


def test_an_upload_over_the_limit_is_refused_with_a_clear_message(server, tmp_path):
    from app.runtime import upload_cache_dir

    url, settings, db, demo = server
    limit = MAX_UPLOAD_MB * 1024 * 1024
    http = signed_in(url, "rita", "rita-pass-1")
    assert http.get("/config").json()["max_file_size"] == limit  # so the page refuses it before sending it
    over = os.urandom(limit + 1024)
    refused = http.post("/gradio_api/upload", files={"files": ("big.dcm", over, "application/dicom")})
    assert refused.status_code == 413
    assert refused.text == (
        "file_too_large: This file is larger than the upload limit of 1 MB (ORAPO_MAX_UPLOAD_MB); it was not stored."
    )
    digest = hashlib.sha256(over).hexdigest()
    cache = upload_cache_dir(settings)
    assert not [p for p in cache.rglob("*") if p.is_file() and hashlib.sha256(p.read_bytes()).hexdigest() == digest]
    assert not [p for p in cache.rglob("*") if p.is_file() and p.stat().st_size > limit]  # nor a partial copy
    under = http.post("/gradio_api/upload", files={"files": ("ok.dcm", os.urandom(limit - 4096), "application/dicom")})
    assert under.status_code == 200, under.text
    Path(under.json()[0]).unlink()
    http.close()


def test_another_users_session_hash_opens_nothing(server, tmp_path):
    from gradio_client import handle_file

    from db import DraftRepository
    from orapo_core.data import load_dataset
    from orapo_core.data.phantom import write_dataset
    from orapo_core.models.prompt import REPORT_PROMPT

    url, settings, db, demo = server
    write_dataset(tmp_path / "phantom", 1, seed=5, size=64)
    image = load_dataset(tmp_path / "phantom")[0].image_paths[0]
    rita = client(url, "rita", "rita-pass-1")
    summary = rita.predict([handle_file(str(image))], api_name="/upload_studies")[1]
    study_id = int(summary.split("study ")[1].split()[0].strip("*,"))  # "study 1, new"
    draft = "Findings: Moderate right pleural effusion.\nImpression: Right effusion."
    DraftRepository(db).create(study_id, model_name="tiny", prompt=REPORT_PROMPT, text=draft)
    rita.predict(study_id, api_name="/open_study")  # rita's tab state now holds the draft
    spans, *_ = rita.predict("Findings: No effusion.", api_name="/rescore_report")  # spans, legend, missed
    assert "Moderate right pleural effusion." in str(spans)  # what a thief would get

    omar = client(url, "omar", "omar-pass-1")
    omar.session_hash = rita.session_hash
    with pytest.raises(Exception) as stolen:
        omar.predict("Findings: No effusion.", api_name="/rescore_report")
    assert "effusion." not in str(stolen.value)
    http = signed_in(url, "omar", "omar-pass-1")
    fn_index = next(i for i, fn in demo.fns.items() if fn.api_name == "rescore_report")
    join = http.post(
        "/gradio_api/queue/join",
        json={
            "data": ["x", None],
            "fn_index": fn_index,
            "event_data": None,
            "session_hash": rita.session_hash,
            "trigger_id": None,
        },
    )
    assert join.status_code == 403 and "belongs to another user" in join.text
    # the same body under any media type FastAPI parses as JSON is checked the same way (D6)
    body = json.dumps(
        {
            "data": ["x", None],
            "fn_index": fn_index,
            "event_data": None,
            "session_hash": rita.session_hash,
            "trigger_id": None,
        }
    )
    for media_type in ("application/x-orapo+json", "application/vnd.api+json", "text/plain", None):
        headers = {"Content-Type": media_type} if media_type else {}
        sneaked = http.post("/gradio_api/queue/join", content=body, headers=headers)
        assert sneaked.status_code == 403 and "belongs to another user" in sneaked.text, (media_type, sneaked.text)
    for media_type in ("application/json", "application/x-orapo+json", "text/plain"):  # and bounded
        huge = http.post(
            "/gradio_api/queue/join",
            content=b'{"data": "' + b"x" * (11 * 1024 * 1024) + b'"}',
            headers={"Content-Type": media_type},
        )
        assert huge.status_code == 413, (media_type, huge.status_code)
    for path in (
        f"/gradio_api/queue/data?session_hash={rita.session_hash}",
        f"/gradio_api/heartbeat/{rita.session_hash}",
    ):
        assert http.get(path).status_code == 403, path
    assert http.get(f"/gradio_api/deep_link?session_hash={rita.session_hash}").status_code == 404
    assert (
        signed_in(url, "rita", "rita-pass-1").get(f"/gradio_api/deep_link?session_hash={rita.session_hash}").status_code
        == 404
    )  # off for everyone
    http.close()


def test_every_handler_that_reads_the_read_tab_state_checks_its_user(tmp_path):
    """Behind the session-hash binding, the Read tab's handlers themselves refuse a state made for another user."""
    from dataclasses import replace

    import gradio as gr

    from app.runtime import open_database
    from app.server import build_app
    from app.tabs.session import PageSession
    from db import UserRepository
    from orapo_core.config import Settings

    settings = Settings(data_dir=tmp_path / "data", deid_secret="test-secret")
    db = open_database(settings)
    UserRepository(db).create("rita", "rita-pass-1")
    UserRepository(db).create("omar", "omar-pass-1")
    demo = build_app(settings=settings, database=db)
    states = [b for b in demo.blocks.values() if isinstance(b, gr.State) and isinstance(b.value, PageSession)]
    assert len(states) == 1
    state = states[0]
    ritas = replace(
        state.value,
        owner="rita",
        study_id=1,
        image_id=1,
        draft_id=1,
        draft_text="Findings: Moderate right pleural effusion.",
    )
    readers = [fn for fn in demo.fns.values() if any(c is state for c in fn.inputs)]
    # draft, FactS (3), store (4); the viewer reads no tab state: its route checks the study (test_viewer_routes.py)
    assert len(readers) >= 8, [fn.name for fn in readers]
    # a script (gradio_client says so in x-gradio-user) gets the error; the page gets the sentence as a warning,
    # and every output keeps its value (app.messages)
    from_a_script = type("Request", (), {"username": "omar", "headers": {"x-gradio-user": "api"}})()
    from_the_page = type("Request", (), {"username": "omar", "headers": {}})()
    for fn in readers:
        args = [ritas if c is state else None for c in fn.inputs]
        with pytest.raises(gr.Error, match="belongs to another user"):
            fn.fn(*args, request=from_a_script)
        with pytest.warns(UserWarning, match="belongs to another user"):
            kept = fn.fn(*args, request=from_the_page)
        assert kept == gr.skip() or (
            isinstance(kept, dict) and all(isinstance(k, gr.components.Component) for k in kept)
        )
