"""Restore a backup made by `orapo backup` into an empty data folder (and empty database), then check it.

A backup whose files do not match its manifest is refused before anything is written. After the restore the
integrity check runs: rows as backed up, SQLite's own checks, the schema at the newest revision, and every
file the database names in place.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="IN", help="the backup folder `orapo backup` wrote")
    parser.add_argument(
        "--data-dir",
        metavar="DIR",
        help="the empty or new data folder to restore into (default: ORAPO_DATA_DIR); the database "
        "is ORAPO_DATABASE_URL's when set (an empty one), else the SQLite file in this folder",
    )


def run(args: argparse.Namespace) -> int:
    from app.commands.users import _cli_actor  # noqa: PLC0415 -- keeps `orapo --help` light
    from app.services.operations.backup import counts_line  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from app.services.operations.restore import restore  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from app.settings import WebSettings  # noqa: PLC0415 -- loads pydantic_settings, pydantic

    settings = WebSettings(**({"data_dir": Path(args.data_dir)} if args.data_dir else {}))
    result = restore(settings, Path(args.source), actor=_cli_actor())
    upgraded = f", upgraded to {result.upgraded_to}" if result.upgraded_to else ""
    print(
        f"Restored the backup of {result.created_at} into {result.data_dir}: the {result.kind} database at revision "
        f"{result.revision or 'none'}{upgraded} ({counts_line(result.counts)}), {result.files} files. "
        "The integrity check passed."
    )
    if result.audit_error:
        print(f"note: the restore is not in the audit log ({result.audit_error}).", file=sys.stderr)
    return 0
