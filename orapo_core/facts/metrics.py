"""Clinical-efficacy metrics, computed the way CheXbert-based tables report them.

Uncertain (-1) counts as positive and a blank as negative; micro averages pool
the counts over observations, macro averages the per-class values with 0 where a
class has no predicted or no reference positives (scikit-learn's zero_division=0).

`EvalMetrics` is the one home of the metrics' names: callers read attributes
(`metrics.macro_f1_14`), and every stored result (a round's evaluation, a
version's held-out numbers, a benchmark's JSON) is `to_dict()` and is read back
by `from_dict()`, with the key names those files have always had.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from orapo_core.errors import OrapoError
from orapo_core.facts.labels import label_value
from orapo_core.facts.ontology import CHEXPERT_14, FIVE_OBSERVATIONS


def is_positive(labels: dict, name: str) -> bool:
    return label_value(labels.get(name)) in (1, -1)


def _prf(tp: int, fp: int, fn: int) -> tuple[float, float, float]:
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return p, r, f


@dataclass(frozen=True)
class EvalMetrics:
    """Clinical-efficacy metrics of a set of drafts (`clinical_efficacy`), with what the evaluator adds.

    `_14` is over all the observations scored (the 14 CheXpert ones unless told otherwise), `_5` over the five
    of them the field reports (None when none of the five was scored). A value nothing computed is None: the
    mean report length without texts, the FactS reward outside `evaluate_drafter`, the drafting time of a
    rescore.
    """

    n_reports: int | None = None
    micro_precision_14: float | None = None
    micro_recall_14: float | None = None
    micro_f1_14: float | None = None
    macro_precision_14: float | None = None
    macro_recall_14: float | None = None
    macro_f1_14: float | None = None
    micro_precision_5: float | None = None
    micro_recall_5: float | None = None
    micro_f1_5: float | None = None
    macro_precision_5: float | None = None
    macro_recall_5: float | None = None
    macro_f1_5: float | None = None
    f1_per_class: dict[str, float] = field(default_factory=dict)
    support_per_class: dict[str, int] = field(default_factory=dict)
    mean_report_length: float | None = None
    facts_reward_mean: float | None = None  # mean FactS reward of the scorable drafts (`evaluate_drafter`)
    seconds: float | None = None  # drafting and scoring wall time (`evaluate_drafter`)

    def to_dict(self) -> dict[str, Any]:
        """The JSON layout of every stored result: the field names, a value nothing computed left out."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) not in (None, {})}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> EvalMetrics:
        """Metrics from any stored result (`to_dict`'s, or a dict of older code with the same names); keys that are
        not metrics (a benchmark's own) are left out."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (data or {}).items() if k in names})

    def headline(self) -> dict[str, float | None]:
        """Macro-F1, precision and recall over the 14, keyed as stored: what a benchmark's JSON keeps of a model."""
        return {
            "macro_f1_14": self.macro_f1_14,
            "macro_precision_14": self.macro_precision_14,
            "macro_recall_14": self.macro_recall_14,
        }

    def with_values(self, **values: Any) -> EvalMetrics:
        """A copy with these metrics set (what the evaluator adds to `clinical_efficacy`'s)."""
        return replace(self, **values)


# The metrics a decision compares by name (the rounds' gate): EvalMetrics' own field names, so that no other module
# writes a metric's name as a string.
MACRO_F1 = "macro_f1_14"
FACTS_REWARD = "facts_reward_mean"
assert {MACRO_F1, FACTS_REWARD} <= {f.name for f in fields(EvalMetrics)}


def clinical_efficacy(
    predicted: list[dict],
    reference: list[dict],
    *,
    observations: Sequence[str] = CHEXPERT_14,
    texts: list[str] | None = None,
) -> EvalMetrics:
    """Micro/macro P/R/F1 over all observations (`_14`) and the five (`_5`), per-class F1, report length."""
    if len(predicted) != len(reference):
        raise OrapoError("metrics_shape", f"{len(predicted)} predicted label sets but {len(reference)} references.")
    counts = {}
    for name in observations:
        tp = fp = fn = 0
        for p, r in zip(predicted, reference):
            yp, yr = is_positive(p, name), is_positive(r, name)
            tp += yp and yr
            fp += yp and not yr
            fn += yr and not yp
        counts[name] = (tp, fp, fn)

    values: dict[str, Any] = {"n_reports": len(predicted)}
    groups = {"14": list(observations), "5": [n for n in FIVE_OBSERVATIONS if n in observations]}
    for suffix, names in groups.items():
        if not names:
            continue
        tp, fp, fn = (sum(counts[n][i] for n in names) for i in range(3))
        values[f"micro_precision_{suffix}"], values[f"micro_recall_{suffix}"], values[f"micro_f1_{suffix}"] = _prf(
            tp, fp, fn
        )
        per = [_prf(*counts[n]) for n in names]
        for i, kind in enumerate(("precision", "recall", "f1")):
            values[f"macro_{kind}_{suffix}"] = sum(v[i] for v in per) / len(per)
    values["f1_per_class"] = {n: _prf(*counts[n])[2] for n in observations}
    values["support_per_class"] = {n: counts[n][0] + counts[n][2] for n in observations}
    if texts is not None:
        values["mean_report_length"] = sum(len(t.split()) for t in texts) / len(texts) if texts else 0.0
    return EvalMetrics(**values)
