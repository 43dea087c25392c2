"""Opening the product's state: settings, folders and an up-to-date database.

Every command that touches durable state (serve, ingest, rounds, export, users)
goes through `open_database`, so a fresh data folder is prepared the same way
whichever command runs first.
"""

from __future__ import annotations

from pathlib import Path

from app.services.operations.leader import this_process
from app.settings import web_settings
from db import Database
from orapo_core.config import Settings


def upload_cache_dir(settings: Settings) -> Path:
    """The upload cache, kept in the data folder, not in /tmp: one folder per server in it (`server_cache_dir`)."""
    return settings.resolved_data_dir / "upload-cache"


def server_cache_dir(settings: Settings, identity=None) -> Path:
    """Gradio's upload and file cache for one server (default: this process; the server sets GRADIO_TEMP_DIR to
    it), `<data>/upload-cache/<server>/`, so a killed server's uploads can go whole while others run
    (`app.services.operations.cache_sweep`)."""
    return upload_cache_dir(settings) / (identity or this_process()).folder


def open_database(settings: Settings | None = None, *, migrate: bool = True):
    """The configured database with the schema at head (SQLite file created in the data folder).

    `settings` may be the engine's: the database URL is the app's setting (`app.settings.web_settings`)."""
    settings = web_settings(settings)
    settings.ensure_dirs()
    database = Database.from_settings(settings)
    if migrate:
        database.upgrade()
    return database
