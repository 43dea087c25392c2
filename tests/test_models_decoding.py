"""Continuous batching (`orapo_core.models.decoding`): drafts joining and leaving a running batch step by step.

The reference is `transformers`' own `generate`: whoever shares a draft's
steps, and whenever it joined, its greedy text is what `generate` decodes for
it, for every model family the project builds.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from tests.support.tiers import first_fast
from tests.support.tiny_vlms import build_tiny_vlm


def image(h: int, w: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).random((h, w)) * 4000).astype(np.uint16)


# different sizes: different numbers of image tokens, so prompts differ in length and are left-padded
IMAGES = [image(90, 70, 0), image(200, 150, 1), image(64, 64, 2), image(120, 300, 3)]


@pytest.fixture(scope="module", params=first_fast())  # qwen2_vl in the fast tier, every family in `make test`
def drafter(request, tmp_path_factory):
    from orapo_core.models import Drafter

    return Drafter.from_dir(
        build_tiny_vlm(tmp_path_factory.mktemp(request.param) / request.param, family=request.param), model_version="v1"
    )


def generate_greedy(drafter, images, max_new_tokens):
    """What `generate` decodes greedily for `images` (one left-padded batch)."""
    pictures = [drafter.prepare(x) for x in images]
    return [greedy for greedy, _ in drafter._generate_many(pictures, 0, max_new_tokens, 1.0, 1.0, None)]


def decode(drafter, schedule, **settings):
    """Run a decoder where `schedule` maps a step number to the images added before it; the requests in order."""
    from orapo_core.models.decoding import DecodeRequest

    decoder = drafter.new_decoder()
    assert decoder is not None
    requests, step = [], 0
    while step <= max(schedule) or decoder.active:
        for x in schedule.get(step, []):
            requests.append(decoder.add(DecodeRequest(drafter.prepare(x), **settings)))
        decoder.step()
        step += 1
    assert all(r.done for r in requests)
    return requests


def test_greedy_drafts_match_generate_alone_together_and_when_joining_mid_decode(drafter):
    reference = generate_greedy(drafter, IMAGES, 20)
    assert all(reference)
    if drafter.loaded.model.config.model_type.startswith("qwen"):  # its image tokens (and drafts) vary with size
        assert len(set(reference)) > 1
    alone = [decode(drafter, {0: [x]}, samples=0, max_new_tokens=20)[0].texts[0] for x in IMAGES]
    together = [r.texts[0] for r in decode(drafter, {0: IMAGES}, samples=0, max_new_tokens=20)]
    # one starts; two join after 5 steps, the last after 9 (a longer prompt joining shorter rows, and the reverse)
    staggered = decode(drafter, {0: IMAGES[:1], 5: IMAGES[1:3], 9: IMAGES[3:]}, samples=2, max_new_tokens=20)
    assert alone == reference
    assert together == reference
    assert [r.texts[0] for r in staggered] == reference
    assert [r.peers for r in staggered] == [4, 4, 4, 4]


def test_a_drafts_samples_depend_on_its_seed_not_on_the_batch(drafter):
    alone = [decode(drafter, {0: [x]}, samples=3, max_new_tokens=12, seed=7)[0].texts for x in IMAGES[:3]]
    joined = [r.texts for r in decode(drafter, {0: IMAGES[2:3], 2: IMAGES[:2]}, samples=3, max_new_tokens=12, seed=7)]
    assert [joined[1], joined[2], joined[0]] == alone
    other = decode(drafter, {0: IMAGES[:1]}, samples=3, max_new_tokens=12, seed=8)[0].texts
    assert other[0] == alone[0][0] and other[1:] != alone[0][1:]  # same greedy text, other samples


def test_rows_leave_at_their_length_and_the_batch_sheds_padding(drafter):
    """A short draft returns while a long one decodes on; once it left, no column of padding it needed stays."""
    from orapo_core.models.decoding import DecodeRequest

    decoder = drafter.new_decoder()
    long = decoder.add(DecodeRequest(drafter.prepare(IMAGES[2]), samples=1, max_new_tokens=30))
    short = decoder.add(DecodeRequest(drafter.prepare(IMAGES[1]), samples=1, max_new_tokens=3))
    finished_at: dict[int, int] = {}
    step = 0
    widths = []
    while decoder.active:
        for r in decoder.step():
            finished_at[id(r)] = step
        if decoder._mask is not None:
            widths.append((step, decoder._mask.shape, int(decoder._mask[:, 0].max())))
        step += 1
    # the prefill step (0) chose each row's first token: 3 tokens by step 2, 30 by step 29
    assert finished_at[id(short)] == 2 and finished_at[id(long)] == 29
    assert all(len(t) > 0 for t in short.texts)
    rows_after, first_column_used = widths[3][1][0], widths[3][2]
    assert rows_after == 2 and first_column_used == 1  # only the long draft's two rows, nothing but its tokens


def test_a_checkpoints_repetition_penalty_applies_as_in_generate(drafter):
    config = drafter.loaded.model.generation_config
    config.repetition_penalty = 1.8
    try:
        reference = generate_greedy(drafter, IMAGES[:2], 16)
        decoded = [r.texts[0] for r in decode(drafter, {0: IMAGES[:1], 3: IMAGES[1:2]}, samples=0, max_new_tokens=16)]
    finally:
        config.repetition_penalty = None
    assert decoded == reference
    assert decoded != generate_greedy(drafter, IMAGES[:2], 16)  # the penalty changed the drafts


def test_top_p_keeps_what_transformers_keeps():
    import torch
    from transformers.generation.logits_process import TopPLogitsWarper

    from orapo_core.models.decoding import top_p_filter

    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    for p in (0.3, 0.9, 0.95):
        expected = TopPLogitsWarper(p)(None, logits.clone())
        assert torch.equal(top_p_filter(logits, p).isinf(), expected.isinf())


def test_a_generation_config_the_loop_does_not_do_falls_back_to_generate(tmp_path):
    from orapo_core.models import Drafter
    from orapo_core.models.decoding import unsupported_reason

    drafter = Drafter.from_dir(build_tiny_vlm(tmp_path / "m", family="qwen2_vl"))
    drafter.loaded.model.generation_config.no_repeat_ngram_size = 2
    assert "no_repeat_ngram_size" in unsupported_reason(drafter.loaded.model)
    assert drafter.new_decoder() is None
    drafts = drafter.draft_many(IMAGES[:2], samples=1, max_new_tokens=8)
    assert [d.text for d in drafts] == generate_greedy(drafter, IMAGES[:2], 8) and all(d.samples for d in drafts)


@pytest.mark.parametrize("drafter", ["qwen2_vl"], indirect=True)
def test_the_batcher_lets_a_late_draft_join_and_returns_each_when_its_own_rows_end(drafter):
    """A reader who asks while another's long draft decodes is answered first, and gets the same text as alone."""
    from app.services.reading.draft_batcher import DraftBatcher

    batcher = DraftBatcher(drafter, max_batch=8, max_wait_s=0)
    done: dict[str, float] = {}
    results: dict[str, object] = {}

    def reader(name, x, **settings):
        results[name] = batcher.draft(x, **settings)
        done[name] = time.perf_counter()

    first = threading.Thread(target=reader, args=("long", IMAGES[0]), kwargs=dict(samples=2, max_new_tokens=150))
    first.start()
    time.sleep(0.05)
    second = threading.Thread(target=reader, args=("short", IMAGES[1]), kwargs=dict(samples=2, max_new_tokens=6))
    second.start()
    first.join(timeout=120)
    second.join(timeout=120)
    assert done["short"] < done["long"]
    assert results["short"].sampling["batch_size"] == 2  # it decoded alongside the long draft
    assert results["short"].text == drafter.draft(IMAGES[1], samples=0, max_new_tokens=6).text
    assert results["long"].text == drafter.draft(IMAGES[0], samples=0, max_new_tokens=150).text
    assert results["short"].sampling["max_new_tokens"] == 6 and len(results["short"].samples) == 2


