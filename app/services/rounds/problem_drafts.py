"""The gate's count of drafts that must not be signed as they are, for both models on the same held-out studies.

A draft the draft checks flag (`orapo_core.facts.draft_checks`: an empty numbered item or section, items numbered
out of order, a sentence written twice, a finding stated and denied, a side or severity conflict) is one a reader
has to fix before signing, whatever its labels score; the Read tab will not accept it unchanged. The gate counts
such drafts per model on the studies it measures macro-F1 on (`evidence.judged`: the PhantomCXR top-up negatives
aside), in the drafts as readers see them (the operating point's left-out sentences removed, the finding checks
applied), and in the paired style of its other checks (`gate.decide`):

- the data shows the candidate worse, and it is rejected, when the 95 % paired bootstrap interval of candidate
  minus served share of flagged drafts lies above 0;
- it writes more of them than the served model but the interval reaches 0: not promoted, held for an
  administrator with the counts;
- as many or fewer: the other checks decide.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from app.services.rounds.evidence import BOOTSTRAP_SEED, Count, judged, resample_weights
from orapo_core.facts.draft_checks import CODES, check_draft


@dataclass(frozen=True)
class ProblemDrafts:
    """Both models' flagged drafts on the same studies, the paired interval of the difference in their shares,
    and how many drafts each kind of problem flagged (a draft with two kinds counts under both)."""

    candidate: Count
    served: Count
    low: float  # the interval of candidate minus served share, as a fraction
    high: float
    candidate_codes: dict[str, int] = field(default_factory=dict)
    served_codes: dict[str, int] = field(default_factory=dict)
    alone: Count | None = None  # the candidate's own drafts, its finding checks set aside (shown, never decides)
    confidence: float = 0.95

    @property
    def more(self) -> bool:
        """Whether the candidate wrote more flagged drafts than the served model."""
        return self.candidate.hits > self.served.hits

    @property
    def any_flagged(self) -> bool:
        """Whether either model (or the candidate's own drafts) wrote a flagged draft."""
        return bool(self.candidate.hits or self.served.hits or (self.alone and self.alone.hits))

    def counts(self) -> str:
        """'12/200 = 6.0% (served 4/200 = 2.0%)': what a reason quotes."""
        return f"{self.candidate} (served {self.served})"

    def describe(self) -> str:
        """The counts, the interval in points, and each model's problems by kind: one line of `decision_lines`."""
        delta = (self.candidate.rate or 0.0) - (self.served.rate or 0.0)
        kinds = "; ".join(
            f"{who}: {_kinds(codes)}"
            for who, codes in (("candidate", self.candidate_codes), ("served", self.served_codes))
            if codes
        )
        return (
            f"drafts that must not be signed as they are (the draft checks): {self.counts()}, "
            f"{delta * 100:+.1f} points, {self.confidence:.0%} interval [{self.low * 100:+.1f}, "
            f"{self.high * 100:+.1f}]" + (f"; {kinds}" if kinds else "")
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidate": [self.candidate.hits, self.candidate.of],
            "served": [self.served.hits, self.served.of],
            "low": self.low,
            "high": self.high,
            "candidate_codes": dict(self.candidate_codes),
            "served_codes": dict(self.served_codes),
            "confidence": self.confidence,
            "alone": [self.alone.hits, self.alone.of] if self.alone is not None else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProblemDrafts:
        def codes(value: Any) -> dict[str, int]:
            return {str(k): int(v) for k, v in (value or {}).items()}

        alone = data.get("alone")
        return cls(
            Count(*map(int, data["candidate"])),
            Count(*map(int, data["served"])),
            float(data["low"]),
            float(data["high"]),
            codes(data.get("candidate_codes")),
            codes(data.get("served_codes")),
            Count(*map(int, alone)) if alone else None,
            float(data.get("confidence", 0.95)),
        )


def _kinds(codes: dict[str, int]) -> str:
    return ", ".join(f"{codes[code]} {code.replace('_', ' ')}" for code in CODES if codes.get(code))


def _flags(rows: Sequence[dict]) -> list[frozenset[str]]:
    """The problem codes of each row's draft."""
    return [_codes(str(r.get("draft") or "")) for r in rows]


@lru_cache(maxsize=8192)
def _codes(text: str) -> frozenset[str]:
    """The problem codes of one draft text: both models often write the same text for a study, and a gate
    decides on thousands of rows, so each distinct text is checked once."""
    return frozenset(p.code for p in check_draft(text))


def _by_code(flags: Sequence[frozenset[str]]) -> dict[str, int]:
    return {code: n for code in CODES if (n := sum(code in f for f in flags))}


def count_problem_drafts(
    candidate: Sequence[dict],
    served: Sequence[dict],
    *,
    alone: Sequence[dict] | None = None,
    resamples: int = 1000,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = 0.95,
) -> ProblemDrafts | None:
    """Both models' flagged drafts on the judged rows (row i of each is study i, as `evidence.paired_rows` gives
    them), with a paired bootstrap percentile interval of the difference in shares; None without judged rows.
    `alone`, the candidate's rows with its finding checks set aside, in the same order, is counted too."""
    import numpy as np

    candidate, served = judged(candidate), judged(served)
    if len(candidate) != len(served):
        raise ValueError(f"{len(candidate)} candidate rows for {len(served)} served rows")
    if not served:
        return None
    c_flags, s_flags = _flags(candidate), _flags(served)
    difference = np.array([bool(c) - bool(s) for c, s in zip(c_flags, s_flags, strict=True)], dtype=float)
    deltas = resample_weights(len(served), resamples, seed) @ difference / len(served)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(deltas, [tail, 100 - tail])
    own = judged(alone) if alone else None
    return ProblemDrafts(
        Count(sum(map(bool, c_flags)), len(candidate)),
        Count(sum(map(bool, s_flags)), len(served)),
        float(low),
        float(high),
        _by_code(c_flags),
        _by_code(s_flags),
        Count(sum(bool(f) for f in _flags(own)), len(own)) if own else None,
        confidence,
    )


def shown_worse(problems: ProblemDrafts | None) -> str | None:
    """Why the data shows the candidate writing more drafts that must not be signed as they are, else None."""
    if problems is None or not problems.more or problems.low <= 0:
        return None
    return (
        f"drafts that must not be signed as they are {problems.counts()}: the {problems.confidence:.0%} interval "
        f"of the difference [{problems.low * 100:+.1f}, {problems.high * 100:+.1f}] points lies above 0, more "
        f"than the served model"
    )


def not_shown_better(problems: ProblemDrafts | None) -> str | None:
    """Why the candidate is not promoted although the data cannot show it worse: it wrote more flagged drafts."""
    if problems is None or not problems.more:
        return None
    return (
        f"the candidate wrote more drafts that must not be signed as they are, {problems.counts()}, than the "
        f"served model"
    )
