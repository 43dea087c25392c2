"""Reward functions by name or dotted import (open-r1 style), FactS by default.

'facts' is FactS built with the recipe's `facts_beta` and `precision_aware`;
other names go to FactS' registry (`facts_plain`, `facts_recall`, ...) or are
imported as 'package.module:function' / 'package.module.function', so users add
rewards without forking.
"""

from __future__ import annotations

import importlib

from orapo_core.errors import OrapoError


def resolve_reward(name: str, *, facts_beta: float = 1.0, precision_aware: bool = True):
    try:
        from orapo_core.facts import get_reward, make_facts_reward
    except ImportError:  # FactS missing from this build: dotted imports still work
        get_reward = make_facts_reward = None
    if name == "facts":
        if make_facts_reward is None:
            raise OrapoError(
                "reward_missing",
                "The FactS reward is not available in this build: set reward_name to a dotted import of another reward.",
            )
        return make_facts_reward(beta=facts_beta, precision_aware=precision_aware)
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
