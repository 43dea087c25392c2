"""Restoring a backup (`orapo restore`) into an empty data folder and an empty database, then checking it.

Everything that can refuse does so before anything is written: a manifest that is missing, does not parse or
names a path outside the backup; a SQLite backup for a PostgreSQL configuration or the other way round; a
database revision this OraPO does not know (a backup of a newer release); a data folder or database that is not
empty; a configured ORAPO_DEID_SECRET that is not the backup's; and any file whose size or SHA-256 is not the
manifest's. Then the database (a copy of the SQLite file, or `pg_restore` into the empty PostgreSQL database),
the images, the model versions and the secret are put in place, and the integrity check runs
(`check_integrity`): the rows per table are the manifest's, SQLite's own checks pass, the schema is at the
newest revision (an older backup is upgraded, as `orapo db upgrade` would), and every file an image or model
version row names exists. A restore that fails the check leaves what it restored in place and says why.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from app.services.operations.backup import FORMAT, FORMAT_VERSION, IMAGES, MANIFEST, MODELS, SECRET_FILE, audit
from app.services.operations.backup_database import (
    database_kind,
    libpq,
    postgres_tool,
    read_snapshot,
    sqlite_path,
    sqlite_problems,
)
from app.services.operations.backup_files import copy_file, file_digest, missing_files
from app.settings import web_settings
from db import Database
from db.database import MIGRATIONS_DIR
from orapo_core.errors import OrapoError

if TYPE_CHECKING:
    from app.settings import WebSettings
    from orapo_core.config import Settings


@dataclass(frozen=True)
class RestoreResult:
    data_dir: Path
    kind: str
    revision: str | None  # the backup's
    upgraded_to: str | None  # the newest revision, when the backup's was older
    counts: dict[str, int]
    files: int
    created_at: str
    audit_error: str | None = None


def read_manifest(source: Path) -> dict[str, Any]:
    """The backup's manifest, checked for shape and for paths that stay inside the backup."""
    path = Path(source) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise OrapoError(
            "backup_invalid", f"{source} is not an OraPO backup: its {MANIFEST} is missing or does not parse."
        ) from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise OrapoError("backup_invalid", f"{source}/{MANIFEST} is not the manifest of an OraPO backup.")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise OrapoError(
            "backup_invalid",
            f"{source} is a backup of format {manifest.get('format_version')!r}; this OraPO reads format {FORMAT_VERSION}.",
        )
    database, files, counts = manifest.get("database"), manifest.get("files"), manifest.get("counts")
    shaped = (
        isinstance(database, dict)
        and database.get("kind") in ("sqlite", "postgresql")
        and isinstance(files, dict)
        and database.get("file") in files
        and isinstance(counts, dict)
        and all(
            isinstance(f, dict) and isinstance(f.get("size"), int) and isinstance(f.get("sha256"), str)
            for f in files.values()
        )
    )
    if not shaped or not isinstance(database, dict) or not isinstance(files, dict):  # (shaped says they are)
        raise OrapoError("backup_invalid", f"{source}/{MANIFEST} lacks the database, its files or its counts.")
    secret = manifest.get("secret")
    for name in files:
        parts = PurePosixPath(name).parts
        allowed = name in (database["file"], SECRET_FILE) or (len(parts) > 1 and parts[0] in (IMAGES, MODELS))
        if not allowed or PurePosixPath(name).is_absolute() or ".." in parts or "\\" in name:
            raise OrapoError(
                "backup_invalid", f"{source}/{MANIFEST} names a file outside the backup's layout: {name!r}."
            )
    if secret is not None and (
        not isinstance(secret, dict) or secret.get("file") != SECRET_FILE or SECRET_FILE not in files
    ):
        raise OrapoError("backup_invalid", f"{source}/{MANIFEST} names a secret the backup does not list.")
    return manifest


