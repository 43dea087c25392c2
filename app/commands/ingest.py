"""Import DICOM, PNG and JPEG files and folders, de-identified, into the database and storage.

One JSON line per file with `--json`; a readable line otherwise. Goes on past
refused files and exits 1 when any was refused, 0 when all went in. A file that
is not a chest radiograph (a CT, an MR image, a colour picture, ...) goes in
and is said to be "stored, not drafted" (`not_drafted` in its JSON line).
"""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files or folders (searched recursively)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per file")


def run(args: argparse.Namespace) -> int:
    from app.runtime import open_database  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from app.services.reading.ingest import ingest_paths  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from orapo_core.config import Settings  # noqa: PLC0415 -- loads pydantic_settings, pydantic

    settings = Settings()
    database = open_database(settings)
    refused = accepted = 0
    for outcome in ingest_paths(args.paths, db=database, settings=settings):
        if outcome.ok:
            accepted += 1
        else:
            refused += 1
        if args.json:
            print(outcome.to_json(), flush=True)
        elif outcome.ok:
            note = " (already stored)" if outcome.duplicate else ""
            print(f"ok      {outcome.file} -> study {outcome.study_id}{note}", flush=True)
            for warning in outcome.warnings:
                print(f"        warning: {warning}", flush=True)
            if outcome.not_drafted:
                print(f"        {outcome.not_drafted}", flush=True)
        else:
            print(f"refused {outcome.file}: {outcome.error}: {outcome.message}", flush=True)
    if not args.json:
        print(f"{accepted} ingested, {refused} refused")
    return 1 if refused else 0
