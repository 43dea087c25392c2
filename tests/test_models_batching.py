"""Batched drafting: `Drafter.draft_many` and the app's `DraftBatcher` in front of it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from orapo_core.errors import OrapoError
from tests.support.tiny_vlms import build_tiny_vlm


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    from orapo_core.models import Drafter

    model_dir: Path = build_tiny_vlm(tmp_path_factory.mktemp("tiny") / "qwen2_vl", family="qwen2_vl")
    return Drafter.from_dir(model_dir, model_version="v1")


def image(h: int, w: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).random((h, w)) * 4000).astype(np.uint16)


# different sizes: different numbers of image tokens, so the batch is left-padded
IMAGES = [image(90, 70, 0), image(200, 150, 1), image(64, 64, 2), image(120, 300, 3)]


def test_greedy_draft_is_the_same_alone_and_in_a_left_padded_batch(drafter):
    alone = [drafter.draft(x, samples=0, max_new_tokens=24) for x in IMAGES]
    together = drafter.draft_many(IMAGES, samples=0, max_new_tokens=24)
    assert [d.text for d in together] == [d.text for d in alone]
    assert all(d.text for d in together)


def test_padding_is_on_the_left_and_mrope_positions_come_from_the_attention_mask(drafter):
    """The per-step scores of a padded row match its unpadded run; they would not with an all-ones mask."""
    import torch

    processor, model = drafter.loaded.processor, drafter.loaded.model
    pictures = [drafter.prepare(x) for x in IMAGES[1:3]]  # the second is shorter: padded

    def scores(pics, *, ignore_padding=False):
        inputs = processor(
            text=[drafter.prompt_text] * len(pics), images=pics, return_tensors="pt", padding=True, padding_side="left"
        )
        if ignore_padding:
            inputs["attention_mask"] = torch.ones_like(inputs["attention_mask"])
        with torch.inference_mode():
            out = model.generate(
                **inputs,
                do_sample=False,
                max_new_tokens=8,
                output_scores=True,
                return_dict_in_generate=True,
                pad_token_id=processor.tokenizer.pad_token_id,
            )
        return inputs["attention_mask"], torch.stack(out.scores, dim=1)

    mask, batched = scores(pictures)
    assert mask[1, 0] == 0 and mask[1, -1] == 1  # left padding
    _, alone = scores(pictures[1:])
    assert torch.allclose(batched[1], alone[0], atol=1e-4)
    _, unmasked = scores(pictures, ignore_padding=True)
    assert not torch.allclose(unmasked[1], alone[0], atol=1e-2)


def test_draft_many_gives_each_image_its_k_samples_and_records_the_batch(drafter):
    drafts = drafter.draft_many(IMAGES[:3], samples=3, max_new_tokens=10, seed=5)
    assert len(drafts) == 3
    for d in drafts:
        assert d.text and len(d.samples) == 3 and d.latency_ms > 0
        assert d.sampling == {
            "samples": 3,
            "max_new_tokens": 10,
            "temperature": 1.0,
            "top_p": 0.95,
            "top_k": 0,
            "seed": 5,
            "batch_size": 3,
        }
        assert (d.model_name, d.model_version) == ("qwen2_vl", "v1")
    again = drafter.draft_many(IMAGES[:3], samples=3, max_new_tokens=10, seed=5)
    assert [d.samples for d in again] == [d.samples for d in drafts]  # a batch is reproducible by its seed
    assert drafter.draft_many([], samples=3) == []
    with pytest.raises(OrapoError):
        drafter.draft_many(IMAGES[:2], samples=40)


class CountingDrafter:
    """Stands in for a Drafter: records each draft_many call; a draft's text names its image."""

    def __init__(self, delay_s: float = 0.2, fail_when=None):
        self.calls: list[list[str]] = []
        self.delay_s = delay_s
        self.fail_when = fail_when or (lambda images: False)

    def draft_many(self, images, **settings):
        self.calls.append(list(images))
        time.sleep(self.delay_s)  # a generate in progress: others arrive meanwhile
        if self.fail_when(images):
            raise OrapoError("draft_failed", "the model fell over")
        return [_FakeDraft(f"report of {x}", settings) for x in images]


class _FakeDraft:
    def __init__(self, text, settings):
        self.text, self.settings = text, settings


