"""The steps of a round, each an object with a typed input and output (the way MONAI Label writes its tasks).

    SelectData(record, policy) -> RoundPlan          the studies, the held-out set, the round marked running
    Train(run)                 -> Candidate | None    `orapo train` as a job, its metrics streamed
    Evaluate(run, candidate)   -> Evaluation | None   both models drafted on the held-out set, in a job
    Decide(plan, evaluation)   -> Decision            the gate: a pure function of the two models' per-study drafts
    Install(run, candidate, evaluation, decision)     the version, corrections marked, promote or reject: one transaction

`RoundRunner` (app.services.rounds.runner) chains them in the round's monitor
thread. A step that returns None has already recorded why on the round (a
failed or cancelled job); `RoundWatch` is what the steps share for that: the
round's log, its cancel flag and its jobs, which run through the configured
backend (`app.services.rounds.backends`: child processes, SLURM or Ray).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.services.reading.served import ServedModel, served_model, stored_path
from app.services.rounds.backends import Backends, JobHandle, JobSpec, JobState
from app.services.rounds.gate import Decision, decide
from app.services.rounds.metrics import HeldoutMetrics, RoundMetrics
from app.services.rounds.plan import (
    Candidate,
    Evaluation,
    EvaluationSpec,
    Installed,
    RoundPlan,
    RunningRound,
    Weights,
    write_plan,
)
from app.services.rounds.policy import POLICY_KEYS, RoundPolicy, check_overrides
from app.services.rounds.processes import JsonlTail, python_command, tail_text, train_command
from app.services.rounds.versions import install_candidate
from orapo_core.errors import OrapoError

if TYPE_CHECKING:
    from app.services.rounds.data import HeldoutSet
    from db import Database, records
    from orapo_core.config import Settings

#: How long a cluster that does not answer (a restarting Ray head, slurmctld failing over) is waited for.
LOST_AFTER_S = 300.0


def round_folder(settings: Settings, round_id: int) -> Path:
    """`<data>/rounds/<id>/`: the round's data, logs and trainer output."""
    return settings.rounds_dir / str(round_id)


def worker_command(*args: object) -> list[str]:
    """`orapo rounds worker ...` as a child process runs it (the one entry point of a round's helper processes)."""
    return python_command("-m", "app.cli", "rounds", "worker", *map(str, args))


def serves_phantom_starter(served: ServedModel) -> bool:
    """Whether the model drafting now is the PhantomCXR starter itself (no promoted version, a starter card)."""
    from orapo_core.models.starter.build import read_card

    return served.version_id is None and served.adapter_dir is None and read_card(served.model_dir) is not None


def untrusted_heldout(heldout: HeldoutSet, served: ServedModel, min_heldout: int) -> str | None:
    """Why this round's held-out set may not promote or reject on its own, or None when it may.

    PhantomCXR stands in for missing signed held-out studies, but no PhantomCXR number says anything about
    patients: it may decide only for the PhantomCXR starter itself (a fresh install), never for a model the
    clinic already serves in its place."""
    if heldout.source != "phantomcxr_valid" or serves_phantom_starter(served):
        return None
    return (f"only {heldout.signed} signed held-out studies (fewer than min_heldout={min_heldout}), and the served "
            f"model is not the PhantomCXR starter, so its PhantomCXR numbers say nothing about this clinic's patients")


