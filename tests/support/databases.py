"""The databases tests run on: a new SQLite file, and PostgreSQL when ORAPO_TEST_POSTGRES_URL names a server.

The `backend`, `blank_database` and `database` fixtures (tests/conftest.py) run
each test on a migrated SQLite file and, when ORAPO_TEST_POSTGRES_URL is set,
again on PostgreSQL in a schema of its own that is dropped afterwards. A set
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
