"""The promotion gate: the candidate and the served model on the same held-out studies, decided only as far as the
data can tell, with the reason and the numbers.

`decide` is a pure function of both models' per-study predictions (what `Evaluate` drafted,
`app.services.rounds.worker`) and of what the round's corrections changed, so the rule is tested on literal rows
and shown to the admin with its numbers; its `Decision` is what `Install` acts on. The rule:

- promote when the 95 % paired interval of candidate-minus-served macro-F1 lies above -`f1_tolerance`, the FactS
  reward difference's lies above `reward_margin`, and every corrected finding's false-positive rate is within
  `max_finding_fpr` (or not above the served model's, where that is higher already) and no more than
  `max_finding_fpr_rise` over the served model's, and the candidate wrote no more drafts that must not be signed
  as they are than the served model (`problem_drafts`: the draft checks' count);
- reject when the data shows the candidate worse: macro-F1's interval below -`f1_tolerance`, the reward's at or
  below `reward_margin`, a corrected finding's false-positive rate over a limit (measured on at least
  `min_finding_negatives` negatives), or the interval of its share of such drafts minus the served model's above 0;
- otherwise hold it for an administrator: the intervals straddle the bounds, the set is too small to measure a
  corrected finding's false-positive rate (fewer than `min_finding_negatives` negatives, even after the PhantomCXR
  top-up of `data.top_up`, which stops at `max_topup_studies` studies), or it wrote more drafts that must not be
  signed as they are than the served model, too few more for the data to show it worse.

Each corrected finding's recall is shown beside its false-positive rate, as counts, or as not measurable where the
held-out set has fewer than `min_finding_positives` studies with it; it holds nothing (the issue's rule checks false
positives; a round corrects many findings, and a clinic's few held-out studies carry few of each). The reason names
only the findings that fail a check; `decision_lines` gives every corrected finding a line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from app.services.rounds.evidence import (
    TOPUP_MAX_STUDIES,
    TOPUP_SOURCE,
    FindingCheck,
    Interval,
    corrected_findings,
    finding_check,
    judged,
    judged_metrics,
    labelled,
    paired_interval,
    paired_rows,
)
from app.services.rounds.problem_drafts import ProblemDrafts, count_problem_drafts, not_shown_better, shown_worse
from orapo_core.facts.metrics import FACTS_REWARD, MACRO_F1, EvalMetrics


@dataclass(frozen=True)
class GatePolicy:
    """The gate's bounds (the round policy's settings of the same names, `RoundPolicy.gate`)."""

    f1_tolerance: float = 0.02
    reward_margin: float = 0.0
    max_finding_fpr: float = 0.05
    max_finding_fpr_rise: float = 0.02
    min_finding_corrections: int = 3
    min_finding_positives: int = 10
    min_finding_negatives: int = 100
    max_topup_studies: int = TOPUP_MAX_STUDIES
    gate_resamples: int = 1000

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> GatePolicy:
        defaults = cls()
        return cls(
            **{k: type(getattr(defaults, k))(v) for k, v in (data or {}).items() if k in cls.__dataclass_fields__}
        )


@dataclass(frozen=True)
class Decision:
    """What the gate decided about a candidate, why, and the numbers it compared."""

    promote: bool
    reason: str
    candidate: EvalMetrics
    served: EvalMetrics
    hold: bool = False  # neither promoted nor rejected: kept as a candidate for an administrator to judge
    intervals: tuple[Interval, ...] = ()  # macro-F1 and FactS reward, candidate minus served, paired
    findings: tuple[FindingCheck, ...] = ()  # the corrected findings' recall and false-positive rates
    heldout_sources: dict[str, int] = field(default_factory=dict)  # held-out studies by where they came from
    # the candidate's own drafts, its finding checks set aside (shown first; the gate decides on the drafts as shown)
    alone: EvalMetrics | None = None
    alone_findings: tuple[FindingCheck, ...] = ()
    # both models' drafts the draft checks flag (`problem_drafts`); None in a decision stored before the gate counted them
    problem_drafts: ProblemDrafts | None = None

    @property
    def verdict(self) -> str:
        return "promote" if self.promote else "hold" if self.hold else "reject"

    def to_dict(self) -> dict[str, Any]:
        return {
            "promote": self.promote,
            "reason": self.reason,
            "candidate": self.candidate.to_dict(),
            "served": self.served.to_dict(),
            "hold": self.hold,
            "intervals": [i.to_dict() for i in self.intervals],
            "findings": [f.to_dict() for f in self.findings],
            "heldout_sources": dict(self.heldout_sources),
            "alone": self.alone.to_dict() if self.alone is not None else None,
            "alone_findings": [f.to_dict() for f in self.alone_findings],
            "problem_drafts": self.problem_drafts.to_dict() if self.problem_drafts is not None else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Decision:
        return cls(
            bool(data.get("promote")),
            str(data.get("reason", "")),
            EvalMetrics.from_dict(data.get("candidate")),
            EvalMetrics.from_dict(data.get("served")),
            bool(data.get("hold", False)),
            tuple(Interval.from_dict(i) for i in data.get("intervals") or ()),
            tuple(FindingCheck.from_dict(f) for f in data.get("findings") or ()),
            {str(k): int(v) for k, v in (data.get("heldout_sources") or {}).items()},
            EvalMetrics.from_dict(data["alone"]) if data.get("alone") else None,
            tuple(FindingCheck.from_dict(f) for f in data.get("alone_findings") or ()),
            ProblemDrafts.from_dict(data["problem_drafts"]) if data.get("problem_drafts") else None,
        )


def _gate_numbers(metrics: EvalMetrics) -> EvalMetrics:
    """The numbers the gate compares, and how many studies they are over."""
    return EvalMetrics(
        n_reports=metrics.n_reports, macro_f1_14=metrics.macro_f1_14, facts_reward_mean=metrics.facts_reward_mean
    )


def _sources(rows: Sequence[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rows:
        source = str(r.get("source") or "heldout")
        counts[source] = counts.get(source, 0) + 1
    return counts


def _worse(
    f1: Interval,
    reward: Interval,
    checks: Sequence[FindingCheck],
    policy: GatePolicy,
    problems: ProblemDrafts | None = None,
) -> list[str]:
    """What the data shows the candidate worse at (any one rejects it)."""
    reasons = [reason] if (reason := shown_worse(problems)) else []
    if f1.high < -policy.f1_tolerance:
        reasons.append(f"{f1.difference()} lies below -{policy.f1_tolerance:g}: worse than the served model")
    if reward.high <= policy.reward_margin:
        reasons.append(f"{reward.difference()} is not above {policy.reward_margin:g}: not better than the served model")
    for check in checks:
        c, s = check.candidate.fpr, check.served.fpr
        if c.of < max(1, policy.min_finding_negatives):
            continue  # too few negatives to measure: said by `_unsure`
        assert c.rate is not None  # c.of >= 1 here
        served_rate = cast(float, s.rate)  # the served model's negatives are the same studies
        # Over the limit is a rejection only where the candidate is also above the served model: a starter that
        # already over-calls a finding (lung opacity at 19 %) must not make a round that lowers it unpromotable.
        if c.rate > policy.max_finding_fpr and c.rate > served_rate:
            reasons.append(f"{check.finding} false positives {c} exceed {policy.max_finding_fpr:.0%} (served {s})")
        elif c.rate - served_rate > policy.max_finding_fpr_rise + 1e-9:  # exactly the limit in points is within it
            reasons.append(
                f"{check.finding} false positives {c} rise {(c.rate - served_rate) * 100:.1f} points over the "
                f"served model's {s} (more than {policy.max_finding_fpr_rise * 100:g})"
            )
    return reasons


def _unsure(
    f1: Interval,
    reward: Interval,
    checks: Sequence[FindingCheck],
    policy: GatePolicy,
    problems: ProblemDrafts | None = None,
) -> list[str]:
    """What the data cannot tell (any one holds the candidate for an administrator). Too few positives for a
    corrected finding's recall is not one: its line says the recall is not measurable. More drafts that must not
    be signed as they are than the served model is one, however few: the candidate is not promoted."""
    reasons = [reason] if (reason := not_shown_better(problems)) else []
    if f1.low <= -policy.f1_tolerance:
        reasons.append(
            f"{f1.difference()} reaches -{policy.f1_tolerance:g}: the data cannot show the candidate not worse"
        )
    if reward.low <= policy.reward_margin:
        reasons.append(
            f"{reward.difference()} reaches {policy.reward_margin:g}: the data cannot show the candidate better"
        )
    short = [c for c in checks if c.candidate.fpr.of < policy.min_finding_negatives]
    if short:
        each = ", ".join(f"{c.finding} ({c.candidate.fpr.of} without it)" for c in short)
        capped = (
            f", even after the PhantomCXR top-up, which stops at max_topup_studies={policy.max_topup_studies} studies"
            if any(c.topped_up for c in short)
            else ""
        )
        reasons.append(
            f"too few held-out studies to measure the false positives of {each}: fewer than "
            f"min_finding_negatives={policy.min_finding_negatives} for a {policy.max_finding_fpr:.0%} "
            f"false-positive rate{capped}"
        )
    return reasons


def decide(
    candidate: Sequence[dict],
    served: Sequence[dict],
    policy: GatePolicy = GatePolicy(),
    *,
    changes: Mapping[str, Mapping[str, int]] | None = None,
    untrusted: str | None = None,
    alone: Sequence[dict] | None = None,
) -> Decision:
    """The gate on both models' prediction rows on the same held-out studies (see the module's rule).

    `changes` is what the round's corrections did to each finding (`evidence.finding_changes`); the findings at
    least `min_finding_corrections` of them added or removed are checked. `untrusted` is why the held-out set
    cannot speak for the served model's patients (e.g. too few signed held-out studies, and a model other than
    the PhantomCXR starter): then nothing is promoted or rejected automatically, the numbers are still shown,
    and the candidate waits for an administrator. `alone` is the candidate's rows with its finding checks set
    aside: shown first (what the model writes by itself), never what the gate decides on.
    """
    candidate, served = paired_rows(candidate, served)
    changes = changes or {}
    numbers: dict[str, Any] = dict(
        candidate=_gate_numbers(judged_metrics(candidate)),
        served=_gate_numbers(judged_metrics(served)),
        heldout_sources=_sources(served),
    )
    if not (labelled(candidate) and labelled(served) and judged(served)):
        return Decision(
            False,
            "held for an administrator: the held-out evaluation kept no per-study labels of both "
            "models, so no paired interval can be computed",
            hold=True,
            **numbers,
        )
    c_judged, s_judged = judged(candidate), judged(served)
    intervals = [
        paired_interval(metric, c_judged, s_judged, resamples=policy.gate_resamples)
        for metric in (MACRO_F1, FACTS_REWARD)
    ]
    checks = [
        finding_check(name, changes[name], candidate, served, min_positives=policy.min_finding_positives)
        for name in corrected_findings(changes, policy.min_finding_corrections)
    ]
    numbers.update(intervals=tuple(i for i in intervals if i is not None), findings=tuple(checks))
    own = paired_rows(alone, served)[0] if alone else None
    problems = count_problem_drafts(candidate, served, alone=own, resamples=policy.gate_resamples)
    numbers.update(problem_drafts=problems)
    if own:
        numbers.update(
            alone=_gate_numbers(judged_metrics(own)),
            alone_findings=tuple(
                finding_check(c.finding, changes[c.finding], own, served, min_positives=policy.min_finding_positives)
                for c in checks
            ),
        )
    if untrusted:
        return Decision(False, f"kept for an administrator to promote by hand: {untrusted}", hold=True, **numbers)
    f1, reward = intervals
    if f1 is None or reward is None:
        return Decision(
            False,
            "held for an administrator: the held-out evaluation produced no macro-F1 or FactS reward to compare",
            hold=True,
            **numbers,
        )
    worse = _worse(f1, reward, checks, policy, problems)
    if worse:
        return Decision(False, "; ".join(worse), **numbers)
    unsure = _unsure(f1, reward, checks, policy, problems)
    if unsure:
        return Decision(False, "held for an administrator: " + "; ".join(unsure), hold=True, **numbers)
    within = (
        f"; {len(checks)} corrected finding(s) within the false-positive limits ({policy.max_finding_fpr:.0%}, "
        f"+{policy.max_finding_fpr_rise * 100:g} points)"
        if checks
        else ""
    )
    if problems is not None and problems.any_flagged:
        within += f"; no more drafts that must not be signed as they are than the served model, {problems.counts()}"
    return Decision(
        True,
        f"{f1.difference()} lies above -{policy.f1_tolerance:g}; {reward.difference()} lies above "
        f"{policy.reward_margin:g}{within}",
        **numbers,
    )


SOURCE_WORDS = {
    "holdout_studies": "signed held-out studies of the clinic",
    "phantomcxr_valid": "PhantomCXR validation studies",
    TOPUP_SOURCE: "PhantomCXR top-up studies (false-positive rates only)",
}


def decision_lines(decision: Decision) -> list[str]:
    """The gate's numbers in words, one line each, the candidate's own first: where the held-out studies came
    from, each paired interval, each corrected finding's recall and false-positive rate (what the round page and
    `orapo rounds show` print under the verdict)."""
    lines = []
    if decision.heldout_sources:
        lines.append(
            "held-out: " + ", ".join(f"{n} {SOURCE_WORDS.get(s, s)}" for s, n in decision.heldout_sources.items())
        )
    if decision.alone is not None:  # what the model writes by itself first, then what its finding checks change
        own, served = decision.alone.macro_f1_14, decision.served.macro_f1_14
        if own is not None and served is not None:
            lines.append(
                f"the candidate's own drafts (finding checks set aside): macro-F1 {own:.4f} (served {served:.4f})"
            )
        lines += [f"own drafts: {f.describe()}" for f in decision.alone_findings]
        problems = decision.problem_drafts
        if problems is not None and problems.alone is not None and problems.alone.hits:
            lines.append(
                f"own drafts: drafts that must not be signed as they are {problems.alone} (served {problems.served})"
            )
        lines.append("as readers see the drafts (with the candidate's finding checks), what the gate decides on:")
    lines += [i.describe() for i in decision.intervals]
    if decision.problem_drafts is not None and decision.problem_drafts.any_flagged:
        lines.append(decision.problem_drafts.describe())
    lines += [f.describe() for f in decision.findings]
    return lines