class RoundWatch:
    """The round's log, its cancel flag and its jobs, as every step uses them."""

    def __init__(self, database: Database, backends: Backends | None = None) -> None:
        self.db = database
        self.backends = backends or Backends()

    def log(self, round_id: int, line: str, *, progress: float | None = None, metrics: dict | None = None) -> bool:
        """Append an event to the round's log; False when the round is no longer running (cancelled meanwhile)."""
        from db import RoundRepository
        rounds = RoundRepository(self.db)
        try:
            current = rounds.get(round_id)
            rounds.update_progress(round_id, current.progress if progress is None else progress,
                                   log_append=f"[{datetime.now(UTC):%H:%M:%S}] {line}\n", metrics=metrics)
            return True
        except OrapoError:
            return False

    def stopped(self, run: RunningRound) -> bool:
        from db import RoundRepository
        return run.cancel.is_set() or RoundRepository(self.db).get(run.plan.round_id).status != "running"

    def fail(self, run: RunningRound, code: str, message: str) -> None:
        from db import RoundRepository
        if run.cancel.is_set():
            return
        try:
            RoundRepository(self.db).transition(run.plan.round_id, "failed", error=f"{code}: {message}", actor="rounds")
        except OrapoError:
            pass  # cancelled or finished meanwhile

    def child(self, run: RunningRound, argv: list[str], log_path: Path, *, phase: str,
              on_poll: Callable[[], None] | None = None) -> JobState | None:
        """Run one command of the round to its end through the backend; None when the round was cancelled meanwhile."""
        from db import RoundRepository

        backend = self.backends.current
        write_plan(run.plan)  # what a restarted app needs to watch the job on (see `RoundService.recover`)
        job = backend.submit(JobSpec(list(map(str, argv)), log_path, phase, run.plan.round_id))
        run.job = job
        RoundRepository(self.db).set_process(run.plan.round_id, pid=job.pid)
        self.log(run.plan.round_id, f"{phase}: {job.describe()}", metrics=RoundMetrics.update(phase=phase, job=job.to_dict()))
        return self.follow(run, job, on_poll=on_poll)

    def follow(self, run: RunningRound, job: JobHandle, *, on_poll: Callable[[], None] | None = None) -> JobState | None:
        """Watch a submitted job to its end (streaming with `on_poll`), stopping it if the round is cancelled."""
        from db import RoundRepository

        backend = self.backends.for_job(job)
        run.job = job
        lost_since = None
        while True:
            state = backend.poll(job)
            if not state.active:
                break
            if state.status == "unknown":  # the cluster does not answer: a restarting head is given a while
                lost_since = lost_since or time.monotonic()
                if time.monotonic() - lost_since > LOST_AFTER_S:
                    state = JobState("gone", detail=f"{state.detail} (for {LOST_AFTER_S:.0f} s)")
                    break
            else:
                lost_since = None
            if on_poll is not None:
                on_poll()
            if run.detach.is_set():
                return None  # the app is going away; a cluster job goes on, and the next start watches it again
            if self.stopped(run):
                backend.cancel(job, grace_s=run.plan.policy.cancel_grace_s)
                return None
            time.sleep(run.plan.policy.poll_s)
        if on_poll is not None:
            on_poll()
        try:
            RoundRepository(self.db).set_process(run.plan.round_id, pid=None)
        except OrapoError:
            pass
        return None if self.stopped(run) else state

    def failure(self, job: JobHandle | None, state: JobState, log_path: Path, lines: int = 15) -> str:
        """How a job ended, with the last lines of its log (from the backend: Ray keeps the log on the cluster)."""
        tail = self.backends.for_job(job).log_tail(job, log_path, lines) if job is not None else tail_text(log_path, lines)
        return f"{state.describe()}. Last lines of {log_path.name}:\n{tail}"


class SelectData:
    """A queued round's studies and held-out set written to its folder, and the round marked running."""

    def __init__(self, database: Database, settings: Settings, watch: RoundWatch) -> None:
        self.db, self.settings, self.watch = database, settings, watch

    def __call__(self, record: records.RoundRecord, actor: records.UserRecord | str | None, policy: RoundPolicy) -> RoundPlan:
        from app.services.rounds.data import round_heldout, select_round_studies, write_training_csv
        from db import RoundRepository

        config = record.config
        policy = policy.updated({k: v for k, v in config.get("policy", {}).items() if k in POLICY_KEYS})
        folder = round_folder(self.settings, record.id)
        folder.mkdir(parents=True, exist_ok=True)
        served = served_model(self.db, self.settings)
        selection = select_round_studies(self.db, self.settings, replay_fraction=policy.replay_fraction,
                                         replay_max=policy.replay_max, seed=record.id,
                                         phantom_size=policy.phantom_size if serves_phantom_starter(served) else None)
        if len(selection.new) < policy.min_new_corrections:
            raise OrapoError("nothing_to_train", f"Only {len(selection.new)} signed, untrained corrections with images; "
                                                 f"a round needs at least {policy.min_new_corrections}.")
        training = check_overrides(config["recipe"], config.get("overrides", {}))
        studies_per_step = training.studies_per_step
        if selection.n_training_rows < studies_per_step:
            raise OrapoError("too_few_corrections", f"{len(selection.new)} new and {selection.n_training_rows - len(selection.new)} "
                                                    f"replayed studies; one optimizer step of this recipe takes "
                                                    f"{studies_per_step}. Nothing was trained and no correction was used.")
        csv_path = write_training_csv(selection, folder / "train.csv")
        summary = selection.summary()
        heldout = round_heldout(self.db, self.settings, policy, summary.finding_changes)
        heldout.write(folder / "heldout.json")
        overrides = dict(config.get("overrides", {}))
        if summary.clinician_pairs and "use_clinician_pairs" not in overrides:  # the oracle term is DPO in the product
            overrides["use_clinician_pairs"] = True
        overrides.update(train_csv=str(csv_path), output_dir=str(folder / "output"))
        plan = RoundPlan(round_id=record.id, round_dir=folder, recipe=config["recipe"], overrides=overrides, policy=policy,
                         served=served, correction_ids=summary.correction_ids, pair_ids=summary.pair_ids,
                         study_ids=selection.study_ids, max_steps=training.optimizer_steps(selection.n_training_rows),
                         actor=actor or record.trigger, started_by=record.started_by, trigger=record.trigger,
                         gate_untrusted=untrusted_heldout(heldout, served, policy.min_heldout),
                         draft_min_agreement=self.settings.draft_min_agreement, finding_changes=summary.finding_changes)
        rounds = RoundRepository(self.db)
        rounds.transition(record.id, "running", actor=plan.actor, metrics=RoundMetrics.update(
            phase="preparing", supervisor_pid=os.getpid(), selection=summary, heldout=heldout.summary(),
            served_version_id=served.version_id, max_steps=plan.max_steps))
        rounds.set_process(record.id, pid=None, output_dir=str(folder))
        sources = ", ".join(f"{n} {source}" for source, n in heldout.summary().sources.items())
        self.watch.log(record.id, f"{len(selection.new)} new and {len(selection.replay) + len(selection.phantom_replay)} "
                                  f"replayed studies ({len(selection.phantom_replay)} from PhantomCXR); "
                                  f"held-out: {heldout.summary().n} ({sources})")
        return plan


