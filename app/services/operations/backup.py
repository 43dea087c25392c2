"""Backups of a data folder (`orapo backup`): the database, the images, the model versions and the secret.

A backup is a folder: `manifest.json`, the database (`orapo.sqlite3`, a copy made with SQLite's online backup
API; or `orapo.pgdump`, a `pg_dump --format=custom` file), `images/` and `models/` as they are under the data
folder, and `deid_secret`, the de-identification secret. The manifest names every file with its size and
SHA-256, the database's kind and Alembic revision, and the rows of each table, so `orapo restore`
(`app.services.operations.restore`) can refuse a damaged backup before it writes anything and check the restored data
against it.

The database is copied first, while the app goes on writing: SQLite's backup API copies every page in one
read transaction (a WAL reader never blocks the writer), and PostgreSQL's dump runs in a snapshot exported from
a REPEATABLE READ transaction, in which the revision and the counts are read too. The image files
are copied after that: an upload moves its files into place before its row commits (`app.services.reading.ingest`) and
no file of a committed row is deleted, so every image row the snapshot holds has its files in place by the time
they are copied. A file added later is copied too, or not: without a row it is an orphan the start-up sweep
removes. The backup is written into a hidden sibling folder and renamed to its name only when complete. The
database's copy is made in `app.services.operations.backup_database`, the files' in
`app.services.operations.backup_files`.

The backup holds the secret: whoever holds it with the database can unseal the archive links and tell whose
studies the pseudonyms stand for, so it is kept like the database itself (folders 0700, files 0600).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.services.operations.backup_database import database_kind, pg_snapshot, sqlite_snapshot
from app.services.operations.backup_files import copy_tree, file_digest, missing_files, write_private
from app.settings import web_settings
from db import AuditRepository, Database
from orapo_core.errors import OrapoError

if TYPE_CHECKING:
    from orapo_core.config import Settings

FORMAT, FORMAT_VERSION = "orapo-backup", 1
MANIFEST = "manifest.json"
SQLITE_FILE, PG_FILE = "orapo.sqlite3", "orapo.pgdump"
SECRET_FILE = "deid_secret"
IMAGES, MODELS = "images", "models"
#: The counts `orapo backup` and `orapo restore` print (the manifest has every table's).
SHOWN = ("users", "studies", "images", "drafts", "corrections", "model_versions")
SECRET_WARNING = (
    "the backup holds the de-identification secret ({file}): whoever has it together with the "
    "database can unseal the archive links and tell whose studies the pseudonyms stand for. "
    "Store and move it like the database itself (encrypted, access-controlled)."
)


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
    settings = web_settings(settings)
    out = Path(out).expanduser().absolute()
    _refuse_existing(out)
    for inside in (settings.storage_dir, settings.models_dir):
        if out.resolve().is_relative_to(inside):
            raise OrapoError(
                "backup_exists", f"{out} is inside {inside}, which the backup copies; name a folder outside it."
            )
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
        snapshot, problems = (sqlite_snapshot if kind == "sqlite" else pg_snapshot)(url, work / db_file)
        files[db_file] = file_digest(work / db_file)
        # 2. The files, after it: every image row in the snapshot has its files by now.
        copy_tree(settings.storage_dir, work / IMAGES, IMAGES, files)
        copy_tree(settings.models_dir, work / MODELS, MODELS, files)
        problems += missing_files(snapshot.image_paths, work / IMAGES, "image files")
        problems += missing_files(snapshot.model_paths, work, "model folders (inside the data folder)")
        # 3. The secret, without which the pseudonyms of new uploads would not match the restored ones.
        secret, source = current_secret(settings)
        if secret is not None:
            with os.fdopen(write_private(work / SECRET_FILE), "w") as f:
                f.write(secret)
            files[SECRET_FILE] = file_digest(work / SECRET_FILE)
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "orapo_version": _version(),
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
            raise OrapoError(
                "backup_exists", f"{out} was filled while the backup was written; name a new folder."
            ) from exc
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    audited = audit(
        url,
        "data.backup",
        actor,
        {"to": str(out), "files": len(files), "revision": snapshot.revision, "secret": secret is not None},
    )
    return BackupResult(
        out,
        kind,
        snapshot.revision,
        snapshot.counts,
        len(files),
        sum(f["size"] for f in files.values()),
        secret is not None,
        problems,
        audited,
    )


def audit(url: str, action: str, actor: Any, details: dict[str, Any]) -> str | None:
    """Record the backup or restore in the audit log; None, or why it could not be (a read-only backup account
    makes a good backup all the same)."""
    database = Database(url)
    try:
        AuditRepository(database).append(action, actor=actor, object_type="data", details=details)
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    finally:
        database.dispose()


def _version() -> str:
    try:
        return version("orapo")
    except PackageNotFoundError:
        return "unknown"
