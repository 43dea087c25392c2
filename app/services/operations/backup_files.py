"""The files of a backup (`app.services.operations.backup`): copied privately (folders 0700, files 0600), each
with its size and SHA-256, and the files the database names checked for.

Partial writes (an upload's `.part-*` file, a model version's `*.part` folder being installed) are left out, and a
file gone while the tree is copied (an upload whose transaction failed: it has no row) is skipped.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path, PurePosixPath
from typing import Any

_CHUNK = 1 << 20


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


def copy_tree(source: Path, target: Path, prefix: str, files: dict[str, Any]) -> None:
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
                    Path(root) / name, target / relative / name
                )
            except FileNotFoundError:  # gone meanwhile: an upload whose transaction failed; it has no row
                continue