class Train:
    """`orapo train` on the round's CSV from the served weights (a served adapter merged first), metrics streamed."""

    def __init__(self, settings: Settings, watch: RoundWatch) -> None:
        self.settings, self.watch = settings, watch

    def __call__(self, run: RunningRound) -> Candidate | None:
        plan = run.plan
        log_path = plan.round_dir / "train.log"
        train_base: Path | None = plan.served.model_dir
        if plan.served.adapter_dir is not None:
            train_base = self._merged_base(run, log_path)
            if train_base is None:
                return None
        plan.overrides["model_name_or_path"] = str(train_base)
        ended = self.watch.child(run, train_command(plan.recipe, plan.overrides), log_path, phase="training",
                                 on_poll=self._metrics_reporter(plan))
        return self._candidate(run, ended)

    def resume(self, run: RunningRound, job: JobHandle) -> Candidate | None:
        """Watch a training job a previous app process submitted to its end, then as `__call__` goes on."""
        if job.phase == "merging":
            ended = self.watch.follow(run, job)
            if ended is None:
                return None
            if not ended.ok:
                self.watch.fail(run, "merge_failed", f"while merging the served adapter: {self.watch.failure(job, ended, run.plan.round_dir / 'train.log', 10)}")
                return None
            return self(run)  # the merged base is there now: train from it
        return self._candidate(run, self.watch.follow(run, job, on_poll=self._metrics_reporter(run.plan)))

    def _metrics_reporter(self, plan: RoundPlan) -> Callable[[], None]:
        tail = JsonlTail(plan.output_dir / "metrics.jsonl")
        latest: dict[str, Any] = {}  # the last value of every logged key (step records, then the run's summary)

        def report_metrics() -> None:
            records = tail.read()
            if records:
                for r in records:
                    latest.update(r)
                step = int(latest.get("step") or 0)
                self.watch.log(plan.round_id, f"step {step}/{plan.max_steps}",
                               progress=0.05 + 0.8 * min(1.0, step / max(1, plan.max_steps)),
                               metrics=RoundMetrics.update(phase="training", train=dict(latest)))

        return report_metrics

    def _candidate(self, run: RunningRound, ended: JobState | None) -> Candidate | None:
        plan = run.plan
        if ended is None:
            return None
        if not ended.ok:
            self.watch.fail(run, "worker_failed", self.watch.failure(run.job, ended, plan.round_dir / "train.log"))
            return None
        output = plan.output_dir
        if (output / "adapter_config.json").is_file():
            return Candidate(Path(plan.overrides["model_name_or_path"]), output)
        if (output / "config.json").is_file():
            return Candidate(output)
        self.watch.fail(run, "worker_failed", f"the worker exited cleanly but saved no model in {output}.")
        return None

    def _merged_base(self, run: RunningRound, log_path: Path) -> Path | None:
        served = run.plan.served
        target = self.settings.models_dir / "merged" / str(served.version_id)
        if not (target / "config.json").is_file():
            ended = self.watch.child(run, worker_command("merge", served.model_dir, served.adapter_dir, target), log_path,
                                     phase="merging")
            if ended is None:
                return None
            if not ended.ok:
                self.watch.fail(run, "merge_failed",
                                f"while merging the served adapter: {self.watch.failure(run.job, ended, log_path, 10)}")
                return None
        return target


