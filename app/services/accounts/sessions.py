"""The server's book of who is signed in, per process: session tokens, Gradio session hashes, open studies, uploads.

A `SessionBook` maps each session token to its user and the password stamp of
its sign-in (`UserRepository.session_stamp`), so the session middleware
(`app.web_security`) can end a session when the password changes or the
account is disabled. It also records which user each Gradio session hash
belongs to, which study each page has open in its Read tab
(`app.tabs.read_guard`), and which session uploaded each file of the upload
cache (uploads are per session).
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SignedInSession:
    username: str
    stamp: str
    address: str
    started: float
    previous_stamp: str | None = None  # the stamp this session had before it changed its own password


class SessionBook:
    """Who each session token belongs to, with the password stamp of its sign-in; and which user each Gradio
    session hash (chosen by the browser, and the key of its per-tab state) belongs to."""

    HASHES_KEPT_S = 24 * 3600  # a session hash unseen this long is forgotten (Gradio has dropped its state)

    def __init__(self) -> None:
        self._sessions: dict[str, SignedInSession] = {}
        self._seen: dict[str, float] = {}  # token -> when the session last did something of its own
        self._hash_owners: dict[str, tuple[str, float]] = {}
        self._open_studies: dict[str, tuple[int, float]] = {}  # session hash -> the study its Read tab has open
        # cached upload path -> {session token: how many of its uploads gave that path}: Gradio names an upload's
        # cache file by its content, so sessions uploading the same file share one path
        self._uploads: dict[str, dict[str, int]] = {}
        self._upload_meta: dict[str, tuple[float, int]] = {}  # cache path -> (when last uploaded, its bytes)
        self._sending: dict[str, int] = {}  # username -> bytes of upload requests still arriving
        self._changing: set[str] = set()  # tokens whose session is changing its own password right now
        self._lock = threading.Lock()

    def open(self, username: str, stamp: str, address: str) -> str:
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._sessions[token] = SignedInSession(username, stamp, address, time.time())
            self._seen[token] = time.time()
        return token

    def touch(self, token: str | None) -> None:
        """The session `token` did something of its own just now (not a heartbeat): its idle time starts again."""
        if token:
            with self._lock:
                if token in self._sessions:
                    self._seen[token] = time.time()

    def expired(self, token: str | None, *, idle_s: float, max_s: float, now: float | None = None) -> bool:
        """Whether the session `token` has been idle longer than `idle_s`, or signed in longer than `max_s`."""
        now = time.time() if now is None else now
        with self._lock:
            session = self._sessions.get(token) if token else None
            if not token or session is None:
                return True
            return now - session.started > max_s or now - self._seen.get(token, session.started) > idle_s

    def get(self, token: str | None) -> SignedInSession | None:
        return self._sessions.get(token) if token else None

    def end(self, token: str | None) -> SignedInSession | None:
        with self._lock:
            if not token:
                return None
            self._seen.pop(token, None)
            return self._sessions.pop(token, None)

    def end_user(self, username: str, *, keep: str | None = None) -> int:
        """End every session of `username` but `keep`; returns how many ended."""
        with self._lock:
            ended = [t for t, s in self._sessions.items() if s.username == username and t != keep]
            for token in ended:
                del self._sessions[token]
                self._seen.pop(token, None)
        return len(ended)

    def restamp(self, token: str, stamp: str) -> None:
        """The session that changed its own password goes on under the new one."""
        with self._lock:
            session = self._sessions.get(token)
            if session is not None:
                self._sessions[token] = SignedInSession(
                    session.username, stamp, session.address, session.started, previous_stamp=session.stamp
                )

    def token_in(self, cookies: Mapping[str, str]) -> str | None:
        """The session token among a request's cookies (Gradio names them after a per-server id)."""
        for name, value in cookies.items():
            if name.startswith("access-token-") and value in self._sessions:
                return value
        return None

    @contextlib.contextmanager
    def changing_password(self, token: str | None) -> Iterator[None]:
        """While the session `token` changes its own password: the new hash is committed before this session is
        restamped with it, and a request of the same session checked in between (the page's event stream, a
        heartbeat) must not end the very session that proved the old password. Other sessions get no grace."""
        if token is None:
            yield
            return
        with self._lock:
            self._changing.add(token)
        try:
            yield
        finally:
            with self._lock:
                self._changing.discard(token)

    def honours(self, token: str | None, stamp: str | None) -> bool:
        """Whether the session `token` goes on, given `stamp`, the account's stamp read from the database just now
        (None: disabled or gone). One look under the lock, so that a change of this session's own password
        finishing while the stamp was being read cannot end it: the stamp read may be the old one (read before the
        commit; the session is restamped by now, and its previous stamp is that one) or the new one (the session is
        still changing, or restamped with it). Other sessions of the user match neither and end."""
        if stamp is None or token is None:
            return False
        with self._lock:
            session = self._sessions.get(token)
            if session is None:
                return False
            return token in self._changing or stamp in (session.stamp, session.previous_stamp)

    def password_changed(self, username: str, stamp: str | None, *, keep: str | None) -> int:
        """After `username` changed their own password: the session `keep` goes on, every other one ends."""
        if keep is not None and stamp is not None:
            self.restamp(keep, stamp)
        return self.end_user(username, keep=keep)

    def claim_hash(self, session_hash: str, username: str) -> bool:
        """True if `session_hash` is `username`'s (claimed now if nobody had it); False if another user's."""
        now = time.time()
        with self._lock:
            owner = self._hash_owners.get(session_hash)
            if owner is not None and owner[0] != username:
                return False
            self._hash_owners[session_hash] = (username, now)
            if len(self._hash_owners) > 10_000:
                for key in [k for k, (_, seen) in self._hash_owners.items() if now - seen > self.HASHES_KEPT_S]:
                    del self._hash_owners[key]
                    self._open_studies.pop(key, None)
        return True

    def note_uploads(self, token: str, paths: Iterable[str | Path], size: int = 0) -> None:
        """The session `token` uploaded these files (Gradio's upload route answered with their cache paths), `size`
        bytes in all (the request's length, shared out among them)."""
        names = [str(p) for p in paths]
        now = time.time()
        with self._lock:
            for path in names:
                holders = self._uploads.setdefault(path, {})
                holders[token] = holders.get(token, 0) + 1
                self._upload_meta[path] = (now, max(size // max(len(names), 1), self._upload_meta.get(path, (0, 0))[1]))

    def upload_started(self, username: str, size: int) -> None:
        with self._lock:
            self._sending[username] = self._sending.get(username, 0) + size

    def upload_ended(self, username: str, size: int) -> None:
        with self._lock:
            self._sending[username] = max(0, self._sending.get(username, 0) - size)
            if not self._sending[username]:
                del self._sending[username]

    def uploads_in_flight(self, username: str) -> int:
        """Bytes `username` has uploaded (or is uploading) that no upload event has ingested yet, in all sessions."""
        with self._lock:
            tokens = {t for t, s in self._sessions.items() if s.username == username}
            waiting = sum(
                self._upload_meta.get(path, (0, 0))[1]
                for path, holders in self._uploads.items()
                if tokens & set(holders)
            )
            return waiting + self._sending.get(username, 0)

    def stale_uploads(self, older_than_s: float) -> list[str]:
        """Forget uploads no upload event ingested within `older_than_s`; their cache paths, for the caller to
        delete (`app.services.operations.cache_sweep`)."""
        now = time.time()
        with self._lock:
            stale = [path for path, (noted, _) in self._upload_meta.items() if now - noted > older_than_s]
            for path in stale:
                self._uploads.pop(path, None)
                self._upload_meta.pop(path, None)
        return stale

    def uploaded_by(self, token: str | None, path: str | Path) -> bool:
        """Whether the session `token` uploaded `path` and has not yet had it ingested."""
        if not token:
            return False
        with self._lock:
            return self._uploads.get(str(path), {}).get(token, 0) > 0

    def release_upload(self, token: str | None, path: str | Path) -> bool:
        """The session `token` is done with one upload of `path`; True when no session still waits to read it (the
        caller deletes the file then)."""
        with self._lock:
            holders = self._uploads.get(str(path))
            if holders is not None and token in holders:
                holders[token] -= 1
                if holders[token] <= 0:
                    del holders[token]
            if holders:
                return False
            self._uploads.pop(str(path), None)
            self._upload_meta.pop(str(path), None)
            return True

    def note_open(self, session_hash: str, study_id: int) -> None:
        """The page whose session hash this is now has `study_id` open in its Read tab (an upload, the worklist,
        a resumed or reloaded study): results computed for any other study no longer belong on that page."""
        now = time.time()
        with self._lock:
            self._open_studies[session_hash] = (int(study_id), now)
            if len(self._open_studies) > 10_000:
                for key in [k for k, (_, seen) in self._open_studies.items() if now - seen > self.HASHES_KEPT_S]:
                    del self._open_studies[key]

    def open_study(self, session_hash: str | None) -> int | None:
        """The study the page with this session hash has open (None: none opened through this server)."""
        if not session_hash:
            return None
        with self._lock:
            entry = self._open_studies.get(session_hash)
        return None if entry is None else entry[0]
