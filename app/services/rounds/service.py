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

The service decides and owns; the work lives beside it in this package:
running a round in its thread is `runner` (the typed steps of `steps`), model
versions (promote, roll back) are `versions`, and the policy, data, gate,
child processes, worker and schedule have their own modules.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.services.operations.leader import server_leases, this_process, watch_of
from app.services.rounds import versions
from app.services.rounds.backends import Backends, JobHandle, stored_job
from app.services.rounds.metrics import RoundMetrics
from app.services.rounds.plan import Evaluation, EvaluationSpec, RunningRound, read_plan
from app.services.rounds.policy import MANAGED_KEYS, POLICY_KEYS, RECIPES_DIR, RoundPolicy, check_overrides
from app.services.rounds.processes import JsonlTail, pid_alive, stop_process, tail_text
from app.services.rounds.runner import RoundRunner
from app.services.rounds.watch import round_folder
from db import CorrectionRepository, ModelVersionRepository, RoundRepository
from orapo_core.config import Settings
from orapo_core.errors import OrapoError

if TYPE_CHECKING:
    from db import Database
    from db.records import ModelVersionRecord, RoundRecord
    from db.repositories.base import Actor


@dataclass(frozen=True)
class RoundDetails:
    """What the admin tab shows for one round."""

    round: Any  # db.records.RoundRecord
    version: Any  # the ModelVersionRecord it produced, if any
    log_tail: str
    metrics_history: list[dict[str, Any]]  # the trainer's metrics.jsonl records, step by step
    round_dir: Path
    metrics: RoundMetrics  # the round row's metrics, typed


def _actor_id(actor: Actor) -> int | None:
    return getattr(actor, "id", None)


