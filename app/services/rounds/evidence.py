"""What the gate judges on, as pure functions of the two models' per-study predictions on the held-out studies.

A prediction row is what the evaluation worker keeps of `evaluate_drafter`'s: `study_id`, `draft`, `labels` (FactS
labels of the draft), `reference` (the study's labels), `facts_score`, and `source` (where the study came from).

- `paired_interval`: a metric's candidate-minus-served difference with a 95 % percentile interval from a paired
  bootstrap: the same resampled studies for both models, so what the two share (an easy or a hard set) cancels.
- `finding_rates`: one model's recall and false-positive rate for one finding, as counts.
- `finding_changes`: what the round's corrections did to each finding (added: the signed report states it and
  the model's draft did not; removed: the other way round); `corrected_findings` keeps those corrected often enough.

The held-out set may be topped up with PhantomCXR studies drawn at PhantomCXR's usual prevalence of every finding
(`TOPUP_SOURCE`, `data.top_up`), so that a corrected finding's negatives include films with other findings: for a
finding they count only where they do not state it, as negatives (its false-positive rate), never as positives (its
recall is the set's own studies'), and never for macro-F1 or the FactS reward (`judged`, `finding_rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from orapo_core.facts.metrics import FACTS_REWARD, MACRO_F1, EvalMetrics, clinical_efficacy, is_positive
from orapo_core.facts.ontology import CHEXPERT_14

TOPUP_SOURCE = "phantomcxr_negatives"  # held-out studies added for the false-positive rates of corrected findings
TOPUP_MAX_STUDIES = 600  # the PhantomCXR top-up pool is drawn up to this many studies (`max_topup_studies`)
# "No Finding" is the absence of the other 13: a correction that adds a finding to a normal draft is counted as
# adding that finding, and No Finding's false positives are the other findings' misses, which their recall shows.
NOT_A_FINDING = frozenset({"No Finding"})
METRICS = {MACRO_F1: "macro-F1", FACTS_REWARD: "FactS reward"}
BOOTSTRAP_SEED = 0

if TYPE_CHECKING:  # numpy is imported where it is used: reading a round's numbers needs none
    import numpy as np


def judged(rows: Sequence[dict]) -> list[dict]:
    """The rows macro-F1 and the FactS reward are measured on: every held-out study but the top-up negatives."""
    return [r for r in rows if r.get("source") != TOPUP_SOURCE]


def finding_rows(rows: Sequence[dict], finding: str) -> list[dict]:
    """The rows `finding` is measured on: every judged row, and the top-up rows that do not state it (its negatives).

    A top-up study that states the finding is left out: it was added as a negative of another corrected finding,
    and the finding's recall is measured on the set's own studies only."""
    return [r for r in rows if r.get("source") != TOPUP_SOURCE or not is_positive(r["reference"], finding)]


def paired_rows(candidate: Sequence[dict], served: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """The two models' rows on the studies both drafted, in the served model's order."""
    by_id = {r.get("study_id"): r for r in candidate}
    pairs = [(by_id[r.get("study_id")], r) for r in served if r.get("study_id") in by_id]
    return [c for c, _ in pairs], [s for _, s in pairs]


def labelled(rows: Sequence[dict]) -> bool:
    """Whether the rows carry the draft's and the study's labels (an evaluation written before they were kept has none)."""
    return bool(rows) and all(isinstance(r.get("labels"), dict) and isinstance(r.get("reference"), dict) for r in rows)


def judged_metrics(rows: Sequence[dict]) -> EvalMetrics:
    """Clinical efficacy and the mean FactS reward of the judged rows, as `evaluate_drafter` computes them."""
    rows = judged(rows)
    if not labelled(rows):
        return EvalMetrics(n_reports=len(rows))
    scores = [r["facts_score"] for r in rows if r.get("facts_score") is not None]
    return clinical_efficacy(
        [r["labels"] for r in rows], [r["reference"] for r in rows], texts=[str(r.get("draft") or "") for r in rows]
    ).with_values(facts_reward_mean=sum(scores) / len(scores) if scores else None)


# --- paired bootstrap intervals --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    """One metric of both models on the same studies: the difference and its percentile interval."""

    metric: str  # a key of METRICS
    candidate: float
    served: float
    low: float
    high: float
    studies: int
    confidence: float = 0.95

    @property
    def delta(self) -> float:
        return self.candidate - self.served

    @property
    def name(self) -> str:
        return METRICS.get(self.metric, self.metric)

    def describe(self) -> str:
        """The model's own number first: 'macro-F1 0.4312 (served 0.4011): +0.0301, 95 % interval [...] on 25 studies'."""
        return (
            f"{self.name} {self.candidate:.4f} (served {self.served:.4f}): {self.delta:+.4f}, "
            f"{self.confidence:.0%} interval [{self.low:+.4f}, {self.high:+.4f}] on {self.studies} studies"
        )

    def difference(self) -> str:
        """'macro-F1 difference +0.0301 (95% interval [-0.0712, +0.1290], 25 studies)': what a reason quotes."""
        return (
            f"{self.name} difference {self.delta:+.4f} ({self.confidence:.0%} interval "
            f"[{self.low:+.4f}, {self.high:+.4f}], {self.studies} studies)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "candidate": self.candidate,
            "served": self.served,
            "low": self.low,
            "high": self.high,
            "studies": self.studies,
            "confidence": self.confidence,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Interval:
        return cls(
            str(data["metric"]),
            float(data["candidate"]),
            float(data["served"]),
            float(data["low"]),
            float(data["high"]),
            int(data["studies"]),
            float(data.get("confidence", 0.95)),
        )


def _positives(label_sets: Iterable[dict]) -> np.ndarray:
    import numpy as np

    return np.array([[is_positive(labels, name) for name in CHEXPERT_14] for labels in label_sets], dtype=bool)


def _macro_f1(rows: Sequence[dict]) -> Callable[[np.ndarray], np.ndarray]:
    """Macro-F1 over the 14 observations of resampled rows (weights: how often each study is drawn), as
    `clinical_efficacy` computes it: 0 for an observation with no predicted and no reference positive."""
    import numpy as np

    predicted, reference = _positives(r["labels"] for r in rows), _positives(r["reference"] for r in rows)
    tp, fp, fn = (
        (a & b).astype(float) for a, b in ((predicted, reference), (predicted, ~reference), (~predicted, reference))
    )

    def at(weights: np.ndarray) -> np.ndarray:
        t, p, n = weights @ tp, weights @ fp, weights @ fn
        denominator = 2 * t + p + n
        return np.where(denominator > 0, 2 * t / np.maximum(denominator, 1e-12), 0.0).mean(axis=-1)

    return at


def _reward_mean(rows: Sequence[dict]) -> Callable[[np.ndarray], np.ndarray]:
    """The mean FactS reward of the scorable drafts among resampled rows (NaN where none is scorable)."""
    import numpy as np

    scores = np.array([np.nan if r.get("facts_score") is None else float(r["facts_score"]) for r in rows])
    scorable = ~np.isnan(scores)
    values = np.where(scorable, scores, 0.0)

    def at(weights: np.ndarray) -> np.ndarray:
        count = weights @ scorable.astype(float)
        return np.where(count > 0, (weights @ values) / np.maximum(count, 1e-12), np.nan)

    return at


_METRIC_OF = {MACRO_F1: _macro_f1, FACTS_REWARD: _reward_mean}


@lru_cache(maxsize=16)
def resample_weights(n: int, resamples: int, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """`resamples` draws of n studies with replacement, as how many times each study is drawn (resamples x n).
    The same draws for every metric of one decision (cached, and read-only so no caller can change them)."""
    import numpy as np

    weights = np.random.default_rng(seed).multinomial(n, np.full(n, 1.0 / n), size=resamples).astype(float)
    weights.flags.writeable = False
    return weights


def paired_interval(
    metric: str,
    candidate: Sequence[dict],
    served: Sequence[dict],
    *,
    resamples: int = 1000,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = 0.95,
) -> Interval | None:
    """Candidate minus served `metric` on the same studies (row i of each is study i), with a paired bootstrap
    percentile interval; None when there are no studies or the metric has no value on them (no scorable draft)."""
    import numpy as np

    if len(candidate) != len(served):
        raise ValueError(f"{len(candidate)} candidate rows for {len(served)} served rows")
    if not served:
        return None
    of_candidate, of_served = _METRIC_OF[metric](candidate), _METRIC_OF[metric](served)
    everything = np.ones((1, len(served)))
    c, s = float(of_candidate(everything)[0]), float(of_served(everything)[0])
    if np.isnan(c) or np.isnan(s):
        return None
    weights = resample_weights(len(served), resamples, seed)
    deltas = of_candidate(weights) - of_served(weights)
    tail = (1 - confidence) / 2 * 100
    low, high = np.nanpercentile(deltas, [tail, 100 - tail])
    return Interval(metric, c, s, float(low), float(high), len(served), confidence)


# --- per-finding rates -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Count:
    """`hits` of `of` studies, e.g. 98/125 true positives among the positives."""

    hits: int
    of: int

    @property
    def rate(self) -> float | None:
        return self.hits / self.of if self.of else None

    def __str__(self) -> str:
        return f"{self.hits}/{self.of}" + (f" = {self.rate:.1%}" if self.of else "")


@dataclass(frozen=True)
class FindingRates:
    """One model on one finding: recall (found / positive studies) and false-positive rate (stated / negative ones)."""

    recall: Count
    fpr: Count


def finding_rates(rows: Sequence[dict], finding: str) -> FindingRates:
    positive = [is_positive(r["reference"], finding) for r in rows]
    stated = [is_positive(r["labels"], finding) for r in rows]
    return FindingRates(
        Count(sum(p and s for p, s in zip(positive, stated, strict=True)), sum(positive)),
        Count(sum(s and not p for p, s in zip(positive, stated, strict=True)), len(rows) - sum(positive)),
    )


@dataclass(frozen=True)
class FindingCheck:
    """A finding the round's corrections changed, and both models' recall and false-positive rate on it."""

    finding: str
    added: int
    removed: int
    candidate: FindingRates
    served: FindingRates
    topped_up: int = 0  # of the negatives, how many are PhantomCXR top-up studies
    min_positives: int = 0  # fewer held-out studies with the finding than this: its recall is not measurable

    @property
    def recall_measurable(self) -> bool:
        return self.served.recall.of >= max(1, self.min_positives)

    def describe(self) -> str:
        """'Pleural Other (added by 150, removed by 0 corrections): recall 9/12 = 75.0% (served 2/12 = 16.7%); false
        positives 3/180 = 1.7% (served 1/180 = 0.6%); 170 of the 180 negatives are PhantomCXR top-up', the recall
        'not measurable: 4 held-out studies with it, fewer than min_finding_positives=10 (found 3/4, served 1/4)'
        on a set with too few positives."""
        c, s = self.candidate, self.served
        where = f"; {self.topped_up} of the {c.fpr.of} negatives are PhantomCXR top-up" if self.topped_up else ""
        recall = f"recall {c.recall} (served {s.recall})"
        if not self.recall_measurable:
            recall = (
                f"recall not measurable: {s.recall.of} held-out studies with it, fewer than "
                f"min_finding_positives={self.min_positives} (found {c.recall.hits}/{c.recall.of}, "
                f"served {s.recall.hits}/{s.recall.of})"
            )
        return (
            f"{self.finding} (added by {self.added}, removed by {self.removed} corrections): "
            f"{recall}; false positives {c.fpr} (served {s.fpr}){where}"
        )

    def to_dict(self) -> dict[str, Any]:
        rates = {
            name: [[r.recall.hits, r.recall.of], [r.fpr.hits, r.fpr.of]]
            for name, r in (("candidate", self.candidate), ("served", self.served))
        }
        return {
            "finding": self.finding,
            "added": self.added,
            "removed": self.removed,
            **rates,
            "topped_up": self.topped_up,
            "min_positives": self.min_positives,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FindingCheck:
        def rates(pair: Sequence[Sequence[Any]]) -> FindingRates:
            return FindingRates(Count(*map(int, pair[0])), Count(*map(int, pair[1])))

        return cls(
            str(data["finding"]),
            int(data.get("added", 0)),
            int(data.get("removed", 0)),
            rates(data["candidate"]),
            rates(data["served"]),
            int(data.get("topped_up", 0)),
            int(data.get("min_positives", 0)),
        )


def finding_check(
    finding: str,
    change: Mapping[str, int],
    candidate: Sequence[dict],
    served: Sequence[dict],
    *,
    min_positives: int = 0,
) -> FindingCheck:
    """Both models' rates on `finding` (`finding_rows`): recall over the set's own studies, the
    false-positive rate over those without it and the top-up studies without it (counted as `topped_up`)."""
    candidate, served = finding_rows(candidate, finding), finding_rows(served, finding)
    topped_up = sum(r.get("source") == TOPUP_SOURCE for r in served)
    return FindingCheck(
        finding,
        int(change.get("added", 0)),
        int(change.get("removed", 0)),
        finding_rates(candidate, finding),
        finding_rates(served, finding),
        topped_up,
        min_positives,
    )


# --- what the round's corrections changed ----------------------------------------------------------------------


def finding_changes(pairs: Iterable[tuple[dict, dict]]) -> dict[str, dict[str, int]]:
    """Per finding, how many corrections added it and how many removed it, from (signed labels, draft labels) pairs."""
    out: dict[str, dict[str, int]] = {}
    for signed, draft in pairs:
        for name in CHEXPERT_14:
            now, before = is_positive(signed, name), is_positive(draft, name)
            if name not in NOT_A_FINDING and now != before:
                entry = out.setdefault(name, {"added": 0, "removed": 0})
                entry["added" if now else "removed"] += 1
    return out


def corrected_findings(changes: Mapping[str, Mapping[str, int]], minimum: int) -> list[str]:
    """The findings at least `minimum` corrections added or removed, in CheXpert order."""
    return [
        name
        for name in CHEXPERT_14
        if name in changes and changes[name].get("added", 0) + changes[name].get("removed", 0) >= max(1, minimum)
    ]
