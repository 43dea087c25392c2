"""The one evaluator, `evaluate_drafter`: batched greedy drafts are the one-by-one drafts, scored the same way."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.support.tiny_vlms import build_tiny_vlm


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    from orapo_core.models import Drafter

    return Drafter.from_dir(build_tiny_vlm(tmp_path_factory.mktemp("tiny") / "qwen2_vl", family="qwen2_vl"))


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """Studies of three image sizes, so a batch holds different numbers of image tokens and is left-padded."""
    from orapo_core.data import write_dataset
    from orapo_core.train.dataset import load_training_records

    root: Path = tmp_path_factory.mktemp("phantoms")
    studies = []
    for size, seed in ((64, 1), (112, 2), (80, 3)):
        studies += load_training_records(write_dataset(root / str(size), n=2, seed=seed, size=size))
    return studies


def test_batched_greedy_drafts_are_the_one_by_one_drafts(drafter, records):
    from orapo_core.models.evaluate import evaluate_drafter, load_study_image

    alone = evaluate_drafter(drafter, records, batch_size=1, max_new_tokens=16)
    seen = []
    batched = evaluate_drafter(
        drafter, records, batch_size=4, max_new_tokens=16, progress=lambda done, total: seen.append((done, total))
    )
    assert [p["draft"] for p in batched.predictions] == [p["draft"] for p in alone.predictions]
    assert any(p["draft"] for p in alone.predictions)
    assert [p["study_id"] for p in batched.predictions] == [r.study_id for r in records]
    assert replace(batched.metrics, seconds=None) == replace(alone.metrics, seconds=None)
    assert alone.metrics.seconds > 0 and alone.metrics.n_reports == len(records)
    assert seen == [(4, 6), (6, 6)]
    # images decoded once by the caller (the ablation does, for its checkpoints) give the same drafts
    images = [load_study_image(r.image_paths[0]) for r in records]
    given = evaluate_drafter(drafter, records, images=images, batch_size=3, max_new_tokens=16)
    assert [p["draft"] for p in given.predictions] == [p["draft"] for p in alone.predictions]


def test_samples_are_kept_and_a_rescore_scores_other_texts_the_same_way(drafter, records):
    from orapo_core.facts import keep_agreed
    from orapo_core.models.evaluate import evaluate_drafter, rescore

    greedy = evaluate_drafter(drafter, records, batch_size=3, max_new_tokens=16)
    sampled = evaluate_drafter(drafter, records, batch_size=3, max_new_tokens=16, samples=2)
    # the greedy drafts and their scores do not depend on the samples drawn beside them
    assert [p["draft"] for p in sampled.predictions] == [p["draft"] for p in greedy.predictions]
    assert replace(sampled.metrics, seconds=None) == replace(greedy.metrics, seconds=None)
    assert all(len(p["samples"]) == 2 for p in sampled.predictions) and "samples" not in greedy.predictions[0]
    same = rescore(sampled, records, lambda row: row["draft"])
    assert same.metrics == replace(greedy.metrics, seconds=None)  # a rescore drafts nothing: no drafting time
    # another text per study is labelled and scored as a draft would be
    normal = "FINDINGS: Cardiomegaly. Moderate right pneumothorax."
    other = rescore(sampled, records, lambda row: normal)
    assert all(p["draft"] == normal and p["labels"]["Pneumothorax"] == 1 for p in other.predictions)
    filtered = rescore(sampled, records, lambda row: keep_agreed(row["draft"], row["samples"], 1.0))
    assert [p["study_id"] for p in filtered.predictions] == [r.study_id for r in records]
    with pytest.raises(ValueError, match="records"):
        rescore(sampled, records[:2], lambda row: row["draft"])


def test_a_model_in_training_mode_is_evaluated_in_eval_mode_and_given_back(drafter, records):
    from orapo_core.models.evaluate import evaluate_drafter

    model = drafter.loaded.model
    modes = []
    hook = model.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    model.train()
    try:
        evaluate_drafter(drafter, records[:2], batch_size=2, max_new_tokens=4)
    finally:
        hook.remove()
        trained = model.training
        model.eval()
    assert modes and not any(modes) and trained


def test_batch_size_must_be_positive(drafter, records):
    from orapo_core.models.evaluate import evaluate_drafter

    with pytest.raises(ValueError, match="batch_size"):
        evaluate_drafter(drafter, records, batch_size=0)
