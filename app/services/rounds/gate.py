"""The promotion gate: the candidate's and the served model's held-out metrics compared, with the reason.

`decide` is a pure function of the two models' `EvalMetrics` (what `Evaluate`
measured, `app.services.rounds.worker`), so the rule is tested on literal
numbers and shown to the admin with its reason; its `Decision` is what
`Install` acts on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orapo_core.facts.metrics import EvalMetrics


@dataclass(frozen=True)
class GatePolicy:
    """Promote when macro-F1 is at most `f1_tolerance` below the served model's and FactS reward rises by more than `reward_margin`."""

    f1_tolerance: float = 0.02
    reward_margin: float = 0.0

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> GatePolicy:
        return cls(**{k: float(v) for k, v in (data or {}).items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Decision:
    """What the gate decided about a candidate, why, and the numbers it compared (macro-F1, FactS reward, studies)."""

    promote: bool
    reason: str
    candidate: EvalMetrics
    served: EvalMetrics
    hold: bool = False  # neither promoted nor rejected: kept as a candidate for an administrator to judge

    def to_dict(self) -> dict[str, Any]:
        return {"promote": self.promote, "reason": self.reason, "candidate": self.candidate.to_dict(),
                "served": self.served.to_dict(), "hold": self.hold}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Decision:
        return cls(bool(data.get("promote")), str(data.get("reason", "")), EvalMetrics.from_dict(data.get("candidate")),
                   EvalMetrics.from_dict(data.get("served")), bool(data.get("hold", False)))


def _gate_numbers(metrics: EvalMetrics) -> EvalMetrics:
    """The numbers the gate compares, and how many studies they are over."""
    return EvalMetrics(n_reports=metrics.n_reports, macro_f1_14=metrics.macro_f1_14,
                       facts_reward_mean=metrics.facts_reward_mean)


def decide(candidate: EvalMetrics, served: EvalMetrics, policy: GatePolicy = GatePolicy(), *,
           untrusted: str | None = None) -> Decision:
    """The gate: macro-F1 not worse beyond the tolerance AND FactS reward better, both on the held-out set.

    `untrusted` is why the held-out set cannot speak for the served model's patients (e.g. too few signed
    held-out studies, and a model other than the PhantomCXR starter): then nothing is promoted or rejected
    automatically, the numbers are still shown, and the candidate waits for an administrator.
    """
    c_f1, s_f1 = candidate.macro_f1_14, served.macro_f1_14
    c_r, s_r = candidate.facts_reward_mean, served.facts_reward_mean
    numbers = dict(candidate=_gate_numbers(candidate), served=_gate_numbers(served))
    if untrusted:
        return Decision(False, f"kept for an administrator to promote by hand: {untrusted}", hold=True, **numbers)
    if None in (c_f1, s_f1, c_r, s_r):
        return Decision(False, "the held-out evaluation produced no macro-F1 or FactS reward to compare", **numbers)
    reasons = []
    if c_f1 < s_f1 - policy.f1_tolerance:
        reasons.append(f"macro-F1 {c_f1:.4f} is worse than the served model's {s_f1:.4f} by more than {policy.f1_tolerance:g}")
    if not c_r > s_r + policy.reward_margin:
        margin = f" + {policy.reward_margin:g}" if policy.reward_margin else ""
        reasons.append(f"FactS reward {c_r:.4f} is not better than the served model's {s_r:.4f}{margin}")
    if reasons:
        return Decision(False, "; ".join(reasons), **numbers)
    return Decision(True, f"macro-F1 {c_f1:.4f} vs {s_f1:.4f} (tolerance {policy.f1_tolerance:g}); "
                              f"FactS reward {c_r:.4f} > {s_r:.4f}", **numbers)
