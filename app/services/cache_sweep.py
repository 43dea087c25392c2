"""What a crash or a stop leaves in the data folder, deleted: no uploaded original outlives the server.

Gradio writes every upload into its cache (`<data>/upload-cache/`, GRADIO_TEMP_DIR) before any handler sees
it, and its own `delete_cache` deletes only files the running process put there (hourly, and when it closes
its server). Ingest deletes each original as soon as its ingest returns, but after `kill -9` (or a power cut)
whatever was uploaded and not yet ingested, or half uploaded, would stay there for good, names and IDs in its
header.
So `orapo serve` calls:

- `sweep_at_start`, before the server listens: everything in the cache but export zips still within their
  download time goes, as do export work folders; and in the storage folder (`<data>/images/`), `.part-*`
  files of an interrupted write and images without a database row (an ingest killed between writing its
  files and its row; de-identified, but no longer anyone's to delete);
- `sweep_at_stop`, after Gradio closed (SIGTERM, SIGINT): everything in the cache, exports included.

Both return counts only: the line the server logs names no file, since a file name can itself carry PHI.

Several servers on one data folder share the upload cache, and each one's Gradio deletes only its own files:
when another server's sign of life is live (`app.services.leader`), a start or a stop must not empty the cache
under it (`shared=True`), so only entries older than `CACHE_MAX_AGE_S` go, the age after which Gradio itself
deletes its files, which no server still serves. What a killed server left is then deleted by the leader's
`sweep_stale` within `CACHE_MAX_AGE_S + CACHE_SWEEP_S`, not at the next start.

A stored file younger than `ORPHAN_GRACE_S` is kept, counted apart: `orapo ingest` running in another process
may be between writing it and committing its row (SQLite waits up to 10 s for each lock). The next start
deletes it if it is still nobody's. The cache has no such case: only the server writes there.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from app.runtime import upload_cache_dir

#: Unreferenced stored files younger than this are left for the next start (see the module docstring).
ORPHAN_GRACE_S = 60.0
# Gradio's cache holds patient-derived files (viewer renders, export zips): every CACHE_SWEEP_S, what the app put
# there more than CACHE_MAX_AGE_S ago is deleted (Gradio's `delete_cache` for its own files, `sweep_stale` on the
# leading server for everyone's), and all of it when the last server closes.
CACHE_SWEEP_S = 5 * 60
CACHE_MAX_AGE_S = 60 * 60
#: The prefix `app.services.ingest._write_atomic` gives a file it has not yet renamed into place.
PARTIAL_PREFIX = ".part-"


@dataclass(frozen=True)
class SweepReport:
    """How many files a sweep deleted, by kind; never which."""

    cache_files: int = 0  # uploads (whole or half written), Gradio's renders, stray files in the upload cache
    exports: int = 0  # export zips past their download time and export work folders
    partial_images: int = 0  # `.part-*` files of an interrupted write to the storage folder
    orphan_images: int = 0  # stored images with no database row
    recent_unreferenced: int = 0  # kept: younger than ORPHAN_GRACE_S, perhaps an ingest under way elsewhere

    def line(self, when: str) -> str:
        """One log line of counts: the upload cache always, the other kinds when there were any."""
        parts = [f"removed {self.cache_files} file(s) from the upload cache"]
        for count, what in ((self.exports, "expired export(s)"), (self.partial_images, "partial image write(s)"),
                            (self.orphan_images, "stored image(s) without a database row")):
            if count:
                parts.append(f"{count} {what}")
        text = f"orapo: {when}: " + ", ".join(parts)
        if self.recent_unreferenced:
            text += f"; kept {self.recent_unreferenced} unreferenced image file(s), too recent, for the next start"
        return text


def sweep_at_start(settings, database, *, now: float | None = None, shared: bool = False) -> SweepReport:
    """Before the server listens: what a previous run, killed or not, left behind (see the module docstring).
    `shared`: other servers use the data folder now, so the upload cache keeps what they may be serving."""
    from app.services.export_downloads import downloads_dir, prune_downloads

    now = time.time() if now is None else now
    exports = downloads_dir(settings)
    expired = prune_downloads(settings, now=now, work=True)
    cache_files = _sweep_upload_cache(settings, keep=exports, older_than=now - CACHE_MAX_AGE_S if shared else None)
    partial, orphans, recent = _sweep_storage(settings, database, now=now)
    return SweepReport(cache_files=cache_files, exports=len(expired), partial_images=partial,
                       orphan_images=orphans, recent_unreferenced=recent)


def sweep_at_stop(settings, *, shared: bool = False) -> SweepReport:
    """After the server closed: nothing stays in the upload cache, not even an export zip; `shared` (other servers
    still run): nothing more goes, since Gradio's close already deleted this server's own files."""
    return SweepReport() if shared else SweepReport(cache_files=_sweep_upload_cache(settings))


def sweep_stale(settings, *, now: float | None = None) -> SweepReport:
    """The leading server's sweep, every CACHE_SWEEP_S: cache entries older than CACHE_MAX_AGE_S, whichever server
    (a killed one included) put them there, and export zips past their download time."""
    from app.services.export_downloads import downloads_dir, prune_downloads

    now = time.time() if now is None else now
    expired = prune_downloads(settings, now=now)
    cache_files = _sweep_upload_cache(settings, keep=downloads_dir(settings), older_than=now - CACHE_MAX_AGE_S)
    return SweepReport(cache_files=cache_files, exports=len(expired))


def _sweep_upload_cache(settings, *, keep: Path | None = None, older_than: float | None = None) -> int:
    """Delete everything in the upload cache except the folder `keep` (and, with `older_than`, entries touched
    since then); returns how many files went."""
    from app.services.export_downloads import newest_mtime

    cache = upload_cache_dir(settings)
    if not cache.is_dir():
        return 0
    removed = 0
    for entry in list(cache.iterdir()):
        if keep is not None and entry == keep:
            continue
        try:
            if older_than is not None and newest_mtime(entry) >= older_than:
                continue
        except FileNotFoundError:
            continue
        removed += _delete(entry)
    return removed


def _delete(path: Path) -> int:
    """Delete a file, link or whole folder (links are not followed); how many files and links went."""
    try:
        if path.is_dir() and not path.is_symlink():
            count = sum(len(files) + sum(os.path.islink(os.path.join(root, d)) for d in dirs)
                        for root, dirs, files in os.walk(path))
            shutil.rmtree(path, ignore_errors=True)
            return count
        path.unlink()
        return 1
    except FileNotFoundError:
        return 0


def _sweep_storage(settings, database, *, now: float) -> tuple[int, int, int]:
    """(partial writes, unreferenced images) deleted from the storage folder, and unreferenced ones kept as recent."""
    from db import StudyRepository

    root, cutoff = settings.storage_dir, now - ORPHAN_GRACE_S
    if not root.is_dir():
        return 0, 0, 0
    referenced = StudyRepository(database).stored_paths()  # read before the walk: a row added meanwhile is recent
    partial = orphans = recent = 0
    emptied: set[Path] = set()
    for path in sorted(root.rglob("*"), reverse=True):  # children before their folders
        if path.is_dir() and not path.is_symlink():
            try:  # only if empty, and not a new one an ingest may be about to write into
                if path in emptied or path.lstat().st_mtime <= cutoff:
                    path.rmdir()
                    emptied.add(path.parent)
            except OSError:
                pass
            continue
        is_partial = path.name.startswith(PARTIAL_PREFIX)
        if not is_partial and path.relative_to(root).as_posix() in referenced:
            continue
        try:
            if path.lstat().st_mtime > cutoff:
                recent += 1
                continue
            path.unlink()
        except FileNotFoundError:
            continue
        emptied.add(path.parent)
        if is_partial:
            partial += 1
        else:
            orphans += 1
    return partial, orphans, recent
