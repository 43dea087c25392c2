"""Create or upgrade the database schema (Alembic migrations, run in-process).

`orapo db upgrade` brings an empty or older database to the newest schema and is
safe to run any number of times; `orapo db current` says where it stands.
"""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    up = sub.add_parser("upgrade", help="apply migrations up to the newest schema (or --revision)")
    up.add_argument("--revision", default="head", help="target revision (default: head)")
    sub.add_parser("current", help="print the schema revision of the database and the newest one")


def run(args: argparse.Namespace) -> int:
    from app.runtime import open_database  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings

    database = open_database(migrate=False)
    try:
        if args.db_command == "upgrade":
            before = database.current_revision()
            database.upgrade(args.revision)
            after = database.current_revision()
            if before == after:
                print(f"{database!r} is already at revision {after}.")
            else:
                print(f"{database!r} upgraded from {before or 'an empty schema'} to {after}.")
            return 0
        current, head = database.current_revision(), database.head_revision()
        state = "up to date" if current == head else f"behind: run `orapo db upgrade` to reach {head}"
        print(f"{database!r}: revision {current or 'none (empty)'} ({state}).")
        return 0
    finally:
        database.dispose()
