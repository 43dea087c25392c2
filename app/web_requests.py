"""What the session middleware reads from a request and adds to every response.

A request's origin (`from_own_page` for a request that changes state: the
browser's `Sec-Fetch-Site` and `Origin` must both name the app's own origin;
`cross_site`, `same_origin` for signing in and out: `Sec-Fetch-Site` first, then
`Origin`, then `Referer`), its address, the route templates it may reach and
where a path parameter resolves to; and the headers every response carries
(no framing, no sniffing, HSTS with secure cookies, no CORS headers), with a plain message for
an upload refused for its size; and the script put first in an HTML page's
`<head>` (`with_early_script`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

from starlette.datastructures import MutableHeaders  # noqa: TID253 -- this module is heavy; light ones import it lazily
from starlette.responses import PlainTextResponse  # noqa: TID253 -- this module is heavy; light ones import it lazily

SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
FRAME_ANCESTORS = "frame-ancestors 'none'"
OWN_REFUSAL = "x-orapo-refusal"  # on the session middleware's own refusals
HSTS = "max-age=31536000"


def route_templates(routes) -> Iterator[str]:
    """Every route's path template, with the prefixes of included routers and mounts."""
    for route in routes:
        contexts = getattr(route, "effective_route_contexts", None)  # FastAPI's included router
        if callable(contexts):
            for context in contexts():
                template = context.path or getattr(context.starlette_route, "path", "")
                if template:
                    yield template
        elif hasattr(route, "routes") and not hasattr(route, "endpoint"):  # a Mount
            prefix = getattr(route, "path", "") or ""
            yield from (prefix + t for t in route_templates(route.routes))
        elif getattr(route, "path", None):
            yield route.path


def inside(value: str, folder: str) -> bool:
    """Whether `value`, resolved as Gradio's file routes resolve a path (absolute against the working folder),
    with symbolic links followed, is `folder` or under it."""
    try:
        resolved = os.path.realpath(os.path.abspath(value))
    except (ValueError, OSError):  # a NUL byte: no file route can open it either
        return False
    return resolved == folder or resolved.startswith(folder + os.sep)


