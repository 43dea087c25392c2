"""Alembic environment for orapo, run programmatically by `Database.upgrade()`.

`Database` passes an open connection in `config.attributes["connection"]`; with
no connection (a developer running `alembic` by hand with `-x url=...` or a
`sqlalchemy.url` option) one is made from that URL. SQLite gets batch mode so
later migrations can alter columns there too. Logging is left to the caller.
"""

from __future__ import annotations

import os

from alembic import context  # noqa: TID253 -- this module is heavy; light ones import it lazily
from sqlalchemy import create_engine  # noqa: TID253 -- this module is heavy; light ones import it lazily

from db.database import sqlite_url
from db.models import Base

target_metadata = Base.metadata
config = context.config


def _configure(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if not url:  # as the app opens it: ORAPO_DATABASE_URL (read by app.settings too), else the data folder's file
        from orapo_core.config import Settings  # noqa: PLC0415 -- loads pydantic_settings, pydantic

        url = os.environ.get("ORAPO_DATABASE_URL") or sqlite_url(Settings().resolved_data_dir)
    return url


def run_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(_url())
    try:
        with engine.begin() as connection:
            _configure(connection)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
