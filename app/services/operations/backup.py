"""Backups of a data folder (`orapo backup`): the database, the images, the model versions and the secret.

A backup is a folder: `manifest.json`, the database (`orapo.sqlite3`, a copy made with SQLite's online backup
API; or `orapo.pgdump`, a `pg_dump --format=custom` file), `images/` and `models/` as they are under the data
folder, and `deid_secret`, the de-identification secret. The manifest names every file with its size and
SHA-256, the database's kind and Alembic revision, and the rows of each table, so `orapo restore`
(`app.services.operations.restore`) can refuse a damaged backup before it writes anything and check the restored data
against it.

The database is copied first, while the app goes on writing: SQLite's backup API copies every page in one
read transaction (a WAL reader never blocks the writer), and PostgreSQL's dump runs in a snapshot this module
exports from a REPEATABLE READ transaction, in which it also reads the revision and the counts. The image files
are copied after that: an upload moves its files into place before its row commits (`app.services.reading.ingest`) and
no file of a committed row is deleted, so every image row the snapshot holds has its files in place by the time
they are copied. A file added later is copied too, or not: without a row it is an orphan the start-up sweep
removes. The backup is written into a hidden sibling folder and renamed to its name only when complete.

The backup holds the secret: whoever holds it with the database can unseal the archive links and tell whose
studies the pseudonyms stand for, so it is kept like the database itself (folders 0700, files 0600).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from orapo_core.errors import OrapoError

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from orapo_core.config import Settings

FORMAT, FORMAT_VERSION = "orapo-backup", 1
MANIFEST = "manifest.json"
SQLITE_FILE, PG_FILE = "orapo.sqlite3", "orapo.pgdump"
SECRET_FILE = "deid_secret"
IMAGES, MODELS = "images", "models"
#: The counts `orapo backup` and `orapo restore` print (the manifest has every table's).
SHOWN = ("users", "studies", "images", "drafts", "corrections", "model_versions")
SECRET_WARNING = ("the backup holds the de-identification secret ({file}): whoever has it together with the "
                  "database can unseal the archive links and tell whose studies the pseudonyms stand for. "
                  "Store and move it like the database itself (encrypted, access-controlled).")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Snapshot:
    """What a database held at one moment: its revision, its rows per table, the files its rows name."""

    revision: str | None
    counts: dict[str, int]
    image_paths: list[str] = field(default_factory=list)  # storage-relative, of every image row
    model_paths: list[str] = field(default_factory=list)  # data-folder-relative, of every model version row


@dataclass(frozen=True)
class BackupResult:
    path: Path
    kind: str
    revision: str | None
    counts: dict[str, int]
    files: int
    size: int
    secret: bool
    problems: list[str]
    audit_error: str | None = None


def counts_line(counts: dict[str, int]) -> str:
    return ", ".join(f"{name.replace('_', ' ')} {counts.get(name, 0)}" for name in SHOWN)


def database_kind(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).get_backend_name()


def sqlite_path(url: str) -> Path:
    from sqlalchemy.engine import make_url

    database = make_url(url).database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        raise OrapoError("backup_unsupported", f"Only a SQLite database in a file can be backed up or restored, not {database or 'one in memory'!r}.")
    return Path(database).expanduser()


def libpq(url: str) -> tuple[str, dict[str, str]]:
    """A SQLAlchemy PostgreSQL URL as (a libpq URI without the password, the environment pg_dump and pg_restore
    run with: PGPASSWORD carries the password, so it never appears in a process list)."""
    from urllib.parse import quote, urlencode

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
        raise OrapoError("pg_dump_missing" if name == "pg_dump" else "pg_restore_missing", f"`{name}` is not on PATH; install PostgreSQL's client programs (the "
                                            "same major version as the server, or newer) to back up or restore PostgreSQL.")
    return path


def read_snapshot(connection: Connection) -> Snapshot:
    """The revision, the rows of every table and the files named by rows, as `connection` sees them."""
    import sqlalchemy as sa
    from alembic.runtime.migration import MigrationContext

    tables = sorted(t for t in sa.inspect(connection).get_table_names() if t != "alembic_version")
    counts = {t: int(connection.execute(sa.select(sa.func.count()).select_from(sa.table(t))).scalar_one()) for t in tables}
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
        problems.append(f"{len(broken)} rows point at rows that do not exist (first: table {broken[0][0]}, row {broken[0][1]})")
    return problems


def missing_files(paths: list[str], root: Path, what: str) -> list[str]:
    missing = [p for p in paths if not (root / p).is_file() and not (root / p).is_dir()]
    if not missing:
        return []
    return [f"{len(missing)} {what} named by the database are missing (first: {missing[0]})"]


def write_private(path: Path) -> int:
    """A new file opened for writing, 0600 from the start; it must not exist."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)


def copy_file(source: Path, target: Path) -> dict[str, Any]:
    """Copy `source` to a new 0600 file `target`, hashing it on the way; its size and SHA-256."""
    digest, size = hashlib.sha256(), 0
    with open(source, "rb") as src, os.fdopen(write_private(target), "wb") as dst:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
            dst.write(chunk)
            size += len(chunk)
    return {"size": size, "sha256": digest.hexdigest()}


def file_digest(path: Path) -> dict[str, Any]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": digest.hexdigest()}


def _skipped(name: str) -> bool:
    """Partial writes: an upload's `.part-*` file, a model version's `*.part` folder being installed."""
    return name.startswith(".part-") or name.endswith(".part")


