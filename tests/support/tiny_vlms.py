"""Tiny random-weight image-text-to-text checkpoints, written the way real ones are.

Tests of the loading path, the drafter and the trainer need a checkpoint folder
that looks like a downloaded one but builds in a second on a CPU and needs no
hub. Each family gets a byte-level BPE tokenizer trained here on short
radiology sentences (so decoded drafts read like words rather than noise), the
family's special tokens and its chat template. The files are written by hand
where a real checkpoint differs from what `save_pretrained` would write today:
the Qwen2.5-VL folder copies the Qwen2.5-VL-3B-Instruct layout (flat pre-v5
`config.json`, `preprocessor_config.json`, `chat_template.json`, sharded
safetensors) so the product is tested against what users actually download.

    from tests.support.tiny_vlms import build_tiny_vlm
    model_dir = build_tiny_vlm(tmp_path / "model", family="qwen2_5_vl")
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "idefics3", "llava")

_FINDINGS = [
    "pleural effusion",
    "pneumothorax",
    "consolidation",
    "atelectasis",
    "pulmonary edema",
    "cardiomegaly",
    "pneumonia",
    "nodule",
    "opacity",
    "fracture",
]
_PLACES = ["right lower lobe", "left lower lobe", "right upper lobe", "left base", "right base", "lingula"]
_TEMPLATES = [
    "There is a small {finding} in the {place}.",
    "No {finding} is seen.",
    "A moderate {finding} is present at the {place}.",
    "Mild {finding} of the {place} is unchanged.",
]
_FIXED = [
    "The lungs are clear.",
    "Heart size is normal.",
    "The cardiomediastinal silhouette is within normal limits.",
    "No acute cardiopulmonary process.",
    "No pleural effusion or pneumothorax.",
    "Support devices are unchanged.",
    "Endotracheal tube terminates above the carina.",
    "Degenerative changes of the thoracic spine.",
    "Findings:",
    "Impression:",
    "Write the findings and impression of this chest X-ray.",
]

# A few hundred short sentences: every template with every finding and place, plus the fixed phrases.
RADIOLOGY_SENTENCES: list[str] = _FIXED + [
    t.format(finding=f, place=p) for t, f, p in itertools.product(_TEMPLATES, _FINDINGS, _PLACES)
]

_QWEN_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_IDEFICS3_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
_LLAVA_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}USER: {% else %}ASSISTANT: {% endif %}"
    "{% for item in message['content'] %}{% if item['type'] == 'text' %}{{ item['text'] }}"
    "{% elif item['type'] == 'image' %}<image>\n{% endif %}{% endfor %}"
    "{% if message['role'] == 'user' %} {% else %}{{ eos_token }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT: {% endif %}"
)

_QWEN_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
_IDEFICS3_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<end_of_utterance>",
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
] + [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)]
_LLAVA_SPECIALS = ["<unk>", "<s>", "</s>", "<image>", "<pad>"]


def train_tokenizer(special_tokens: list[str], *, chat_template: str, vocab_size: int = 400, **token_roles):
    """A byte-level BPE trained on `RADIOLOGY_SENTENCES`, as a `PreTrainedTokenizerFast`.

    `token_roles` names the special tokens' roles (eos_token="<|im_end|>", pad_token=...).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special_tokens, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(RADIOLOGY_SENTENCES, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, **token_roles)
    tokenizer.chat_template = chat_template
    return tokenizer


def build_tiny_vlm(out_dir: str | Path, family: str = "qwen2_vl", seed: int = 0) -> Path:
    """Write a tiny random-weight checkpoint of `family` into `out_dir` and return the folder."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")
    import torch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    builder = {"qwen2_vl": _qwen2_vl, "qwen2_5_vl": _qwen2_5_vl, "idefics3": _idefics3, "llava": _llava}[family]
    builder(out)
    return out


def _text_dims(vocab_size: int, **ids) -> dict:
    return dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        **ids,
    )


def _qwen_tokenizer():
    return train_tokenizer(
        _QWEN_SPECIALS, chat_template=_QWEN_TEMPLATE, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )


def _qwen_token_ids(tokenizer) -> dict:
    ids = tokenizer.convert_tokens_to_ids
    return dict(
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )


def _qwen_text_config(tokenizer) -> dict:
    # mrope_section splits head_dim/2 (=4 here) across time, height and width.
    return _text_dims(
        len(tokenizer),
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]},
    )


def _qwen_image_processor_config(processor_class: str, max_pixels: int) -> dict:
    return {
        "min_pixels": 56 * 56,
        "max_pixels": max_pixels,
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": processor_class,
    }


def _qwen2_vl(out: Path) -> None:
    """Today's `save_pretrained` layout: nested config, processor_config.json, chat_template.jinja."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    tokenizer = _qwen_tokenizer()
    config = Qwen2VLConfig(
        text_config=_qwen_text_config(tokenizer),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, mlp_ratio=2),
        **_qwen_token_ids(tokenizer),
    )
    Qwen2VLForConditionalGeneration(config).save_pretrained(out)
    tokenizer.save_pretrained(out)  # also writes chat_template.jinja
    image_processor = _qwen_image_processor_config("Qwen2VLProcessor", max_pixels=112 * 112)
    image_processor.pop("processor_class")
    (out / "processor_config.json").write_text(
        json.dumps({"image_processor": image_processor, "processor_class": "Qwen2VLProcessor"}, indent=2)
    )


