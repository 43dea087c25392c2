"""No page of another origin can act with a signed-in user's cookie, and no answer lets it read one.

The attack: an administrator is signed in at http://127.0.0.1:PORT; a page served by another port of the same host
(or a sibling subdomain, or a sandboxed `null` origin) posts to `/gradio_api/run/create_user` with
`credentials: 'include'`. SameSite=Lax does not stop it (the cookie is the same site's: ports do not count), and
Gradio echoed localhost origins with credentials. The middleware now asks every state-changing request for the
browser's proof that the app's own page sent it (`app.web_requests.from_own_page`), and strips every CORS header.
"""

from __future__ import annotations

import httpx
import pytest

from tests.support.app import free_port, launched_app, make_env

pytestmark = pytest.mark.slow  # live servers


def sign_in(url: str, username: str, password: str, **headers) -> httpx.Client:
    http = httpx.Client(base_url=url, timeout=30, headers=headers)
    response = http.post("/login", data={"username": username, "password": password})
    assert response.status_code == 200, response.text
    return http


def create_user(http: httpx.Client, name: str, **headers) -> httpx.Response:
    """What the attacking page's fetch sends: Gradio's one-shot run route, with the admin's cookie."""
    return http.post("/gradio_api/run/create_user", json={"data": [name, "admin"]}, headers=headers)


def usernames(db) -> set[str]:
    from db import UserRepository

    return {u.username for u in UserRepository(db).list()}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from app.settings import web_settings

    settings, db = make_env(tmp_path_factory.mktemp("origin"))
    with launched_app(web_settings(settings), db) as (url, demo):
        yield url, db


def test_another_origin_cannot_create_an_admin_with_the_admins_cookie(served):
    url, db = served
    port = int(url.rsplit(":", 1)[1])
    other_port = f"http://127.0.0.1:{free_port() if port != 7999 else 7998}"
    boss = sign_in(url, "boss", "admin-pass-1")
    forged = [
        {"Origin": other_port, "Sec-Fetch-Site": "same-site"},  # another port of the same host, as Chromium sends it
        {"Origin": other_port},  # a browser that sends no Sec-Fetch-Site
        {"Origin": url.replace("127.0.0.1", "localhost")},  # another host name for the same server
        {"Origin": "null", "Sec-Fetch-Site": "cross-site"},  # a sandboxed iframe, a data: URL
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},  # a browser that leaves Origin out
        {"Sec-Fetch-Site": "same-site"},
        {"Sec-Fetch-Site": "none"},  # typed or bookmarked: never a POST the page made
        {"User-Agent": "Mozilla/5.0 (X11; Linux x86_64) Chrome/140.0"},  # no Origin, no Sec-Fetch-Site at all
        {"Origin": url, "Sec-Fetch-Site": "cross-site"},  # both must agree
    ]
    for number, headers in enumerate(forged):
        response = create_user(boss, f"mallory{number}", **headers)
        assert response.status_code == 403, (headers, response.status_code, response.text[:300])
        assert "another site" in response.text
        assert "access-control-allow-origin" not in response.headers
    # the queue (what the page itself uses) and uploads are refused the same way
    assert (
        boss.post(
            "/gradio_api/queue/join",
            json={"fn_index": 0, "data": [], "session_hash": "abc"},
            headers={"Origin": other_port},
        ).status_code
        == 403
    )
    assert (
        boss.post(
            "/gradio_api/upload", files={"files": ("x.txt", b"x", "text/plain")}, headers={"Origin": other_port}
        ).status_code
        == 403
    )
    assert not any(name.startswith("mallory") for name in usernames(db))

    # the app's own page (same origin, as Chromium sends it) still creates one: the refusals above are the origin's
    made = create_user(boss, "trudy", Origin=url, **{"Sec-Fetch-Site": "same-origin"})
    assert made.status_code == 200, made.text[:300]
    assert "trudy" in usernames(db)
    boss.close()


def test_no_answer_lets_another_origin_read_it_with_credentials(served):
    url, db = served
    other = "http://127.0.0.1:7999"
    boss = sign_in(url, "boss", "admin-pass-1")
    preflight = boss.options(
        "/gradio_api/run/create_user",
        headers={
            "Origin": other,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
    )
    responses = [
        preflight,
        boss.get("/config", headers={"Origin": other}),
        boss.get("/gradio_api/info", headers={"Origin": other}),
        boss.get("/config", headers={"Origin": "http://localhost:7999"}),
    ]
    for response in responses:
        leaked = {k: v for k, v in response.headers.items() if k.lower().startswith("access-control-")}
        assert leaked == {}, (response.request.method, response.request.url, leaked)
    boss.close()


def test_behind_a_proxy_only_the_public_origin_acts(tmp_path):
    """With ORAPO_PUBLIC_URL the app's origin is that address: a sibling subdomain of the hospital's domain, or the
    plain-HTTP twin of the address, is another origin."""
    from app.settings import web_settings

    settings, db = make_env(tmp_path)
    public = "https://orapo.hospital.example"
    settings = web_settings(settings).model_copy(update={"public_url": public})
    with launched_app(settings, db) as (url, demo):
        boss = sign_in(url, "boss", "admin-pass-1")
        proxied = {"Host": "orapo.hospital.example"}
        for number, origin in enumerate(
            (
                "https://pacs.hospital.example",
                "http://orapo.hospital.example",
                "https://orapo.hospital.example:8443",
                url,
                "null",
            )
        ):
            response = create_user(boss, f"mallory{number}", Origin=origin, **proxied)
            assert response.status_code == 403, (origin, response.text[:300])
        assert not any(name.startswith("mallory") for name in usernames(db))
        made = create_user(boss, "trudy", Origin=public, **proxied, **{"Sec-Fetch-Site": "same-origin"})
        assert made.status_code == 200, made.text[:300]
        boss.close()


def test_the_origin_rule_on_its_own():
    from app.web_requests import from_own_page

    def scope(host: str, **headers: str) -> dict:
        raw = [(b"host", host.encode())] + [
            (k.lower().replace("_", "-").encode(), v.encode()) for k, v in headers.items()
        ]
        return {"type": "http", "method": "POST", "headers": raw}

    here = "127.0.0.1:7981"
    assert from_own_page(scope(here, origin="http://127.0.0.1:7981", sec_fetch_site="same-origin"))
    assert from_own_page(scope(here, origin="http://127.0.0.1:7981"))
    assert from_own_page(scope(here, sec_fetch_site="same-origin"))  # a browser's own word, which no page can forge
    assert not from_own_page(scope(here, origin="http://127.0.0.1:7999"))
    assert not from_own_page(scope(here, origin="http://127.0.0.1:7999", sec_fetch_site="same-origin"))
    assert not from_own_page(scope(here, origin="null"))
    assert not from_own_page(scope(here))
    assert not from_own_page(scope(here, referer="http://127.0.0.1:7981/"))  # a Referer alone proves nothing
    public = "https://orapo.example.org"
    assert from_own_page(scope("orapo.example.org", origin="https://orapo.example.org:443"), public)
    assert not from_own_page(scope("orapo.example.org", origin="https://x.orapo.example.org"), public)
    assert not from_own_page(scope("orapo.example.org", origin="http://orapo.example.org"), public)
