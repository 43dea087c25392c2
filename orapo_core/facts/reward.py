"""FactS as a GRPO reward, callable exactly as TRL's GRPOTrainer calls reward functions.

TRL passes `prompts`, `completions`, `completion_ids`, every other dataset column
by name, and `trainer_state`, `log_extra`, `log_metric`; a reward returns one
float per completion or None for "nothing to score". Parameterised variants come
from a factory returning a named function (the name becomes the metric key, as
in open-r1), and rewards are found by name or dotted import path.
"""

from __future__ import annotations

import importlib

from orapo_core.errors import OrapoError
from orapo_core.facts.extract import extract_facts, labels_from_facts
from orapo_core.facts.labels import normalize_labels
from orapo_core.facts.score import score_facts


def completion_text(completion) -> str:
    """The report text of a completion: a plain string, or the last assistant turn of a conversation."""
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    for message in reversed(list(completion)):
        if isinstance(message, dict) and message.get("role", "assistant") == "assistant":
            content = message.get("content", "")
            if isinstance(content, list):  # multimodal content parts
                return "".join(part.get("text", "") for part in content if isinstance(part, dict))
            return str(content or "")
    return ""


def _reference(labels, reference_text) -> dict | None:
    reference = normalize_labels(labels) if labels is not None else {}
    if not any(v is not None for v in reference.values()):
        if reference_text:
            return labels_from_facts(extract_facts(reference_text).facts, "chexpert")
        return None
    return reference


def make_facts_reward(
    *,
    beta: float = 1.0,
    precision_aware: bool = True,
    penalty: float = 0.5,
    reference_text_column: str | None = None,
    name: str | None = None,
):
    """A FactS reward with fixed parameters.

    beta > 1 favours recall, as the OraPO paper does; `precision_aware` charges
    contradicted and unsupported sentences (see `score_facts`). Rows without
    labels are scored against the report in `reference_text_column` when given,
    otherwise they get None.
    """
    if beta <= 0:
        raise OrapoError("bad_beta", f"beta must be positive (got {beta}); beta > 1 favours recall.")
    if not 0 <= penalty <= 1:
        raise OrapoError("bad_penalty", f"penalty must lie in [0, 1] (got {penalty}).")

    def facts_reward(completions, *, labels=None, log_metric=None, **kwargs) -> list[float | None]:
        n = len(completions)
        labels = list(labels) if labels is not None else [None] * n
        references = kwargs.get(reference_text_column) if reference_text_column else None
        references = list(references) if references is not None else [None] * n
        if len(labels) != n or len(references) != n:
            raise OrapoError("reward_shape", f"{n} completions but {len(labels)} label sets were given.")
        rewards: list[float | None] = []
        precisions, recalls = [], []
        for completion, row_labels, row_reference in zip(completions, labels, references):
            reference = _reference(row_labels, row_reference)
            if reference is None:
                rewards.append(None)
                continue
            score = score_facts(extract_facts(completion_text(completion)), reference, beta=beta, precision_aware=precision_aware, penalty=penalty)
            rewards.append(score.facts_score)
            precisions.append(score.precision)
            recalls.append(score.recall)
        if callable(log_metric) and precisions:
            log_metric(f"{facts_reward.__name__}/precision", sum(precisions) / len(precisions))
            log_metric(f"{facts_reward.__name__}/recall", sum(recalls) / len(recalls))
        return rewards

    if name is None:
        name = "facts_reward" if (beta, precision_aware) == (1.0, True) else f"facts_f{beta:g}" + ("_pa" if precision_aware else "")
    facts_reward.__name__ = facts_reward.__qualname__ = name
    return facts_reward


facts_reward = make_facts_reward()

# Rewards by name, for recipes; anything else is imported by dotted path.
REWARDS = {
    "facts": facts_reward,
    "facts_reward": facts_reward,
    "facts_plain": make_facts_reward(precision_aware=False, name="facts_plain"),
    "facts_recall": make_facts_reward(beta=2.0, precision_aware=True, name="facts_recall"),
}


def get_reward(name_or_path: str):
    """A reward function by registry name or dotted path ("pkg.module.func" or "pkg.module:func")."""
    if name_or_path in REWARDS:
        return REWARDS[name_or_path]
    module_name, sep, attr = name_or_path.replace(":", ".").rpartition(".")
    if not sep or not module_name:
        raise OrapoError("unknown_reward", f"No reward named {name_or_path!r}; known: {', '.join(REWARDS)}, or give a dotted path.")
    try:
        func = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise OrapoError("unknown_reward", f"Cannot import reward {name_or_path!r}: {exc}.") from None
    if not callable(func):
        raise OrapoError("unknown_reward", f"{name_or_path!r} is not callable.")
    return func
