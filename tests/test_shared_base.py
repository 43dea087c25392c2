"""Versions on one base share one copy of it: the base loads once, each version's LoRA adapter is a named adapter.

The baseline and a round's candidate are the same base folder with and without
an adapter; the web process used to load the base once per version. Here each
view of a shared base gives exactly the logits and drafts of that version loaded
on its own, adapters come and go without touching the others, and the registry
keeps one base in memory over five promote/rollback cycles of three versions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _adapter(base: Path, out: Path, seed: int, targets: list[str]) -> Path:
    """A LoRA adapter for `base` with random (non-zero) B matrices, as a round of training would leave."""
    import torch
    from peft import LoraConfig, get_peft_model

    from orapo_core.models import load_model, save_adapter

    torch.manual_seed(seed)
    peft_model = get_peft_model(load_model(base).model, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    return save_adapter(peft_model, out)


@pytest.fixture(scope="module")
def adapters(tiny_model: Path, tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return (
        _adapter(tiny_model, root / "a1", 1, ["q_proj", "v_proj"]),
        _adapter(tiny_model, root / "a2", 2, ["q_proj", "o_proj", "down_proj"]),
    )


def _image() -> np.ndarray:
    y, x = np.mgrid[0:64, 0:56]
    return (np.exp(-(((y - 32) / 20) ** 2 + ((x - 28) / 18) ** 2)) * 255).astype(np.uint8)


def _logits(loaded, lock=None):
    import contextlib

    import torch

    from orapo_core.models import render_prompt, to_rgb_image

    inputs = loaded.processor(
        text=[render_prompt(loaded.processor)], images=[to_rgb_image(_image())], return_tensors="pt"
    )
    with lock or contextlib.nullcontext(), torch.inference_mode(), loaded.using() as model:
        return model(**inputs).logits[0, -1].clone()


def test_each_view_of_a_shared_base_is_exactly_its_version_loaded_alone(tiny_model, adapters):
    import torch

    from orapo_core.models import load_model
    from orapo_core.models.shared_base import SharedBase

    a1, a2 = adapters
    alone = {key: _logits(load_model(tiny_model, adapter)) for key, adapter in (("v0", None), ("v1", a1), ("v2", a2))}
    assert not torch.allclose(alone["v0"], alone["v1"], atol=1e-4)
    assert not torch.allclose(alone["v1"], alone["v2"], atol=1e-4)

    shared = SharedBase(tiny_model)
    views = {"v0": shared.view("v0"), "v1": shared.view("v1", a1), "v2": shared.view("v2", a2)}
    assert shared.views() == 3 and len(shared.adapters()) == 2
    for _ in range(2):  # switching back and forth leaves no adapter on for the wrong version
        for key in ("v1", "v0", "v2", "v0"):
            assert torch.allclose(_logits(views[key], shared.lock), alone[key], atol=1e-5), key

    assert shared.release("v1") == 2 and len(shared.adapters()) == 1
    assert torch.allclose(_logits(views["v2"], shared.lock), alone["v2"], atol=1e-5)
    assert torch.allclose(_logits(views["v0"], shared.lock), alone["v0"], atol=1e-5)
    # a draft that was waiting when its version was released still runs on its own adapter, then lets it go
    assert torch.allclose(_logits(views["v1"], shared.lock), alone["v1"], atol=1e-5)
    assert len(shared.adapters()) == 1

    assert shared.release("v2") == 1 and shared.adapters() == []
    assert shared._peft is None  # no PEFT wrapper left around the plain base
    assert torch.allclose(_logits(views["v0"], shared.lock), alone["v0"], atol=1e-5)
    assert shared.release("v0") == 0


def test_drafts_on_a_shared_base_are_the_drafts_of_each_version_alone(tiny_model, adapters):
    from orapo_core.models import Drafter
    from orapo_core.models.shared_base import SharedBase

    a1, _ = adapters
    shared = SharedBase(tiny_model)
    on_shared = [Drafter(shared.view(key, adapter), lock=shared.lock) for key, adapter in (("v0", None), ("v1", a1))]
    for drafter, adapter in zip(on_shared, (None, a1)):
        alone = Drafter.from_dir(tiny_model, adapter)
        mine, theirs = (
            drafter.draft(_image(), samples=2, max_new_tokens=8),
            alone.draft(_image(), samples=2, max_new_tokens=8),
        )
        assert (mine.text, mine.samples) == (theirs.text, theirs.samples)


@pytest.fixture
def versions_on_one_base(tmp_path: Path, tiny_model: Path, adapters):
    from app.runtime import open_database
    from db import ModelVersionRepository
    from orapo_core.config import Settings

    settings = Settings(data_dir=tmp_path / "data", model_dir=tiny_model, deid_secret="test-secret")
    db = open_database(settings)
    repo = ModelVersionRepository(db)
    ids = [repo.create("tiny-base", base_model_path=str(tiny_model)).id]
    ids += [
        repo.create(f"tiny-a{i}", base_model_path=str(tiny_model), adapter_path=str(a)).id
        for i, a in enumerate(adapters, 1)
    ]
    return settings, db, ids


def test_the_registry_keeps_one_base_for_every_version_on_it(versions_on_one_base, adapters, monkeypatch):
    from app.services.reading.registry import ModelRegistry
    from app.services.rounds.versions import promote_version, rollback
    from orapo_core.models import Drafter, shared_base

    settings, db, (v0, v1, v2) = versions_on_one_base
    loads: list[Path] = []
    real_init = shared_base.SharedBase.__init__

    def counting_init(self, model_dir, **kwargs):
        loads.append(Path(model_dir))
        real_init(self, model_dir, **kwargs)

    monkeypatch.setattr(shared_base.SharedBase, "__init__", counting_init)
    registry = ModelRegistry(settings, db)
    alone = {
        v: Drafter.from_dir(settings.model_dir, adapter).draft(_image(), samples=0, max_new_tokens=8).text
        for v, adapter in ((v0, None), (v1, adapters[0]), (v2, adapters[1]))
    }

    def draft(expected: int) -> None:
        served = registry.served()
        assert served.version_id == expected
        assert registry.batcher(served).draft(_image(), samples=0, max_new_tokens=8).text == alone[expected]
        assert len(registry.resident()) <= 2 and len(registry.bases()) == 1

    promote_version(db, v0)
    draft(v0)
    for cycle in range(5):
        candidate = (v1, v2)[cycle % 2]
        promote_version(db, candidate)
        draft(candidate)
        rollback(db, v0)
        draft(v0)
    assert len(loads) == 1  # the base was loaded once; versions came and went as adapters on it
    base = next(iter(registry._bases.values()))
    assert len(base.adapters()) == 1 and base.views() == 2  # v0 and the last candidate, nothing else kept
