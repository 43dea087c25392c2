"""Training rounds as the admin runs them: request, train in a child process, evaluate, gate, promote or reject.

A round is a row that moves queued -> running -> succeeded -> promoted|rejected
(or failed/cancelled), and a folder `<data>/rounds/<id>/` holding its training
CSV, held-out set, `train.log`, the trainer's `metrics.jsonl` and its output.
Training is the same `orapo train --config RECIPE ...` a user could type, run
as a child process in its own session; a monitor thread owned by the
`RoundService` tails its metrics into the database, then evaluates the
candidate and the served model on the held-out set and applies the gate. The
database changes of a finished round (version, corrections marked trained,
pairs assigned, promotion) are one transaction, so a crash or a cancel before
it leaves the served model and the data exactly as they were.

One round at a time across every process (app, CLI, scheduler): a request is
refused with `round_active` while another is queued or running, and two
requests racing each other are settled by the database (the older id wins).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.services.rounds_gate import decide
from app.services.rounds_policy import (  # noqa: F401 - re-exported: the admin tab imports them from here
    DEFAULT_RECIPE,
    MANAGED_KEYS,
    POLICY_KEYS,
    RECIPES_DIR,
    RoundPolicy,
    estimate_steps,
    parse_settings,
)
from app.services.rounds_worker import (
    JsonlTail,
    describe_exit,
    launch,
    pid_alive,
    python_command,
    stop_process,
    tail_text,
    train_command,
)
from orapo_core.config import Settings
from orapo_core.errors import OrapoError


@dataclass(frozen=True)
class RoundDetails:
    """What the admin tab shows for one round."""

    round: Any  # db.records.RoundRecord
    version: Any  # the ModelVersionRecord it produced, if any
    log_tail: str
    metrics_history: list[dict[str, Any]]
    round_dir: Path


@dataclass
class _Plan:
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


@dataclass
class _Running:
    plan: _Plan
    thread: threading.Thread | None = None
    process: Any = None
    cancel: threading.Event = field(default_factory=threading.Event)


def _now() -> str:
    return datetime.now(UTC).strftime("%H:%M:%S")


def _actor_id(actor) -> int | None:
    return getattr(actor, "id", None)


class RoundService:
    """Owns the rounds this process runs (their monitor threads); everything durable is in the database."""

    def __init__(self, database, settings: Settings | None = None, *, policy: RoundPolicy | None = None,
                 evaluator: Callable[[dict[str, Any]], dict[str, Any]] | None = None):
        self.db = database
        self.settings = settings or Settings()
        self.policy = policy or RoundPolicy()
        self._evaluator = evaluator  # a hook: spec -> {"served": {"metrics": ...}, "candidate": {...}}
        self._lock = threading.Lock()
        self._running: dict[int, _Running] = {}

    # --- queries ------------------------------------------------------------------------------------------

    def list_rounds(self, *, status=None, limit: int = 50):
        from db import RoundRepository

        return RoundRepository(self.db).list(status=status, limit=limit)

    def get_round(self, round_id: int):
        from db import RoundRepository

        return RoundRepository(self.db).get(round_id)

    def round_dir(self, round_id: int) -> Path:
        return self.settings.rounds_dir / str(round_id)

    def round_details(self, round_id: int, *, log_lines: int = 40) -> RoundDetails:
        from db import ModelVersionRepository

        record = self.get_round(round_id)
        version = next((v for v in ModelVersionRepository(self.db).list() if v.round_id == round_id), None)
        folder = self.round_dir(round_id)
        history = JsonlTail(folder / "output" / "metrics.jsonl").read()
        return RoundDetails(record, version, tail_text(folder / "train.log", log_lines), history, folder)

    def list_versions(self, *, status: str | None = None):
        from db import ModelVersionRepository

        return ModelVersionRepository(self.db).list(status=status)

    def served_version(self):
        from db import ModelVersionRepository

        return ModelVersionRepository(self.db).promoted()

    def is_running_here(self, round_id: int) -> bool:
        with self._lock:
            run = self._running.get(round_id)
        return run is not None and run.thread is not None and run.thread.is_alive()

    # --- starting ---------------------------------------------------------------------------------------

    def request_round(self, *, trigger: str = "manual", actor=None, recipe: str | None = None,
                      settings: dict[str, Any] | None = None, resume_from: int | None = None):
        """A queued round, or `round_active` (with the id of the round in the way) while another is active."""
        from db import CorrectionRepository, RoundRepository

        rounds = RoundRepository(self.db)
        self._refuse_if_active(rounds.active(), None)
        settings = dict(settings or {})
        policy_values = {k: v for k, v in settings.items() if k in POLICY_KEYS}
        overrides = {k: v for k, v in settings.items() if k not in POLICY_KEYS}
        managed = sorted(MANAGED_KEYS & set(overrides))
        if managed:
            raise OrapoError("managed_setting", f"A round sets {', '.join(managed)} itself; leave them out of --set.")
        policy = self.policy.updated(policy_values)
        recipe_path = self._resolve_recipe(recipe or policy.recipe)
        if resume_from is not None:
            overrides["resume_from_checkpoint"] = str(self._last_checkpoint(resume_from))
        untrained = CorrectionRepository(self.db).count_untrained()
        if untrained < policy.min_new_corrections:
            raise OrapoError("nothing_to_train", f"There are {untrained} signed, untrained corrections of training studies; "
                                                 f"a round needs at least {policy.min_new_corrections}.")
        config = {"recipe": str(recipe_path), "overrides": overrides, "policy": {**asdict(policy), "recipe": str(recipe_path)},
                  **({"resume_from": resume_from} if resume_from is not None else {})}
        record = rounds.create(trigger=trigger, config=config, started_by=_actor_id(actor), actor=actor or trigger)
        # Two requests may both have passed the check above: the older active round wins, the newer withdraws.
        try:
            self._refuse_if_active(rounds.active(), record.id)
        except OrapoError as exc:
            rounds.transition(record.id, "cancelled", error=f"{exc.code}: {exc.message}", actor=actor or trigger)
            raise
        return record

    def start_round(self, *, wait: bool = False, **request):
        """Request a round and run it; with `wait`, return once it is finished (promoted, rejected, failed...)."""
        record = self.request_round(**request)
        return self.run_round(record.id, wait=wait, actor=request.get("actor"))

    def run_round(self, round_id: int, *, wait: bool = True, actor=None):
        """Prepare a queued round's data, start its worker and monitor; returns the round (finished when `wait`)."""
        from db import RoundRepository

        rounds = RoundRepository(self.db)
        record = rounds.get(round_id)
        if record.status != "queued":
            raise OrapoError("round_not_queued", f"Round {round_id} is {record.status}; only a queued round can be run.")
        try:
            plan = self._prepare(record, actor)
        except Exception as exc:
            message = f"{exc.code}: {exc.message}" if isinstance(exc, OrapoError) else f"{type(exc).__name__}: {exc}"
            try:
                rounds.transition(round_id, "failed", error=message, actor=actor or "rounds")
            except OrapoError:
                pass  # cancelled while its data was being prepared
            raise
        run = _Running(plan)
        run.thread = threading.Thread(target=self._execute, args=(run,), name=f"orapo-round-{round_id}", daemon=True)
        with self._lock:
            self._running[round_id] = run
        run.thread.start()
        if wait:
            run.thread.join()
        return rounds.get(round_id)

    def wait(self, round_id: int, timeout: float | None = None):
        with self._lock:
            run = self._running.get(round_id)
        if run is not None and run.thread is not None:
            run.thread.join(timeout)
        return self.get_round(round_id)

    # --- stopping ---------------------------------------------------------------------------------------

    def cancel_round(self, round_id: int, *, actor=None, reason: str | None = None):
        """Cancel a queued or running round: marked cancelled first, then its process group stopped (TERM, then KILL)."""
        from db import RoundRepository

        rounds = RoundRepository(self.db)
        record = rounds.get(round_id)
        if record.status not in ("queued", "running"):
            raise OrapoError("round_not_active", f"Round {round_id} is {record.status}; there is nothing to cancel.")
        with self._lock:
            run = self._running.get(round_id)
        if run is not None:
            run.cancel.set()
        # Marking first means a worker that finishes meanwhile cannot promote anything: succeeded is no longer reachable.
        who = getattr(actor, "username", actor) or "admin"
        record = rounds.transition(round_id, "cancelled", error=reason or f"cancelled by {who}", actor=actor)
        pid = record.pid
        process = run.process if run is not None else None
        grace = run.plan.policy.cancel_grace_s if run is not None else self.policy.cancel_grace_s
        if pid:
            stop_process(pid, process=process, grace_s=grace)
        if run is not None and run.thread is not None and run.thread is not threading.current_thread():
            run.thread.join(grace + 10)
        return rounds.get(round_id)

    def recover(self) -> list:
        """At app start: rounds left queued or running by a process that is gone are marked failed (workers stopped)."""
        from db import RoundRepository

        rounds = RoundRepository(self.db)
        recovered = []
        for record in rounds.active():
            if self.is_running_here(record.id):
                continue
            supervisor = (record.metrics or {}).get("supervisor_pid")
            if supervisor and supervisor != os.getpid() and pid_alive(supervisor):
                continue  # another live process (e.g. `orapo rounds run`) is watching it
            if record.status == "running" and record.pid and pid_alive(record.pid):
                stop_process(record.pid, grace_s=self.policy.cancel_grace_s)
                error = (f"worker_orphaned: the app stopped while worker {record.pid} ran; it was stopped. "
                         f"Resume it with `orapo rounds run --resume {record.id}`.")
            elif record.status == "running":
                error = f"worker_gone: worker process {record.pid} is gone (the app or the machine restarted)."
            else:
                error = "app_restarted: the app stopped before this round started."
            try:
                recovered.append(rounds.transition(record.id, "failed", error=error, actor="system"))
            except OrapoError:
                continue  # finished meanwhile
        return recovered

    def shutdown(self, *, cancel: bool = True, timeout: float = 30.0) -> None:
        """Stop this process's rounds (cancelled, so the next start does not find them orphaned)."""
        with self._lock:
            runs = list(self._running.items())
        for round_id, run in runs:
            if run.thread is not None and run.thread.is_alive():
                if cancel:
                    try:
                        self.cancel_round(round_id, actor="system", reason="cancelled: the app shut down")
                    except OrapoError:
                        pass
                run.thread.join(timeout)

    # --- versions ----------------------------------------------------------------------------------------

    def promote_version(self, version_id: int, *, actor=None, reason: str | None = None):
        from db import ModelVersionRepository

        return ModelVersionRepository(self.db).promote(version_id, reason=reason or "promoted by hand", actor=actor)

    def rollback(self, version_id: int | None = None, *, actor=None, reason: str | None = None):
        """Serve an earlier version again (default: the served version's parent); one action, audited as `version.rollback`."""
        from db import AuditRepository, ModelVersionRepository

        with self.db.session() as session:
            versions = ModelVersionRepository(session)
            current = versions.promoted()
            if version_id is None:
                if current is None or current.parent_id is None:
                    raise OrapoError("no_rollback_target", "The served model has no earlier version; name one to roll back to.")
                version_id = current.parent_id
            target = versions.get(version_id)
            if target.status == "rejected":
                raise OrapoError("version_rejected", f"Model version {version_id} was rejected by the gate; it cannot be served.")
            if current is not None and current.id == version_id:
                raise OrapoError("already_served", f"Model version {version_id} is already the served model.")
            promoted = versions.promote(version_id, reason=reason or "rollback", actor=actor)
            AuditRepository(session).append("version.rollback", actor=actor, object_type="model_version", object_id=version_id,
                                            details={"from": current.id if current else None, "to": version_id,
                                                     **({"reason": reason} if reason else {})})
            return promoted

    # --- internals ----------------------------------------------------------------------------------------

    @staticmethod
    def _refuse_if_active(active, own_id: int | None) -> None:
        others = sorted((r for r in active if r.id != own_id), key=lambda r: r.id)
        if own_id is None and others:
            r = others[0]
            raise OrapoError("round_active", f"Round {r.id} is {r.status}; one round runs at a time. Wait for it or cancel it.")
        if own_id is not None and others and others[0].id < own_id:
            r = others[0]
            raise OrapoError("round_active", f"Round {r.id} was requested first and is {r.status}; one round runs at a time.")

    def _resolve_recipe(self, recipe: str) -> Path:
        path = Path(recipe).expanduser()
        if not path.is_absolute() and not path.exists() and (RECIPES_DIR / path).exists():
            path = RECIPES_DIR / path
        if not path.is_file():
            raise OrapoError("recipe_missing", f"The recipe {recipe} does not exist (see orapo_core/train/recipes/).")
        return path.resolve()

    def _last_checkpoint(self, round_id: int) -> Path:
        record = self.get_round(round_id)
        if record.status not in ("failed", "cancelled"):
            raise OrapoError("not_resumable", f"Round {round_id} is {record.status}; only a failed or cancelled round is resumed.")
        checkpoints = sorted(self.round_dir(round_id).glob("output/checkpoint-*"),
                             key=lambda p: int(p.name.rsplit("-", 1)[-1]) if p.name.rsplit("-", 1)[-1].isdigit() else -1)
        if not checkpoints:
            raise OrapoError("no_checkpoint", f"Round {round_id} saved no checkpoint (set save_strategy=steps to make rounds resumable).")
        return checkpoints[-1]

    def _resolve_path(self, path: str | None) -> str | None:
        if path is None:
            return None
        p = Path(path).expanduser()
        return str(p if p.is_absolute() else self.settings.resolved_data_dir / p)

    def _stored_path(self, path: Path) -> str:
        try:
            return path.resolve().relative_to(self.settings.resolved_data_dir).as_posix()
        except ValueError:
            return str(path.resolve())

    def _served(self) -> dict[str, Any]:
        from orapo_core.models.loading import resolve_model_dir

        version = self.served_version()
        if version is not None:
            return {"version_id": version.id, "name": version.name, "base": self._resolve_path(version.base_model_path),
                    "adapter": self._resolve_path(version.adapter_path)}
        return {"version_id": None, "name": None, "base": str(resolve_model_dir(settings=self.settings)), "adapter": None}

    def _prepare(self, record, actor) -> _Plan:
        import yaml

        from app.services.rounds_data import select_heldout, select_round_studies, write_training_csv
        from db import RoundRepository

        config = record.config
        policy = self.policy.updated({k: v for k, v in config.get("policy", {}).items() if k in POLICY_KEYS})
        folder = self.round_dir(record.id)
        folder.mkdir(parents=True, exist_ok=True)
        selection = select_round_studies(self.db, self.settings, replay_fraction=policy.replay_fraction,
                                         replay_max=policy.replay_max, seed=record.id)
        if len(selection.new) < policy.min_new_corrections:
            raise OrapoError("nothing_to_train", f"Only {len(selection.new)} signed, untrained corrections with images; "
                                                 f"a round needs at least {policy.min_new_corrections}.")
        csv_path = write_training_csv(selection, folder / "train.csv")
        heldout = select_heldout(self.db, self.settings, min_heldout=policy.min_heldout, max_heldout=policy.max_heldout,
                                 phantom_studies=policy.phantom_studies, phantom_size=policy.phantom_size)
        heldout.write(folder / "heldout.json")
        served = self._served()
        recipe_values = yaml.safe_load(Path(config["recipe"]).read_text()) or {}
        overrides = dict(config.get("overrides", {}))
        merged_values = {**recipe_values, **overrides}
        if (selection.summary()["clinician_pairs"] and merged_values.get("oracle_mode", "dpo") == "dpo"
                and "use_clinician_pairs" not in overrides):
            overrides["use_clinician_pairs"] = True
        overrides.update(train_csv=str(csv_path), output_dir=str(folder / "output"))
        summary = selection.summary()
        plan = _Plan(round_id=record.id, round_dir=folder, recipe=config["recipe"], overrides=overrides, policy=policy,
                     served=served, correction_ids=summary["correction_ids"], pair_ids=summary["pair_ids"],
                     study_ids=selection.study_ids, max_steps=estimate_steps(merged_values, len(selection.studies)),
                     actor=actor or record.trigger, started_by=record.started_by, trigger=record.trigger)
        rounds = RoundRepository(self.db)
        rounds.transition(record.id, "running", actor=plan.actor, metrics={
            "phase": "preparing", "supervisor_pid": os.getpid(), "selection": summary, "heldout": heldout.summary(),
            "served_version_id": served["version_id"], "max_steps": plan.max_steps})
        rounds.set_process(record.id, pid=None, output_dir=str(folder))
        self._log(record.id, f"{len(selection.new)} new and {len(selection.replay)} replayed studies; "
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

    def _stopped(self, run: _Running) -> bool:
        from db import RoundRepository

        return run.cancel.is_set() or RoundRepository(self.db).get(run.plan.round_id).status != "running"

    def _fail(self, run: _Running, code: str, message: str) -> None:
        from db import RoundRepository

        if run.cancel.is_set():
            return
        try:
            RoundRepository(self.db).transition(run.plan.round_id, "failed", error=f"{code}: {message}", actor="rounds")
        except OrapoError:
            pass  # cancelled or finished meanwhile

    def _child(self, run: _Running, argv: list[str], log_path: Path, *, phase: str,
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

    def _execute(self, run: _Running) -> None:
        plan = run.plan
        try:
            self._train_evaluate_and_gate(run)
        except Exception as exc:  # a monitor thread never dies silently: the round says why
            self._fail(run, "internal_error", f"{type(exc).__name__}: {exc}")
        finally:
            run.process = None
            with self._lock:
                self._running.pop(plan.round_id, None)

    def _train_evaluate_and_gate(self, run: _Running) -> None:
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
        decision = decide(results["candidate"]["metrics"], results["served"]["metrics"], plan.policy.gate)
        self._log(plan.round_id, f"gate: {'promote' if decision.promote else 'reject'} ({decision.reason})", progress=0.99)
        self._finalize(run, candidate, results, decision)

    def _merged_base(self, run: _Running, log_path: Path) -> str | None:
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

    def _evaluate(self, run: _Running, candidate: dict[str, Any]) -> dict[str, Any] | None:
        import json

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

    def _install_candidate(self, plan: _Plan, candidate: dict[str, Any]) -> dict[str, str | None]:
        """Copy the candidate (adapter, or whole model) out of the round folder into `<data>/models/versions/round-<id>/`."""
        source = Path(candidate["adapter"] or candidate["base"])
        target = self.settings.models_dir / "versions" / f"round-{plan.round_id}"
        if target.exists():
            shutil.rmtree(target)
        tmp = target.with_name(target.name + ".part")
        if tmp.exists():
            shutil.rmtree(tmp)
        shutil.copytree(source, tmp, ignore=shutil.ignore_patterns("checkpoint-*", "metrics.jsonl", "*.part"))
        tmp.rename(target)
        if candidate["adapter"]:
            return {"base": self._stored_path(Path(candidate["base"])), "adapter": self._stored_path(target)}
        return {"base": self._stored_path(target), "adapter": None}

    def _finalize(self, run: _Running, candidate: dict[str, Any], results: dict[str, Any], decision) -> None:
        """The round's durable outcome in one transaction: succeeded, the version, data marked used, promote or reject."""
        import json

        from db import CorrectionRepository, ModelVersionRepository, PairRepository, RoundRepository

        plan = run.plan
        if self._stopped(run):
            return
        installed = self._install_candidate(plan, candidate)
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
                if parent_id is None and decision.promote:
                    # The model served until now becomes a version too, so a rollback to it is one action.
                    served_dir = Path(plan.served["base"])
                    base = versions.create(f"base-{served_dir.name}", base_model_path=self._stored_path(served_dir),
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
                else:
                    versions.reject(version.id, reason=decision.reason, actor=plan.actor)
        except OrapoError:
            if self._stopped(run):
                return  # cancelled at the last moment: the transaction wrote nothing
            raise
