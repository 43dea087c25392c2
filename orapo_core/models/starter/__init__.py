"""The starter model: a small Qwen2-VL the project builds itself, on a CPU, in minutes.

`build_starter` trains a report tokenizer (`tokenizer`), builds the model from
config (`architecture`), warm-starts it on PhantomCXR with rare findings kept
scarce (`sft`) and saves an ordinary `save_pretrained` folder with a build card
(`build`), which `load_model` reads like any downloaded checkpoint.
"""

from orapo_core.models.starter.architecture import StarterArchitecture
from orapo_core.models.starter.build import CARD_NAME, build_starter, ensure_starter, read_card
from orapo_core.models.starter.sft import RARE_KINDS, WarmStartPlan

__all__ = [
    "CARD_NAME",
    "RARE_KINDS",
    "StarterArchitecture",
    "WarmStartPlan",
    "build_starter",
    "ensure_starter",
    "read_card",
]
