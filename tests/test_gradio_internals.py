"""What `app.gradio_internals` relies on of Gradio's internals, checked against the installed Gradio.

Each test names one detail the adapter reads from Gradio's source; an upgrade
that changes it fails here, by name, rather than as a signed-out user, a token
route left open or an upload file left in the cache. The app is built as
`build_app` builds it and served by the server app Gradio makes for it
(`gradio.routes.App.create_app`, what `launch` calls), without the session
middleware, so what answers is Gradio itself.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(settings, the Blocks, the server app Gradio makes for it) of the real app on an empty data folder."""
    from gradio.routes import App

    from app.runtime import open_database
    from app.server import build_app
    from app.settings import WebSettings

    settings = WebSettings(data_dir=tmp_path_factory.mktemp("internals") / "data", deid_secret="test-secret")
    demo = build_app(settings=settings, database=open_database(settings))
    return settings, demo, App.create_app(demo)


def test_the_installed_gradio_is_the_one_the_adapter_was_read_from():
    import gradio

    from app.gradio_internals import PINNED_GRADIO

    pins = {
        m.group(1)
        for name in ("pyproject.toml", "constraints.txt")
        for m in re.finditer(r'^\s*"?gradio==([\w.]+)"?,?\s*$', (ROOT / name).read_text(), re.MULTILINE)
    }
    assert pins == {PINNED_GRADIO}, f"pyproject/constraints pin {pins}; read app/gradio_internals.py against it"
    assert gradio.__version__ == PINNED_GRADIO


def test_the_cache_folder_comes_from_the_environment(built):
    from gradio.utils import get_upload_folder

    from app.runtime import server_cache_dir, upload_cache_dir

    settings, demo, server = built
    cache = str(server_cache_dir(settings))  # this server's own folder in the data folder's upload cache
    assert server_cache_dir(settings).parent == upload_cache_dir(settings)
    assert get_upload_folder() == cache
    assert demo.GRADIO_CACHE == cache and server.uploaded_file_dir == cache


def test_the_running_server_leads_to_the_blocks_and_the_app_context(built):
    from app.context import AppContext
    from app.gradio_internals import blocks_of, context_of, warms_model

    settings, demo, server = built
    assert blocks_of(server) is demo
    ctx = context_of(server)
    assert isinstance(ctx, AppContext) and ctx is context_of(demo) and ctx.settings is settings
    assert warms_model(server) is False
    assert blocks_of(object()) is None and context_of(object()) is None


def test_gradios_routes_know_who_a_session_token_belongs_to_by_the_adapters_cookie(built):
    from starlette.testclient import TestClient

    from app.gradio_internals import cookie_names, grant_token, revoke_tokens, session_token, token_user

    _, _, server = built
    secure, plain = cookie_names(server)
    grant_token(server, "token-rita", "rita")
    grant_token(server, "token-rita-2", "rita")
    assert token_user(server, "token-rita") == "rita" and session_token(server, {plain: "token-rita"}) == "token-rita"
    client = TestClient(server)
    for name in (secure, plain):  # Gradio's own routes read the same cookie and the same map
        client.cookies.clear()
        client.cookies.set(name, "token-rita")
        assert client.get("/gradio_api/user").json() == "rita"
    revoke_tokens(server, username="rita")
    assert client.get("/gradio_api/user").json() is None and token_user(server, "token-rita-2") is None


def test_the_routes_the_middleware_names_are_gradios(built):
    from app.gradio_internals import DEEP_LINK_PATH, STARTUP_EVENTS_PATH, TOKEN_PATHS, UPLOAD_PATHS
    from app.web_requests import route_templates

    _, _, server = built
    templates = set(route_templates(server.routes))
    named = {DEEP_LINK_PATH, STARTUP_EVENTS_PATH, *TOKEN_PATHS, *UPLOAD_PATHS}
    assert named <= templates, sorted(named - templates)


def test_uploads_reach_handlers_without_a_stray_cache_file(built, tmp_path):
    import gradio as gr
    from gradio.data_classes import FileData
    from gradio.utils import NamedString

    from app.runtime import server_cache_dir

    settings, demo, _ = built
    for cls in (gr.File, gr.UploadButton):  # the method the adapter replaces, with the signature it keeps
        assert list(inspect.signature(cls._process_single_file).parameters) == ["self", "f"]
    uploads = [b for b in demo.blocks.values() if isinstance(b, (gr.File, gr.UploadButton))]
    assert uploads and all("_process_single_file" in vars(b) for b in uploads)
    cache = server_cache_dir(settings)
    upload = cache / "abc" / "chest.png"
    upload.parent.mkdir(parents=True, exist_ok=True)
    upload.write_bytes(b"\x89PNG")
    before = sorted(cache.rglob("*"))
    for block in uploads:
        if block.type == "filepath":
            passed = block._process_single_file(FileData(path=str(upload), orig_name="chest.png"))
            assert isinstance(passed, NamedString) and passed == str(upload)
    assert sorted(cache.rglob("*")) == before  # Gradio's own method would have left a tmp* file per call


@pytest.mark.slow
def test_a_launched_server_bounds_its_graceful_shutdown():
    import gradio as gr

    from app.gradio_internals import blocks_of, bound_graceful_shutdown, cookie_names
    from tests.support.app import free_port

    with gr.Blocks() as demo:
        gr.Markdown("internals")
    demo.launch(server_name="127.0.0.1", server_port=free_port(), quiet=True, prevent_thread_lock=True)
    try:
        bound_graceful_shutdown(demo, 3)
        assert demo.server.config.timeout_graceful_shutdown == 3
        assert blocks_of(demo.server_app) is demo and cookie_names(demo.server_app)
    finally:
        demo.close()


def test_the_page_closes_its_connection_in_a_beforeunload_listener_its_modules_add():
    # app.page_scripts.EARLY_HEAD holds back the window's later beforeunload listeners while it prompts, and the
    # middleware puts it right after the page's opening <head> tag, ahead of the page's own scripts
    import gradio

    frontend = Path(gradio.__file__).parent / "templates" / "frontend"
    close = re.compile(r"window\.addEventListener\(`beforeunload`,\(\)=>\{\w+\(\w+\)\.close\(\)\}\)")
    assert any(close.search(f.read_text(errors="replace")) for f in (frontend / "assets").glob("*.js"))
    page = (frontend / "index.html").read_text()
    head = re.search(r"<head[^>]*>", page)
    assert head and head.end() < page.index("<script")
