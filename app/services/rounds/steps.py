"""The steps of a round, each an object with a typed input and output (the way MONAI Label writes its tasks).

    SelectData(record, policy) -> RoundPlan          the studies, the held-out set, the round marked running
    Train(run)                 -> Candidate | None    `orapo train` as a job, its metrics streamed
    Evaluate(run, candidate)   -> Evaluation | None   both models drafted on the held-out set, in a job
    Decide(plan, evaluation)   -> Decision            the gate: a pure function of the two models' per-study drafts
    Install(run, candidate, evaluation, decision)     the version, corrections marked, promote or reject: one transaction

The steps that run in the app's own process are here; `Train` and `Evaluate`,
which run as jobs of the backend and can be watched again after a restart, are
`app.services.rounds.job_steps`. `RoundRunner` (app.services.rounds.runner)
chains them in the round's monitor thread. A step that returns None has already
recorded why on the round (a failed or cancelled job); `RoundWatch`
(`app.services.rounds.watch`) is what the steps share for that: the round's log,
its cancel flag and its jobs, which run through the configured backend
(`app.services.rounds.backends`: child processes, SLURM or Ray).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from app.services.reading.served import ServedModel, served_model, stored_path
from app.services.rounds.gate import Decision, decide
from app.services.rounds.metrics import HeldoutMetrics, RoundMetrics
from app.services.rounds.plan import Candidate, Evaluation, Installed, RoundPlan, RunningRound
from app.services.rounds.policy import POLICY_KEYS, RoundPolicy, check_overrides
from app.services.rounds.versions import install_candidate
from app.services.rounds.watch import RoundWatch, round_folder
from db import CorrectionRepository, ModelVersionRepository, PairRepository, RoundRepository
from orapo_core.errors import OrapoError

if TYPE_CHECKING:
    from app.services.rounds.heldout import HeldoutSet
    from db import Database, records
    from orapo_core.config import Settings


def serves_phantom_starter(served: ServedModel) -> bool:
    """Whether the model drafting now is the PhantomCXR starter itself (no promoted version, a starter card)."""
    from orapo_core.models.starter.build import read_card  # noqa: PLC0415 -- loads numpy

    return served.version_id is None and served.adapter_dir is None and read_card(served.model_dir) is not None


def untrusted_heldout(heldout: HeldoutSet, served: ServedModel, min_heldout: int) -> str | None:
    """Why this round's held-out set may not promote or reject on its own, or None when it may.

    PhantomCXR stands in for missing signed held-out studies, but no PhantomCXR number says anything about
    patients: it may decide only for the PhantomCXR starter itself (a fresh install), never for a model the
    clinic already serves in its place."""
    if heldout.source != "phantomcxr_valid" or serves_phantom_starter(served):
        return None
    return (
        f"only {heldout.signed} signed held-out studies (fewer than min_heldout={min_heldout}), and the served "
        f"model is not the PhantomCXR starter, so its PhantomCXR numbers say nothing about this clinic's patients"
    )


class SelectData:
    """A queued round's studies and held-out set written to its folder, and the round marked running."""

    def __init__(self, database: Database, settings: Settings, watch: RoundWatch) -> None:
        self.db, self.settings, self.watch = database, settings, watch

    def __call__(
        self, record: records.RoundRecord, actor: records.UserRecord | str | None, policy: RoundPolicy
    ) -> RoundPlan:
        from app.services.rounds.data import select_round_studies, write_training_csv  # noqa: PLC0415 -- loads numpy
        from app.services.rounds.heldout import round_heldout  # noqa: PLC0415 -- loads numpy

        config = record.config
        policy = policy.updated({k: v for k, v in config.get("policy", {}).items() if k in POLICY_KEYS})
        folder = round_folder(self.settings, record.id)
        folder.mkdir(parents=True, exist_ok=True)
        served = served_model(self.db, self.settings)
        selection = select_round_studies(
            self.db,
            self.settings,
            replay_fraction=policy.replay_fraction,
            replay_max=policy.replay_max,
            seed=record.id,
            phantom_size=policy.phantom_size if serves_phantom_starter(served) else None,
        )
        if len(selection.new) < policy.min_new_corrections:
            raise OrapoError(
                "nothing_to_train",
                f"Only {len(selection.new)} signed, untrained corrections with images; "
                f"a round needs at least {policy.min_new_corrections}.",
            )
        training = check_overrides(config["recipe"], config.get("overrides", {}))
        studies_per_step = training.studies_per_step
        if selection.n_training_rows < studies_per_step:
            raise OrapoError(
                "too_few_corrections",
                f"{len(selection.new)} new and {selection.n_training_rows - len(selection.new)} "
                f"replayed studies; one optimizer step of this recipe takes "
                f"{studies_per_step}. Nothing was trained and no correction was used.",
            )
        csv_path = write_training_csv(selection, folder / "train.csv")
        summary = selection.summary()
        heldout = round_heldout(self.db, self.settings, policy, summary.finding_changes)
        heldout.write(folder / "heldout.json")
        overrides = dict(config.get("overrides", {}))
        if summary.clinician_pairs and "use_clinician_pairs" not in overrides:  # the oracle term is DPO in the product
            overrides["use_clinician_pairs"] = True
        overrides.update(train_csv=str(csv_path), output_dir=str(folder / "output"))
        plan = RoundPlan(
            round_id=record.id,
            round_dir=folder,
            recipe=config["recipe"],
            overrides=overrides,
            policy=policy,
            served=served,
            correction_ids=summary.correction_ids,
            pair_ids=summary.pair_ids,
            study_ids=selection.study_ids,
            max_steps=training.optimizer_steps(selection.n_training_rows),
            actor=actor or record.trigger,
            started_by=record.started_by,
            trigger=record.trigger,
            gate_untrusted=untrusted_heldout(heldout, served, policy.min_heldout),
            draft_min_agreement=self.settings.draft_min_agreement,
            finding_changes=summary.finding_changes,
        )
        rounds = RoundRepository(self.db)
        rounds.transition(
            record.id,
            "running",
            actor=plan.actor,
            metrics=RoundMetrics.update(
                phase="preparing",
                supervisor_pid=os.getpid(),
                selection=summary,
                heldout=heldout.summary(),
                served_version_id=served.version_id,
                max_steps=plan.max_steps,
            ),
        )
        rounds.set_process(record.id, pid=None, output_dir=str(folder))
        sources = ", ".join(f"{n} {source}" for source, n in heldout.summary().sources.items())
        self.watch.log(
            record.id,
            f"{len(selection.new)} new and {len(selection.replay) + len(selection.phantom_replay)} "
            f"replayed studies ({len(selection.phantom_replay)} from PhantomCXR); "
            f"held-out: {heldout.summary().n} ({sources})",
        )
        return plan


