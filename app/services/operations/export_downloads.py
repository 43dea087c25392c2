"""Exports an administrator downloads from the app: built in a throwaway folder, offered as one short-lived zip.

`orapo export` writes where its user says and leaves it there; the app has no
such user choice, so nothing it exports is meant to stay. Each export is built
in its own folder under `<data>/export-work/`, removed as soon as the zip is
made (or the export fails), and the zip is written straight into this
server's Gradio cache (`<data>/upload-cache/<server>/exports/<random>/`), where
Gradio serves the file as it stands instead of keeping a second copy. The
random folder name keeps one administrator's zip from being guessed by another
signed-in user. Exports are per server, like the rest of its cache: only the
server that made a zip serves it (Gradio serves files from its own cache
folder), and with sticky sessions the administrator's download comes back to
that server.

A zip is kept `DOWNLOAD_RETENTION_S` for its download: every new export and
every start of the app delete older ones (the start also any work folder a
crash left), the leading server's sweep deletes every live server's older ones
(`app.services.operations.cache_sweep.sweep_stale`), and Gradio's own cache sweep
(`delete_cache` in `build_app`) deletes what is left while the app runs and
when it closes.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from app.runtime import server_cache_dir
from app.services.accounts.auth import require_role
from app.services.operations.export import ExportSummary, SkippedStudy, export_pairs
from app.services.operations.export_fhir import export_fhir
from db import AuditRepository
from orapo_core.errors import OrapoError

if TYPE_CHECKING:
    from db.database import Database
    from db.records import UserRecord
    from orapo_core.config import Settings

_Result = TypeVar("_Result")

DOWNLOAD_RETENTION_S = 15 * 60
#: The folder of export zips in a server's cache folder.
EXPORTS = "exports"


@dataclass(frozen=True)
class ExportDownload:
    """One export, zipped and ready to download until `DOWNLOAD_RETENTION_S` has passed."""

    archive: Path
    summaries: tuple[ExportSummary, ...] = ()  # training data: one per format
    bundles: int = 0  # FHIR: how many study bundles
    skipped: tuple[SkippedStudy, ...] = ()  # FHIR: studies left out, with why (also `fhir/skipped.json` in the zip)


def downloads_dir(settings: Settings) -> Path:
    """Where this server keeps the export zips it offers: in its own cache folder, which Gradio serves."""
    return server_cache_dir(settings) / EXPORTS


def work_dir(settings: Settings) -> Path:
    return settings.resolved_data_dir / "export-work"


def newest_mtime(path: Path) -> float:
    stamps = [path.lstat().st_mtime]
    if path.is_dir() and not path.is_symlink():
        stamps += [p.lstat().st_mtime for p in path.rglob("*")]
    return max(stamps)


def prune_downloads(
    settings: Settings, *, max_age_s: float = DOWNLOAD_RETENTION_S, now: float | None = None, work: bool = False
) -> list[Path]:
    """Delete export zips untouched for more than `max_age_s` and, with `work` (at the app's start, when no
    export of its own can be under way), work folders a crash left; returns what went."""
    cutoff = (time.time() if now is None else now) - max_age_s
    return [
        gone
        for root in (downloads_dir(settings), *([work_dir(settings)] if work else []))
        for gone in prune_folder(root, cutoff)
    ]


def prune_folder(root: Path, cutoff: float) -> list[Path]:
    """Delete the entries of `root` (files, or folders whole) untouched since `cutoff`; returns what went."""
    if not root.is_dir():
        return []
    removed = []
    for entry in list(root.iterdir()):
        try:
            if newest_mtime(entry) >= cutoff:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except FileNotFoundError:
            continue  # another export (or Gradio's sweep) removed it meanwhile
        removed.append(entry)
    return removed


def _zip_export(settings: Settings, kind: str, write: Callable[[Path], _Result]) -> tuple[Path, _Result]:
    """Run `write(folder)` in a fresh work folder, zip that folder into a new download folder; the work folder goes."""
    prune_downloads(settings)
    work_root, downloads = work_dir(settings), downloads_dir(settings)
    work_root.mkdir(parents=True, exist_ok=True)
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{kind}-", dir=work_root) as work:
        result = write(Path(work))
        offered = downloads / secrets.token_hex(16)
        offered.mkdir()
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        archive = Path(shutil.make_archive(str(offered / f"orapo-{kind}-{stamp}"), "zip", work))
    return archive, result


def download_training_data(
    db: Database, settings: Settings, actor: UserRecord, formats: Sequence[str]
) -> ExportDownload:
    """The preference pairs and OraPO prompts in each of `formats`, as one zip (`<format>/` folders inside); audited."""
    require_role(actor, "admin")
    if not formats:
        raise OrapoError("no_format", "Choose at least one format to export.")
    archive, summaries = _zip_export(
        settings,
        "training-data",
        lambda folder: tuple(export_pairs(db, settings, folder / fmt, format=fmt) for fmt in formats),
    )
    AuditRepository(db).append(
        "export.pairs",
        actor=actor,
        object_type="export",
        object_id=archive.stem,
        details={s.format: s.rows for s in summaries},
    )
    return ExportDownload(archive, summaries=summaries)


def download_fhir(db: Database, settings: Settings, actor: UserRecord) -> ExportDownload:
    """Every reported study as a FHIR R4 Bundle (`fhir/study-<id>.json` inside the zip); audited. A study that
    cannot be exported is left out and listed, with why, in `fhir/skipped.json` and in `skipped`."""
    require_role(actor, "admin")
    archive, result = _zip_export(settings, "fhir", lambda folder: export_fhir(db, folder / "fhir"))
    AuditRepository(db).append(
        "export.fhir",
        actor=actor,
        object_type="export",
        object_id=archive.stem,
        details={"bundles": len(result.written), "skipped": {str(s.study_id): s.error for s in result.skipped}},
    )
    return ExportDownload(archive, bundles=len(result.written), skipped=result.skipped)
