"""The databases tests run on: a new SQLite file, and PostgreSQL when ORAPO_TEST_POSTGRES_URL names a server.

The `backend`, `blank_database` and `database` fixtures (tests/conftest.py) run
each test on a migrated SQLite file (a copy of one migrated once per session,
`sqlite_copy`) and, when ORAPO_TEST_POSTGRES_URL is set, again on PostgreSQL in
a schema of its own, migrated for the test and dropped afterwards. A set
variable with no server behind it fails the PostgreSQL tests loudly: it never
turns them into skips.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from db.database import Database

POSTGRES_URL = os.environ.get("ORAPO_TEST_POSTGRES_URL", "").strip()
BACKENDS = ["sqlite"] + (["postgres"] if POSTGRES_URL else [])
BACKEND_PARAMS = [pytest.param(b, marks=[pytest.mark.postgres] if b == "postgres" else []) for b in BACKENDS]


@contextmanager
def empty_database(backend: str, tmp_path: Path) -> Iterator[Database]:
    """A database with no tables at all: a new SQLite file, or a new PostgreSQL schema."""
    if backend == "sqlite":
        database = Database(f"sqlite:///{tmp_path / 'orapo-test.sqlite3'}")
        try:
            yield database
        finally:
            database.dispose()
        return
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    schema = f"orapo_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_URL)
    try:
        with admin.begin() as conn:  # raises (fails the test) when the server is down
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        url = make_url(POSTGRES_URL).update_query_dict({"options": f"-csearch_path={schema}"})
        database = Database(url.render_as_string(hide_password=False))
        try:
            yield database
        finally:
            database.dispose()
            with admin.begin() as conn:
                conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    finally:
        admin.dispose()


@contextmanager
def sqlite_copy(template: Path, tmp_path: Path) -> Iterator[Database]:
    """A new SQLite file in `tmp_path` holding `template`'s bytes: the same database, without running the
    migrations that made it again. Made 0600, as `Database` makes its own files."""
    path = tmp_path / "orapo-test.sqlite3"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(template.read_bytes())
    database = Database(f"sqlite:///{path}")
    try:
        yield database
    finally:
        database.dispose()
