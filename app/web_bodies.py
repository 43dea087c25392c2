"""What the session middleware (`app.web_security`) reads from the bodies of requests and answers.

The Gradio session hashes a request names, its JSON body included (read at most
`MAX_JSON_BODY` bytes, then replayed to the route: `session_hashes`), and the
cache paths Gradio's upload route answers with, noted for the session that
uploaded them (`noting_uploads`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from urllib.parse import parse_qs

MAX_JSON_BODY = 10 * 1024 * 1024  # event payloads carry text and file references, never file bytes
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
FORM_TYPES = frozenset({b"multipart/form-data", b"application/x-www-form-urlencoded"})


async def session_hashes(scope, receive, route_params: Iterable[dict[str, str]]):
    """The Gradio session hashes a request names (in its query, its path: `route_params`, the parameters of the
    routes its path matches, or its JSON body), with a `receive` that replays the body read, and whether that body
    was over `MAX_JSON_BODY`."""
    hashes = set(parse_qs(scope.get("query_string", b"").decode("latin-1")).get("session_hash", []))
    for params in route_params:
        if "session_hash" in params:
            hashes.add(params["session_hash"])
    headers = dict(scope.get("headers") or [])
    content_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
    # Every body FastAPI might parse as JSON is read here, whatever its media type (`application/json`, any
    # `application/*+json`, none at all, `text/plain` ...): only the form encodings that never carry JSON are
    # left to their routes (uploads, with their own size limit; the sign-in form, which `app.web_signin` answers).
    if scope["type"] != "http" or scope.get("method", "GET").upper() in SAFE_METHODS or content_type in FORM_TYPES:
        return receive, hashes, False
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        more = message.get("more_body", False)
        if size > MAX_JSON_BODY:
            return receive, hashes, True
    body = b"".join(chunks)
    try:
        data = json.loads(body or b"null")
    except ValueError:
        data = None
    if isinstance(data, dict) and "session_hash" in data:
        hashes.add(str(data["session_hash"]))
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay, hashes, False


def noting_uploads(send, book, token: str | None, size: int):
    """`send` that tells the session book which cache paths Gradio's upload route gave this session, so that the
    upload handler reads only what this session uploaded (`SessionBook.uploaded_by`)."""
    status, chunks = 0, []

    async def wrapped(message):
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body" and status == 200 and token is not None:
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                try:
                    paths = json.loads(b"".join(chunks) or b"null")
                except ValueError:
                    paths = None
                if isinstance(paths, list):
                    book.note_uploads(token, [p for p in paths if isinstance(p, str)], size)
        await send(message)

    return wrapped
