"""Experiments, kept out of the product (as TRL keeps `trl.experimental`): settings no recipe, app path or default uses.

    ablation   the paper's ablation modes of the oracle term: SFT on the oracle instead of DPO, and none (plain
               GRPO): `AblationConfig`, `AblationTrainer`, `parse_ablation_recipe`, `train_ablation_round`;
               `python -m orapo_core.experimental.ablation --config RECIPE [--key value ...]` trains one
    starter    the starter build's architecture experiments (image side, patch size, vision warm-up, perception
               batches, rare-finding share): `starter_variant`, which `benchmarks.bench_starter --rebuild`
               passes on

What each measured, and why it is not the product's, is in the research journal (docs/pages/research/). The
product never imports this package (a test holds it); the benchmarks do. Its modules import torch and TRL only
when used.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AblationConfig": "orapo_core.experimental.ablation",
    "AblationTrainer": "orapo_core.experimental.ablation",
    "ABLATION_ORACLE_MODES": "orapo_core.experimental.ablation",
    "parse_ablation_recipe": "orapo_core.experimental.ablation",
    "train_ablation_round": "orapo_core.experimental.ablation",
    "starter_variant": "orapo_core.experimental.starter",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
