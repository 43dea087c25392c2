"""The one reward registry: rewards by name or dotted import (TRL's `scripts/grpo.py`, open-r1), FactS by default.

A recipe names its rewards as TRL's GRPO script does, `reward_funcs: [facts]`
(weights in TRL's `reward_weights`), or one reward with `reward_name` (an
alias). Names: 'facts' is FactS built with the recipe's `facts_beta`,
`precision_aware`, `facts_attribute_check` and `facts_form_guard`; 'facts_plain' and
'facts_recall' are fixed FactS variants; 'rouge_l' and 'token_f1' are
text-overlap rewards against the reference report (the paper's "accuracy
reward" baseline: they reward wording, not findings). Any other name is
imported as 'package.module:function' / 'package.module.function', so users
add rewards without forking.
"""

from __future__ import annotations

import importlib
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orapo_core.errors import OrapoError
from orapo_core.facts.reward import completion_text, make_facts_reward

if TYPE_CHECKING:
    from orapo_core.facts.reward import Completion, RewardFunction
    from orapo_core.train.config import OraPOConfig

_WORD = re.compile(r"[a-z0-9]+")


def _words(text: Completion) -> list[str]:
    return _WORD.findall(completion_text(text).lower())


def _lcs_length(a: list[str], b: list[str]) -> int:
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def _f1(overlap: int, predicted: int, reference: int) -> float:
    if not overlap:
        return 0.0
    precision, recall = overlap / predicted, overlap / reference
    return 2 * precision * recall / (precision + recall)


def _overlap_reward(name: str, overlap: Callable[[list[str], list[str]], int]) -> RewardFunction:
    def reward(
        completions: list[Completion], *, reference_report: list[str | None] | None = None, **kwargs: Any
    ) -> list[float | None]:
        references = list(reference_report) if reference_report is not None else [None] * len(completions)
        if len(references) != len(completions):
            raise OrapoError("reward_shape", f"{len(completions)} completions but {len(references)} reference reports.")
        scores: list[float | None] = []
        for completion, reference in zip(completions, references):
            ref = _words(reference or "")
            if not ref:
                scores.append(None)  # nothing to compare with: cannot score
                continue
            got = _words(completion)
            scores.append(_f1(overlap(got, ref), len(got), len(ref)) if got else 0.0)
        return scores

    reward.__name__ = reward.__qualname__ = name
    return reward


# ROUGE-L F1 (longest common word subsequence) and bag-of-words F1, lower-cased words, against `reference_report`.
rouge_l_reward = _overlap_reward("rouge_l_reward", _lcs_length)
token_f1_reward = _overlap_reward("token_f1_reward", lambda a, b: sum((Counter(a) & Counter(b)).values()))
TEXT_REWARDS = {"rouge_l": rouge_l_reward, "token_f1": token_f1_reward}


@dataclass(frozen=True)
class RewardSettings:
    """The recipe's settings of the FactS reward ('facts'); None keeps FactS's own default."""

    facts_beta: float = 1.0
    precision_aware: bool = True
    attribute_check: bool | None = None
    form_guard: bool | None = None

    @classmethod
    def from_config(cls, args: OraPOConfig) -> RewardSettings:
        return cls(args.facts_beta, args.precision_aware, args.facts_attribute_check, args.facts_form_guard)


def _facts(settings: RewardSettings, **fixed: Any) -> RewardFunction:
    extra: dict[str, Any] = {} if settings.attribute_check is None else {"attribute_check": settings.attribute_check}
    if settings.form_guard is not None:
        extra["form_guard"] = settings.form_guard
    return make_facts_reward(**{**extra, **fixed})


# name -> factory(settings) -> reward function. 'facts_reward' is the function's own name, kept as a name too.
REWARDS: dict[str, Callable[[RewardSettings], RewardFunction]] = {
    "facts": lambda s: _facts(s, beta=s.facts_beta, precision_aware=s.precision_aware),
    "facts_reward": lambda s: _facts(s, beta=s.facts_beta, precision_aware=s.precision_aware),
    "facts_plain": lambda s: _facts(s, precision_aware=False, name="facts_plain"),
    "facts_recall": lambda s: _facts(s, beta=2.0, precision_aware=True, name="facts_recall"),
    "rouge_l": lambda s: rouge_l_reward,
    "token_f1": lambda s: token_f1_reward,
}


def get_reward(name: str, settings: RewardSettings | None = None) -> RewardFunction:
    """The reward called `name` in the registry, or imported from 'package.module:function'."""
    if name in REWARDS:
        return REWARDS[name](settings or RewardSettings())
    module_name, sep, attr = name.replace(":", ".").rpartition(".")
    if not sep or not module_name:
        raise OrapoError(
            "unknown_reward",
            f"No reward named {name!r}; known: {', '.join(REWARDS)}, or give a dotted path 'package.module:function'.",
        )
    try:
        func = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise OrapoError("unknown_reward", f"Cannot import the reward {name!r}: {exc}.") from None
    if not callable(func):
        raise OrapoError("unknown_reward", f"The reward {name!r} is not callable.")
    return func


def rewards_for(args: OraPOConfig) -> list[RewardFunction]:
    """The reward functions an `OraPOConfig` names (`reward_funcs`, in order; their weights are `reward_weights`)."""
    settings = RewardSettings.from_config(args)
    return [get_reward(name, settings) for name in args.reward_funcs or ()]  # the config sets it (None: 'facts')
