"""Shared test set-up: offline, one thread, and the fixtures more than one test module uses.

Helpers (builders, launchers, seeders) are in `tests.support`; fixtures are here,
so no test module imports another. Fixtures that build something slow to make
(a tiny model, PhantomCXR studies, Chromium) are made once per session and are
never written to by a test.

Tiers: `make test-fast` runs every test not marked `slow`; a test that takes
more than about 2 s on a busy 2-core machine (a browser, a live server, a training
run, a starter build, a subprocess, a sweep) carries `@pytest.mark.slow` or its
module's `pytestmark = pytest.mark.slow`, every test_browser_* module is slow
whether it says so or not (`pytest_collection_modifyitems`), and a per-family
test runs its first family in both tiers and the others in `make test` only
(`tests.support.tiers.first_fast`). See docs/pages/developer.md, test tiers.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"

from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tests.support.databases import BACKEND_PARAMS, empty_database, sqlite_copy  # noqa: E402
from tests.support.tiers import slow_by_measure  # noqa: E402


def pytest_collection_modifyitems(config, items) -> None:
    """Browser tests, and the modules and tests listed in tests/slow_by_measure.txt, are `slow`: `make test` runs
    them, `make test-fast` leaves them out (docs/pages/developer.md, Test tiers)."""
    listed = slow_by_measure()
    for item in items:
        module, name = item.nodeid.split("::")[0], item.nodeid.split("[")[0]
        if item.path.name.startswith("test_browser_") or module in listed or name in listed:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True, scope="session")
def quick_password_hashes() -> Iterator[None]:
    """Argon2id at its lowest cost for every test that stores a user in this process.

    The product's hasher (db.repositories.users, the library's defaults) takes about half a second a password
    on a busy machine, and most app tests create three users; the hashes stay argon2id and verify the same way.
    Servers a test starts in another process keep the real cost."""
    from argon2 import PasswordHasher

    from db.repositories import users

    real = users._hasher
    users._hasher = PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)
    users._dummy_hash.cache_clear()
    try:
        yield
    finally:
        users._hasher = real
        users._dummy_hash.cache_clear()


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty ORAPO_DATA_DIR for one test."""
    d = tmp_path / "data"
    d.mkdir()
    monkeypatch.setenv("ORAPO_DATA_DIR", str(d))
    monkeypatch.delenv("ORAPO_DATABASE_URL", raising=False)
    return d


# --- databases ---------------------------------------------------------------------------------------------


@pytest.fixture(params=BACKEND_PARAMS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def blank_database(backend: str, tmp_path: Path):
    """A database with no tables, on each configured backend (SQLite; PostgreSQL with ORAPO_TEST_POSTGRES_URL)."""
    with empty_database(backend, tmp_path) as database:
        yield database


@pytest.fixture(scope="session")
def sqlite_at_head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One SQLite file migrated to head, once per session (per xdist worker): never written to, only copied."""
    from db import Database

    path = tmp_path_factory.mktemp("schema") / "head.sqlite3"
    template = Database(f"sqlite:///{path}")
    template.upgrade()
    template.dispose()  # the last connection closed: the WAL is folded into the file, which is all there is
    return path


@pytest.fixture
def database(backend: str, tmp_path: Path, request: pytest.FixtureRequest):
    """A database migrated to head, on each configured backend.

    SQLite: a copy of `sqlite_at_head` (the migrations are what `tests/test_db_schema.py` tests, on
    `blank_database`; running all of them again for every test cost about 0.1 s a test). PostgreSQL: a new
    schema, migrated."""
    if backend == "sqlite":
        with sqlite_copy(request.getfixturevalue("sqlite_at_head"), tmp_path) as database:
            yield database
        return
    blank = request.getfixturevalue("blank_database")
    blank.upgrade()
    yield blank


# --- models and data ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny random Qwen2-VL checkpoint folder (tests.support.tiny_vlms), built once per session."""
    from tests.support.tiny_vlms import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("model") / "qwen2_vl", family="qwen2_vl")


@pytest.fixture(scope="session")
def phantom(tmp_path_factory):
    """Eight small PhantomCXR studies (PNG + report) to seed the database with."""
    from orapo_core.data import load_dataset
    from orapo_core.data.phantom import write_dataset

    folder = tmp_path_factory.mktemp("phantom")
    write_dataset(folder, 8, seed=3, size=64)
    return load_dataset(folder)


# --- the test archive ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def orthanc():
    """The Orthanc `.ci/orthanc.sh` started (tests.support.orthanc): skipped with a reason without one, except in CI."""
    from tests.support.orthanc import require_orthanc

    return require_orthanc()


# --- the browser -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator:
    """Debian's Chromium under Playwright, with explicit timeouts (skipped without Chromium, except in CI).

    Per module, not per session: Playwright's sync API keeps an event loop of its own while it runs."""
    from tests.support.browser import launch, require_chromium

    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()


def pytest_sessionfinish(session, exitstatus):
    """No thread of the app is left inside torch when the interpreter ends: that aborts the process after every test
    passed ("terminate called without an active exception", make error 134). Servers close their registries
    (`ModelRegistry.close`); a test that drafted without a server leaves at most an idle batcher, which ends here.
    Whatever is still running is named, so a new leak shows up by name rather than as an abort."""
    import threading

    left = [t for t in threading.enumerate() if t.name.startswith("orapo-") and t.is_alive()]
    for thread in left:
        thread.join(60)
    still = [t.name for t in left if t.is_alive()]
    if still:
        print(f"\nthreads of the app still running at exit: {', '.join(sorted(still))}")
