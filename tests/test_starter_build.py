"""Building the starter: a few steps make a folder the product's loading path reads and drafts from."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # starter builds

TINY = dict(
    n_train=12,
    steps=3,
    batch_size=4,
    warmup_steps=1,
    vision_steps=2,
    vision_batch=4,
    vision_n_train=8,
    perception_batch=0,
)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    from orapo_core.models.starter import WarmStartPlan, build_starter

    return build_starter(tmp_path_factory.mktemp("starter") / "starter", WarmStartPlan(**TINY), show_progress=False)


def test_a_build_is_a_save_pretrained_folder_that_drafts(built):
    from orapo_core.data.phantom import generate_study
    from orapo_core.models import Drafter

    assert {
        "config.json",
        "model.safetensors",
        "processor_config.json",
        "tokenizer.json",
        "chat_template.jinja",
        "generation_config.json",
        "starter_card.json",
    } <= {p.name for p in built.iterdir()}
    assert not built.with_name("starter.partial").exists()
    drafter = Drafter.from_dir(built)
    assert type(drafter.loaded.model).__name__ == "Qwen2VLForConditionalGeneration"
    draft = drafter.draft(generate_study(3, size=300).image, samples=2, max_new_tokens=6)
    assert isinstance(draft.text, str) and len(draft.samples) == 2


def test_a_square_or_near_square_radiograph_becomes_one_visual_token(built):
    from PIL import Image

    from orapo_core.models import load_model

    processor = load_model(built).processor
    # (1841, 1955): a portrait radiograph like pydicom-data's; even 3:1 fits the one-token pixel budget.
    for size, expected in [((96, 96), 1), ((512, 512), 1), ((1841, 1955), 1), ((3000, 1000), 1)]:
        inputs = processor(
            text=["<|vision_start|><|image_pad|><|vision_end|>"], images=[Image.new("RGB", size)], return_tensors="pt"
        )
        tokens = int((inputs["input_ids"] == processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")).sum())
        assert tokens == expected, (size, tokens)


def test_the_card_says_how_it_was_built(built):
    from orapo_core.models.starter import RARE_KINDS, read_card
    from orapo_core.models.starter.sft import COMMON_KINDS

    card = read_card(built)
    assert card["plan"]["seed"] == 0 and card["steps_done"] == 3 and card["stopped_by"] == "steps"
    # TINY's vision warm-up is not the shipped one: an experiment's build, which the benchmark makes
    assert card["command"].startswith(f"python -m benchmarks.bench_starter --build-only --rebuild {built} --seed 0 ")
    from orapo_core.models.starter import StarterArchitecture, WarmStartPlan
    from orapo_core.models.starter.build import build_command

    assert build_command(built, WarmStartPlan(), StarterArchitecture()) == (
        "orapo starter build --seed 0 --n-train 2000 --steps 300"
    )  # the shipped starter's card says this
    prevalence = card["plan"]["prevalence"]
    from orapo_core.data.phantom import DEFAULT_PREVALENCE

    for kind in RARE_KINDS:  # rare findings scarce on purpose, common ones drawn more often than PhantomCXR does
        assert prevalence[kind] == pytest.approx(DEFAULT_PREVALENCE[kind] * 0.5)
    common = card["plan"]["common_prevalence"]
    for kind in COMMON_KINDS:
        assert prevalence[kind] == max(DEFAULT_PREVALENCE[kind], common) > DEFAULT_PREVALENCE[kind] * 0.99
    assert prevalence["atelectasis"] == DEFAULT_PREVALENCE["atelectasis"]
    assert card["parameters"] > 1_000_000 and card["torch"]


def test_same_seed_same_weights(built, tmp_path):
    from safetensors.numpy import load_file

    from orapo_core.models.starter import WarmStartPlan, build_starter

    again = build_starter(tmp_path / "again", WarmStartPlan(**TINY), show_progress=False)
    first, second = load_file(built / "model.safetensors"), load_file(again / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(np.array_equal(first[k], second[k]) for k in first)


def test_the_wall_clock_cap_stops_training_and_the_card_says_so(tmp_path):
    from orapo_core.models.starter import WarmStartPlan, build_starter, read_card

    plan = WarmStartPlan(**{**TINY, "steps": 1000, "max_minutes": 0.0})
    card = read_card(build_starter(tmp_path / "capped", plan, show_progress=False))
    assert card["stopped_by"] == "time" and card["steps_done"] < 1000


def test_if_missing_copies_a_shipped_build_only_when_it_was_made_with_the_same_settings(built, tmp_path):
    from orapo_core.models.starter import WarmStartPlan
    from orapo_core.models.starter.build import copy_shipped_starter

    plan = WarmStartPlan(**TINY)
    assert copy_shipped_starter(tmp_path / "a", replace(plan, seed=1), shipped_dir=built) is None
    assert copy_shipped_starter(tmp_path / "a", replace(plan, steps=4), shipped_dir=built) is None
    assert copy_shipped_starter(tmp_path / "a", plan, shipped_dir=tmp_path / "nothing") is None
    copied = copy_shipped_starter(tmp_path / "a", replace(plan, max_minutes=1.0), shipped_dir=built)
    assert (copied / "model.safetensors").read_bytes() == (built / "model.safetensors").read_bytes()
    other_shape = tmp_path / "other-shape"  # same plan, another architecture: not the default starter
    shutil.copytree(built, other_shape)
    card = json.loads((other_shape / "starter_card.json").read_text())
    card["architecture"]["image_side"] = 224
    (other_shape / "starter_card.json").write_text(json.dumps(card))
    assert copy_shipped_starter(tmp_path / "b", plan, shipped_dir=other_shape) is None
    assert copy_shipped_starter(tmp_path / "c", replace(plan, perception_batch=4), shipped_dir=built) is None
    older = tmp_path / "older-card"  # a card written before a plan field existed: built with its default
    shutil.copytree(built, older)
    card = json.loads((older / "starter_card.json").read_text())
    del card["plan"]["perception_batch"]
    (older / "starter_card.json").write_text(json.dumps(card))
    assert copy_shipped_starter(tmp_path / "d", plan, shipped_dir=older) is not None


def test_orapo_starter_build_if_missing_and_info(built, data_dir, capsys):
    from app.cli import main

    target = data_dir / "models" / "starter"
    shutil.copytree(built, target)
    stamp = (target / "model.safetensors").stat().st_mtime_ns
    assert main(["starter", "build", "--if-missing", "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == str(target)
    assert (target / "model.safetensors").stat().st_mtime_ns == stamp
    assert main(["starter", "info"]) == 0
    assert json.loads(capsys.readouterr().out)["folder"] == str(target)


def test_orapo_starter_refuses_bad_options_and_a_missing_model(data_dir, capsys):
    from app.cli import main

    assert main(["starter", "build", "--steps", "0"]) == 2
    assert capsys.readouterr().err.startswith("bad_option: ")
    assert main(["starter", "build", "--minutes", "-1"]) == 2
    assert "--minutes must be above 0" in capsys.readouterr().err
    assert main(["starter", "info"]) == 2
    assert "orapo starter build" in capsys.readouterr().err


def test_the_architecture_experiments_are_the_benchmarks_not_the_commands(data_dir, capsys):
    from app.cli import main
    from orapo_core.errors import OrapoError
    from orapo_core.experimental.starter import starter_variant

    for option in (
        "--image-side",
        "--patch-size",
        "--vision-n-train",
        "--vision-steps",
        "--perception-batch",
        "--rare-fraction",
    ):
        with pytest.raises(SystemExit):
            main(["starter", "build", option, "1"])
        assert "unrecognized arguments" in capsys.readouterr().err
    for options, said in (
        ({"vision_steps": -1}, "--vision-steps must be above 0"),
        ({"perception_batch": -1}, "--perception-batch must be 0 (off) or above"),
        ({"rare_fraction": 1.5}, "--rare-fraction must lie in (0, 1]"),
        ({"image_side": 100, "patch_size": 24}, "multiple of twice --patch-size"),
    ):  # 100: not 2x2x24
        with pytest.raises(OrapoError, match="bad_option") as refused:
            starter_variant(**options)
        assert said in refused.value.message
    plan, arch = starter_variant(rare_fraction=0.25, vision_steps=3)
    assert (plan.rare_fraction, plan.vision_steps, arch) == (0.25, 3, None)  # None: the shipped architecture
    # The starter shipped until 2026-12-07 stays buildable: no perception batches, the smaller vision warm-up.
    plan, _ = starter_variant(rare_fraction=0.25, vision_steps=1000, vision_n_train=2000, perception_batch=0)
    assert plan.perception_batch == 0


def test_a_variant_with_a_quarter_patch_has_four_visual_tokens_and_says_so(tmp_path):
    from PIL import Image

    from orapo_core.experimental.starter import starter_variant
    from orapo_core.models import load_model
    from orapo_core.models.starter import WarmStartPlan, build_starter, read_card

    assert starter_variant()[1] is None  # the default, shipped one
    _, arch = starter_variant(image_side=96, patch_size=24)
    out = build_starter(tmp_path / "four", WarmStartPlan(**TINY), arch, show_progress=False)
    card = read_card(out)
    assert card["architecture"]["patch_size"] == 24
    assert card["command"].endswith("--image-side 96 --patch-size 24")
    processor = load_model(out).processor
    inputs = processor(
        text=["<|vision_start|><|image_pad|><|vision_end|>"], images=[Image.new("RGB", (512, 512))], return_tensors="pt"
    )
    assert int((inputs["input_ids"] == processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")).sum()) == 4


def test_perception_batches_train_the_answer_state_on_the_films_and_the_card_says_so(built, tmp_path):
    from safetensors.torch import load_file

    from orapo_core.models.starter import WarmStartPlan, build_starter, read_card

    out = build_starter(tmp_path / "perceiving", WarmStartPlan(**{**TINY, "perception_batch": 4}), show_progress=False)
    card = read_card(out)
    assert card["plan"]["perception_batch"] == 4
    assert card["command"].endswith("--vision-n-train 8 --vision-steps 2 --perception-batch 4")  # TINY's own
    assert read_card(built)["plan"]["perception_batch"] == 0 and "--perception-batch 0" in read_card(built)["command"]
    # Same seed, same vision warm-up: only the report steps' extra loss tells the two builds apart.
    mine, plain = load_file(out / "model.safetensors"), load_file(built / "model.safetensors")
    assert mine.keys() == plain.keys()
    assert any(not (mine[k] == plain[k]).all() for k in mine if k.startswith("model.layers."))


def test_the_benchmark_builds_a_variant_with_the_options_the_command_leaves_out(data_dir, tmp_path, monkeypatch):
    import orapo_core.models.starter as starter_pkg
    from app.cli import main
    from benchmarks import bench_starter
    from orapo_core.models.starter import WarmStartPlan

    seen = {}

    def fake_build(out, plan, arch=None, *, show_progress):
        seen["plan"], seen["arch"] = plan, arch
        return Path(out)

    monkeypatch.setattr(starter_pkg, "build_starter", fake_build)
    bench_starter.main(
        ["--build-only", "--rebuild", str(tmp_path / "m"), "--rare-fraction", "0.25", "--patch-size", "24"]
    )
    assert seen["plan"].rare_fraction == 0.25 and seen["arch"].patch_size == 24
    assert main(["starter", "build", "--out", str(tmp_path / "n"), "--quiet", "--no-calibration"]) == 0
    assert seen["plan"] == WarmStartPlan() and seen["arch"] is None  # the shipped build's
    assert (seen["plan"].rare_fraction, seen["plan"].perception_batch) == (0.5, 16)


def test_orapo_starter_build_writes_the_unfamiliar_film_calibration_beside_the_weights(built, tmp_path, monkeypatch):
    """Issue 41 §3: a starter built on site had no calibration, so its first drafts said the check had not run."""
    import orapo_core.models.starter as starter_pkg
    from app.cli import main
    from orapo_core.models import unfamiliar
    from orapo_core.models.loading import load_model

    def copy_build(out, plan, arch=None, *, show_progress):  # the fixture's tiny build stands in for a new one
        shutil.copytree(built, out, dirs_exist_ok=True)
        (Path(out) / unfamiliar.CALIBRATION_FILE).unlink(missing_ok=True)
        return Path(out)

    real = unfamiliar.build_calibration
    monkeypatch.setattr(starter_pkg, "build_starter", copy_build)
    monkeypatch.setattr(
        unfamiliar,
        "build_calibration",
        lambda loaded, cache_dir=None: real(loaded, cache_dir, n_reference=48, n_heldout=48, side=96),
    )
    out = tmp_path / "site-starter"
    assert main(["starter", "build", "--out", str(out), "--quiet"]) == 0
    assert unfamiliar.find_calibration(load_model(out, device="cpu")) is not None  # found, and fits these weights
    bare = tmp_path / "bare"
    assert main(["starter", "build", "--out", str(bare), "--quiet", "--no-calibration"]) == 0
    assert not (bare / unfamiliar.CALIBRATION_FILE).exists()


def test_two_first_requests_copying_the_shipped_starter_at_once_both_get_it(built, tmp_path):
    """On a new data folder two requests at once both copied the starter into one shared '.partial' folder, and
    one failed with FileExistsError."""
    import threading

    from orapo_core.models.starter.build import WarmStartPlan, copy_shipped_starter, read_card

    plan = WarmStartPlan(**{k: v for k, v in read_card(built)["plan"].items() if k in WarmStartPlan().to_dict()})
    out, results, errors = tmp_path / "data" / "models" / "starter", [], []
    start = threading.Barrier(4)

    def copy():
        start.wait()
        try:
            results.append(copy_shipped_starter(out, plan, shipped_dir=built))
        except Exception as exc:  # noqa: BLE001 - the test reports any failure
            errors.append(exc)

    threads = [threading.Thread(target=copy) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and results == [out] * 4 and (out / "config.json").is_file()
    assert sorted(p.name for p in out.parent.iterdir()) == ["starter"]  # no staging folder left behind