@pytest.mark.parametrize("drafter", ["qwen2_vl"], indirect=True)
def test_a_failed_step_fails_the_drafts_in_it_and_the_batcher_goes_on(drafter, monkeypatch):
    from app.services.reading.draft_batcher import DraftBatcher
    from orapo_core.models import decoding

    batcher = DraftBatcher(drafter, max_wait_s=0)
    real = decoding.ContinuousDecoder._decode
    calls = {"n": 0}

    def flaky(self):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("out of memory")
        return real(self)

    monkeypatch.setattr(decoding.ContinuousDecoder, "_decode", flaky)
    with pytest.raises(RuntimeError, match="out of memory"):
        batcher.draft(IMAGES[0], samples=1, max_new_tokens=8)
    assert batcher.draft(IMAGES[0], samples=1, max_new_tokens=8).text  # the next draft decodes on a fresh batch


def test_the_image_features_are_what_the_language_model_reads_per_image_alone_or_joined(drafter):
    """The merger's output, averaged over each image's tokens: the same alone, batched or joining, and equal to
    what the model's own `get_image_features` gives for the image. Families without a merger get None."""
    import torch

    from orapo_core.models.features import vision_merger

    alone = [decode(drafter, {0: [x]}, samples=0, max_new_tokens=3)[0].image_features for x in IMAGES]
    joined = [r.image_features for r in decode(drafter, {0: IMAGES[:2], 2: IMAGES[2:]}, samples=1, max_new_tokens=3)]
    model = drafter.loaded.model
    if vision_merger(model) is None:
        assert alone == [None] * 4 and joined == [None] * 4
        return
    expected = []
    for x in IMAGES:
        inputs = drafter.loaded.processor(text=[drafter.prompt_text], images=[drafter.prepare(x)], return_tensors="pt")
        with torch.inference_mode():
            out = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
        tokens = out.pooler_output if hasattr(out, "pooler_output") else out
        expected.append((tokens[0] if isinstance(tokens, (list, tuple)) else tokens).float().mean(0).numpy())
    assert np.allclose(np.array(alone), np.array(expected), atol=1e-4)
    assert np.allclose(np.array(joined), np.array(alone), atol=1e-4)
    assert drafter.draft(IMAGES[0], samples=0, max_new_tokens=3).image_features == pytest.approx(alone[0], abs=1e-4)


def test_a_model_wrapped_for_lora_still_shows_its_vision_merger(drafter):
    """A model in training is a PEFT wrapper; the ablation's checkpoint drafts score each film's familiarity from the
    merger's output, and found none there ("no vision merger"), which ended every `bench_learning` run at its first
    checkpoint. The wrapper is looked through, and the features it captures are the unwrapped model's."""
    import copy

    from peft import LoraConfig, get_peft_model

    from orapo_core.models.features import vision_merger

    model = copy.deepcopy(drafter.loaded.model)
    if vision_merger(model) is None:
        pytest.skip("this family has no vision merger")
    wrapped = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    assert vision_merger(wrapped) is not None and vision_merger(wrapped) is vision_merger(wrapped.get_base_model())
