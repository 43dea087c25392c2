"""Reward functions by name or dotted import (open-r1 style), FactS by default.

'facts' is FactS built with the recipe's `facts_beta`, `precision_aware` and
`facts_attribute_check`;
'rouge_l' and 'token_f1' are text-overlap rewards against the reference report
(the paper's "accuracy reward" baseline: they reward wording, not findings);
other names go to FactS' registry (`facts_plain`, `facts_recall`, ...) or are
imported as 'package.module:function' / 'package.module.function', so users add
rewards without forking.
"""

from __future__ import annotations

import importlib
import re
from collections import Counter

from orapo_core.errors import OrapoError

_WORD = re.compile(r"[a-z0-9]+")


def _words(text) -> list[str]:
    from orapo_core.facts.reward import completion_text

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


def _overlap_reward(name: str, overlap):
    def reward(completions, *, reference_report=None, **kwargs) -> list[float | None]:
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


def resolve_reward(name: str, *, facts_beta: float = 1.0, precision_aware: bool = True, attribute_check: bool | None = None):
    """The reward named `name`; FactS's parameters apply to 'facts' only (None: FactS's own default)."""
    try:
        from orapo_core.facts import get_reward, make_facts_reward
    except ImportError:  # FactS missing from this build: dotted imports still work
        get_reward = make_facts_reward = None
    if name in TEXT_REWARDS:
        return TEXT_REWARDS[name]
    if name == "facts":
        if make_facts_reward is None:
            raise OrapoError(
                "reward_missing",
                "The FactS reward is not available in this build: set reward_name to a dotted import of another reward.",
            )
        extra = {} if attribute_check is None else {"attribute_check": attribute_check}
        return make_facts_reward(beta=facts_beta, precision_aware=precision_aware, **extra)
    if get_reward is not None:
        return get_reward(name)
    module_name, sep, attr = name.replace(":", ".").rpartition(".")
    if not sep or not module_name:
        raise OrapoError("unknown_reward", f"Unknown reward {name!r}: use 'facts' or 'package.module:function'.")
    try:
        func = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise OrapoError("unknown_reward", f"Cannot import the reward {name!r}: {exc}.") from None
    if not callable(func):
        raise OrapoError("unknown_reward", f"The reward {name!r} is not callable.")
    return func
