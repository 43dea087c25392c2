"""What the steps of a round hand each other, as dataclasses: the plan, the candidate, the evaluation.

A round is five steps (`app.services.rounds.steps`): select the data (-> a
`RoundPlan`), train (-> a `Candidate`), evaluate both models on the held-out
set (-> an `Evaluation`), decide (-> a gate `Decision`) and install (-> an
`Installed` version). Whatever crosses a process boundary (the evaluation's
spec and results) is written as JSON by `to_dict` and read back by
`from_dict`, so the child process and the app agree on one shape.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.services.reading.served import ServedModel
from app.services.rounds.policy import RoundPolicy
from orapo_core.facts.metrics import EvalMetrics


@dataclass(frozen=True)
class Weights:
    """A model to load: base weights, and a LoRA adapter on top of them or None."""

    base: Path
    adapter: Path | None = None

    @classmethod
    def of(cls, served: ServedModel) -> Weights:
        return cls(served.model_dir, served.adapter_dir)

    def to_dict(self) -> dict[str, str | None]:
        return {"base": str(self.base), "adapter": str(self.adapter) if self.adapter else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Weights:
        return cls(Path(data["base"]), Path(data["adapter"]) if data.get("adapter") else None)


@dataclass(frozen=True)
class Candidate(Weights):
    """The model a round trained: a LoRA adapter on the base it trained from, or a whole model (adapter None)."""


@dataclass(frozen=True)
class RoundPlan:
    """What one round trains on and against, fixed when its data is selected."""

    round_id: int
    round_dir: Path
    recipe: str
    overrides: dict[str, Any]
    policy: RoundPolicy
    served: ServedModel
    correction_ids: list[int]
    pair_ids: list[int]
    study_ids: list[int]
    max_steps: int
    actor: Any
    started_by: int | None
    trigger: str = "manual"
    gate_untrusted: str | None = None  # why the held-out set may not decide alone (see `gate.decide`), or None
    draft_min_agreement: float = 0.0  # the app's ORAPO_DRAFT_MIN_AGREEMENT when the round began: the gate drafts so
    # per finding, how many of the round's corrections added it and removed it: the gate checks the frequent ones
    finding_changes: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def output_dir(self) -> Path:
        return self.round_dir / "output"

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON (`plan.json` in the round folder); the actor becomes its name."""
        return {
            "round_id": self.round_id,
            "round_dir": str(self.round_dir),
            "recipe": self.recipe,
            "overrides": self.overrides,
            "policy": self.policy.model_dump(),
            "served": self.served.to_dict(),
            "correction_ids": self.correction_ids,
            "pair_ids": self.pair_ids,
            "study_ids": self.study_ids,
            "max_steps": self.max_steps,
            "actor": getattr(self.actor, "username", self.actor),
            "started_by": self.started_by,
            "trigger": self.trigger,
            "gate_untrusted": self.gate_untrusted,
            "draft_min_agreement": self.draft_min_agreement,
            "finding_changes": self.finding_changes,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RoundPlan:
        return cls(
            int(data["round_id"]),
            Path(data["round_dir"]),
            data["recipe"],
            dict(data.get("overrides") or {}),
            RoundPolicy.model_validate(data.get("policy") or {}),
            ServedModel.from_dict(data["served"]),
            list(data.get("correction_ids") or []),
            list(data.get("pair_ids") or []),
            list(data.get("study_ids") or []),
            int(data.get("max_steps") or 1),
            data.get("actor") or "rounds",
            data.get("started_by"),
            data.get("trigger") or "manual",
            data.get("gate_untrusted"),
            float(data.get("draft_min_agreement") or 0.0),
            dict(data.get("finding_changes") or {}),
        )


PLAN_FILE = "plan.json"


def write_plan(plan: RoundPlan) -> Path:
    """Keep the plan in the round folder, so an app started later can watch the round's job to its end."""
    path = plan.round_dir / PLAN_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(plan.to_dict(), indent=1))
    tmp.replace(path)
    return path


def read_plan(round_dir: Path) -> RoundPlan | None:
    """The plan `write_plan` kept, or None when there is none (a round started by an older version)."""
    try:
        return RoundPlan.from_dict(json.loads((Path(round_dir) / PLAN_FILE).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass
class RunningRound:
    """A round this process runs: its plan, monitor thread, current job (a backends.JobHandle) and cancel flag."""

    plan: RoundPlan
    thread: threading.Thread | None = None
    job: Any = None
    cancel: threading.Event = field(default_factory=threading.Event)
    detach: threading.Event = field(default_factory=threading.Event)  # stop watching, leave the job running


@dataclass(frozen=True)
class EvaluationSpec:
    """What the evaluation worker drafts: both models, on the round's held-out set (heldout.json), as the app drafts:
    greedily, and with `min_agreement` above 0 the findings too few of 4 samples assert left out."""

    heldout: Path
    served: Weights
    candidate: Weights
    max_new_tokens: int = 160
    batch_size: int = 8
    min_agreement: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "heldout": str(self.heldout),
            "max_new_tokens": self.max_new_tokens,
            "batch_size": self.batch_size,
            "min_agreement": self.min_agreement,
            "models": {"served": self.served.to_dict(), "candidate": self.candidate.to_dict()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvaluationSpec:
        models = data["models"]
        return cls(
            Path(data["heldout"]),
            Weights.from_dict(models["served"]),
            Weights.from_dict(models["candidate"]),
            int(data.get("max_new_tokens", 160)),
            int(data.get("batch_size", 8)),
            float(data.get("min_agreement") or 0.0),
        )


@dataclass(frozen=True)
class ModelScores:
    """One model's held-out metrics (`evaluate_drafter`'s clinical efficacy) and its drafts, one per study: the
    rows the gate reads (`app.services.rounds.evidence`: draft, labels, reference labels, FactS reward, source)."""

    metrics: EvalMetrics
    predictions: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"metrics": self.metrics.to_dict(), "predictions": self.predictions}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelScores:
        return cls(EvalMetrics.from_dict(data.get("metrics")), list(data.get("predictions") or []))


@dataclass(frozen=True)
class Evaluation:
    """The served model and the candidate scored on the same held-out studies."""

    served: ModelScores
    candidate: ModelScores
    candidate_alone: ModelScores | None = None  # the candidate with its finding checks set aside, when it has them

    def to_dict(self) -> dict[str, Any]:
        out = {"served": self.served.to_dict(), "candidate": self.candidate.to_dict()}
        if self.candidate_alone is not None:
            out["candidate_alone"] = self.candidate_alone.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Evaluation:
        alone = data.get("candidate_alone")
        return cls(
            ModelScores.from_dict(data["served"]),
            ModelScores.from_dict(data["candidate"]),
            ModelScores.from_dict(alone) if alone else None,
        )


@dataclass(frozen=True)
class Installed:
    """A candidate copied into `<data>/models/versions/round-<id>/`, as the paths its version stores."""

    base: str
    adapter: str | None
