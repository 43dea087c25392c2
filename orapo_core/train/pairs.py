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
- Finding pairs (``finding_pairs``, off by default; ours, not the paper's): for
  each finding the oracle states or hedges and none of the group's rollouts
  does, the oracle over the oracle without that finding's sentences
  (`omission_pairs`); for each finding every rollout states and the oracle
  does not, the oracle over the oracle with a rollout's sentence stating it
  put in where that rollout put it (`commission_pairs`). The two answers of a
  finding pair are the same text up to where the finding is said or not. With
  ``finding_pair_span='decision'`` both are cut at their first differing word
  (`decision_point`) and carry no end of turn, so the pair's whole DPO margin is
  that one choice, made in the same context: the token where a greedy draft
  decides to say the finding. (With the whole reports, ``'report'``, the margin
  is mostly the finding sentence's other tokens, which follow easily once it
  has begun.) They come after the clinician pair and take the rows of the
  least-failed rollouts. Measured on the rare-enriched ablation (docs,
  Research): neither span moved rare-finding F1 or the first token of a rare
  finding's sentence beyond seed noise, because the text model's states carry
  those findings only at AUC 0.5-0.8 there; hence off by default.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


FINDING_PAIR_SPANS = ("decision", "report")


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
    completions: Sequence[str] = ()  # the rollouts' texts, in the order of `rewards` (finding pairs read them)


def omission_pairs(oracle: str, completions: Sequence[str]) -> list[tuple[str, str]]:
    """(finding, the oracle without its sentences) for each CheXpert finding `oracle` states or hedges and no text
    of `completions` does, in CheXpert order; none without completions, or where nothing would be left."""
    from orapo_core.facts import label_report
    from orapo_core.facts.consistency import split_unsupported

    if not completions or not oracle:
        return []
    said = set().union(*(_stated(label_report(text or "")) for text in completions))
    out = []
    for finding, value in label_report(oracle).items():
        if finding == "No Finding" or value not in (1, -1) or finding in said:
            continue
        rejected, removed = split_unsupported(oracle, {finding})
        if removed and rejected.strip() and rejected != oracle:
            out.append((finding, rejected))
    return out


def _stated(labels) -> set[str]:
    return {n for n, v in labels.items() if n != "No Finding" and v in (1, -1)}


def commission_pairs(oracle: str, completions: Sequence[str]) -> list[tuple[str, str]]:
    """(finding, the oracle with a rollout's sentence stating it put in) for each CheXpert finding every text of
    `completions` states or hedges and `oracle` does not, in CheXpert order. The sentence is the first rollout's
    first findings sentence that states it, put in before the oracle's findings sentence of the same index."""
    from orapo_core.facts import label_report
    from orapo_core.facts.text import split_sentences
    from orapo_core.report_layout import report_text, split_report

    if not completions or not oracle:
        return []
    common = set.intersection(*(_stated(label_report(text or "")) for text in completions))
    oracle_labels = label_report(oracle)
    findings, impression = split_report(oracle)
    mine = [x.text for x in split_sentences(findings)]
    out = []
    for finding in oracle_labels:
        if finding not in common or finding in _stated(oracle_labels):
            continue
        for text in completions:
            theirs = split_sentences(split_report(text)[0])
            at = next((i for i, x in enumerate(theirs) if label_report(x.text).get(finding) in (1, -1)), None)
            if at is not None:
                out.append((finding, report_text(" ".join([*mine[:at], theirs[at].text, *mine[at:]]), impression)))
                break
    return out


def decision_point(chosen: str, rejected: str) -> tuple[str, str] | None:
    """Both texts cut just after the first word in which they differ (their shared start backed off to a word
    boundary, so the start tokenises alike in both), or None when one is the other or a prefix of it."""
    n = 0
    for a, b in zip(chosen, rejected, strict=False):
        if a != b:
            break
        n += 1
    if n == len(chosen) or n == len(rejected):
        return None
    start = max(chosen.rfind(" ", 0, n), chosen.rfind("\n", 0, n)) + 1  # the differing word's first character

    def word(text: str) -> str:
        end = start
        while end < len(text) and text[end].isspace():
            end += 1
        while end < len(text) and not text[end].isspace():
            end += 1
        return text[:end]

    return word(chosen), word(rejected)


@dataclass(frozen=True)
class MinedPair:
    """One DPO pair of a group: ``chosen`` over either rollout ``rollout_index`` or the clinician's draft."""

    chosen: str
    rollout_index: int | None = None  # the rejected answer is this rollout (index within the group)
    rejected_text: str | None = None  # ... or this text (a clinician's draft, or the oracle less a finding)
    finding: str | None = None  # a finding pair: the finding it is about
    eos: bool = True  # whether both answers end with the end of turn (a pair cut at its decision point does not)


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


def _text(value) -> str | None:
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
        finding_pairs: bool = False,
        finding_pair_span: str = "decision",
    ):
        if finding_pair_span not in FINDING_PAIR_SPANS:
            raise ValueError(f"finding_pair_span must be one of {', '.join(FINDING_PAIR_SPANS)}, got {finding_pair_span!r}")
        self.finding_pair_span = finding_pair_span
        self.w_min, self.w_max, self.gamma = w_min, w_max, gamma
        self.threshold = threshold
        self.max_rejected_per_group = max_rejected_per_group
        self.use_clinician_pairs = use_clinician_pairs
        self.finding_pairs = finding_pairs
        self.ema = ZeroRewardEMA(ema_alpha)

    @classmethod
    def from_config(cls, args) -> OraclePairMiner:
        return cls(
            w_min=args.dpo_weight_min,
            w_max=args.dpo_weight_max,
            gamma=args.dpo_weight_gamma,
            ema_alpha=args.zero_reward_ema_alpha,
            threshold=args.zero_reward_threshold,
            max_rejected_per_group=args.max_rejected_per_group,
            use_clinician_pairs=args.use_clinician_pairs,
            finding_pairs=args.finding_pairs,
            finding_pair_span=args.finding_pair_span,
        )

    def failed_rollouts(self, rewards: Sequence[float | None]) -> list[int]:
        """Indices of failed rollouts, lowest reward first, capped at ``max_rejected_per_group``."""
        failed = [
            (r, j) for j, r in enumerate(rewards) if r is not None and not math.isnan(r) and r <= self.threshold
        ]
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
        if self.finding_pairs and oracle is not None:
            found = omission_pairs(oracle, group.completions) + commission_pairs(oracle, group.completions)
            for finding, rejected in found:
                pair = MinedPair(chosen=oracle, rejected_text=rejected, finding=finding)
                if self.finding_pair_span == "decision":
                    cut = decision_point(oracle, rejected)
                    if cut is None:
                        continue
                    pair = MinedPair(chosen=cut[0], rejected_text=cut[1], finding=finding, eos=False)
                if len(pairs) >= len(group.rewards):
                    rollout = [i for i, p in enumerate(pairs) if p.rollout_index is not None]
                    if not rollout:
                        break  # every row already carries a clinician or finding pair
                    del pairs[rollout[-1]]  # the least-failed rollout's
                pairs.append(pair)
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
