"""The database of a backup (`app.services.operations.backup`): a copy of one moment, and what it holds.

SQLite's online backup API copies every page in one read transaction (a WAL reader never blocks the writer);
PostgreSQL's dump runs in a snapshot exported from a REPEATABLE READ transaction, in which the revision, the rows
of every table and the files its rows name are read too (`read_snapshot`), so the dump and the manifest describe
the same moment. `orapo restore` (`app.services.operations.restore`) reads the same helpers.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING
from urllib.parse import quote, urlencode

from app.services.operations.backup_files import write_private
from db.database import SQLITE_BUSY_TIMEOUT_MS
from orapo_core.errors import OrapoError

if TYPE_CHECKING:
    from sqlalchemy import Connection


@dataclass(frozen=True)
class Snapshot:
    """What a database held at one moment: its revision, its rows per table, the files its rows name."""

    revision: str | None
    counts: dict[str, int]
    image_paths: list[str] = field(default_factory=list)  # storage-relative, of every image row
    model_paths: list[str] = field(default_factory=list)  # data-folder-relative, of every model version row


def database_kind(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).get_backend_name()


def sqlite_path(url: str) -> Path:
    from sqlalchemy.engine import make_url

    database = make_url(url).database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        raise OrapoError(
            "backup_unsupported",
            f"Only a SQLite database in a file can be backed up or restored, not {database or 'one in memory'!r}.",
        )
    return Path(database).expanduser()


def libpq(url: str) -> tuple[str, dict[str, str]]:
    """A SQLAlchemy PostgreSQL URL as (a libpq URI without the password, the environment pg_dump and pg_restore
    run with: PGPASSWORD carries the password, so it never appears in a process list)."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    user = f"{quote(u.username, safe='')}@" if u.username else ""
    host = (f"[{u.host}]" if u.host and ":" in u.host else u.host or "") + (f":{u.port}" if u.port else "")
    query = urlencode([(k, v) for k, vs in u.query.items() for v in (vs if isinstance(vs, tuple) else (vs,))])
    env = {**os.environ}
    if u.password:
        env["PGPASSWORD"] = u.password
    return f"postgresql://{user}{host}/{quote(u.database or '', safe='')}{'?' + query if query else ''}", env


def postgres_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise OrapoError(
            "pg_dump_missing" if name == "pg_dump" else "pg_restore_missing",
            f"`{name}` is not on PATH; install PostgreSQL's client programs (the "
            "same major version as the server, or newer) to back up or restore PostgreSQL.",
        )
    return path


def read_snapshot(connection: Connection) -> Snapshot:
    """The revision, the rows of every table and the files named by rows, as `connection` sees them."""
    import sqlalchemy as sa
    from alembic.runtime.migration import MigrationContext

    tables = sorted(t for t in sa.inspect(connection).get_table_names() if t != "alembic_version")
    counts = {
        t: int(connection.execute(sa.select(sa.func.count()).select_from(sa.table(t))).scalar_one()) for t in tables
    }
    images, models = [], []
    if "images" in tables:
        rows = connection.execute(sa.text("SELECT dicom_path, display_path FROM images"))
        images = sorted({p for row in rows for p in row if p})
    if "model_versions" in tables:
        rows = connection.execute(sa.text("SELECT base_model_path, adapter_path FROM model_versions"))
        models = sorted({p for row in rows for p in row if p and not PurePosixPath(p).is_absolute()})
    revision = MigrationContext.configure(connection).get_current_revision()
    return Snapshot(revision, counts, images, models)


def sqlite_problems(connection: Connection) -> list[str]:
    """SQLite's own checks: `PRAGMA integrity_check` and `PRAGMA foreign_key_check`."""
    import sqlalchemy as sa

    problems = []
    result = [row[0] for row in connection.execute(sa.text("PRAGMA integrity_check"))]
    if result != ["ok"]:
        problems.append(f"SQLite's integrity check failed: {'; '.join(map(str, result[:5]))}")
    broken = connection.execute(sa.text("PRAGMA foreign_key_check")).fetchall()
    if broken:
        problems.append(
            f"{len(broken)} rows point at rows that do not exist (first: table {broken[0][0]}, row {broken[0][1]})"
        )
    return problems


def sqlite_snapshot(url: str, target: Path) -> tuple[Snapshot, list[str]]:
    """Copy the live SQLite database to `target` with the online backup API; what the copy holds, and the problems
    SQLite's checks find in it."""
    import sqlalchemy as sa

    source_path = sqlite_path(url)
    if not source_path.is_file():
        raise OrapoError(
            "backup_no_database",
            f"There is no database at {source_path}; check ORAPO_DATA_DIR (or ORAPO_DATABASE_URL).",
        )
    os.close(write_private(target))
    source = sqlite3.connect(source_path, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000)
    copy = sqlite3.connect(target)
    try:
        # pages=-1: every page in one step, so in one read transaction: one consistent moment, while writers
        # go on (WAL). The copy is then made a single self-contained file (no -wal beside it).
        source.backup(copy, pages=-1)
        copy.execute("PRAGMA journal_mode=DELETE")
    finally:
        copy.close()
        source.close()
    engine = sa.create_engine(f"sqlite:///{target}")  # plain: no WAL switch on the copy
    try:
        with engine.connect() as connection:
            return read_snapshot(connection), sqlite_problems(connection)
    finally:
        engine.dispose()


def pg_snapshot(url: str, target: Path) -> tuple[Snapshot, list[str]]:
    """`pg_dump --format=custom` into `target`, in a snapshot exported from a REPEATABLE READ transaction that also
    reads the revision and the counts: the dump and the manifest describe the same moment."""
    import sqlalchemy as sa

    pg_dump = postgres_tool("pg_dump")
    uri, env = libpq(url)
    os.close(write_private(target))
    engine = sa.create_engine(url)
    try:
        with engine.connect().execution_options(isolation_level="REPEATABLE READ") as connection, connection.begin():
            snapshot_id = connection.execute(sa.text("SELECT pg_export_snapshot()")).scalar_one()
            snapshot = read_snapshot(connection)
            done = subprocess.run(
                [
                    pg_dump,
                    "--format=custom",
                    "--no-password",
                    f"--snapshot={snapshot_id}",
                    f"--file={target}",
                    f"--dbname={uri}",
                ],
                env=env,
                capture_output=True,
                text=True,
            )
    finally:
        engine.dispose()
    if done.returncode != 0:
        raise OrapoError("pg_dump_failed", f"pg_dump failed: {_last_line(done.stderr)}")
    return snapshot, []


def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no message"
