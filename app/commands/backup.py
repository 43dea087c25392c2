"""Back up the database, the images, the model versions and the de-identification secret into a new folder.

The database is copied while the app runs (SQLite's online backup API; `pg_dump` for PostgreSQL), then the
files; `manifest.json` lists every file with its SHA-256. The backup holds the de-identification secret: keep
it like the database itself. `orapo restore` puts it back into an empty data folder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", metavar="OUT", help="a new (or empty) folder to write the backup into")
    parser.add_argument("--data-dir", metavar="DIR", help="the data folder to back up (default: ORAPO_DATA_DIR)")


def run(args: argparse.Namespace) -> int:
    from app.commands.users import _cli_actor  # noqa: PLC0415 -- keeps `orapo --help` light
    from app.services.operations.backup import (  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
        SECRET_FILE,
        SECRET_WARNING,
        backup,
        counts_line,
    )
    from app.settings import WebSettings  # noqa: PLC0415 -- loads pydantic_settings, pydantic

    settings = WebSettings(**({"data_dir": Path(args.data_dir)} if args.data_dir else {}))
    result = backup(settings, Path(args.out), actor=_cli_actor())
    print(
        f"Backed up the {result.kind} database at revision {result.revision or 'none'} ({counts_line(result.counts)}) "
        f"and {result.files - 1 - result.secret} image and model files to {result.path}: "
        f"{result.files} files, {result.size / 1e6:.1f} MB."
    )
    if result.secret:
        print(f"warning: {SECRET_WARNING.format(file=result.path / SECRET_FILE)}", file=sys.stderr)
    else:
        print("note: no de-identification secret was made yet, so the backup holds none.", file=sys.stderr)
    if result.audit_error:
        print(f"note: the backup is not in the audit log ({result.audit_error}).", file=sys.stderr)
    for problem in result.problems:
        print(f"warning: {problem}; the backup holds the data as it is.", file=sys.stderr)
    return 1 if result.problems else 0