class Decide:
    """The gate on both models' held-out drafts: promote, reject, or hold for an administrator (see `gate.decide`)."""

    def __call__(self, plan: RoundPlan, evaluation: Evaluation) -> Decision:
        alone = evaluation.candidate_alone.predictions if evaluation.candidate_alone is not None else None
        return decide(
            evaluation.candidate.predictions,
            evaluation.served.predictions,
            plan.policy.gate,
            changes=plan.finding_changes,
            untrusted=plan.gate_untrusted,
            alone=alone,
        )


class Install:
    """The round's durable outcome in one transaction: succeeded, the version, data marked used, promote or reject.

    A crash or a cancel before the transaction commits leaves the served model and the data exactly as they were."""

    def __init__(self, database: Database, settings: Settings, watch: RoundWatch) -> None:
        self.db, self.settings, self.watch = database, settings, watch

    def __call__(self, run: RunningRound, candidate: Candidate, evaluation: Evaluation, decision: Decision) -> None:
        plan = run.plan
        if self.watch.stopped(run):
            return
        installed: Installed = install_candidate(self.settings, plan.round_id, candidate)
        recipe_file = plan.output_dir / "orapo_recipe.json"
        resolved = json.loads(recipe_file.read_text()) if recipe_file.is_file() else {}
        served, scored = evaluation.served.metrics, evaluation.candidate.metrics
        try:
            with self.db.session() as session:
                rounds = RoundRepository(session)
                rounds.transition(
                    plan.round_id,
                    "succeeded",
                    actor=plan.actor,
                    metrics=RoundMetrics.update(
                        phase="finished", heldout_metrics=HeldoutMetrics(served=served, candidate=scored), gate=decision
                    ),
                )
                versions = ModelVersionRepository(session)
                parent_id = plan.served.version_id
                if parent_id is None:
                    # The model served until now becomes a version too, whatever the gate says: the versions table
                    # and the round charts show it as the baseline beside the candidate, and a rollback to it is
                    # one action.
                    served_dir = plan.served.model_dir
                    base = versions.create(
                        f"base-{served_dir.name}",
                        base_model_path=stored_path(self.settings, served_dir),
                        metrics={"heldout": served.to_dict()},
                        config={"registered_by_round": plan.round_id},
                    )
                    versions.promote(base.id, reason="the model served before the first promoted round", actor="system")
                    parent_id = base.id
                version = versions.create(
                    f"round-{plan.round_id}",
                    base_model_path=installed.base,
                    adapter_path=installed.adapter,
                    metrics={
                        "heldout": scored.to_dict(),
                        "served_heldout": served.to_dict(),
                        "gate": decision.to_dict(),
                        "train": RoundMetrics.of(rounds.get(plan.round_id)).train,
                    },
                    parent_id=parent_id,
                    round_id=plan.round_id,
                    study_ids_seen=plan.study_ids,
                    config={
                        "recipe": plan.recipe,
                        "overrides": plan.overrides,
                        "policy": plan.policy.model_dump(),
                        "resolved": resolved,
                        "served_version_id": plan.served.version_id,
                        "trigger": plan.trigger,
                        "started_by": getattr(plan.actor, "username", plan.actor),
                    },
                    created_by=plan.started_by,
                )
                if plan.correction_ids:
                    CorrectionRepository(session).mark_trained(plan.correction_ids, plan.round_id)
                if plan.pair_ids:
                    PairRepository(session).assign_to_round(plan.pair_ids, plan.round_id)
                if decision.promote:
                    versions.promote(version.id, reason=decision.reason, actor=plan.actor)
                elif not decision.hold:
                    versions.reject(version.id, reason=decision.reason, actor=plan.actor)
        except OrapoError:
            if self.watch.stopped(run):
                return  # cancelled at the last moment: the transaction wrote nothing
            raise