def verify(source: Path, manifest: dict[str, Any]) -> None:
    """Every file the manifest lists is in the backup with its size and SHA-256."""
    for name, expected in sorted(manifest["files"].items()):
        path = Path(source) / name
        try:
            actual = file_digest(path)
        except OSError as exc:
            raise OrapoError(
                "backup_damaged", f"{path} is missing from the backup or cannot be read; nothing was restored."
            ) from exc
        if actual != {"size": expected["size"], "sha256": expected["sha256"]}:
            raise OrapoError(
                "backup_damaged",
                f"{path} is not the file the backup was made with (its size or SHA-256 differs); nothing was restored.",
            )


def _has_files(folder: Path) -> bool:
    return folder.exists() and (not folder.is_dir() or any(p.is_file() or p.is_symlink() for p in folder.rglob("*")))


def _postgres_tables(url: str) -> int:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return int(
                connection.execute(
                    sa.text(
                        "SELECT count(*) FROM information_schema.tables "
                        "WHERE table_schema NOT IN ('pg_catalog', 'information_schema')"
                    )
                ).scalar_one()
            )
    finally:
        engine.dispose()


def _known_revision(revision: str | None) -> bool:
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    if revision is None:
        return True
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    script = ScriptDirectory.from_config(config)
    try:
        return script.get_revision(revision) is not None
    except CommandError:
        return False


def _refusals(settings: WebSettings, source: Path, manifest: dict[str, Any]) -> None:
    url, kind = settings.sqlalchemy_url, manifest["database"]["kind"]
    if database_kind(url) != kind:
        raise OrapoError(
            "backup_database_mismatch",
            f"The backup holds a {kind} database, but this configuration's "
            f"is {database_kind(url)}; set ORAPO_DATABASE_URL to match.",
        )
    if not _known_revision(manifest["database"].get("revision")):
        raise OrapoError(
            "backup_newer",
            f"The backup's schema revision {manifest['database']['revision']} is unknown "
            "here: it was made by a newer OraPO; restore it with that release.",
        )
    data = settings.resolved_data_dir
    if _has_files(data):
        raise OrapoError("restore_not_empty", f"{data} holds files; restore into an empty (or new) data folder.")
    if kind == "sqlite" and sqlite_path(url).exists():
        raise OrapoError("restore_not_empty", f"{sqlite_path(url)} exists; restore into a new database file.")
    if kind == "postgresql":
        postgres_tool("pg_restore")
        if _postgres_tables(url):
            raise OrapoError(
                "restore_not_empty",
                "The configured PostgreSQL database has tables; restore into an empty "
                "database (createdb a new one, or drop and create it again).",
            )
    secret = manifest.get("secret")
    if settings.deid_secret and secret is not None:
        backed_up = (Path(source) / SECRET_FILE).read_text().strip()
        if backed_up != settings.deid_secret:
            raise OrapoError(
                "restore_secret_mismatch",
                "ORAPO_DEID_SECRET is set and is not the backup's secret: pseudonyms "
                "and archive links would not match. Unset it, or set it to the backup's.",
            )


