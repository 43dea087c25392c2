"""Start the web app.

The first start prepares everything a fresh machine lacks: the data folder, the
database schema, the default model, and a first administrator whose one-time
password is printed here once (it must be changed at first sign-in).

Uploaded originals carry names and IDs, so the server cleans up after itself
however it stops: before it listens it deletes what a killed run left in the
upload cache and the storage folder (`app.services.operations.cache_sweep`), and SIGTERM
(what Docker and systemd send) stops it the way Ctrl-C does: Gradio closes
(its lifespan deletes its cache files and stops the rounds scheduler), then
this server's folder in the upload cache is deleted, and the process exits without
the interpreter's teardown (`end_process`). Each sweep logs one line of counts on stderr. Each server
has its own folder there: both sweeps also delete the folders of servers found dead and leave live servers'
folders alone, so with no other server alive the whole cache goes, as it always did.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator

#: How long a stop waits for requests under way (an upload, a draft) before cancelling them.
GRACEFUL_SHUTDOWN_S = 3


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None, help="address to bind (default ORAPO_HOST, 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port (default ORAPO_PORT, 7860)")
    parser.add_argument("--no-model", action="store_true", help="serve without preparing the default model")


def bootstrap_admin(database) -> tuple[str, str] | None:
    """Create the first admin when there are no users; returns (name, one-time password) once."""
    from db import UserRepository  # noqa: PLC0415 -- loads sqlalchemy

    users = UserRepository(database)
    if users.list():
        return None
    user, password = users.create_with_one_time_password("admin", role="admin", actor="serve")
    return user.username, password


def run(args: argparse.Namespace) -> int:
    from app import gradio_internals  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from app.runtime import open_database  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from app.server import build_app, launch_options  # noqa: PLC0415 -- loads gradio, sqlalchemy
    from app.services.operations.cache_sweep import (  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
        sweep_at_start,
        sweep_at_stop,
    )
    from app.settings import WebSettings  # noqa: PLC0415 -- loads pydantic_settings, pydantic

    settings = WebSettings()
    host = args.host or settings.host
    port = args.port or settings.port
    database = open_database(settings)
    if not args.no_model and settings.model_dir is None:
        from orapo_core.models.starter import ensure_starter  # noqa: PLC0415 -- loads numpy

        # The shipped starter is copied into the data folder; without one it is built here (minutes, once).
        ensure_starter(settings.models_dir / "starter")
    first_admin = bootstrap_admin(database)
    # what this server's previous runs and any dead server left; live servers' folders stay
    # (app.services.operations.cache_sweep)
    print(sweep_at_start(settings, database).line("start-up sweep"), file=sys.stderr, flush=True)
    demo = build_app(settings=settings, database=database, warm_model=True)  # the model loads as the server starts
    with stop_signals() as stop:
        try:
            demo.queue(default_concurrency_limit=4).launch(
                server_name=host,
                server_port=port,
                quiet=True,
                prevent_thread_lock=True,
                **launch_options(settings, database),
            )
            # uvicorn runs the lifespan's shutdown only once every open request ended, and Gradio's close waits
            # 5 s for it: bound the wait, or one client stalled mid-upload would keep it from running.
            gradio_internals.bound_graceful_shutdown(demo, GRACEFUL_SHUTDOWN_S)
            print(f"OraPO is ready: open http://{host}:{port}/ in a browser.", flush=True)
            if first_admin:
                name, password = first_admin
                print(
                    f"First sign-in: user '{name}', one-time password '{password}' (shown once; change it at first sign-in).",
                    flush=True,
                )
            while not stop.wait(0.5):
                pass
        finally:
            print("OraPO is stopping.", flush=True)
            close(demo)
            print(sweep_at_stop(settings, database).line("stop sweep"), file=sys.stderr, flush=True)
    end_process(0)  # a failed start raised above instead, and the command line reports it
    return 0  # not reached


def end_process(code: int) -> None:
    """Exit once the clean-up above has run, without the interpreter's teardown. A daemon thread may still be
    inside native code when the server stops (the model's warm-up or a reader's draft in torch); tearing the
    interpreter down under it can abort the process (SIGABRT, "terminate called without an active exception")
    after the cache is already empty, and Docker or systemd would then log a clean stop as a crash. Nothing
    is left for the teardown to do: the database commits as it goes, and the logs and streams are flushed here."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


@contextlib.contextmanager
def stop_signals() -> Iterator[threading.Event]:
    """An event set by SIGTERM or SIGINT; a signal that comes while stopping is ignored, so it cannot cut
    the clean-up short (a kill -9 still stops the process, and the next start sweeps)."""
    stop = threading.Event()

    def handle(signum, frame) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def close(demo) -> None:
    """Close the server as Gradio's Ctrl-C does, and make sure the rounds scheduler stopped even if uvicorn
    could not reach its lifespan's shutdown within Gradio's wait (a client holding a request open)."""
    demo.close()
    from app import gradio_internals  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings

    scheduler = getattr(demo, "round_scheduler", None)
    if scheduler is not None:
        scheduler.shutdown()  # a no-op when the lifespan already stopped it
    metrics = getattr(gradio_internals.context_of(demo), "metrics", None)
    if metrics is not None:
        metrics.stop()  # ORAPO_METRICS_PORT closed: a no-op when the lifespan already closed it
    registry = getattr(gradio_internals.context_of(demo), "registry", None)
    if hasattr(registry, "wait_for_warm_up"):
        registry.wait_for_warm_up(GRACEFUL_SHUTDOWN_S)  # a warm-up draft under way ends before the process does