def _copy_tree(source: Path, target: Path, prefix: str, files: dict[str, Any]) -> None:
    """Every file under `source` into `target` (folders 0700, files 0600), recorded in `files` as `prefix/...`."""
    if not source.is_dir():
        return
    for root, dirs, names in os.walk(source):  # symbolic links to folders are not followed
        dirs[:] = sorted(d for d in dirs if not _skipped(d))
        relative = Path(root).relative_to(source)
        (target / relative).mkdir(mode=0o700, exist_ok=True)
        for name in sorted(names):
            if _skipped(name):
                continue
            try:
                files[(PurePosixPath(prefix) / relative.as_posix() / name).as_posix()] = copy_file(
                    Path(root) / name, target / relative / name)
            except FileNotFoundError:  # gone meanwhile: an upload whose transaction failed; it has no row
                continue


def _sqlite_snapshot(url: str, target: Path) -> tuple[Snapshot, list[str]]:
    """Copy the live SQLite database to `target` with the online backup API; what the copy holds, and the problems
    SQLite's checks find in it."""
    import sqlite3

    import sqlalchemy as sa

    from db.database import SQLITE_BUSY_TIMEOUT_MS

    source_path = sqlite_path(url)
    if not source_path.is_file():
        raise OrapoError("backup_no_database", f"There is no database at {source_path}; check ORAPO_DATA_DIR (or ORAPO_DATABASE_URL).")
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


def _pg_snapshot(url: str, target: Path) -> tuple[Snapshot, list[str]]:
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
            done = subprocess.run([pg_dump, "--format=custom", "--no-password", f"--snapshot={snapshot_id}",
                                   f"--file={target}", f"--dbname={uri}"], env=env, capture_output=True, text=True)
    finally:
        engine.dispose()
    if done.returncode != 0:
        raise OrapoError("pg_dump_failed", f"pg_dump failed: {_last_line(done.stderr)}")
    return snapshot, []


def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


def current_secret(settings: Settings) -> tuple[str | None, str | None]:
    """(the de-identification secret, where it comes from: 'setting' or 'file'), or (None, None) when none was made
    yet. Reading it never creates one (`Settings.secret` would)."""
    if settings.deid_secret:
        return settings.deid_secret, "setting"
    path = settings.resolved_data_dir / ".deid_secret"
    if path.is_file():
        return path.read_text().strip(), "file"
    return None, None


def _refuse_existing(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OrapoError("backup_exists", f"{out} exists and is not an empty folder; name a new folder for the backup.")


def backup(settings: Settings, out: Path, *, actor: Any = "cli") -> BackupResult:
    """Back up the data folder `settings` names (and its database) into the new or empty folder `out`."""
    from app.settings import web_settings

    settings = web_settings(settings)
    out = Path(out).expanduser().absolute()
    _refuse_existing(out)
    for inside in (settings.storage_dir, settings.models_dir):
        if out.resolve().is_relative_to(inside):
            raise OrapoError("backup_exists", f"{out} is inside {inside}, which the backup copies; name a folder outside it.")
    url = settings.sqlalchemy_url
    kind = database_kind(url)
    if kind not in ("sqlite", "postgresql"):
        raise OrapoError("backup_unsupported", f"Backups cover SQLite and PostgreSQL, not {kind}.")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.part-"))  # 0700
    try:
        files: dict[str, Any] = {}
        # 1. The database, first (see the module's docstring for why the order matters).
        db_file = SQLITE_FILE if kind == "sqlite" else PG_FILE
        snapshot, problems = (_sqlite_snapshot if kind == "sqlite" else _pg_snapshot)(url, work / db_file)
        files[db_file] = file_digest(work / db_file)
        # 2. The files, after it: every image row in the snapshot has its files by now.
        _copy_tree(settings.storage_dir, work / IMAGES, IMAGES, files)
        _copy_tree(settings.models_dir, work / MODELS, MODELS, files)
        problems += missing_files(snapshot.image_paths, work / IMAGES, "image files")
        problems += missing_files(snapshot.model_paths, work, "model folders (inside the data folder)")
        # 3. The secret, without which the pseudonyms of new uploads would not match the restored ones.
        secret, source = current_secret(settings)
        if secret is not None:
            with os.fdopen(write_private(work / SECRET_FILE), "w") as f:
                f.write(secret)
            files[SECRET_FILE] = file_digest(work / SECRET_FILE)
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "orapo_version": _version(),
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "database": {"kind": kind, "file": db_file, "revision": snapshot.revision},
            "counts": snapshot.counts,
            "secret": {"file": SECRET_FILE, "source": source} if secret is not None else None,
            "problems": problems,
            "files": files,
        }
        with os.fdopen(write_private(work / MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
        os.sync()  # on disk before it has its name
        try:
            os.rename(work, out)  # replaces an empty folder; refused for one that was filled meanwhile
        except OSError as exc:
            raise OrapoError("backup_exists", f"{out} was filled while the backup was written; name a new folder.") from exc
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    audited = audit(url, "data.backup", actor, {"to": str(out), "files": len(files), "revision": snapshot.revision,
                                                "secret": secret is not None})
    return BackupResult(out, kind, snapshot.revision, snapshot.counts, len(files),
                        sum(f["size"] for f in files.values()), secret is not None, problems, audited)


def audit(url: str, action: str, actor: Any, details: dict[str, Any]) -> str | None:
    """Record the backup or restore in the audit log; None, or why it could not be (a read-only backup account
    makes a good backup all the same)."""
    from db import AuditRepository, Database

    database = Database(url)
    try:
        AuditRepository(database).append(action, actor=actor, object_type="data", details=details)
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    finally:
        database.dispose()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("orapo")
    except PackageNotFoundError:
        return "unknown"