def client_address(scope) -> str:
    """The caller's address (uvicorn already put a trusted proxy's X-Forwarded-For here)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or []:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _same_host(url: str, scope) -> bool:
    host = _header(scope, b"host")
    try:
        return bool(host) and urlsplit(url).netloc.lower() == host.lower()
    except ValueError:
        return False


def cross_site(scope) -> bool:
    """Whether the browser says this request was made by another site's page: `Sec-Fetch-Site`, else the
    `Origin` or `Referer` of another host. A request with none of them (a script, curl) is not cross-site."""
    site = _header(scope, b"sec-fetch-site")
    if site is not None:
        return site.lower() not in ("same-origin", "none")
    origin = _header(scope, b"origin")
    if origin is not None:
        return origin == "null" or not _same_host(origin, scope)
    referer = _header(scope, b"referer")
    return referer is not None and not _same_host(referer, scope)


_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def _origin_key(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an origin or URL, default ports filled in; None if it is not one."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in _DEFAULT_PORTS or not host:
        return None
    return (
        "https" if scheme == "wss" else "http" if scheme == "ws" else scheme,
        host,
        port if port is not None else _DEFAULT_PORTS[scheme],
    )


def own_origin(origin: str, scope, public_url: str | None) -> bool:
    """Whether `origin` (an Origin header's value) is the app's own: `public_url`'s origin when the app is served
    behind a proxy under that address (ORAPO_PUBLIC_URL), else the scheme-less host and port the request was sent to
    (its Host header). "null" (a sandboxed page, a file, a redirect across sites) is never the app's."""
    if origin.strip().lower() == "null":
        return False
    if public_url:
        mine = _origin_key(public_url)
        return mine is not None and _origin_key(origin) == mine
    return _same_host(origin, scope)


def from_own_page(scope, public_url: str | None = None) -> bool:
    """Positive evidence that the app's own page made this request, for a request that changes state: a browser's
    `Sec-Fetch-Site: same-origin` (a header no page can set), and an `Origin` that is the app's own when one is sent.
    A request with neither header is refused too: every browser the app supports sends `Origin` with a POST and a
    WebSocket handshake, and a script (gradio_client) sends the app's address as its Origin (`Client(...,
    headers={"Origin": url})`)."""
    site = _header(scope, b"sec-fetch-site")
    if site is not None and site.strip().lower() != "same-origin":
        return False
    origin = _header(scope, b"origin")
    if origin is None:
        return site is not None
    return own_origin(origin, scope, public_url)


def same_origin(scope) -> bool:
    """Positive evidence that the app's own page (or the user typing the address) made this request."""
    site = _header(scope, b"sec-fetch-site")
    if site is not None:
        return site.lower() in ("same-origin", "none")
    for name in (b"origin", b"referer"):
        value = _header(scope, name)
        if value is not None:
            return _same_host(value, scope)
    return False


def with_headers(send, secure: bool, too_large_message: str | None):
    """`send` that adds the security headers to every response and rewrites a 413 from an upload route."""
    replaced = False

    async def wrapped(message):
        nonlocal replaced
        if replaced:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                replaced = False
            return
        if message["type"] == "http.response.start":
            own = any(k.lower() == OWN_REFUSAL.encode() for k, _ in message.get("headers", []))
            if too_large_message is not None and message["status"] == 413 and not own:
                body = too_large_message.encode()
                response = PlainTextResponse(too_large_message, status_code=413)
                start = {"type": "http.response.start", "status": 413, "headers": response.raw_headers}
                _add_headers(start, secure)
                await send(start)
                await send({"type": "http.response.body", "body": body, "more_body": False})
                replaced = True
                return
            _add_headers(message, secure)
        await send(message)

    return wrapped


def _add_headers(message, secure: bool) -> None:
    headers = MutableHeaders(scope=message)
    for name, value in SECURITY_HEADERS.items():
        headers[name] = value
    # Gradio's CORS middleware echoes localhost origins (and, under a host name, any origin) with credentials; the
    # app's pages are its own origin and need no CORS at all, so no answer lets another origin read it or send
    # credentials (a preflight from another origin then fails in the browser).
    for name in [key for key in headers.keys() if key.lower().startswith("access-control-")]:
        del headers[name]
    csp = headers.get("content-security-policy")
    if csp is None:
        headers["Content-Security-Policy"] = FRAME_ANCESTORS
    elif "frame-ancestors" not in csp:
        headers["Content-Security-Policy"] = f"{csp}; {FRAME_ANCESTORS}"
    if secure:
        headers["Strict-Transport-Security"] = HSTS


_HEAD_TAG = re.compile(rb"<head(?:\s[^>]*)?>", re.IGNORECASE)


def _rewriting(send, media_types: tuple[str, ...], rewrite: Callable[[bytes, str, MutableHeaders], bytes]):
    """`send` that holds back a 200 answer of one of `media_types` (not content-encoded) until its body is whole, and
    sends `rewrite(body, media type, its headers)` instead, with its length set again; any other answer goes through
    as it is."""
    start: dict | None = None
    media = ""
    chunks: list[bytes] = []
    passing = False

    async def wrapped(message):
        nonlocal start, passing, media
        if passing:
            await send(message)
            return
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            given = (headers.get("content-type") or "").lower()
            media = next((m for m in media_types if given.startswith(m)), "")
            if message["status"] != 200 or not media or headers.get("content-encoding"):
                passing = True
                await send(message)
                return
            start = message
            return
        if message["type"] != "http.response.body" or start is None:
            await send(message)
            return
        chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        headers = MutableHeaders(scope=start)
        body = rewrite(b"".join(chunks), media, headers)
        if "content-length" in headers:
            headers["content-length"] = str(len(body))
        await send(start)
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return wrapped


def with_early_script(send, script_tag: str):
    """`send` that puts `script_tag` right after the opening `<head>` of an HTML page (status 200, not encoded),
    before any script the page itself carries; any other response goes through as it is. A policy with its own
    `script-src` (none is sent today) gets the script's hash, unless it already allows inline scripts."""
    tag = script_tag.encode()

    def rewrite(body: bytes, media: str, headers: MutableHeaders) -> bytes:
        body, found = _HEAD_TAG.subn(lambda m: m.group(0) + tag, body, count=1)
        csp = headers.get("content-security-policy")
        if found and csp is not None:
            headers["content-security-policy"] = _allow_script(csp, script_tag)
        return body

    return _rewriting(send, ("text/html",), rewrite)


def _allow_script(csp: str, script_tag: str) -> str:
    """The policy with the inline script's hash in its `script-src`, where it has one that needs it."""
    source = script_tag.removeprefix("<script>").removesuffix("</script>")
    digest = "'sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode() + "'"
    directives = [d.strip() for d in csp.split(";")]
    for i, directive in enumerate(directives):
        if directive.split(" ", 1)[0].lower() == "script-src" and "'unsafe-inline'" not in directive:
            directives[i] = f"{directive} {digest}"
    return "; ".join(d for d in directives if d)


_API_INFO = re.compile(rb"(window\.gradio_api_info\s*=\s*)(.*?)(;\s*</script>)", re.DOTALL)
NO_API = {"named_endpoints": {}, "unnamed_endpoints": {}}


def api_info_for(info, keep: Callable[[str], bool]):
    """Gradio's API description with only the named endpoints `keep` accepts (and no unnamed ones)."""
    if not isinstance(info, dict):
        return info
    named = info.get("named_endpoints")
    return {
        **info,
        "named_endpoints": {k: v for k, v in (named or {}).items() if keep(str(k))},
        "unnamed_endpoints": {},
    }


def with_api_info(send, keep: Callable[[str], bool]):
    """`send` that narrows the API description an answer carries to the endpoints `keep` accepts: the JSON of
    Gradio's info route, or the `window.gradio_api_info` a page embeds. Other answers go through as they are."""

    def narrowed(found: re.Match) -> bytes:
        try:
            info = api_info_for(json.loads(found.group(2)), keep)
        except ValueError:
            info = NO_API
        return found.group(1) + json.dumps(info).replace("</", "<\\/").encode() + found.group(3)

    def rewrite(body: bytes, media: str, headers: MutableHeaders) -> bytes:
        if media == "text/html":
            return _API_INFO.sub(narrowed, body, count=1)
        try:
            return json.dumps(api_info_for(json.loads(body), keep)).encode()
        except ValueError:
            return body

    return _rewriting(send, ("text/html", "application/json"), rewrite)