def _draft_at_once(batcher, names, **settings):
    results: dict[str, object] = {}
    start = threading.Barrier(len(names))

    def reader(name):
        start.wait()
        try:
            results[name] = batcher.draft(name, **settings)
        except Exception as exc:  # noqa: BLE001
            results[name] = exc

    threads = [threading.Thread(target=reader, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    return results


def test_the_batcher_drafts_concurrent_requests_together_and_each_caller_gets_its_own():
    from app.services.reading.draft_batcher import DraftBatcher

    fake = CountingDrafter()
    batcher = DraftBatcher(fake, max_batch=8, max_wait_s=0.05)
    names = [f"image-{i}" for i in range(6)]
    results = _draft_at_once(batcher, names, samples=4)
    assert {n: r.text for n, r in results.items()} == {n: f"report of {n}" for n in names}
    assert all(r.settings == {"samples": 4} for r in results.values())
    assert len(fake.calls) < len(names)  # fewer generates than requests
    assert sorted(x for call in fake.calls for x in call) == sorted(names)  # each drafted exactly once


def test_the_batcher_caps_a_batch_and_never_mixes_settings():
    from app.services.reading.draft_batcher import DraftBatcher

    fake = CountingDrafter(delay_s=0.1)
    batcher = DraftBatcher(fake, max_batch=3, max_wait_s=0.05)
    assert {n: r.text for n, r in _draft_at_once(batcher, [f"a{i}" for i in range(7)]).items()} == {
        f"a{i}": f"report of a{i}" for i in range(7)
    }
    assert max(len(c) for c in fake.calls) <= 3 and len(fake.calls) >= 3

    fake.calls.clear()
    out: dict[str, object] = {}
    threads = [
        threading.Thread(target=lambda n=n, k=k: out.__setitem__(n, batcher.draft(n, samples=k)))
        for n, k in [("x", 1), ("y", 2), ("z", 1)]
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert {n: d.settings["samples"] for n, d in out.items()} == {"x": 1, "y": 2, "z": 1}
    for call in fake.calls:
        assert len({out[n].settings["samples"] for n in call}) == 1


def test_a_failed_batch_fails_every_caller_in_it_and_the_batcher_keeps_working():
    from app.services.reading.draft_batcher import DraftBatcher

    fake = CountingDrafter(fail_when=lambda images: "poison" in images)
    batcher = DraftBatcher(fake, max_batch=8, max_wait_s=0.1)
    results = _draft_at_once(batcher, ["poison", "b", "c"])
    failed = [n for n, r in results.items() if isinstance(r, OrapoError)]
    poisoned = next(call for call in fake.calls if "poison" in call)
    assert sorted(failed) == sorted(poisoned) and len(poisoned) > 1  # everyone in that batch, and only them
    assert all(results[n].code == "draft_failed" for n in failed)
    assert batcher.draft("d").text == "report of d"  # the worker survived


def test_the_worker_stops_when_idle_and_starts_again_on_demand():
    from app.services.reading.draft_batcher import DraftBatcher

    batcher = DraftBatcher(CountingDrafter(delay_s=0), max_wait_s=0, idle_s=0.05)
    assert batcher.draft("a").text == "report of a"
    deadline = time.monotonic() + 5
    while batcher._worker is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert batcher._worker is None
    assert batcher.draft("b").text == "report of b"


def test_a_bad_image_fails_only_its_own_caller(drafter):
    from app.services.reading.draft_batcher import DraftBatcher

    batcher = DraftBatcher(drafter, max_wait_s=0.05)
    with pytest.raises(OrapoError) as refused:
        batcher.draft(np.zeros((2, 3, 5, 7)), samples=0, max_new_tokens=4)
    assert refused.value.code == "image_invalid"


def test_the_batcher_in_front_of_a_real_drafter_matches_drafting_alone(drafter):
    from app.services.reading.draft_batcher import DraftBatcher

    calls = []
    original = drafter.draft_many

    class Spy:
        prepare = staticmethod(drafter.prepare)

        def draft_many(self, images, **settings):
            calls.append(len(images))
            return original(images, **settings)

    batcher = DraftBatcher(Spy(), max_batch=8, max_wait_s=0.2)
    names = [str(i) for i in range(len(IMAGES))]
    results: dict[str, object] = {}
    start = threading.Barrier(len(names))

    def reader(i):
        start.wait()
        results[str(i)] = batcher.draft(IMAGES[i], samples=2, max_new_tokens=16)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(len(IMAGES))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    alone = [drafter.draft(x, samples=0, max_new_tokens=16).text for x in IMAGES]
    assert [results[n].text for n in names] == alone
    assert all(len(results[n].samples) == 2 and results[n].latency_ms > 0 for n in names)
    assert sum(calls) == len(IMAGES) and len(calls) < len(IMAGES)