class RoundService:
    """Owns the rounds this process runs (their monitor threads); everything durable is in the database."""

    def __init__(
        self,
        database: Database,
        settings: Settings | None = None,
        *,
        policy: RoundPolicy | None = None,
        evaluator: Callable[[EvaluationSpec], Evaluation] | None = None,
        backends: Backends | None = None,
    ) -> None:
        self.db = database
        self.settings = settings or Settings()
        self.policy = policy or RoundPolicy()
        # where jobs run: ORAPO_ROUND_BACKEND by default (local child processes, SLURM or Ray)
        self.backends = backends or Backends()
        # `evaluator` is a hook in place of the evaluation worker (see `job_steps.Evaluate`)
        self._runner = RoundRunner(database, self.settings, evaluator=evaluator, backends=self.backends)
        self._lock = threading.Lock()
        self._running: dict[int, RunningRound] = {}

    # --- queries ------------------------------------------------------------------------------------------

    def list_rounds(self, *, status: str | Sequence[str] | None = None, limit: int = 50) -> list[RoundRecord]:
        return RoundRepository(self.db).list(status=status, limit=limit)

    def get_round(self, round_id: int) -> RoundRecord:
        return RoundRepository(self.db).get(round_id)

    def round_dir(self, round_id: int) -> Path:
        return round_folder(self.settings, round_id)

    def round_details(self, round_id: int, *, log_lines: int = 40) -> RoundDetails:
        record = self.get_round(round_id)
        version = next((v for v in ModelVersionRepository(self.db).list() if v.round_id == round_id), None)
        folder = self.round_dir(round_id)
        history = JsonlTail(folder / "output" / "metrics.jsonl").read()
        return RoundDetails(
            record, version, tail_text(folder / "train.log", log_lines), history, folder, RoundMetrics.of(record)
        )

    def list_versions(self, *, status: str | None = None) -> list[ModelVersionRecord]:
        return versions.list_versions(self.db, status=status)

    def served_version(self) -> ModelVersionRecord | None:
        return versions.served_version(self.db)

    def is_running_here(self, round_id: int) -> bool:
        with self._lock:
            run = self._running.get(round_id)
        return run is not None and run.thread is not None and run.thread.is_alive()

    # --- starting ---------------------------------------------------------------------------------------

    def request_round(
        self,
        *,
        trigger: str = "manual",
        actor: Actor = None,
        recipe: str | None = None,
        settings: dict[str, Any] | None = None,
        resume_from: int | None = None,
    ) -> RoundRecord:
        """A queued round, or `round_active` (with the id of the round in the way) while another is active."""
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
        studies_per_step = check_overrides(recipe_path, overrides).studies_per_step
        untrained = CorrectionRepository(self.db).count_untrained()
        # Replayed studies may fill a step, so refuse here only when even full replay could not (the exact
        # count is checked again when the round's data is selected, before any training).
        if untrained < policy.min_new_corrections or untrained * (1 + policy.replay_fraction) < studies_per_step:
            needed = max(policy.min_new_corrections, math.ceil(studies_per_step / (1 + policy.replay_fraction)))
            why = (
                f"one optimizer step of this recipe takes {studies_per_step} studies, replay included"
                if untrained >= policy.min_new_corrections
                else f"min_new_corrections is {policy.min_new_corrections}"
            )
            raise OrapoError(
                "too_few_corrections" if untrained else "nothing_to_train",
                f"There are {untrained} signed, untrained corrections of training "
                f"studies; a round needs at least {needed} ({why}).",
            )
        config = {
            "recipe": str(recipe_path),
            "overrides": overrides,
            "policy": {**policy.model_dump(), "recipe": str(recipe_path)},
            **({"resume_from": resume_from} if resume_from is not None else {}),
        }
        record = rounds.create(trigger=trigger, config=config, started_by=_actor_id(actor), actor=actor or trigger)
        # Two requests may both have passed the check above: the older active round wins, the newer withdraws.
        try:
            self._refuse_if_active(rounds.active(), record.id)
        except OrapoError as exc:
            rounds.transition(record.id, "cancelled", error=f"{exc.code}: {exc.message}", actor=actor or trigger)
            raise
        return record

    def start_round(self, *, wait: bool = False, **request: Any) -> RoundRecord:
        """Request a round and run it; with `wait`, return once it is finished (promoted, rejected, failed...)."""
        record = self.request_round(**request)
        return self.run_round(record.id, wait=wait, actor=request.get("actor"))

    def run_round(self, round_id: int, *, wait: bool = True, actor: Actor = None) -> RoundRecord:
        """Prepare a queued round's data, start its worker and monitor; returns the round (finished when `wait`)."""
        rounds = RoundRepository(self.db)
        record = rounds.get(round_id)
        if record.status != "queued":
            raise OrapoError(
                "round_not_queued", f"Round {round_id} is {record.status}; only a queued round can be run."
            )
        try:
            plan = self._runner.prepare(record, actor, self.policy)
        except Exception as exc:
            message = f"{exc.code}: {exc.message}" if isinstance(exc, OrapoError) else f"{type(exc).__name__}: {exc}"
            try:
                rounds.transition(round_id, "failed", error=message, actor=actor or "rounds")
            except OrapoError:
                pass  # cancelled while its data was being prepared
            raise
        run = RunningRound(plan)
        run.thread = threading.Thread(target=self._execute, args=(run,), name=f"orapo-round-{round_id}", daemon=True)
        with self._lock:
            self._running[round_id] = run
        run.thread.start()
        if wait:
            run.thread.join()
        return rounds.get(round_id)

    def wait(self, round_id: int, timeout: float | None = None) -> RoundRecord:
        with self._lock:
            run = self._running.get(round_id)
        if run is not None and run.thread is not None:
            run.thread.join(timeout)
        return self.get_round(round_id)

    # --- stopping ---------------------------------------------------------------------------------------

    def cancel_round(self, round_id: int, *, actor: Actor = None, reason: str | None = None) -> RoundRecord:
        """Cancel a queued or running round: marked cancelled first, then its job stopped (TERM then KILL, `scancel`,
        `ray job stop`)."""
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
        job = (run.job if run is not None else None) or stored_job(record)
        grace = run.plan.policy.cancel_grace_s if run is not None else self.policy.cancel_grace_s
        if job is not None:
            self.backends.for_job(job).cancel(job, grace_s=grace)
        if run is not None and run.thread is not None and run.thread is not threading.current_thread():
            run.thread.join(grace + 10)
        return rounds.get(round_id)

    def recover(self, *, queued_grace_s: float = 0.0) -> list[RoundRecord]:
        """At app start: rounds left queued or running by a process that is gone are marked failed (workers stopped),
        except a round whose job runs on SLURM or Ray, which is watched again (`_reattach`)."""
        rounds = RoundRepository(self.db)
        me, servers = this_process(), server_leases(self.db)
        recovered = []
        for record in rounds.active():
            if self.is_running_here(record.id):
                continue
            # Another live process watching it (a server, on any machine, or `orapo rounds run` here) keeps it; so
            # does a queued round younger than `queued_grace_s`, which its requester may still be preparing.
            watch = watch_of(record, me=me, servers=servers, queued_grace_s=queued_grace_s)
            if not watch.gone:
                continue
            if self._reattach(record):  # its job runs on a cluster: watched again from here (see `_reattach`)
                self._runner.watch.log(
                    record.id, f"watched by {me}", metrics=RoundMetrics.update(supervisor=me.as_dict())
                )
                continue
            if record.status == "running" and record.pid and watch.local and pid_alive(record.pid):
                stop_process(record.pid, grace_s=self.policy.cancel_grace_s)
                error = (
                    f"worker_orphaned: the app stopped while worker {record.pid} ran; it was stopped. "
                    f"Resume it with `orapo rounds run --resume {record.id}`."
                )
            elif record.status == "running":
                error = (
                    f"worker_gone: worker process {record.pid} is gone (the app or the machine restarted)."
                    if watch.local
                    else f"worker_gone: {watch.who}, which watched this round, is gone."
                )
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
            if run.job is not None and run.job.backend != "local":
                run.detach.set()  # a cluster job outlives the app: the next start watches it again (`_reattach`)
                if run.thread is not None:
                    run.thread.join(timeout)
                continue
            if run.thread is not None and run.thread.is_alive():
                if cancel:
                    try:
                        self.cancel_round(round_id, actor="system", reason="cancelled: the app shut down")
                    except OrapoError:
                        pass
                run.thread.join(timeout)

    # --- versions ----------------------------------------------------------------------------------------

    def promote_version(self, version_id: int, *, actor: Actor = None, reason: str | None = None) -> ModelVersionRecord:
        return versions.promote_version(self.db, version_id, actor=actor, reason=reason)

    def rollback(
        self, version_id: int | None = None, *, actor: Actor = None, reason: str | None = None
    ) -> ModelVersionRecord:
        """Serve an earlier version again (default: the served version's parent); one action, audited as `version.rollback`."""
        return versions.rollback(self.db, version_id, actor=actor, reason=reason)

    # --- internals ----------------------------------------------------------------------------------------

    @staticmethod
    def _refuse_if_active(active: Iterable[RoundRecord], own_id: int | None) -> None:
        others = sorted((r for r in active if r.id != own_id), key=lambda r: r.id)
        if own_id is None and others:
            r = others[0]
            raise OrapoError(
                "round_active", f"Round {r.id} is {r.status}; one round runs at a time. Wait for it or cancel it."
            )
        if own_id is not None and others and others[0].id < own_id:
            r = others[0]
            raise OrapoError(
                "round_active", f"Round {r.id} was requested first and is {r.status}; one round runs at a time."
            )

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
            raise OrapoError(
                "not_resumable", f"Round {round_id} is {record.status}; only a failed or cancelled round is resumed."
            )
        checkpoints = sorted(
            self.round_dir(round_id).glob("output/checkpoint-*"),
            key=lambda p: int(p.name.rsplit("-", 1)[-1]) if p.name.rsplit("-", 1)[-1].isdigit() else -1,
        )
        if not checkpoints:
            raise OrapoError(
                "no_checkpoint",
                f"Round {round_id} saved no checkpoint (set save_strategy=steps to make rounds resumable).",
            )
        return checkpoints[-1]

    def _reattach(self, record: RoundRecord) -> bool:
        """Watch again a running round whose job a gone app process submitted to SLURM or Ray; False for local jobs.

        A cluster job outlives the app that submitted it (a restart, an upgrade, another app server taking over),
        and a research-computing team does not expect GPU hours thrown away for it: a job still queued or running
        is followed to its end and the round goes on from there (evaluation, gate, promotion). A job that ended
        meanwhile is read as it ended (a training job that succeeded goes on to evaluation); a job the cluster no
        longer knows fails the round as `worker_gone`."""
        job = stored_job(record)
        if record.status != "running" or job is None or job.backend == "local":
            return False
        plan = read_plan(self.round_dir(record.id))
        if plan is None:  # nothing to go on from: stop the job, and the round fails as any orphan does
            self.backends.for_job(job).cancel(job, grace_s=self.policy.cancel_grace_s)
            return False
        run = RunningRound(plan, job=job)
        self._runner.watch.log(
            record.id,
            f"watching {job.describe()} ({job.phase}) again: the app that started it stopped",
            metrics=RoundMetrics.update(supervisor_pid=os.getpid()),
        )
        run.thread = threading.Thread(
            target=self._execute, args=(run, job), name=f"orapo-round-{record.id}", daemon=True
        )
        with self._lock:
            self._running[record.id] = run
        run.thread.start()
        return True

    def _execute(self, run: RunningRound, job: JobHandle | None = None) -> None:
        try:
            self._runner.execute(run, job=job)
        finally:
            run.job = None
            with self._lock:
                self._running.pop(run.plan.round_id, None)