class Evaluate:
    """The served model and the candidate drafted on the held-out set (`orapo rounds worker evaluate`, by default)."""

    def __init__(self, watch: RoundWatch, *, evaluator: Callable[[EvaluationSpec], Evaluation] | None = None):
        self.watch = watch
        self.evaluator = evaluator  # a hook in place of the worker (an evaluation done elsewhere)

    def __call__(self, run: RunningRound, candidate: Candidate) -> Evaluation | None:
        plan = run.plan
        self.watch.log(plan.round_id, "training finished; evaluating on the held-out set", progress=0.85,
                       metrics=RoundMetrics.update(phase="evaluating"))
        spec = EvaluationSpec(plan.round_dir / "heldout.json", Weights.of(plan.served), candidate,
                              max_new_tokens=plan.policy.eval_max_new_tokens, min_agreement=plan.draft_min_agreement)
        if self.evaluator is not None:
            return self.evaluator(spec)
        if not plan.policy.evaluate_in_subprocess:
            from app.services.rounds.worker import evaluate_models

            return evaluate_models(spec)
        spec_path, out_path, log_path = plan.round_dir / "eval_spec.json", plan.round_dir / "eval.json", plan.round_dir / "eval.log"
        spec_path.write_text(json.dumps(spec.to_dict(), indent=1))
        return self._result(run, self.watch.child(run, worker_command("evaluate", spec_path, out_path), log_path,
                                                  phase="evaluating"))

    def resume(self, run: RunningRound, job: JobHandle) -> Evaluation | None:
        """Watch an evaluation job a previous app process submitted to its end, and read its result."""
        return self._result(run, self.watch.follow(run, job))

    def _result(self, run: RunningRound, ended: JobState | None) -> Evaluation | None:
        out_path, log_path = run.plan.round_dir / "eval.json", run.plan.round_dir / "eval.log"
        if ended is None:
            return None
        if not ended.ok or not out_path.is_file():
            self.watch.fail(run, "evaluation_failed", self.watch.failure(run.job, ended, log_path))
            return None
        return Evaluation.from_dict(json.loads(out_path.read_text()))


class Decide:
    """The gate on both models' held-out drafts: promote, reject, or hold for an administrator (see `gate.decide`)."""

    def __call__(self, plan: RoundPlan, evaluation: Evaluation) -> Decision:
        alone = evaluation.candidate_alone.predictions if evaluation.candidate_alone is not None else None
        return decide(evaluation.candidate.predictions, evaluation.served.predictions, plan.policy.gate,
                      changes=plan.finding_changes, untrusted=plan.gate_untrusted, alone=alone)


class Install:
    """The round's durable outcome in one transaction: succeeded, the version, data marked used, promote or reject.

    A crash or a cancel before the transaction commits leaves the served model and the data exactly as they were."""

    def __init__(self, database: Database, settings: Settings, watch: RoundWatch) -> None:
        self.db, self.settings, self.watch = database, settings, watch

    def __call__(self, run: RunningRound, candidate: Candidate, evaluation: Evaluation, decision: Decision) -> None:
        from db import CorrectionRepository, ModelVersionRepository, PairRepository, RoundRepository

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
                rounds.transition(plan.round_id, "succeeded", actor=plan.actor, metrics=RoundMetrics.update(
                    phase="finished", heldout_metrics=HeldoutMetrics(served=served, candidate=scored), gate=decision))
                versions = ModelVersionRepository(session)
                parent_id = plan.served.version_id
                if parent_id is None:
                    # The model served until now becomes a version too, whatever the gate says: the versions table
                    # and the round charts show it as the baseline beside the candidate, and a rollback to it is
                    # one action.
                    served_dir = plan.served.model_dir
                    base = versions.create(f"base-{served_dir.name}", base_model_path=stored_path(self.settings, served_dir),
                                           metrics={"heldout": served.to_dict()},
                                           config={"registered_by_round": plan.round_id})
                    versions.promote(base.id, reason="the model served before the first promoted round", actor="system")
                    parent_id = base.id
                version = versions.create(
                    f"round-{plan.round_id}", base_model_path=installed.base, adapter_path=installed.adapter,
                    metrics={"heldout": scored.to_dict(), "served_heldout": served.to_dict(), "gate": decision.to_dict(),
                             "train": RoundMetrics.of(rounds.get(plan.round_id)).train},
                    parent_id=parent_id, round_id=plan.round_id, study_ids_seen=plan.study_ids,
                    config={"recipe": plan.recipe, "overrides": plan.overrides, "policy": plan.policy.model_dump(),
                            "resolved": resolved, "served_version_id": plan.served.version_id,
                            "trigger": plan.trigger, "started_by": getattr(plan.actor, "username", plan.actor)},
                    created_by=plan.started_by)
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