def _restore_database(settings: WebSettings, source: Path, manifest: dict[str, Any]) -> None:
    url, name = settings.sqlalchemy_url, manifest["database"]["file"]
    if manifest["database"]["kind"] == "sqlite":
        target = sqlite_path(url)
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        _copy_checked(source, name, target, manifest)
        return
    uri, env = libpq(url)
    done = subprocess.run(
        [
            postgres_tool("pg_restore"),
            "--no-owner",
            "--no-privileges",
            "--exit-on-error",
            "--single-transaction",
            "--no-password",
            f"--dbname={uri}",
            str(Path(source) / name),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        raise OrapoError("pg_restore_failed", f"pg_restore failed: {lines[-1] if lines else 'no message'}")


def _restore_files(settings: Settings, source: Path, manifest: dict[str, Any]) -> None:
    roots = {IMAGES: settings.storage_dir, MODELS: settings.models_dir}
    for name in sorted(manifest["files"]):
        parts = PurePosixPath(name).parts
        if parts[0] not in roots:
            continue
        target = roots[parts[0]].joinpath(*parts[1:])
        folder = roots[parts[0]]
        for part in parts[1:-1]:  # 0700 each, as the backup's
            folder = folder / part
            folder.mkdir(mode=0o700, exist_ok=True)
        _copy_checked(source, name, target, manifest)
    if manifest.get("secret") is not None:
        _copy_checked(source, SECRET_FILE, settings.resolved_data_dir / ".deid_secret", manifest)


def _copy_checked(source: Path, name: str, target: Path, manifest: dict[str, Any]) -> None:
    """Copy one file of the backup, and check it again on the way (it was checked before anything was written)."""
    expected = manifest["files"][name]
    if copy_file(Path(source) / name, target) != {"size": expected["size"], "sha256": expected["sha256"]}:
        raise OrapoError(
            "backup_damaged",
            f"{Path(source) / name} changed while it was restored; empty {target.parent} "
            "and restore again from an unchanging copy.",
        )


def check_integrity(database: Database, settings: Settings) -> list[str]:
    """What is wrong with a database and its data folder (empty: nothing): SQLite's integrity and foreign-key
    checks, the schema at the newest revision, every file that an image row or a model version row (inside the
    data folder) names."""
    with database.engine.connect() as connection:
        problems = sqlite_problems(connection) if database.is_sqlite else []
        snapshot = read_snapshot(connection)
    head = database.head_revision()
    if snapshot.revision != head:
        problems.append(f"the schema is at revision {snapshot.revision}, not the newest, {head}")
    problems += missing_files(snapshot.image_paths, settings.storage_dir, "image files")
    problems += missing_files(snapshot.model_paths, settings.resolved_data_dir, "model folders")
    return problems


def restore(settings: Settings, source: Path, *, actor: Any = "cli") -> RestoreResult:
    """Restore the backup in `source` into the (empty) data folder and database `settings` names, and check it."""
    settings = web_settings(settings)
    source = Path(source).expanduser().absolute()
    manifest = read_manifest(source)
    _refusals(settings, source, manifest)
    verify(source, manifest)
    data = settings.resolved_data_dir
    data.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(data, 0o700)  # it is to hold the secret and the database
    for folder in (settings.storage_dir, settings.models_dir):
        folder.mkdir(mode=0o700, exist_ok=True)
    settings.ensure_dirs()
    _restore_database(settings, source, manifest)
    _restore_files(settings, source, manifest)
    database = Database(settings.sqlalchemy_url)
    try:
        # The rows are compared before any upgrade: a migration may add rows of its own.
        with database.engine.connect() as connection:
            restored = read_snapshot(connection).counts
        expected = manifest["counts"]
        upgraded_to = None
        if not database.is_up_to_date():
            database.upgrade()
            upgraded_to = database.current_revision()
        problems = check_integrity(database, settings)
        if restored != expected:
            differ = sorted(t for t in set(restored) | set(expected) if restored.get(t) != expected.get(t))
            problems.insert(
                0,
                "rows differ from the backup's in "
                + ", ".join(f"{t} ({expected.get(t)} backed up, {restored.get(t)} restored)" for t in differ),
            )
    finally:
        database.dispose()
    if problems and manifest.get("problems"):
        problems.append("the backup itself was made with these: " + "; ".join(manifest["problems"]))
    audited = audit(
        settings.sqlalchemy_url,
        "data.restore",
        actor,
        {
            "backup_created_at": manifest.get("created_at"),
            "revision": manifest["database"].get("revision"),
            "problems": len(problems),
        },
    )
    if problems:
        raise OrapoError(
            "integrity_failed",
            f"The backup was restored into {data}, but the integrity check found: " + "; ".join(problems) + ".",
        )
    return RestoreResult(
        data,
        manifest["database"]["kind"],
        manifest["database"].get("revision"),
        upgraded_to,
        restored,
        len(manifest["files"]),
        str(manifest.get("created_at")),
        audited,
    )