def _qwen2_5_vl(out: Path) -> None:
    """The Qwen2.5-VL-3B-Instruct folder as downloaded: flat pre-v5 config.json with
    `rope_scaling: mrope`, preprocessor_config.json, chat_template.json, sharded safetensors."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tokenizer = _qwen_tokenizer()
    config = Qwen2_5_VLConfig(
        text_config=_qwen_text_config(tokenizer),
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=32,
            window_size=56,
            fullatt_block_indexes=[1],
        ),
        **_qwen_token_ids(tokenizer),
    )
    Qwen2_5_VLForConditionalGeneration(config).save_pretrained(out, max_shard_size="100KB")

    nested = json.loads((out / "config.json").read_text())
    text = nested.pop("text_config")
    rope = text.pop("rope_parameters")
    flat = {**{k: v for k, v in text.items() if k not in ("model_type", "layer_types", "dtype")}, **nested}
    flat.update(
        architectures=["Qwen2_5_VLForConditionalGeneration"],
        model_type="qwen2_5_vl",
        torch_dtype="float32",
        rope_theta=rope["rope_theta"],
        rope_scaling={"type": "mrope", "mrope_section": rope["mrope_section"]},
    )
    flat.pop("dtype", None)
    flat["vision_config"].pop("dtype", None)
    (out / "config.json").write_text(json.dumps(flat, indent=2))

    tokenizer.chat_template = None  # the real folder keeps its template in chat_template.json only
    tokenizer.save_pretrained(out)
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    tok_config["tokenizer_class"] = "Qwen2Tokenizer"
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    (out / "chat_template.json").write_text(json.dumps({"chat_template": _QWEN_TEMPLATE}, indent=2))
    (out / "preprocessor_config.json").write_text(
        json.dumps(_qwen_image_processor_config("Qwen2_5_VLProcessor", max_pixels=12845056), indent=2)
    )


def _idefics3(out: Path) -> None:
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3Processor,
    )

    tokenizer = train_tokenizer(
        _IDEFICS3_SPECIALS,
        chat_template=_IDEFICS3_TEMPLATE,
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        pad_token="<|endoftext|>",
    )
    # 32px tiles of 8px patches, pixel-shuffled by 2: 4 image tokens per tile.
    config = Idefics3Config(
        text_config=dict(
            model_type="llama",
            **_text_dims(
                len(tokenizer),
                bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            ),
        ),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        ),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        scale_factor=2,
        pad_token_id=tokenizer.pad_token_id,
    )
    Idefics3ForConditionalGeneration(config).save_pretrained(out)
    image_processor = Idefics3ImageProcessorPil(
        size={"longest_edge": 64}, max_image_size={"longest_edge": 32}, do_image_splitting=False
    )
    Idefics3Processor(
        image_processor=image_processor, tokenizer=tokenizer, image_seq_len=4, chat_template=_IDEFICS3_TEMPLATE
    ).save_pretrained(out)


def _llava(out: Path) -> None:
    from transformers import CLIPImageProcessorPil, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor

    tokenizer = train_tokenizer(
        _LLAVA_SPECIALS,
        chat_template=_LLAVA_TEMPLATE,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )
    # 28px images of 14px patches: 4 patch features once the CLS token is dropped ("default" strategy).
    config = LlavaConfig(
        text_config=dict(
            model_type="llama",
            **_text_dims(
                len(tokenizer),
                bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            ),
        ),
        vision_config=dict(
            model_type="clip_vision_model",
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=28,
            patch_size=14,
            projection_dim=32,
        ),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        image_seq_length=4,
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
    )
    LlavaForConditionalGeneration(config).save_pretrained(out)
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=_LLAVA_TEMPLATE,
    ).save_pretrained(out)
