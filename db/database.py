"""The database handle: a URL, an engine built on first use, sessions and migrations.

`Database(url)` costs nothing until the first query, so the CLI and the app can
build one wherever they need it and tests can hold several. SQLite (the embedded
default) is switched to WAL with foreign keys and a busy timeout on every new
connection, so the web app's readers never block the writer; the same code runs
on PostgreSQL when the URL says so.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import (  # noqa: TID253 -- this module is heavy; light ones import it lazily
    Engine,
    create_engine,
    event,
    text,
)
from sqlalchemy.engine import make_url  # noqa: TID253 -- this module is heavy; light ones import it lazily
from sqlalchemy.orm import Session, sessionmaker  # noqa: TID253 -- this module is heavy; light ones import it lazily
from sqlalchemy.pool import StaticPool  # noqa: TID253 -- this module is heavy; light ones import it lazily

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 10_000


def sqlite_url(data_dir: str | Path) -> str:
    """The embedded default: the SQLite file in the data folder."""
    return f"sqlite:///{Path(data_dir) / 'orapo.sqlite3'}"


def _on_sqlite_connect(dbapi_connection: Any, _record: Any, *, in_memory: bool) -> None:
    cursor = dbapi_connection.cursor()
    try:
        if not in_memory:
            cursor.execute("PRAGMA journal_mode=WAL")
            # Safe with WAL: a crash loses at most the last commits, never corrupts.
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    finally:
        cursor.close()


def _create_private(path: Path) -> None:
    """A new SQLite file is made 0600 (it holds password hashes and reports) in a new folder made 0700, before
    SQLite opens it; SQLite gives its -wal and -shm files the database file's mode. Existing ones are left as
    they are."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # an empty file is an empty database
    except FileExistsError:
        pass


class Database:
    """One database named by a SQLAlchemy URL; thread-safe, lazy, cheap to construct."""

    def __init__(self, url: str, *, echo: bool = False):
        self.url = url
        self._echo = echo
        self._engine: Engine | None = None
        self._sessionmaker: sessionmaker[Session] | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings) -> Database:
        """The database `settings.sqlalchemy_url` names (the app's `WebSettings`: ORAPO_DATABASE_URL, else
        `sqlite_url` of the data folder)."""
        return cls(settings.sqlalchemy_url)

    def __repr__(self) -> str:
        return f"Database({make_url(self.url).render_as_string(hide_password=True)!r})"

    @property
    def is_sqlite(self) -> bool:
        return make_url(self.url).get_backend_name() == "sqlite"

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            with self._lock:
                if self._engine is None:
                    self._engine = self._create_engine()
                    self._sessionmaker = sessionmaker(self._engine, expire_on_commit=False)
        return self._engine

    def _create_engine(self) -> Engine:
        url = make_url(self.url)
        if url.get_backend_name() != "sqlite":
            return create_engine(url, echo=self._echo, pool_pre_ping=True)
        database = url.database or ""
        in_memory = database in ("", ":memory:") or database.startswith("file::memory:")
        if in_memory:
            # One shared connection, or every checkout would see a different empty database.
            engine = create_engine(
                url, echo=self._echo, poolclass=StaticPool, connect_args={"check_same_thread": False}
            )
        else:
            if not database.startswith("file:"):
                _create_private(Path(database).expanduser())
            engine = create_engine(url, echo=self._echo, connect_args={"check_same_thread": False})
        event.listen(engine, "connect", lambda c, r: _on_sqlite_connect(c, r, in_memory=in_memory))
        return engine

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A unit of work: commits when the block ends, rolls back if it raises."""
        self.engine  # noqa: B018 - builds the sessionmaker on first use
        assert self._sessionmaker is not None
        with self._sessionmaker() as session:
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise

    def _alembic_config(self, connection: Any = None):
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        config.attributes["connection"] = connection
        return config

    def upgrade(self, revision: str = "head") -> None:
        """Apply the migrations up to `revision` (an empty database gets the whole schema)."""
        from alembic import command

        with self.engine.begin() as connection:
            command.upgrade(self._alembic_config(connection), revision)

    def downgrade(self, revision: str) -> None:
        from alembic import command

        with self.engine.begin() as connection:
            command.downgrade(self._alembic_config(connection), revision)

    def current_revision(self) -> str | None:
        """The revision the database is at, or None for a database never migrated."""
        from alembic.runtime.migration import MigrationContext

        with self.engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()

    def head_revision(self) -> str | None:
        from alembic.script import ScriptDirectory

        return ScriptDirectory.from_config(self._alembic_config()).get_current_head()

    def is_up_to_date(self) -> bool:
        return self.current_revision() == self.head_revision()

    def ping(self) -> None:
        """One trivial query (`SELECT 1`); raises when the database does not answer (the app's `/readyz`)."""
        with self.engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    def dispose(self) -> None:
        with self._lock:
            if self._engine is not None:
                self._engine.dispose()
            self._engine = None
            self._sessionmaker = None
