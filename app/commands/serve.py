"""Start the web app.

The first start prepares everything a fresh machine lacks: the data folder, the
database schema, the default model, and a first administrator whose one-time
password is printed here once (it must be changed at first sign-in).
"""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None, help="address to bind (default ORAPO_HOST, 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port (default ORAPO_PORT, 7860)")
    parser.add_argument("--no-model", action="store_true", help="serve without preparing the default model")


def bootstrap_admin(database) -> tuple[str, str] | None:
    """Create the first admin when there are no users; returns (name, one-time password) once."""
    from db import UserRepository

    users = UserRepository(database)
    if users.list():
        return None
    user, password = users.create_with_one_time_password("admin", role="admin", actor="serve")
    return user.username, password


def run(args: argparse.Namespace) -> int:
    from app.runtime import open_database
    from app.server import build_app, launch_options
    from orapo_core.config import Settings

    settings = Settings()
    host = args.host or settings.host
    port = args.port or settings.port
    database = open_database(settings)
    if not args.no_model and settings.model_dir is None:
        from orapo_core.models.starter import ensure_starter

        # The shipped starter is copied into the data folder; without one it is built here (minutes, once).
        ensure_starter(settings.models_dir / "starter")
    first_admin = bootstrap_admin(database)
    demo = build_app(settings=settings, database=database)
    print(f"OraPO is ready: open http://{host}:{port}/ in a browser.", flush=True)
    if first_admin:
        name, password = first_admin
        print(f"First sign-in: user '{name}', one-time password '{password}' (shown once; change it at first sign-in).", flush=True)
    demo.queue(default_concurrency_limit=4).launch(
        server_name=host, server_port=port, quiet=True, **launch_options(settings, database),
    )
    return 0
