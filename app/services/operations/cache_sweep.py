"""What a crash or a stop leaves in the data folder, deleted: no uploaded original outlives the server.

Gradio writes every upload into its cache before any handler sees it, and its own `delete_cache` deletes only
files the running process put there (hourly, and when it closes its server). Ingest deletes each original as soon
as its ingest returns, but after `kill -9` (or a power cut) whatever was uploaded and not yet ingested, or half
uploaded, would stay there for good, names and IDs in its header.

Each server has its own cache folder, `<data>/upload-cache/<server>/` (GRADIO_TEMP_DIR; the name is its
sign-of-life identity, `app.services.operations.leader.ServerIdentity.folder`), so what a dead server left can go whole
while other servers on the same data folder keep theirs. A server is dead when its process is gone (on this
machine) or its sign-of-life lease has run out (on another machine; `live_server_folders`). So `orapo serve`
calls:

- `sweep_at_start`, before the server listens: in the upload cache, its own folder (it cannot exist yet), the
  whole folder of every dead server and anything else at the top level that is no live server's folder (the
  single-folder layout of earlier versions); export work folders a crash left; and in the storage folder
  (`<data>/images/`), `.part-*` files of an interrupted write and images without a database row (an ingest
  killed between writing its files and its row; de-identified, but no longer anyone's to delete);
- `sweep_at_stop`, after Gradio closed (SIGTERM, SIGINT): its own folder, exports included, and again what no
  live server owns.

The leading server's `sweep_stale`, every `CACHE_SWEEP_S`, also deletes dead servers' folders at once, and in
live servers' folders only entries older than `CACHE_MAX_AGE_S` (Gradio's own rule) and export zips past their
download time. With no other server alive, a start or a stop empties the whole cache, as a single server
always did.

A killed server's originals therefore go when the next server starts (on its machine at once; elsewhere once
its lease ran out) or at the leader's first sweep after its lease ran out: within ORAPO_LEADER_LEASE_S +
CACHE_SWEEP_S of the kill, or ORAPO_LEADER_LEASE_S * 4/3 + CACHE_SWEEP_S when it was the leader (another
server takes over first). While no server runs at all, they wait for the next start.

Every sweep returns counts only: the line the server logs names no file, since a file name can itself carry PHI.

A stored file younger than `ORPHAN_GRACE_S` is kept, counted apart: `orapo ingest` running in another process
may be between writing it and committing its row (SQLite waits up to 10 s for each lock). The next start
deletes it if it is still nobody's. The cache has no such case: only the servers write there.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from app.runtime import upload_cache_dir
from app.services.operations.export_downloads import (
    DOWNLOAD_RETENTION_S,
    EXPORTS,
    newest_mtime,
    prune_downloads,
    prune_folder,
)
from app.services.operations.leader import live_server_folders, this_process
from db import StudyRepository

if TYPE_CHECKING:
    from app.services.operations.leader import ServerIdentity
    from db.database import Database
    from orapo_core.config import Settings

#: Unreferenced stored files younger than this are left for the next start (see the module docstring).
ORPHAN_GRACE_S = 60.0
# Gradio's cache holds patient-derived files (viewer renders, export zips): every CACHE_SWEEP_S, what the app put
# there more than CACHE_MAX_AGE_S ago is deleted (Gradio's `delete_cache` for its own files, `sweep_stale` on the
# leading server for every live server's), and a server's whole folder when it stops or is found dead.
CACHE_SWEEP_S = 5 * 60
CACHE_MAX_AGE_S = 60 * 60
#: The prefix `app.services.reading.ingest._write_atomic` gives a file it has not yet renamed into place.
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
        for count, what in (
            (self.exports, "expired export(s)"),
            (self.partial_images, "partial image write(s)"),
            (self.orphan_images, "stored image(s) without a database row"),
        ):
            if count:
                parts.append(f"{count} {what}")
        text = f"orapo: {when}: " + ", ".join(parts)
        if self.recent_unreferenced:
            text += f"; kept {self.recent_unreferenced} unreferenced image file(s), too recent, for the next start"
        return text


def sweep_at_start(
    settings: Settings, database: Database, *, me: ServerIdentity | None = None, now: float | None = None
) -> SweepReport:
    """Before the server `me` (default: this process) listens: what a run, killed or not, of it or of any server
    now dead left behind (see the module docstring)."""
    now = time.time() if now is None else now
    expired = prune_downloads(settings, now=now, work=True)
    cache_files = _sweep_upload_cache(settings, database, me=me, keep_own=False)[0]
    partial, orphans, recent = _sweep_storage(settings, database, now=now)
    return SweepReport(
        cache_files=cache_files,
        exports=len(expired),
        partial_images=partial,
        orphan_images=orphans,
        recent_unreferenced=recent,
    )


def sweep_at_stop(settings: Settings, database: Database, *, me: ServerIdentity | None = None) -> SweepReport:
    """After the server `me` (default: this process) closed: its whole folder, not even an export zip stays, and
    what dead servers left. With the database unreachable, its own folder only: who else lives is unknown, and
    the leader or the next start deletes the rest."""
    me = me or this_process()
    try:
        return SweepReport(cache_files=_sweep_upload_cache(settings, database, me=me, keep_own=False)[0])
    except Exception:  # noqa: BLE001 - SQLAlchemy's errors, whatever the driver
        return SweepReport(cache_files=_delete(upload_cache_dir(settings) / me.folder))


def sweep_stale(
    settings: Settings, database: Database, *, me: ServerIdentity | None = None, now: float | None = None
) -> SweepReport:
    """The leading server's sweep, every CACHE_SWEEP_S: dead servers' folders whole; in live ones (`me`'s, default
    this process's, included) entries older than CACHE_MAX_AGE_S and export zips past their download time."""
    cache_files, exports = _sweep_upload_cache(
        settings, database, me=me, keep_own=True, now=time.time() if now is None else now
    )
    return SweepReport(cache_files=cache_files, exports=exports)


def _sweep_upload_cache(
    settings: Settings, database: Database, *, me: ServerIdentity | None, keep_own: bool, now: float | None = None
) -> tuple[int, int]:
    """Delete, at the top of the upload cache, every entry that is not a live server's folder (`me`'s only with
    `keep_own`); with `now`, in the live folders kept, entries older than CACHE_MAX_AGE_S and export zips past
    their download time. Returns how many files went, and how many of those zips apart."""
    me = me or this_process()
    cache = upload_cache_dir(settings)
    if not cache.is_dir():
        return 0, 0
    entries = list(cache.iterdir())
    live = live_server_folders([e.name for e in entries if e.is_dir() and not e.is_symlink()], database, me)
    if not keep_own:
        live.discard(me.folder)
    removed = exports = 0
    for entry in entries:
        if entry.name not in live or entry.is_symlink() or not entry.is_dir():
            removed += _delete(entry)
        elif now is not None:
            try:
                inside = list(entry.iterdir())
            except FileNotFoundError:  # that server stopped meanwhile and took its folder with it
                continue
            for inner in inside:
                if inner.name == EXPORTS and inner.is_dir() and not inner.is_symlink():
                    # the folder stays: an export may be about to write into it
                    exports += len(prune_folder(inner, now - DOWNLOAD_RETENTION_S))
                    continue
                try:
                    if newest_mtime(inner) >= now - CACHE_MAX_AGE_S:
                        continue
                except FileNotFoundError:
                    continue
                removed += _delete(inner)
    return removed, exports


def delete_uploads(paths: Iterable[str | Path]) -> int:
    """Delete uploads no upload event stored in time (`SessionBook.stale_uploads`), each with the folder Gradio made
    for it when that is left empty; how many files went."""
    removed = 0
    for raw in paths:
        path = Path(raw)
        removed += _delete(path) if path.is_file() else 0
        try:
            path.parent.rmdir()
        except OSError:
            pass
    return removed


def _delete(path: Path) -> int:
    """Delete a file, link or whole folder (links are not followed); how many files and links went."""
    try:
        if path.is_dir() and not path.is_symlink():
            count = sum(
                len(files) + sum(os.path.islink(os.path.join(root, d)) for d in dirs)
                for root, dirs, files in os.walk(path)
            )
            shutil.rmtree(path, ignore_errors=True)
            return count
        path.unlink()
        return 1
    except FileNotFoundError:
        return 0


def _sweep_storage(settings: Settings, database: Database, *, now: float) -> tuple[int, int, int]:
    """(partial writes, unreferenced images) deleted from the storage folder, and unreferenced ones kept as recent."""
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
