"""OraPO training: the config, the trainer, pair mining and recipes.

`pairs` is plain Python (no torch); the rest imports torch and TRL, so the
package exports them lazily and `import orapo_core.train` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "OraPOConfig": "orapo_core.train.config",
    "OraPOScriptArguments": "orapo_core.train.config",
    "parse_recipe": "orapo_core.train.config",
    "OraPOTrainer": "orapo_core.train.trainer",
    "OraclePairMiner": "orapo_core.train.pairs",
    "ZeroRewardEMA": "orapo_core.train.pairs",
    "RolloutGroup": "orapo_core.train.pairs",
    "dpo_weight": "orapo_core.train.pairs",
    "zero_reward_rate": "orapo_core.train.pairs",
    "build_training_dataset": "orapo_core.train.dataset",
    "load_round_dataset": "orapo_core.train.dataset",
    "load_training_records": "orapo_core.train.dataset",
    "MetricsJsonlCallback": "orapo_core.train.metrics_log",
    "get_reward": "orapo_core.train.rewards",
    "rewards_for": "orapo_core.train.rewards",
    "train_round": "orapo_core.train.run",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
