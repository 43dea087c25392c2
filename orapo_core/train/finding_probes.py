"""Finding probes for rounds: an auxiliary loss that keeps what the model reads of an image about the findings.

The starter was built with two linear probes beside its report loss (`orapo_core.models.starter.sft`): one
on the merged visual token(s), one on the text model's state. They are why its visual token carries the
findings (`benchmarks/bench_probe.py`), and they were discarded after the build. A round, left to GRPO and
the oracle term, changes the vision tower and the merger through the words only; its false positives are
confusions of the corrected finding with those it co-occurs with (docs, Research). With
``finding_probe_weight > 0`` the trainer puts the two probes back for the round: on each micro-batch TRL's
own forward is observed (no extra model run), the merged visual tokens (averaged per image) and the text
model's last prompt state (where the report begins) are read by a fresh linear layer each, and a binary
cross-entropy against the oracle report's FactS labels (the 14 observations, an uncertain mention counted as
present) is added to the loss. The probes' own weights are thrown away after the round; only the LoRA
adapter they trained through is kept.

Not synchronised across processes: with several processes each one trains its own copy of the two small
layers (the adapter's gradients are still reduced as usual).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any, cast

import torch  # noqa: TID253 -- this module is heavy; light ones import it lazily

from orapo_core.facts import label_report
from orapo_core.facts.ontology import CHEXPERT_14


@functools.lru_cache(maxsize=65536)
def finding_targets(report: str) -> tuple[float, ...]:
    """1.0 per CheXpert observation the report states or hedges (FactS), 0.0 otherwise, in `CHEXPERT_14` order."""
    labels = label_report(report or "")
    return tuple(1.0 if labels.get(name) in (1, -1) else 0.0 for name in CHEXPERT_14)


def _module_ending(model: torch.nn.Module, suffix: str) -> torch.nn.Module | None:
    for name, module in model.named_modules():
        if name.endswith(suffix):
            return module
    return None


def _text_hidden_size(model: Any) -> int:
    config = model.config
    text = getattr(config, "text_config", None)
    return int(getattr(text, "hidden_size", None) or config.hidden_size)


def _standardized(features: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
    """Each row to zero mean and unit variance (no parameters): a probe step then moves a logit by about
    `lr x width`, whatever the scale of the states it reads, and the scale the round's training gives them."""
    features = features.to(layer.weight.dtype)
    return torch.nn.functional.layer_norm(features, features.shape[-1:])


class FindingProbes(torch.nn.Module):
    """Two linear probes (merged visual tokens, last prompt state) onto the 14 observations, and their loss."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        hidden = _text_hidden_size(model)
        merger, norm = _module_ending(model, "visual.merger"), _module_ending(model, "language_model.norm")
        if merger is None and norm is None:
            raise ValueError(
                "finding_probe_weight needs a vision-language model with a vision merger "
                "(Qwen2-VL / Qwen2.5-VL) or a text model whose final norm is `language_model.norm`."
            )
        self.merge = int(getattr(getattr(model.config, "vision_config", None), "spatial_merge_size", 1) or 1)
        self.visual = torch.nn.Linear(hidden, len(CHEXPERT_14))
        self.prompt = torch.nn.Linear(hidden, len(CHEXPERT_14))
        # The model's modules are observed, not owned: a tuple keeps them out of this module's parameters.
        self._observed = (merger, norm)

    @contextlib.contextmanager
    def observe(self) -> Iterator[dict[str, list[torch.Tensor]]]:
        """Within the block, every output of the merger and the final norm is kept (with its graph)."""
        seen: dict[str, list[torch.Tensor]] = {"visual": [], "prompt": []}
        hooks: list[torch.utils.hooks.RemovableHandle] = []
        merger, norm = self._observed
        if merger is not None:
            hooks.append(merger.register_forward_hook(lambda _m, _i, out: seen["visual"].append(out)))
        if norm is not None:
            hooks.append(norm.register_forward_hook(lambda _m, _i, out: seen["prompt"].append(out)))
        try:
            yield seen
        finally:
            for hook in hooks:
                hook.remove()

    def loss(
        self, seen: dict[str, list[torch.Tensor]], inputs: dict[str, Any], targets: torch.Tensor
    ) -> tuple[torch.Tensor | None, dict[str, float]]:
        """Mean BCE of each probe that could read this micro-batch's rows; None when neither could."""
        rows = targets.size(0)
        bce = torch.nn.functional.binary_cross_entropy_with_logits
        parts: dict[str, torch.Tensor] = {}
        grid = inputs.get("image_grid_thw")
        if seen["visual"] and grid is not None and grid.size(0) == rows:
            merged = torch.cat(seen["visual"], 0)
            counts = [int(t) * int(h) * int(w) // (self.merge * self.merge) for t, h, w in grid.tolist()]
            if sum(counts) == merged.size(0):  # one image per row, tokens in row order
                pooled = torch.stack([chunk.mean(0) for chunk in merged.split(counts)])
                parts["visual"] = bce(self.visual(_standardized(pooled, self.visual)), targets)
        if seen["prompt"]:
            states = torch.cat(seen["prompt"], 0)
            if states.dim() == 3 and states.size(0) == rows:
                last = inputs["prompt_ids"].size(1) - 1  # prompts are left-padded: the last prompt token of every row
                parts["prompt"] = bce(self.prompt(_standardized(states[:, last], self.prompt)), targets)
        if not parts:
            return None, {}
        return cast(torch.Tensor, sum(parts.values())) / len(parts), {k: v.detach().item() for k, v in parts.items()}
