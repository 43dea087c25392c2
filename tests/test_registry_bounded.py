"""The web process is bounded: the drafting registry keeps the served model and one more, never every version.

Promotions and rollbacks switch the served version; each switch may load a
model, and without eviction every version ever served stayed in memory. Here
five promote/rollback cycles over three versions of the tiny model keep at most
two loaded, the evicted ones are really freed (their weakrefs die), drafting
works after every switch, and a draft in flight on a model being evicted still
finishes on it.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import pytest


def _alive(refs, *, expected: int = 0, timeout_s: float = 10.0) -> int:
    """How many of `refs` still live after garbage collection, waiting up to `timeout_s` for no more than
    `expected` (an evicted batcher's worker may take a moment to end)."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = sum(r() is not None for r in refs)
        if alive <= expected or time.monotonic() > deadline:
            return alive
        gc.collect()  # about a second with torch loaded: only when reference counting has not freed them yet
        time.sleep(0.05)


@pytest.fixture
def three_versions(tmp_path: Path, tiny_model: Path):
    import shutil

    from app.runtime import open_database
    from db import ModelVersionRepository
    from orapo_core.config import Settings

    settings = Settings(data_dir=tmp_path / "data", model_dir=tiny_model, deid_secret="test-secret")
    db = open_database(settings)
    versions = ModelVersionRepository(db)
    # three bases, as after rounds that each merged the one before (versions on one base share it:
    # tests/test_shared_base.py)
    bases = [shutil.copytree(tiny_model, tmp_path / f"base-{i}") for i in range(3)]
    ids = [versions.create(f"tiny-v{i}", base_model_path=str(base)).id for i, base in enumerate(bases)]
    return settings, db, ids


def test_promotions_and_rollbacks_keep_two_models_loaded_and_free_the_rest(three_versions):
    from app.services.reading.registry import ModelRegistry
    from app.services.rounds.versions import promote_version, rollback

    settings, db, (v0, v1, v2) = three_versions
    registry = ModelRegistry(settings, db)
    assert registry.max_resident == 2  # the default: the served model and one more
    image = np.zeros((48, 48), dtype=np.uint8)
    loaded: list[tuple[weakref.ref, weakref.ref]] = []  # (Drafter, its torch model) of every load

    def draft_with_the_served_model(expected_version: int) -> None:
        served = registry.served()
        assert served.version_id == expected_version
        draft = registry.batcher(served).draft(image, samples=0, max_new_tokens=2)
        assert draft.model_version == served.name and isinstance(draft.text, str)
        drafter = registry.drafter(served)
        if not any(ref() is drafter for ref, _ in loaded):
            loaded.append((weakref.ref(drafter), weakref.ref(drafter.loaded.model)))
        resident = registry.resident()
        assert len(resident) <= 2 and resident[-1] == served.key
        del drafter, draft
        assert _alive([ref for ref, _ in loaded], expected=len(resident)) == len(resident)  # the registry's only

    promote_version(db, v0)
    draft_with_the_served_model(v0)
    for cycle in range(5):  # a new candidate goes live, then the served model rolls back to v0
        candidate = (v1, v2)[cycle % 2]
        promote_version(db, candidate)
        draft_with_the_served_model(candidate)
        rollback(db, v0)
        draft_with_the_served_model(v0)

    assert len(loaded) == 6  # v0 once (kept: each rollback found it loaded), then each candidate, reloaded
    gc.collect()
    gone = [(d, m) for d, m in loaded if d() is None]
    assert len(gone) == 4 and all(m() is None for _, m in gone)  # the weights went with the Drafter


class _GatedDrafter:
    """A stand-in Drafter whose drafts wait for `gate`, so a test can evict it while a draft is in flight."""

    def __init__(self, name: str, gate: threading.Event | None = None):
        self.name = name
        self.gate = gate
        self.started = threading.Event()

    def draft_many(self, images, **settings):
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(30)
        return [f"{self.name}: {settings}" for _ in images]


def _served(i: int):
    from app.services.reading.served import ServedModel

    return ServedModel(i, f"v{i}", Path(f"/models/base-{i}"))


def test_a_draft_in_flight_on_an_evicted_model_finishes_and_the_model_is_then_freed():
    from app.services.reading.registry import ModelRegistry

    gate = threading.Event()
    registry = ModelRegistry(
        None,
        None,
        max_resident=2,
        loader=lambda served: _GatedDrafter(served.name, gate if served.version_id == 0 else None),
    )
    first = registry.drafter(_served(0))
    first_ref = weakref.ref(first)
    results: list[str] = []
    reader = threading.Thread(target=lambda: results.append(registry.batcher(_served(0)).draft("image", samples=1)))
    reader.start()
    assert first.started.wait(30)
    del first

    assert registry.batcher(_served(1)).draft("image", samples=1) == "v1: {'samples': 1}"
    assert registry.batcher(_served(2)).draft("image", samples=1) == "v2: {'samples': 1}"  # evicts v0 mid-draft
    assert registry.resident() == ["version-1", "version-2"]
    assert first_ref() is not None  # the reader still drafts on it
    gate.set()
    reader.join(30)
    assert results == ["v0: {'samples': 1}"]
    assert _alive([first_ref]) == 0  # its batcher's worker ended instead of idling with it

    registry.drafter(_served(1))  # a use makes v1 the most recent: loading v3 evicts v2
    registry.drafter(_served(3))
    assert registry.resident() == ["version-1", "version-3"]


def test_the_bound_comes_from_the_settings_and_the_served_model_always_fits(monkeypatch, tmp_path):
    from app.services.reading.draft_batcher import DraftBatcher
    from app.services.reading.registry import ModelRegistry
    from app.settings import web_settings
    from orapo_core.config import Settings

    monkeypatch.setenv("ORAPO_MAX_RESIDENT_MODELS", "3")
    settings = web_settings(Settings(data_dir=tmp_path))
    assert settings.max_resident_models == 3 and ModelRegistry(settings, None).max_resident == 3
    assert ModelRegistry(settings, None, max_resident=1).max_resident == 1
    with pytest.raises(ValueError, match="at least 1"):
        ModelRegistry(settings, None, max_resident=0)

    batcher = DraftBatcher(_GatedDrafter("idle"), idle_s=60)
    assert batcher.draft("image") == "idle: {}"
    worker = batcher._worker
    assert worker is not None and worker.is_alive()  # idling, ready for the next draft
    batcher.close()
    worker.join(5)
    assert not worker.is_alive()
    assert batcher.draft("image") == "idle: {}"  # a caller holding a closed batcher still gets its draft


def test_the_draft_batching_window_comes_from_the_settings(monkeypatch, tmp_path):
    from app.services.reading.draft_batcher import DRAFT_MAX_WAIT_S
    from app.services.reading.registry import ModelRegistry
    from orapo_core.config import Settings

    loader = lambda served: _GatedDrafter(served.name)  # noqa: E731
    monkeypatch.delenv("ORAPO_DRAFT_WAIT_MS", raising=False)
    assert (
        ModelRegistry(Settings(data_dir=tmp_path), None, loader=loader).batcher(_served(0)).max_wait_s
        == DRAFT_MAX_WAIT_S
    )
    monkeypatch.setenv("ORAPO_DRAFT_WAIT_MS", "250")
    registry = ModelRegistry(Settings(data_dir=tmp_path), None, loader=loader)  # an engine Settings: read from the env
    assert registry.batcher(_served(0)).max_wait_s == 0.25
    assert registry.batcher(_served(0)).draft("image") == "v0: {}"
    monkeypatch.setenv("ORAPO_DRAFT_WAIT_MS", "-1")
    with pytest.raises(ValueError):
        ModelRegistry(Settings(data_dir=tmp_path), None, loader=loader)
