"""Loading local checkpoints of four VLM families, adapters, refusals, and no network."""

from __future__ import annotations

import importlib.util
import json
import socket
from pathlib import Path

import numpy as np
import pytest

from orapo_core.errors import OrapoError
from tests.support.tiny_vlms import FAMILIES, build_tiny_vlm

MODEL_CLASSES = {
    "qwen2_vl": ("Qwen2VLForConditionalGeneration", "Qwen2VLProcessor"),
    "qwen2_5_vl": ("Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLProcessor"),
    "idefics3": ("Idefics3ForConditionalGeneration", "Idefics3Processor"),
    "llava": ("LlavaForConditionalGeneration", "LlavaProcessor"),
}


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_vlms")
    return {family: build_tiny_vlm(root / family, family=family) for family in FAMILIES}


def xray(height: int = 96, width: int = 80) -> np.ndarray:
    """A 12-bit radiograph-like array: a bright body on a dark background."""
    y, x = np.mgrid[0:height, 0:width]
    body = np.exp(-(((y - height / 2) / (height / 3)) ** 2 + ((x - width / 2) / (width / 3)) ** 2))
    return (body * 4095).astype(np.uint16)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_loads_back_and_drafts_from_an_image(tiny_dirs, family):
    from orapo_core.models import Drafter, load_model

    loaded = load_model(tiny_dirs[family])
    model_class, processor_class = MODEL_CLASSES[family]
    assert type(loaded.model).__name__ == model_class
    assert type(loaded.processor).__name__ == processor_class
    assert (loaded.device, str(loaded.dtype)) == ("cpu", "torch.float32")

    draft = Drafter(loaded).draft(xray(), samples=0, max_new_tokens=6)
    assert draft.text and isinstance(draft.text, str)
    assert draft.model_name == family


def test_loaded_weights_are_the_saved_ones(tiny_dirs):
    # The Qwen2.5-VL folder has a flat pre-v5 config.json; a misread config would
    # give layers of other shapes, re-initialised at random instead of loaded.
    from safetensors import safe_open

    from orapo_core.models import load_model

    folder = tiny_dirs["qwen2_5_vl"]
    loaded = list(load_model(folder).model.state_dict().values())
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 1
    checked = 0
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():  # checkpoint names differ from v5 module names, so match by value
                saved = f.get_tensor(name)
                assert any(t.shape == saved.shape and (t == saved).all() for t in loaded), name
                checked += 1
    assert checked == len(loaded)


def test_qwen2_5_vl_3b_layout_loads_without_torchvision_or_video_processor(tiny_dirs):
    from orapo_core.models import load_model, render_prompt

    folder = tiny_dirs["qwen2_5_vl"]
    files = {p.name for p in folder.iterdir()}
    assert {
        "preprocessor_config.json",
        "chat_template.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors.index.json",
    } <= files
    assert not any("video" in name for name in files) and "processor_config.json" not in files
    assert importlib.util.find_spec("torchvision") is None

    processor = load_model(folder).processor
    assert not hasattr(processor, "video_processor")
    assert type(processor.image_processor).__name__ == "Qwen2VLImageProcessorPil"
    assert type(processor.tokenizer).__name__ == "Qwen2Tokenizer"
    assert "<|vision_start|><|image_pad|><|vision_end|>" in render_prompt(processor)  # from chat_template.json


def test_a_processor_saved_through_the_shim_names_the_real_family_class(tiny_dirs, tmp_path):
    import shutil

    from orapo_core.models import load_model

    copy = tmp_path / "copy"
    shutil.copytree(tiny_dirs["qwen2_5_vl"], copy)
    load_model(copy).processor.save_pretrained(copy)
    assert json.loads((copy / "processor_config.json").read_text())["processor_class"] == "Qwen2_5_VLProcessor"
    assert type(load_model(copy).processor).__name__ == "Qwen2_5_VLProcessor"


def test_missing_and_invalid_folders_are_refused_with_a_code(tiny_dirs, tmp_path):
    from orapo_core.models import load_model

    with pytest.raises(OrapoError) as missing:
        load_model(tmp_path / "nowhere")
    assert missing.value.code == "model_not_found"

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(OrapoError) as no_config:
        load_model(empty)
    assert no_config.value.code == "model_invalid"
    assert no_config.value.message == (
        f"The folder {empty} has no config.json: point ORAPO_MODEL_DIR at a saved checkpoint."
    )

    config_only = tmp_path / "config_only"
    config_only.mkdir()
    (config_only / "config.json").write_text((tiny_dirs["llava"] / "config.json").read_text())
    with pytest.raises(OrapoError, match="no weights") as no_weights:
        load_model(config_only)
    assert no_weights.value.code == "model_invalid"


def test_weights_that_do_not_fit_the_config_are_refused_not_reinitialised(tiny_dirs, tmp_path):
    import shutil

    from orapo_core.models import load_model

    wrong = tmp_path / "wrong"
    shutil.copytree(tiny_dirs["llava"], wrong)
    config = json.loads((wrong / "config.json").read_text())
    config["text_config"]["intermediate_size"] = 48
    (wrong / "config.json").write_text(json.dumps(config))
    with pytest.raises(OrapoError, match="do not match") as refused:
        load_model(wrong)
    assert refused.value.code == "model_invalid"


