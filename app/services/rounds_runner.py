"""One round's run, in its monitor thread: prepare its data, train, evaluate, gate, and record the outcome.

`RoundService` (app.services.rounds) decides whether a round may run and owns
the thread; a `RoundRunner` does the work inside it. The work is a chain of
child processes (merge the served adapter, `orapo train`, evaluate on the
held-out set), each watched until it ends or the round is cancelled, then one
transaction that records the outcome (`_finalize`), so a crash or a cancel
before it leaves the served model and the data exactly as they were.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.services.rounds_gate import decide
from app.services.rounds_policy import POLICY_KEYS, RoundPolicy, check_overrides, estimate_steps
from app.services.rounds_versions import install_candidate, served_model, stored_path
from app.services.rounds_worker import (
    JsonlTail,
    describe_exit,
    launch,
    python_command,
    stop_process,
    tail_text,
    train_command,
)
from orapo_core.errors import OrapoError


@dataclass
class RoundPlan:
    """What one round trains on and against, fixed when its data is prepared."""

    round_id: int
    round_dir: Path
    recipe: str
    overrides: dict[str, Any]
    policy: RoundPolicy
    served: dict[str, Any]  # {"version_id", "base", "adapter"}
    correction_ids: list[int]
    pair_ids: list[int]
    study_ids: list[int]
    max_steps: int
    actor: Any
    started_by: int | None
    trigger: str = "manual"
    gate_untrusted: str | None = None  # why the held-out set may not decide alone (see `decide`), or None


@dataclass
class RunningRound:
    """A round this process runs: its plan, monitor thread, current child process and cancel flag."""

    plan: RoundPlan
    thread: threading.Thread | None = None
    process: Any = None
    cancel: threading.Event = field(default_factory=threading.Event)


def _now() -> str:
    return datetime.now(UTC).strftime("%H:%M:%S")


def serves_phantom_starter(served: dict[str, Any]) -> bool:
    """Whether the model drafting now is the PhantomCXR starter itself (no promoted version, a starter card)."""
    from orapo_core.models.starter.build import read_card

    return served.get("version_id") is None and not served.get("adapter") and read_card(served["base"]) is not None


def untrusted_heldout(heldout, served: dict[str, Any], min_heldout: int) -> str | None:
    """Why this round's held-out set may not promote or reject on its own, or None when it may.

    PhantomCXR stands in for missing signed held-out studies, but no PhantomCXR number says anything about
    patients: it may decide only for the PhantomCXR starter itself (a fresh install), never for a model the
    clinic already serves in its place."""
    if heldout.source != "phantomcxr_valid" or serves_phantom_starter(served):
        return None
    return (f"only {heldout.signed} signed held-out studies (fewer than min_heldout={min_heldout}), and the served "
            f"model is not the PhantomCXR starter, so its PhantomCXR numbers say nothing about this clinic's patients")


def round_folder(settings, round_id: int) -> Path:
    """`<data>/rounds/<id>/`: the round's data, logs and trainer output."""
    return settings.rounds_dir / str(round_id)


