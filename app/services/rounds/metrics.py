"""What a round records about itself as it runs, typed: phase, supervisor, selection, training, evaluation, gate.

The round row's `metrics` column is JSON that steps update key by key (the
repository merges the keys it is given), so a half-finished round shows what it
has. Every update goes through `RoundMetrics.update(...)`, which writes the
known keys with their types and `schema` (the layout's version); reading goes
through `RoundMetrics.of(record)`, which accepts rows of every version, the
first one (no `schema` key, the same keys) included, and keeps any key it does
not know in `extra`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from app.services.rounds.gate import Decision
from orapo_core.facts.metrics import EvalMetrics

if TYPE_CHECKING:
    from db.records import RoundRecord

SCHEMA = 2  # 1: rows written before the layout was versioned (no `schema` key); the keys are the same


@dataclass(frozen=True)
class Selection:
    """The studies a round trains on: new corrections, replayed studies, and the corrections and pairs it uses."""

    new_studies: list[int] = field(default_factory=list)
    replayed_studies: list[int] = field(default_factory=list)
    phantom_replay: int = 0
    correction_ids: list[int] = field(default_factory=list)
    pair_ids: list[int] = field(default_factory=list)
    clinician_pairs: int = 0
    # the new studies' clinician pairs by the worklist ordering they were read from ("unordered": none)
    pairs_by_order: dict[str, int] = field(default_factory=dict)
    # per finding, how many new corrections added it to the model's draft and how many removed it (evidence.finding_changes)
    finding_changes: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class HeldoutSummary:
    """Where the held-out set came from (the clinic's held-out studies or PhantomCXR's) and which studies."""

    source: str = ""
    n: int = 0
    signed_heldout: int = 0
    study_ids: list[str] = field(default_factory=list)
    sources: dict[str, int] = field(default_factory=dict)  # the studies by where they came from (the top-up too)
    topped_up_for: list[str] = field(default_factory=list)  # the corrected findings PhantomCXR negatives were added for


@dataclass(frozen=True)
class HeldoutMetrics:
    """The held-out metrics of both models, as the gate compared them."""

    served: EvalMetrics = field(default_factory=EvalMetrics)
    candidate: EvalMetrics = field(default_factory=EvalMetrics)

    def to_dict(self) -> dict[str, Any]:
        return {"served": self.served.to_dict(), "candidate": self.candidate.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> HeldoutMetrics:
        data = data or {}
        return cls(EvalMetrics.from_dict(data.get("served")), EvalMetrics.from_dict(data.get("candidate")))


def _known(cls: type[Any], data: dict[str, Any] | None) -> Any:
    """An instance of the dataclass `cls` from those keys of `data` that are its fields (the others are left out)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in (data or {}).items() if k in names})


_TYPED = {"selection": Selection, "heldout": HeldoutSummary}


@dataclass(frozen=True)
class RoundMetrics:
    """A round's metrics column, read back into types; every field is None until the step that writes it ran."""

    schema: int = 1
    phase: str | None = None  # preparing, merging, training, evaluating, finished
    supervisor_pid: int | None = None  # the process whose thread watches the round
    # that process in full, host, pid and start time (app.services.operations.leader.ServerIdentity): servers share the database
    supervisor: dict[str, Any] | None = None
    job: dict[str, Any] | None = None  # the step's job as its backend knows it (backends.JobHandle.to_dict), None after
    served_version_id: int | None = None  # the version the round trained from and compared with
    max_steps: int | None = None
    selection: Selection | None = None
    heldout: HeldoutSummary | None = None
    train: dict[str, Any] = field(default_factory=dict)  # the last value of every key the trainer logged
    heldout_metrics: HeldoutMetrics | None = None
    gate: Decision | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys of a later layout, kept as they are

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> RoundMetrics:
        data = dict(data or {})
        names = {f.name for f in fields(cls)} - {"extra"}
        values: dict[str, Any] = {"extra": {k: v for k, v in data.items() if k not in names}}
        for key in names & set(data):
            value = data[key]
            if key in _TYPED and isinstance(value, dict):
                value = _known(_TYPED[key], value)
            elif key == "heldout_metrics" and isinstance(value, dict):
                value = HeldoutMetrics.from_dict(value)
            elif key == "gate" and isinstance(value, dict):
                value = Decision.from_dict(value)
            elif key == "train":
                value = dict(value or {})
            values[key] = value
        return cls(**values)

    @classmethod
    def of(cls, record: RoundRecord | None) -> RoundMetrics:
        """The metrics of a round row (`db.records.RoundRecord`)."""
        return cls.from_json(getattr(record, "metrics", None))

    @staticmethod
    def update(**changes: Any) -> dict[str, Any]:
        """The JSON of the keys one step writes (typed values as plain data), with the layout's version."""
        names = {f.name for f in fields(RoundMetrics)} - {"extra", "schema"}
        unknown = set(changes) - names
        if unknown:
            raise TypeError(f"not round metrics: {sorted(unknown)}")
        out: dict[str, Any] = {"schema": SCHEMA}
        for key, value in changes.items():
            if isinstance(value, (Decision, HeldoutMetrics)):
                value = value.to_dict()
            elif hasattr(value, "__dataclass_fields__"):
                value = {f.name: getattr(value, f.name) for f in fields(value)}
            out[key] = value
        return out
