"""The app as tests run it: a data folder with the usual three users, launched on a free local port.

`make_env` is every app test's data folder and database: boss (an administrator),
rita and omar (radiologists), with the passwords the tests sign in with.
"""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

USERS = (
    ("boss", "admin-pass-1", "admin"),
    ("rita", "rita-pass-1", "radiologist"),
    ("omar", "omar-pass-1", "radiologist"),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_env(root: Path, model_dir: Path | None = None):
    """(settings, database) of a new data folder under `root`, with boss, rita and omar."""
    from app.runtime import open_database
    from db import UserRepository
    from orapo_core.config import Settings

    settings = Settings(data_dir=root / "data", model_dir=model_dir, deid_secret="test-secret")
    db = open_database(settings)
    users = UserRepository(db)
    for name, password, role in USERS:
        users.create(name, password, role=role)
    return settings, db


@contextlib.contextmanager
def launched_app(settings, database, registry=None, rounds=None, **build):
    """The app as `orapo serve` launches it, on a free local port; yields its URL and the Blocks. `build`: any
    other `build_app` argument (say, a `signin` guard with test limits)."""
    from app.server import build_app, launch_options

    demo = build_app(settings=settings, database=database, registry=registry, rounds=rounds, **build)
    port = free_port()
    demo.queue(default_concurrency_limit=4).launch(
        server_name="127.0.0.1",
        server_port=port,
        quiet=True,
        prevent_thread_lock=True,
        **launch_options(settings, database),
    )
    try:
        yield f"http://127.0.0.1:{port}", demo
    finally:
        demo.close()


def client(url, user, password):
    from gradio_client import Client

    # a script names the app's own address as its Origin: the app refuses a state-changing request without one
    return Client(url, auth=(user, password), verbose=False, download_files=False, headers={"Origin": url.rstrip("/")})


def phantom_png(path: Path, seed: int, size: int = 256) -> Path:
    """A PhantomCXR radiograph as an 8-bit PNG; a different seed is a different image, hence a different study."""
    import numpy as np
    from PIL import Image

    from orapo_core.data.phantom import generate_study

    image = generate_study(seed, size=size).image
    Image.fromarray(np.clip(image * 255.0, 0, 255).astype("uint8")).save(path)
    return path
