"""What the language model is shown of an image: the vision merger's output, one pooled vector per image.

The worklist's "most useful first" ordering needs to tell the films that carry
a finding the model never writes from those that do not, and the words the
model would write barely do (`benchmarks/bench_finding_evidence.py`: AUC
0.53-0.57). The merged visual tokens do: projected on the direction from the
films readers signed without the finding to those a correction added it to,
they rank unread films at AUC 0.79 with 5 such films and 0.85 with 20 (same
benchmark, `--exemplars`). So drafting keeps them: `capture_image_features`
hooks the merger during the forward that prefills a draft (no extra model
run) and returns each image's tokens averaged into one vector, stored with the
draft (`drafts.image_features`).

Qwen2-VL and Qwen2.5-VL keep the merger at `model.visual.merger` (or
`model.model.visual.merger`); a model without one gets no features, and the
ordering falls back to what it used before.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
DECIMALS = 5  # stored as JSON: 5 decimals keep the rankings (cosines to 1e-5) at a third of the text


def vision_merger(model: Any) -> torch.nn.Module | None:
    """The module whose output the language model reads as image tokens, or None. A PEFT wrapper (a model in
    training, or a LoRA adapter loaded on its base) is looked through to the model it wraps."""
    if callable(getattr(model, "get_base_model", None)):
        model = model.get_base_model()
    for owner in (getattr(model, "model", None), model):
        merger = getattr(getattr(owner, "visual", None), "merger", None)
        if merger is not None:
            return merger
    return None


def _tokens_per_image(model: Any, grid: torch.Tensor | None) -> list[int] | None:
    vision = getattr(model.config, "vision_config", None)
    merge = int(getattr(vision, "spatial_merge_size", 1) or 1)
    if grid is None:
        return None
    return [int(t) * int(h) * int(w) // (merge * merge) for t, h, w in grid.tolist()]


@contextlib.contextmanager
def capture_image_features(model: Any, inputs: Any, n_images: int) -> Iterator[list[list[float] | None]]:
    """Within the block, run the forward over `inputs` (a processor's output for `n_images` images); after it,
    the yielded list holds one pooled feature vector (a list of floats) per image, or None per image when the
    model has no merger or its output could not be split by image."""
    out: list[list[float] | None] = [None] * n_images
    merger = vision_merger(model)
    captured: list[torch.Tensor] = []
    hook = None
    if merger is not None:
        hook = merger.register_forward_hook(lambda _m, _i, output: captured.append(output.detach()))
    try:
        yield out
    finally:
        if hook is not None:
            hook.remove()
    if not captured:
        return
    try:
        tokens = captured[0].float()
        counts = _tokens_per_image(model, inputs.get("image_grid_thw"))
        if counts is None or sum(counts) != tokens.shape[0] or len(counts) != n_images:
            if tokens.shape[0] % n_images:
                return
            counts = [tokens.shape[0] // n_images] * n_images
        for i, chunk in enumerate(tokens.split(counts)):
            out[i] = [round(float(v), DECIMALS) for v in chunk.mean(dim=0).tolist()]
    except Exception as exc:  # features are a convenience of the worklist: never fail a draft for them
        log.warning("orapo: no image features for this draft: %s", exc)
