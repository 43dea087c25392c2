"""FactS as a GRPO reward, callable exactly as TRL's GRPOTrainer calls reward functions.

TRL passes `prompts`, `completions`, `completion_ids`, every other dataset column
by name, and `trainer_state`, `log_extra`, `log_metric`; a reward returns one
float per completion or None for "nothing to score". Parameterised variants come
from a factory returning a named function (the name becomes the metric key, as
in open-r1); recipes find rewards by name in the one registry,
`orapo_core.train.rewards`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orapo_core.errors import OrapoError
from orapo_core.facts.extract import ReportFacts, extract_facts, labels_from_facts
from orapo_core.facts.form import REQUIRED_SECTIONS, report_form
from orapo_core.facts.labels import normalize_labels
from orapo_core.facts.score import score_facts

# Whether the reward checks side, severity, change, device type and tip position against the reference report by
# default (OraPOConfig.facts_attribute_check); the measurement behind it is on the docs' FactS page.
ATTRIBUTE_CHECK_DEFAULT = True
# Whether the reward multiplies FactS by the completion's form factor (repeats, fragments, stutters, self-contradictions,
# missing sections; `orapo_core.facts.form`) by default (OraPOConfig.facts_form_guard). Off: it keeps GRPO alone
# from degenerate text, but on the clinic story it raised a round's false positives (docs, Research).
FORM_GUARD_DEFAULT = False

# A reward as TRL's GRPOTrainer calls it: completions, then dataset columns and logging hooks by keyword.
RewardFunction = Callable[..., list[float | None]]
# A completion as TRL passes it: the text, or a conversation (one message or a list of them).
Completion = str | dict[str, Any] | list[dict[str, Any]] | None


def completion_text(completion: Completion) -> str:
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


def _reference(labels: object, reference_facts: ReportFacts | None) -> dict[str, int | None] | None:
    reference = normalize_labels(labels) if labels is not None else {}
    if not any(v is not None for v in reference.values()):
        if reference_facts is not None:
            return labels_from_facts(reference_facts.facts, "chexpert")
        return None
    return reference


def _sections(reference_text: str | None, extracted: dict[str, ReportFacts]) -> tuple[str, ...]:
    """The report sections a completion is charged for lacking: those of its reference report (none without one)."""
    if not reference_text:
        return ()
    if reference_text not in extracted:
        extracted[reference_text] = extract_facts(reference_text)
    present = {s.section for s in extracted[reference_text].sentences}
    return tuple(name for name in REQUIRED_SECTIONS if name in present)


def make_facts_reward(
    *,
    beta: float = 1.0,
    precision_aware: bool = True,
    penalty: float = 0.5,
    reference_text_column: str | None = None,
    attribute_check: bool = ATTRIBUTE_CHECK_DEFAULT,
    form_guard: bool = FORM_GUARD_DEFAULT,
    name: str | None = None,
) -> RewardFunction:
    """A FactS reward with fixed parameters.

    beta > 1 favours recall, as the OraPO paper does; `precision_aware` charges
    contradicted and unsupported sentences (see `score_facts`). Rows without
    labels are scored against the report in `reference_text_column` when given,
    otherwise they get None. With `attribute_check` the reference report (the
    `reference_text_column`, by default `reference_report`) also judges each
    entailed finding's side, severity, change, device type and tip position, while the labels still
    decide which findings are right; a row without a reference report is judged
    per observation. Attribute contradictions change the reward only through the
    precision-aware penalty: with `precision_aware=False` they change nothing.
    """
    if beta <= 0:
        raise OrapoError("bad_beta", f"beta must be positive (got {beta}); beta > 1 favours recall.")
    if not 0 <= penalty <= 1:
        raise OrapoError("bad_penalty", f"penalty must lie in [0, 1] (got {penalty}).")
    text_column = reference_text_column or ("reference_report" if (attribute_check or form_guard) else None)

    def facts_reward(
        completions: list[Completion],
        *,
        labels: list[object] | None = None,
        log_metric: Callable[[str, float], None] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        n = len(completions)
        labels = list(labels) if labels is not None else [None] * n
        references = kwargs.get(text_column) if text_column else None
        references = list(references) if references is not None else [None] * n
        if len(labels) != n or len(references) != n:
            raise OrapoError("reward_shape", f"{n} completions but {len(labels)} label sets were given.")
        rewards: list[float | None] = []
        precisions: list[float] = []
        recalls: list[float] = []
        forms: list[float] = []
        extracted: dict[str, ReportFacts] = {}  # a group's G completions share one reference: extract it once
        for completion, row_labels, row_reference in zip(completions, labels, references):
            reference_facts = None
            if row_reference and (attribute_check or reference_text_column):
                if row_reference not in extracted:
                    extracted[row_reference] = extract_facts(row_reference)
                reference_facts = extracted[row_reference]
            reference = _reference(row_labels, reference_facts if reference_text_column else None)
            if reference is None:
                rewards.append(None)
                continue
            facts = extract_facts(completion_text(completion))
            score = score_facts(
                facts,
                reference,
                beta=beta,
                precision_aware=precision_aware,
                penalty=penalty,
                reference_facts=reference_facts if attribute_check else None,
            )
            value = score.facts_score
            if form_guard:
                form = report_form(facts, required_sections=_sections(row_reference, extracted))
                value *= form.factor
                forms.append(form.factor)
            rewards.append(value)
            precisions.append(score.precision)
            recalls.append(score.recall)
        if callable(log_metric) and precisions:
            log_metric(f"{facts_reward.__name__}/precision", sum(precisions) / len(precisions))
            log_metric(f"{facts_reward.__name__}/recall", sum(recalls) / len(recalls))
        if callable(log_metric) and forms:
            log_metric(f"{facts_reward.__name__}/form", sum(forms) / len(forms))
        return rewards

    if name is None:
        name = (
            "facts_reward"
            if (beta, precision_aware) == (1.0, True)
            else f"facts_f{beta:g}" + ("_pa" if precision_aware else "")
        )
    facts_reward.__name__ = facts_reward.__qualname__ = name
    return facts_reward


facts_reward = make_facts_reward()
