"""The ablation's oracle terms: SFT on the oracle instead of DPO, and none at all (plain GRPO).

The paper's Table 4 compares OraPO with GRPO alone and with GRPO plus an SFT
term on the oracle; the product trains only OraPO's DPO term, so these two live
here. `AblationConfig` is `OraPOConfig` that also accepts ``oracle_mode`` 'sft'
and 'none'; `AblationTrainer` is `OraPOTrainer` with its oracle-term hooks
overridden (`oracle_answers`, `dpo_weights`, `pair_losses`, `oracle_loss`), so
a method trained here differs from OraPO only by its term, and in 'dpo' mode
trains exactly as the product does (tests/test_experimental.py). `benchmarks.ablation` (the
ablation harness of `benchmarks.bench_learning`) and
`benchmarks.bench_round_grpo_twin` train through them.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

import torch  # noqa: TID253 -- this module is heavy; light ones import it lazily

from orapo_core.train.config import OraPOConfig, OraPOScriptArguments, parse_recipe
from orapo_core.train.pairs import MinedGroup
from orapo_core.train.run import train_round
from orapo_core.train.trainer import OraPOTrainer

if TYPE_CHECKING:
    from trl import ModelConfig

    from orapo_core.facts.reward import RewardFunction

ABLATION_ORACLE_MODES = ("dpo", "sft", "none")
# What a pair's rows carry in each mode: SFT scores only the oracle; GRPO alone has no pair to score.
_ANSWERS = {"dpo": ("chosen", "rejected"), "sft": ("chosen",), "none": ()}


def sft_loss(policy_chosen_mean_logps: torch.Tensor) -> torch.Tensor:
    """Per-row negative log-likelihood of the oracle (per-token mean), the SFT-on-oracle term."""
    return -policy_chosen_mean_logps


@dataclass
class AblationConfig(OraPOConfig):
    """`OraPOConfig` with the ablation's oracle modes besides OraPO's."""

    oracle_mode: str = field(
        default="dpo",
        metadata={
            "help": "How the oracle report enters the loss: 'dpo' (OraPO), 'sft' (NLL on the oracle instead) or "
            "'none' (plain GRPO)."
        },
    )
    oracle_modes: ClassVar[tuple[str, ...]] = ABLATION_ORACLE_MODES

    def __post_init__(self) -> None:
        if self.use_clinician_pairs and self.oracle_mode in ("sft", "none"):
            raise ValueError(
                "AblationConfig: use_clinician_pairs needs oracle_mode='dpo' (a pair is a DPO signal): "
                "set one or the other."
            )
        super().__post_init__()


class AblationTrainer(OraPOTrainer):
    """`OraPOTrainer` with the oracle term of ``args.oracle_mode``: DPO (OraPO's), SFT on the oracle, or none."""

    args: AblationConfig  # checked by __init__

    def __init__(
        self,
        model: Any,
        reward_funcs: list[RewardFunction] | None = None,
        args: AblationConfig | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(args, AblationConfig):
            raise TypeError("AblationTrainer needs an AblationConfig as `args`.")
        super().__init__(model, reward_funcs, args, **kwargs)

    # OraPOTrainer's class attributes, read per instance here: the mode is the config's
    @property
    def oracle_answers(self) -> tuple[str, ...]:  # type: ignore[override]
        return _ANSWERS[self.args.oracle_mode]

    @property
    def oracle_loss_metric(self) -> str:  # type: ignore[override]
        return "orapo/sft_loss" if self.args.oracle_mode == "sft" else "orapo/dpo_loss"

    def dpo_weights(self, mined: list[MinedGroup]) -> list[float]:
        if self.args.oracle_mode == "none":
            return [0.0] * len(mined)
        return super().dpo_weights(mined)

    def oracle_loss(self, model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor | None:
        if self.args.oracle_mode == "none":
            return None
        return super().oracle_loss(model, inputs)

    def pair_losses(
        self, model: torch.nn.Module, inputs: dict[str, Any], rows: torch.Tensor, batch: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.args.oracle_mode != "sft":
            return super().pair_losses(model, inputs, rows, batch)
        chosen = self._chosen_logps(model, batch, length_normalize=True)
        return sft_loss(chosen), chosen.detach()


def parse_ablation_recipe(
    config_path: str | Path | None = None, overrides: Mapping[str, Any] | Sequence[str] | None = None
) -> tuple[OraPOScriptArguments, AblationConfig, ModelConfig]:
    """`parse_recipe` into an `AblationConfig`: the same recipes and overrides, the ablation's oracle modes too."""
    return cast(
        "tuple[OraPOScriptArguments, AblationConfig, ModelConfig]",
        parse_recipe(config_path, overrides, config_class=AblationConfig),
    )


def train_ablation_round(
    script_args: OraPOScriptArguments, training_args: AblationConfig, model_args: ModelConfig, **kwargs: Any
) -> Path:
    """`orapo_core.train.run.train_round` with `AblationTrainer`: one round of an ablation method."""
    return train_round(script_args, training_args, model_args, trainer_class=AblationTrainer, **kwargs)


def main(argv: list[str] | None = None) -> int:
    """`python -m orapo_core.experimental.ablation --config RECIPE [--key value ...]`: `orapo train` with the
    ablation's oracle modes (e.g. `--oracle_mode none --use_clinician_pairs false` for GRPO alone)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "--config" or len(argv) < 2:
        print(
            "usage: python -m orapo_core.experimental.ablation --config RECIPE.yaml [--key value ...]", file=sys.stderr
        )
        return 2
    script_args, training_args, model_args = parse_ablation_recipe(argv[1], argv[2:])
    out = train_ablation_round(script_args, training_args, model_args)
    print(f"trained: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