def test_default_model_is_the_starter_copied_from_the_shipped_one(data_dir, monkeypatch, tiny_dirs, tmp_path):
    """No model configured: the data folder's starter; a fresh data folder gets the shipped one copied in, as
    `orapo serve` does; with nothing suitable shipped, the error says how to build one (it is never built here)."""
    import shutil

    from orapo_core.config import Settings
    from orapo_core.models import resolve_model_dir
    from orapo_core.models.starter import StarterArchitecture, WarmStartPlan, build

    monkeypatch.delenv("ORAPO_MODEL_DIR", raising=False)
    monkeypatch.setattr(build, "SHIPPED_DIR", tmp_path / "nothing-shipped")
    with pytest.raises(OrapoError, match="orapo starter build") as missing:
        resolve_model_dir(None, Settings())
    assert missing.value.code == "model_not_found"

    shipped = tmp_path / "shipped"  # a stand-in for assets/starter, its card saying it is today's default build
    shutil.copytree(tiny_dirs["qwen2_vl"], shipped)
    (shipped / build.CARD_NAME).write_text(
        json.dumps(
            {"stopped_by": "steps", "plan": WarmStartPlan().to_dict(), "architecture": StarterArchitecture().to_dict()}
        )
    )
    monkeypatch.setattr(build, "SHIPPED_DIR", shipped)
    starter = resolve_model_dir(None, Settings())
    assert starter == data_dir.resolve() / "models" / "starter"
    assert (starter / "config.json").read_bytes() == (shipped / "config.json").read_bytes()
    (shipped / "config.json").unlink()  # from now on the data folder's own starter is used, not the shipped one
    assert resolve_model_dir(None, Settings()) == starter

    monkeypatch.setenv("ORAPO_MODEL_DIR", str(tiny_dirs["llava"]))
    assert resolve_model_dir(None, Settings()) == tiny_dirs["llava"]
    assert resolve_model_dir(tiny_dirs["idefics3"], Settings()) == tiny_dirs["idefics3"]


def test_the_training_loader_checks_weights_and_loads_for_training(tiny_dirs, tmp_path):
    import shutil

    import torch

    from orapo_core.models import load_for_training

    policy = load_for_training(tiny_dirs["qwen2_vl"], dtype="bfloat16", attn_implementation="eager")
    assert policy.model.training and not policy.has_adapter and policy.device == "cpu"
    assert policy.dtype == torch.bfloat16 and next(policy.model.parameters()).dtype == torch.bfloat16
    assert policy.model.config._attn_implementation == "eager"
    assert load_for_training(tiny_dirs["qwen2_vl"], dtype="float32").dtype == torch.float32
    with pytest.raises(OrapoError, match="dtype"):
        load_for_training(tiny_dirs["qwen2_vl"], dtype="int8")

    wrong = tmp_path / "wrong"  # a round must not train randomly initialised layers either
    shutil.copytree(tiny_dirs["llava"], wrong)
    config = json.loads((wrong / "config.json").read_text())
    config["text_config"]["intermediate_size"] = 48
    (wrong / "config.json").write_text(json.dumps(config))
    with pytest.raises(OrapoError, match="do not match") as refused:
        load_for_training(wrong)
    assert refused.value.code == "model_invalid"


def _logits(loaded, image):
    import torch

    from orapo_core.models import render_prompt, to_rgb_image

    inputs = loaded.processor(text=[render_prompt(loaded.processor)], images=[to_rgb_image(image)], return_tensors="pt")
    with torch.inference_mode():
        return loaded.model(**inputs).logits[0, -1].clone()


def test_a_saved_lora_adapter_changes_outputs_and_unloads_cleanly(tiny_dirs, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model

    from orapo_core.models import load_model, save_adapter, unload_adapter

    folder, image = tiny_dirs["qwen2_vl"], xray()
    base_logits = _logits(load_model(folder), image)

    trained = load_model(folder)
    peft_model = get_peft_model(trained.model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # LoRA B starts at zero; give it weights as a round of training would
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    saved = save_adapter(peft_model, tmp_path / "versions" / "v1")
    assert (saved / "adapter_config.json").is_file() and (saved / "adapter_model.safetensors").is_file()

    adapted = load_model(folder, adapter_dir=saved)
    assert adapted.has_adapter and adapted.adapter_dir == saved
    adapted_logits = _logits(adapted, image)
    assert not torch.allclose(adapted_logits, base_logits, atol=1e-4)

    unloaded = unload_adapter(adapted)
    assert not unloaded.has_adapter and unloaded.adapter_dir is None
    assert torch.allclose(_logits(unloaded, image), base_logits, atol=1e-5)


def test_adapter_folders_are_checked(tiny_dirs, tmp_path):
    from orapo_core.models import load_model, save_adapter

    with pytest.raises(OrapoError) as missing:
        load_model(tiny_dirs["llava"], adapter_dir=tmp_path / "v9")
    assert missing.value.code == "adapter_not_found"
    (tmp_path / "v9").mkdir()
    with pytest.raises(OrapoError) as invalid:
        load_model(tiny_dirs["llava"], adapter_dir=tmp_path / "v9")
    assert invalid.value.code == "adapter_invalid"
    with pytest.raises(OrapoError) as not_peft:
        save_adapter(load_model(tiny_dirs["llava"]), tmp_path / "v10")
    assert not_peft.value.code == "adapter_invalid"


def test_loading_and_drafting_open_no_network_connection(tiny_dirs, monkeypatch):
    from orapo_core.models import Drafter, load_model

    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network disabled by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    for family in ("qwen2_5_vl", "idefics3"):
        Drafter(load_model(tiny_dirs[family])).draft(xray(), samples=0, max_new_tokens=4)
    assert attempts == []
