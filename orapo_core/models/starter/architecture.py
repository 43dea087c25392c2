"""The starter's shape: a small Qwen2-VL built from config, and its processor.

Qwen2-VL because the product already loads the family (and its processor, via
`compat`) and its vision tower takes patches at any grid, so nothing here is
a custom layer: the saved folder is an ordinary `save_pretrained` checkpoint.

Every image is resized to one small square grid (min_pixels = max_pixels) of
2x2 large patches, merged into ONE visual token. That is a choice about
learning, measured on PhantomCXR (2026-11-30, `benchmarks/bench_starter.py` and
the notes in `sft.py`): Qwen2-VL's tower has no absolute position embedding
(only rotary, relative positions), so with the family's usual 14 px patches a
token does not know where in the chest it sits, and a tiny tower trained for
minutes on CPU could not learn cardiomegaly or effusion from a pooled readout
(AUC ~0.6 after 200 steps), nor could the text model learn to read 64 tokens
by position. Inside one patch the patch embedding *is* position-specific (one
weight per pixel), and the merger concatenates the 2x2 patches in a fixed
order, so the single token is a learned, position-aware function of the whole
downsampled image, which is what separates PhantomCXR's findings (a ridge fit
on 32x32 thumbnails does it almost perfectly). The same tower and a pooled
multi-label head reach AUC 1.0 for cardiomegaly and edema and ~0.9 for
effusion, consolidation and devices within 400 steps (30 s on one core).
The cost is detail: rare, small findings (a pneumothorax line, a rib fracture,
a nodule) are barely visible at this size, which is where the starter is meant
to be weak anyway (the RL rounds have something to learn). A radiograph that is
not square is fitted into the same pixel budget by the processor's own
`smart_resize`, so it becomes one token too (checked up to 3:1).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from orapo_core.models.compat import without_video_processor

if TYPE_CHECKING:
    from transformers import GenerationConfig, PreTrainedTokenizerBase, ProcessorMixin, Qwen2VLConfig

IMAGE_SIDE = 96
# Qwen2-VL's CLIP normalisation; a grey radiograph simply has equal channels.
IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)
IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class StarterArchitecture:
    """The sizes of the starter (defaults: what `orapo starter build` makes)."""

    vision_depth: int = 2
    vision_embed_dim: int = 128
    vision_heads: int = 4
    text_hidden: int = 256
    text_layers: int = 4
    text_heads: int = 4
    text_kv_heads: int = 2
    text_intermediate: int = 768
    max_positions: int = 1024
    image_side: int = IMAGE_SIDE
    patch_size: int = IMAGE_SIDE // 2  # 2x2 patches, merged 2x2: one visual token per square image
    # Low, unlike Qwen's 10000: chosen when the image was an 8x8 token grid, so that mrope turned visibly
    # across it. With one visual token it only sets the text positions' frequencies; kept because the
    # shipped build was made and measured with it.
    rope_theta: float = 10.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_config(arch: StarterArchitecture, tokenizer: PreTrainedTokenizerBase) -> Qwen2VLConfig:
    """A `Qwen2VLConfig` whose token ids are `tokenizer`'s."""
    from transformers import Qwen2VLConfig

    def ids(token: str) -> int:
        token_id = tokenizer.convert_tokens_to_ids(token)
        assert isinstance(token_id, int)  # one token, one id
        return token_id

    head_dim = arch.text_hidden // arch.text_heads
    # mrope splits head_dim/2 rotary pairs over time, height and width, 1:1.5:1.5 as Qwen2-VL does.
    temporal = head_dim // 8
    spatial = (head_dim // 2 - temporal) // 2
    mrope = [head_dim // 2 - 2 * spatial, spatial, spatial]
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=arch.text_hidden,
        intermediate_size=arch.text_intermediate,
        num_hidden_layers=arch.text_layers,
        num_attention_heads=arch.text_heads,
        num_key_value_heads=arch.text_kv_heads,
        max_position_embeddings=arch.max_positions,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        rope_parameters={"rope_type": "default", "rope_theta": float(arch.rope_theta), "mrope_section": mrope},
        tie_word_embeddings=True,
    )
    vision = dict(
        depth=arch.vision_depth,
        embed_dim=arch.vision_embed_dim,
        hidden_size=arch.text_hidden,
        num_heads=arch.vision_heads,
        mlp_ratio=4,
        patch_size=arch.patch_size,
        spatial_merge_size=2,
        temporal_patch_size=2,
    )
    return Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        tie_word_embeddings=True,
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )


def build_processor(arch: StarterArchitecture, tokenizer: PreTrainedTokenizerBase) -> ProcessorMixin:
    """The family's processor (without a video part: see `compat`) at the fixed input size."""
    from transformers import Qwen2VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    pixels = arch.image_side * arch.image_side
    image_processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": pixels, "longest_edge": pixels},
        min_pixels=pixels,
        max_pixels=pixels,
        patch_size=arch.patch_size,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=list(IMAGE_MEAN),
        image_std=list(IMAGE_STD),
    )
    processor_class = without_video_processor(Qwen2VLProcessor)
    return processor_class(image_processor=image_processor, tokenizer=tokenizer, chat_template=tokenizer.chat_template)


def visual_tokens(arch: StarterArchitecture) -> int:
    """How many visual tokens a square image becomes."""
    return (arch.image_side // (2 * arch.patch_size)) ** 2


def build_generation_config(tokenizer: PreTrainedTokenizerBase, max_new_tokens: int = 160) -> GenerationConfig:
    """Greedy by default and stopping at `<|im_end|>`: a report is ~50 tokens, the longest PhantomCXR ~90."""
    from transformers import GenerationConfig

    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.pad_token_id,
    )