class RoundRunner:
    """Runs rounds inside their monitor threads; holds no state of its own beyond the database and the settings."""

    def __init__(self, database, settings, *, evaluator: Callable[[dict[str, Any]], dict[str, Any]] | None = None):
        self.db = database
        self.settings = settings
        self._evaluator = evaluator  # a hook: spec -> {"served": {"metrics": ...}, "candidate": {...}}

    def execute(self, run: RunningRound) -> None:
        """The monitor thread's work, to the round's end; a failure of its own is recorded on the round, never raised."""
        try:
            self._train_evaluate_and_gate(run)
        except Exception as exc:  # a monitor thread never dies silently: the round says why
            self._fail(run, "internal_error", f"{type(exc).__name__}: {exc}")

    def prepare(self, record, actor, policy: RoundPolicy) -> RoundPlan:
        """A queued round's data written to its folder and the round marked running; `policy` is the service's."""
        import yaml

        from app.services.rounds_data import select_heldout, select_round_studies, write_training_csv
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
        studies_per_step = check_overrides(config["recipe"], config.get("overrides", {}))
        if selection.n_training_rows < studies_per_step:
            raise OrapoError("too_few_corrections", f"{len(selection.new)} new and {selection.n_training_rows - len(selection.new)} "
                                                    f"replayed studies; one optimizer step of this recipe takes "
                                                    f"{studies_per_step}. Nothing was trained and no correction was used.")
        csv_path = write_training_csv(selection, folder / "train.csv")
        heldout = select_heldout(self.db, self.settings, min_heldout=policy.min_heldout, max_heldout=policy.max_heldout,
                                 phantom_studies=policy.phantom_studies, phantom_size=policy.phantom_size)
        heldout.write(folder / "heldout.json")
        gate_untrusted = untrusted_heldout(heldout, served, policy.min_heldout)
        recipe_values = yaml.safe_load(Path(config["recipe"]).read_text()) or {}
        overrides = dict(config.get("overrides", {}))
        merged_values = {**recipe_values, **overrides}
        if (selection.summary()["clinician_pairs"] and merged_values.get("oracle_mode", "dpo") == "dpo"
                and "use_clinician_pairs" not in overrides):
            overrides["use_clinician_pairs"] = True
        overrides.update(train_csv=str(csv_path), output_dir=str(folder / "output"))
        summary = selection.summary()
        plan = RoundPlan(round_id=record.id, round_dir=folder, recipe=config["recipe"], overrides=overrides, policy=policy,
                         served=served, correction_ids=summary["correction_ids"], pair_ids=summary["pair_ids"],
                         study_ids=selection.study_ids, max_steps=estimate_steps(merged_values, selection.n_training_rows),
                         actor=actor or record.trigger, started_by=record.started_by, trigger=record.trigger,
                         gate_untrusted=gate_untrusted)
        rounds = RoundRepository(self.db)
        rounds.transition(record.id, "running", actor=plan.actor, metrics={
            "phase": "preparing", "supervisor_pid": os.getpid(), "selection": summary, "heldout": heldout.summary(),
            "served_version_id": served["version_id"], "max_steps": plan.max_steps})
        rounds.set_process(record.id, pid=None, output_dir=str(folder))
        self._log(record.id, f"{len(selection.new)} new and {len(selection.replay) + len(selection.phantom_replay)} "
                             f"replayed studies ({len(selection.phantom_replay)} from PhantomCXR); "
                             f"held-out: {heldout.summary()['n']} ({heldout.source})")
        return plan

    def _log(self, round_id: int, line: str, *, progress: float | None = None, metrics: dict | None = None) -> bool:
        """Append an event to the round's log; False when the round is no longer running (cancelled meanwhile)."""
        from db import RoundRepository

        rounds = RoundRepository(self.db)
        try:
            current = rounds.get(round_id)
            rounds.update_progress(round_id, current.progress if progress is None else progress,
                                   log_append=f"[{_now()}] {line}\n", metrics=metrics)
            return True
        except OrapoError:
            return False

    def _stopped(self, run: RunningRound) -> bool:
        from db import RoundRepository

        return run.cancel.is_set() or RoundRepository(self.db).get(run.plan.round_id).status != "running"

    def _fail(self, run: RunningRound, code: str, message: str) -> None:
        from db import RoundRepository

        if run.cancel.is_set():
            return
        try:
            RoundRepository(self.db).transition(run.plan.round_id, "failed", error=f"{code}: {message}", actor="rounds")
        except OrapoError:
            pass  # cancelled or finished meanwhile

    def _child(self, run: RunningRound, argv: list[str], log_path: Path, *, phase: str,
               on_poll: Callable[[], None] | None = None) -> int | None:
        """Run one child to its end, recording its pid; None when the round was cancelled meanwhile."""
        from db import RoundRepository

        rounds = RoundRepository(self.db)
        process = launch(argv, log_path)
        run.process = process
        rounds.set_process(run.plan.round_id, pid=process.pid)
        self._log(run.plan.round_id, f"{phase}: worker pid {process.pid}", metrics={"phase": phase})
        while process.poll() is None:
            if on_poll is not None:
                on_poll()
            if self._stopped(run):
                stop_process(process.pid, process=process, grace_s=run.plan.policy.cancel_grace_s)
                return None
            time.sleep(run.plan.policy.poll_s)
        if on_poll is not None:
            on_poll()
        try:
            rounds.set_process(run.plan.round_id, pid=None)
        except OrapoError:
            pass
        return None if self._stopped(run) else process.returncode

    def _train_evaluate_and_gate(self, run: RunningRound) -> None:
        plan = run.plan
        log_path = plan.round_dir / "train.log"
        train_base = plan.served["base"]
        if plan.served["adapter"]:
            train_base = self._merged_base(run, log_path)
            if train_base is None:
                return
        plan.overrides["model_name_or_path"] = train_base
        tail = JsonlTail(plan.round_dir / "output" / "metrics.jsonl")
        latest: dict[str, Any] = {}  # the last value of every logged key (step records, then the run's summary)

        def report_metrics() -> None:
            records = tail.read()
            if records:
                for r in records:
                    latest.update(r)
                step = int(latest.get("step") or 0)
                self._log(plan.round_id, f"step {step}/{plan.max_steps}",
                          progress=0.05 + 0.8 * min(1.0, step / max(1, plan.max_steps)),
                          metrics={"phase": "training", "train": dict(latest)})

        code = self._child(run, train_command(plan.recipe, plan.overrides), log_path, phase="training", on_poll=report_metrics)
        if code is None:
            return
        if code != 0:
            self._fail(run, "worker_failed", f"{describe_exit(code)}. Last lines of train.log:\n{tail_text(log_path, 15)}")
            return
        output = plan.round_dir / "output"
        if not ((output / "adapter_config.json").is_file() or (output / "config.json").is_file()):
            self._fail(run, "worker_failed", f"the worker exited cleanly but saved no model in {output}.")
            return
        candidate = {"base": train_base, "adapter": str(output) if (output / "adapter_config.json").is_file() else None}
        if candidate["adapter"] is None:
            candidate["base"] = str(output)
        self._log(plan.round_id, "training finished; evaluating on the held-out set", progress=0.85,
                  metrics={"phase": "evaluating"})
        results = self._evaluate(run, candidate)
        if results is None:
            return
        decision = decide(results["candidate"]["metrics"], results["served"]["metrics"], plan.policy.gate,
                          untrusted=plan.gate_untrusted)
        verdict = "promote" if decision.promote else "hold" if decision.hold else "reject"
        self._log(plan.round_id, f"gate: {verdict} ({decision.reason})", progress=0.99)
        self._finalize(run, candidate, results, decision)

    def _merged_base(self, run: RunningRound, log_path: Path) -> str | None:
        served = run.plan.served
        target = self.settings.models_dir / "merged" / str(served["version_id"])
        if not (target / "config.json").is_file():
            code = self._child(run, python_command("-m", "app.services.rounds_gate", "merge", served["base"],
                                                   served["adapter"], str(target)), log_path, phase="merging")
            if code is None:
                return None
            if code != 0:
                self._fail(run, "merge_failed", f"{describe_exit(code)} while merging the served adapter:\n{tail_text(log_path, 10)}")
                return None
        return str(target)

    def _evaluate(self, run: RunningRound, candidate: dict[str, Any]) -> dict[str, Any] | None:
        plan = run.plan
        spec = {"heldout": str(plan.round_dir / "heldout.json"), "max_new_tokens": plan.policy.eval_max_new_tokens,
                "models": {"served": {"base": plan.served["base"], "adapter": plan.served["adapter"]}, "candidate": candidate}}
        if self._evaluator is not None:
            return self._evaluator(spec)
        if not plan.policy.evaluate_in_subprocess:
            from app.services.rounds_gate import evaluate_models

            return evaluate_models(spec)
        spec_path, out_path = plan.round_dir / "eval_spec.json", plan.round_dir / "eval.json"
        spec_path.write_text(json.dumps(spec, indent=1))
        code = self._child(run, python_command("-m", "app.services.rounds_gate", "evaluate", str(spec_path), str(out_path)),
                           plan.round_dir / "eval.log", phase="evaluating")
        if code is None:
            return None
        if code != 0 or not out_path.is_file():
            self._fail(run, "evaluation_failed", f"{describe_exit(code)}:\n{tail_text(plan.round_dir / 'eval.log', 15)}")
            return None
        return json.loads(out_path.read_text())

    def _finalize(self, run: RunningRound, candidate: dict[str, Any], results: dict[str, Any], decision) -> None:
        """The round's durable outcome in one transaction: succeeded, the version, data marked used, promote or reject."""
        from db import CorrectionRepository, ModelVersionRepository, PairRepository, RoundRepository

        plan = run.plan
        if self._stopped(run):
            return
        installed = install_candidate(self.settings, plan.round_id, candidate)
        recipe_file = plan.round_dir / "output" / "orapo_recipe.json"
        resolved = json.loads(recipe_file.read_text()) if recipe_file.is_file() else {}
        heldout = {"served": results["served"]["metrics"], "candidate": results["candidate"]["metrics"]}
        try:
            with self.db.session() as session:
                rounds = RoundRepository(session)
                rounds.transition(plan.round_id, "succeeded", actor=plan.actor,
                                  metrics={"phase": "finished", "heldout_metrics": heldout, "gate": decision.to_dict()})
                versions = ModelVersionRepository(session)
                parent_id = plan.served["version_id"]
                if parent_id is None:
                    # The model served until now becomes a version too, whatever the gate says: the versions table
                    # and the round charts show it as the baseline beside the candidate, and a rollback to it is
                    # one action.
                    served_dir = Path(plan.served["base"])
                    base = versions.create(f"base-{served_dir.name}", base_model_path=stored_path(self.settings, served_dir),
                                           metrics={"heldout": results["served"]["metrics"]},
                                           config={"registered_by_round": plan.round_id})
                    versions.promote(base.id, reason="the model served before the first promoted round", actor="system")
                    parent_id = base.id
                version = versions.create(
                    f"round-{plan.round_id}", base_model_path=installed["base"], adapter_path=installed["adapter"],
                    metrics={"heldout": results["candidate"]["metrics"], "served_heldout": results["served"]["metrics"],
                             "gate": decision.to_dict(), "train": (rounds.get(plan.round_id).metrics or {}).get("train", {})},
                    parent_id=parent_id, round_id=plan.round_id, study_ids_seen=plan.study_ids,
                    config={"recipe": plan.recipe, "overrides": plan.overrides, "policy": asdict(plan.policy),
                            "resolved": resolved, "served_version_id": plan.served["version_id"],
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
            if self._stopped(run):
                return  # cancelled at the last moment: the transaction wrote nothing
            raise
