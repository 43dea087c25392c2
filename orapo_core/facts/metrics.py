"""Clinical-efficacy metrics, computed the way CheXbert-based tables report them.

Uncertain (-1) counts as positive and a blank as negative; micro averages pool
the counts over observations, macro averages the per-class values with 0 where a
class has no predicted or no reference positives (scikit-learn's zero_division=0).
"""

from __future__ import annotations

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


def clinical_efficacy(predicted: list[dict], reference: list[dict], *, observations=CHEXPERT_14, texts: list[str] | None = None) -> dict:
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

    result: dict = {"n_reports": len(predicted)}
    groups = {"14": list(observations), "5": [n for n in FIVE_OBSERVATIONS if n in observations]}
    for suffix, names in groups.items():
        if not names:
            continue
        tp, fp, fn = (sum(counts[n][i] for n in names) for i in range(3))
        result[f"micro_precision_{suffix}"], result[f"micro_recall_{suffix}"], result[f"micro_f1_{suffix}"] = _prf(tp, fp, fn)
        per = [_prf(*counts[n]) for n in names]
        for i, kind in enumerate(("precision", "recall", "f1")):
            result[f"macro_{kind}_{suffix}"] = sum(v[i] for v in per) / len(per)
    result["f1_per_class"] = {n: _prf(*counts[n])[2] for n in observations}
    result["support_per_class"] = {n: counts[n][0] + counts[n][2] for n in observations}
    if texts is not None:
        result["mean_report_length"] = sum(len(t.split()) for t in texts) / len(texts) if texts else 0.0
    return result
