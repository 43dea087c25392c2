"""Opening the product's state: settings, folders and an up-to-date database.

Every command that touches durable state (serve, ingest, rounds, export, users)
goes through `open_database`, so a fresh data folder is prepared the same way
whichever command runs first.
"""

from __future__ import annotations

from orapo_core.config import Settings


def open_database(settings: Settings | None = None, *, migrate: bool = True):
    """The configured database with the schema at head (SQLite file created in the data folder)."""
    from db import Database

    settings = settings or Settings()
    settings.ensure_dirs()
    database = Database.from_settings(settings)
    if migrate:
        database.upgrade()
    return database
