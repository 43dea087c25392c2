"""Teacher-forced reading of given answers: how likely a model finds a text after the drafting prompt and a film.

One forward scores every answer of a batch. The finding check (`orapo_core.models.verifier`) uses it to let the
model choose, among the sentences a round's reports state a finding with, the one this film fits (side, size);
the benchmarks use it for the oracle's log-likelihood and for a finding sentence's first token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from orapo_core.models.prompt import render_prompt

if TYPE_CHECKING:
    import torch
    from PIL import Image


def answer_token_logps(
    model: Any,
    processor: Any,
    pictures: Sequence[Image.Image],
    answers: Sequence[list[int]],
    *,
    prompt_text: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each answer (token ids) read after the drafting prompt and its picture, under teacher forcing, in one
    forward: (log-prob of each answer token, the argmax token at each position, mask), each (answers, width).
    `prompt_text` is the rendered prompt (default: `render_prompt(processor)`)."""
    import torch

    prompt = prompt_text if prompt_text is not None else render_prompt(processor)
    tokenizer = processor.tokenizer
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    inputs = processor(
        text=[prompt] * len(pictures), images=list(pictures), return_tensors="pt", padding=True, padding_side="left"
    ).to(device)
    width = max(len(a) for a in answers)
    ids = torch.tensor([a + [pad_id] * (width - len(a)) for a in answers], device=device)
    mask = torch.tensor([[1] * len(a) + [0] * (width - len(a)) for a in answers], device=device)
    prompt_len = inputs["input_ids"].shape[1]
    extra = {
        key: value.to(dtype) if torch.is_floating_point(value) else value  # pixels in the model's dtype
        for key, value in inputs.items()
        if key not in ("input_ids", "attention_mask")
    }
    for key in ("token_type_ids", "mm_token_type_ids"):  # per-token types, as the trainer does: the answer is text
        if key in extra:
            extra[key] = torch.cat([extra[key], extra[key].new_zeros(ids.shape)], dim=1)
    with torch.no_grad():
        logits = model(
            input_ids=torch.cat([inputs["input_ids"], ids], dim=1),
            attention_mask=torch.cat([inputs["attention_mask"], mask], dim=1),
            **extra,
        ).logits
    logps = torch.log_softmax(logits[:, prompt_len - 1 : -1].float(), dim=-1)
    return logps.gather(-1, ids.unsqueeze(-1)).squeeze(-1), logps.argmax(-1), mask


def best_continuation(
    model: Any,
    processor: Any,
    picture: Image.Image,
    prefix: str,
    candidates: Sequence[str],
    *,
    prompt_text: str | None = None,
) -> int:
    """Index of the candidate the model reads most easily after `prefix` as the start of its answer on `picture`:
    the highest mean log-prob per token of the candidate's own tokens (the prefix's are context only)."""
    tokenizer = processor.tokenizer
    head = tokenizer(prefix, add_special_tokens=False)["input_ids"] if prefix else []
    answers, spans = [], []
    for text in candidates:
        whole = tokenizer(prefix + text, add_special_tokens=False)["input_ids"]
        # the candidate's tokens: those past the prefix's own (a merge at the seam counts as the candidate's)
        start = next((i for i, (a, b) in enumerate(zip(head, whole)) if a != b), min(len(head), len(whole)))
        answers.append(whole)
        spans.append((start, len(whole)))
    token, _, _ = answer_token_logps(model, processor, [picture] * len(candidates), answers, prompt_text=prompt_text)
    means = [float(token[i, a:b].mean()) if b > a else float("-inf") for i, (a, b) in enumerate(spans)]
    return max(range(len(candidates)), key=means.__getitem__)
