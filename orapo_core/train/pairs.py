"""Oracle pair mining and the per-study zero-reward EMA, apart from any trainer.

OraPO adds a DPO term to GRPO for prompts whose rollouts fail: the oracle report
(the clinician's correction, else the dataset's reference report) is the chosen
answer and the group's failed rollouts are the rejected ones. How strongly that
term counts for a prompt depends on how often the study's rollouts fail, smoothed
across visits of the same study. All of that is plain arithmetic on lists of
floats, so it lives here without torch and is tested on literal numbers; the
trainer only turns the result into tensors.

Choices the paper leaves open, made here:

- A rollout "fails" when its reward is ``<= zero_reward_threshold`` (default 0.0,
  i.e. exactly the paper's ``r == 0`` for rewards in [0, 1]).
- A rollout whose reward is ``None``/NaN (the reward could not score it) is
  neither failed nor passed: it is left out of ``z_i``'s denominator and is never
  a rejected answer. A group with no scorable rollout has ``z_i = 0``.
- On the first visit of a study the EMA starts at the observed rate
  (``z~ = z``), so one visit is not diluted by an invented prior of 0.
- Failed rollouts are rejected in order of increasing reward, then rollout
  order, up to ``max_rejected_per_group``; a group without an oracle yields no
  rollout pairs (its weight still follows the schedule, for logging).
- A group without any pair trains on GRPO alone (``effective_weight = 0``):
  the schedule's ``w_min`` floor only applies where a DPO term exists.
- A clinician pair (``clinician_chosen`` over ``clinician_rejected``, i.e. the
  corrected report over the model's own draft) joins the group's DPO term as one
  more pair when enabled, whether or not a rollout failed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orapo_core.train.config import OraPOConfig


def zero_reward_rate(rewards: Sequence[float | None], threshold: float = 0.0) -> float:
    """Fraction of scorable rollouts whose reward is ``<= threshold`` (0.0 when none is scorable)."""
    scored = [r for r in rewards if r is not None and not math.isnan(r)]
    if not scored:
        return 0.0
    return sum(1 for r in scored if r <= threshold) / len(scored)


def dpo_weight(z_smoothed: float, *, w_min: float = 0.05, w_max: float = 0.15, gamma: float = 2.0) -> float:
    """``clip(w_min + (w_max - w_min) * z~**gamma, w_min, w_max)``: the weight of the DPO term for one prompt."""
    w = w_min + (w_max - w_min) * (max(z_smoothed, 0.0) ** gamma)
    return min(max(w, w_min), w_max)


class ZeroRewardEMA:
    """Per-study exponential moving average of the zero-reward rate: ``z~ <- alpha*z~ + (1-alpha)*z``.

    The state is a plain ``{study_id: (z~, visits)}`` mapping, saved beside each
    checkpoint so a resumed run smooths exactly as the uninterrupted one would.
    """

    def __init__(self, alpha: float = 0.5):
        if not 0.0 <= alpha < 1.0:
            raise ValueError(f"alpha must be in [0, 1), got {alpha}")
        self.alpha = alpha
        self._state: dict[str, tuple[float, int]] = {}

    def peek(self, study_id: str, z: float) -> float:
        """The smoothed rate this observation would give, without recording it."""
        if study_id not in self._state:
            return z
        previous, _ = self._state[study_id]
        return self.alpha * previous + (1.0 - self.alpha) * z

    def update(self, study_id: str, z: float) -> float:
        """Record one visit's rate ``z`` and return the smoothed rate."""
        smoothed = self.peek(study_id, z)
        visits = self._state.get(study_id, (0.0, 0))[1] + 1
        self._state[study_id] = (smoothed, visits)
        return smoothed

    def get(self, study_id: str) -> float | None:
        entry = self._state.get(study_id)
        return None if entry is None else entry[0]

    def __len__(self) -> int:
        return len(self._state)

    def state_dict(self) -> dict:
        return {"alpha": self.alpha, "studies": {k: [v, n] for k, (v, n) in self._state.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.alpha = float(state.get("alpha", self.alpha))
        self._state = {str(k): (float(v), int(n)) for k, (v, n) in state.get("studies", {}).items()}


@dataclass(frozen=True)
class RolloutGroup:
    """The K rollouts of one prompt, as the miner needs them."""

    study_id: str
    rewards: Sequence[float | None]
    oracle: str | None = None
    clinician_chosen: str | None = None
    clinician_rejected: str | None = None


@dataclass(frozen=True)
class MinedPair:
    """One DPO pair of a group: ``chosen`` over either rollout ``rollout_index`` or the clinician's draft."""

    chosen: str
    rollout_index: int | None = None  # the rejected answer is this rollout (index within the group)
    rejected_text: str | None = None  # ... or this text (a clinician's draft)


@dataclass(frozen=True)
class MinedGroup:
    study_id: str
    zero_reward_rate: float
    smoothed_rate: float
    weight: float
    pairs: tuple[MinedPair, ...] = field(default_factory=tuple)

    @property
    def effective_weight(self) -> float:
        """The weight the loss uses: ``weight`` when the group has pairs, else 0 (an absent term cannot count)."""
        return self.weight if self.pairs else 0.0


def _text(value: object) -> str | None:
    if value is None:
        return None
    value = str(value).strip()
    return value or None


class OraclePairMiner:
    """Turns groups of scored rollouts into weighted (oracle, rejected) pairs and keeps the per-study EMA."""

    def __init__(
        self,
        *,
        w_min: float = 0.05,
        w_max: float = 0.15,
        gamma: float = 2.0,
        ema_alpha: float = 0.5,
        threshold: float = 0.0,
        max_rejected_per_group: int | None = None,
        use_clinician_pairs: bool = False,
    ):
        self.w_min, self.w_max, self.gamma = w_min, w_max, gamma
        self.threshold = threshold
        self.max_rejected_per_group = max_rejected_per_group
        self.use_clinician_pairs = use_clinician_pairs
        self.ema = ZeroRewardEMA(ema_alpha)

    @classmethod
    def from_config(cls, args: OraPOConfig) -> OraclePairMiner:
        return cls(
            w_min=args.dpo_weight_min,
            w_max=args.dpo_weight_max,
            gamma=args.dpo_weight_gamma,
            ema_alpha=args.zero_reward_ema_alpha,
            threshold=args.zero_reward_threshold,
            max_rejected_per_group=args.max_rejected_per_group,
            use_clinician_pairs=args.use_clinician_pairs,
        )

    def failed_rollouts(self, rewards: Sequence[float | None]) -> list[int]:
        """Indices of failed rollouts, lowest reward first, capped at ``max_rejected_per_group``."""
        failed = [(r, j) for j, r in enumerate(rewards) if r is not None and not math.isnan(r) and r <= self.threshold]
        failed.sort()
        indices = [j for _, j in failed]
        if self.max_rejected_per_group is not None:
            indices = indices[: self.max_rejected_per_group]
        return indices

    def mine_group(self, group: RolloutGroup, *, update_state: bool = True) -> MinedGroup:
        z = zero_reward_rate(group.rewards, self.threshold)
        smoothed = self.ema.update(group.study_id, z) if update_state else self.ema.peek(group.study_id, z)
        weight = dpo_weight(smoothed, w_min=self.w_min, w_max=self.w_max, gamma=self.gamma)
        pairs: list[MinedPair] = []
        oracle = _text(group.oracle)
        if oracle is not None:
            pairs = [MinedPair(chosen=oracle, rollout_index=j) for j in self.failed_rollouts(group.rewards)]
        if self.use_clinician_pairs:
            chosen, rejected = _text(group.clinician_chosen), _text(group.clinician_rejected)
            if chosen is not None and rejected is not None and chosen != rejected:
                if len(pairs) >= len(group.rewards):
                    # The trainer carries one pair per rollout row; make room by dropping the least-failed rollout.
                    pairs = pairs[:-1]
                pairs.append(MinedPair(chosen=chosen, rejected_text=rejected))
        return MinedGroup(group.study_id, z, smoothed, weight, tuple(pairs))

    def mine(self, groups: Sequence[RolloutGroup], *, update_state: bool = True) -> list[MinedGroup]:
        return [self.mine_group(g, update_state=update_state) for g in groups]

    def state_dict(self) -> dict:
        return {"ema": self.ema.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.ema.load_state_dict(state.get("ema", {}))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.state_dict()))

    def load(self, path: str | Path) -> None:
        self.load_state_dict(json.loads(Path(path).read_text()))
