"""Log-probs of several answers after one prompt: the prompt and its image run once, the answers continue from its cache.

The reference scores a study's oracle and each of its rejected answers after the same prompt and image, and with an
image the prompt is most of a row (on the starter build profiled for issue 5: 117 prompt tokens, 64 of them the image,
against answers of about 50; the prompt with the vision tower was about three quarters of a row's forward). Scored row
by row, that prompt ran once per answer; here it runs once per study, and every answer of the study runs on a copy of
its cache.

The prompt runs without its last token, which then opens each answer's continuation, so the first answer token is
scored by TRL's fused head like the others (same temperature, same log-softmax). Positions and attention are those of
the full forward, so the log-probs are those of `_get_per_token_logps_and_entropies` on the joined rows up to float
rounding (a test holds them within 1e-4 on every family listed here):

- Qwen2-VL and Qwen2.5-VL number text with a 3-D rope whose text positions continue from the prompt's last token,
  which the model's own `get_rope_index` gives;
- LLaVA and Idefics3 (Llama-style text models) number columns, the cache included, which is the model's default
  when no positions are passed.

A model of any other family is scored row by row, as before: its positions or attention (a bidirectional image
prefix, say) may depend on the whole sequence in a way not checked here.
"""

from __future__ import annotations

from typing import Any

import torch  # noqa: TID253 -- this module is heavy; light ones import it lazily

SHARED_PROMPT_MODEL_TYPES = frozenset({"qwen2_vl", "qwen2_5_vl", "idefics3", "llava"})


def supports_shared_prompt(model: object) -> bool:
    """Whether `answer_logps_after_prompts` reproduces the full forward for this (unwrapped) model."""
    return getattr(getattr(model, "config", None), "model_type", None) in SHARED_PROMPT_MODEL_TYPES


def _rope_index_owner(model: torch.nn.Module) -> Any:
    """The module with Qwen-VL's ``get_rope_index`` (the inner model), or None for column-numbered families."""
    for module in model.modules():
        if callable(getattr(module, "get_rope_index", None)):
            return module
    return None


def answer_logps_after_prompts(
    model: torch.nn.Module,
    prompts: dict[str, torch.Tensor],
    prompt_kwargs: dict[str, torch.Tensor],
    owners: torch.Tensor,
    answer_ids: torch.Tensor,
    answer_mask: torch.Tensor,
    *,
    unwrapped: torch.nn.Module | None = None,
) -> torch.Tensor:
    """Per-token log-probs ``(len(owners), answer_ids.size(1))`` of each answer after prompt ``owners[i]``.

    ``prompts`` holds ``prompt_ids``/``prompt_mask`` (left-padded, one row per distinct prompt) and, for Qwen-VL,
    ``mm_token_type_ids`` and ``image_grid_thw``; ``prompt_kwargs`` is what the model's forward takes besides ids and
    mask for those rows (image tensors, prompt-width type ids). ``model`` must carry TRL's fused head
    (``fused_lm_head=True``); ``unwrapped`` is the plain model behind it, for its rope (default: ``model``).
    """
    prompt_ids, prompt_mask = prompts["prompt_ids"], prompts["prompt_mask"]
    width = prompt_ids.size(1)
    head_kwargs = {
        key: value[:, : width - 1] if key in ("token_type_ids", "mm_token_type_ids") else value
        for key, value in prompt_kwargs.items()
    }
    cache = model(
        input_ids=prompt_ids[:, :-1],
        attention_mask=prompt_mask[:, :-1],
        use_cache=True,
        logits_to_keep=1,
        **head_kwargs,
    ).past_key_values
    if cache is None or cache.get_seq_length() != width - 1:
        # A layer under gradient checkpointing in training mode drops the cache; the answers would then not see the
        # prompt at all. The caller turns checkpointing off; this only guards against a silent wrong result.
        raise RuntimeError("the prompt forward kept no cache (gradient checkpointing on?): cannot score after it")
    cache.reorder_cache(owners)  # one copy of a study's prompt per answer (an index_select: rows may repeat)

    # Each answer continues its prompt's last token; padding (mask 0) only ever follows an answer's real tokens.
    ids = torch.cat([prompt_ids[owners, -1:], answer_ids], dim=1)
    mask = torch.cat([prompt_mask[owners], answer_mask], dim=1)
    labels = ids.masked_fill(torch.cat([torch.zeros_like(answer_mask[:, :1]), answer_mask], dim=1) == 0, -100)
    extra: dict[str, torch.Tensor] = {}
    rope = _rope_index_owner(unwrapped if unwrapped is not None else model)
    if rope is not None:
        positions, _ = rope.get_rope_index(
            prompt_ids,
            mm_token_type_ids=prompts["mm_token_type_ids"][:, :width],
            image_grid_thw=prompts.get("image_grid_thw"),
            attention_mask=prompt_mask,
        )
        # A text token after the prompt sits one past the previous one, on all three axes.
        steps = torch.arange(ids.size(1), device=positions.device)
        extra["position_ids"] = positions[:, owners, -1:] + steps
    out = model(input_ids=ids, attention_mask=mask, past_key_values=cache, labels=labels, fused_lm_head=True, **extra)
    return out.log_probs[:, -answer_ids.size(1) :]
