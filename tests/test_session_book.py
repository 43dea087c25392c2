"""The session check against a password change finishing while the check reads the account's stamp.

The middleware reads the stamp from the database in a thread; the session's own password change (commit the new
hash, restamp this session, end the others) can finish in that time. The page's event stream, checked then, used
to be ended: its session was looked up before the read, so the check compared the new stamp with the old one
after the change had already left its grace (a `CancelledError` in the Gradio client, seen once in a full run).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from app import web_security
from app.services.accounts.sessions import SessionBook

OLD, NEW = "stamp-of-the-old-hash", "stamp-of-the-new-hash"


class Racing(web_security.RequireSession):
    """The middleware, with the database read replaced by: `before` (what happens while it reads), then `read`."""

    def __init__(self, before, read):
        super().__init__(app=None)
        self.before, self.read = before, read

    def _stamp(self, username):
        self.before()
        return self.read


def check(book: SessionBook, token: str, before, read) -> str | None:
    app = SimpleNamespace(tokens={token: "cora"})
    return asyncio.run(Racing(before, read)._session_user({"app": app}, SimpleNamespace(sessions=book)))


@pytest.fixture
def book(monkeypatch):
    monkeypatch.setattr(web_security, "_token", lambda scope: next(iter(scope["app"].tokens)))
    return SessionBook()


def change(book: SessionBook, token: str):
    """The session `token` changes its own password: committed (the database now says NEW), restamped, others end."""
    with book.changing_password(token):
        book.password_changed("cora", NEW, keep=token)


def test_a_change_finishing_while_the_new_stamp_is_read_does_not_end_the_changing_session(book):
    here = book.open("cora", OLD, "192.0.2.1")
    assert check(book, here, lambda: change(book, here), NEW) == "cora"
    assert book.get(here) is not None and book.get(here).stamp == NEW


def test_a_change_finishing_after_the_old_stamp_was_read_does_not_end_it_either(book):
    here = book.open("cora", OLD, "192.0.2.1")
    assert check(book, here, lambda: change(book, here), OLD) == "cora"
    assert check(book, here, lambda: None, NEW) == "cora"  # and afterwards it goes on under the new stamp


def test_the_other_sessions_end_whenever_they_are_checked(book):
    here, other = book.open("cora", OLD, "192.0.2.1"), book.open("cora", OLD, "192.0.2.2")
    with book.changing_password(here):  # committed, nobody restamped yet
        assert check(book, other, lambda: None, NEW) is None
    later = book.open("cora", OLD, "192.0.2.3")
    assert check(book, later, lambda: change(book, here), NEW) is None  # ended by the change while read


def test_a_disabled_account_or_a_password_reset_ends_even_the_session_that_changed_its_own(book):
    here = book.open("cora", OLD, "192.0.2.1")
    change(book, here)
    assert check(book, here, lambda: None, "stamp-of-an-admin-reset") is None
    there = book.open("cora", NEW, "192.0.2.2")
    with book.changing_password(there):
        assert check(book, there, lambda: None, None) is None  # disabled: no grace
