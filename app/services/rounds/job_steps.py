"""The two steps of a round that run as jobs of the backend: `Train` and `Evaluate`.

    Train(run)                 -> Candidate | None    `orapo train` as a job, its metrics streamed
    Evaluate(run, candidate)   -> Evaluation | None   both models drafted on the held-out set, in a job

Each can also `resume` a job a previous app process submitted (`RoundService.recover`).
A step that returns None has already recorded why on the round (`RoundWatch`). The
steps that run in the app's own process are `app.services.rounds.steps`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.services.rounds.backends import JobHandle, JobState
from app.services.rounds.metrics import RoundMetrics
from app.services.rounds.plan import Candidate, Evaluation, EvaluationSpec, RoundPlan, RunningRound, Weights
from app.services.rounds.processes import JsonlTail, train_command
from app.services.rounds.watch import RoundWatch, worker_command
from app.services.rounds.worker import evaluate_models

if TYPE_CHECKING:
    from orapo_core.config import Settings


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
        ended = self.watch.child(
            run,
            train_command(plan.recipe, plan.overrides),
            log_path,
            phase="training",
            on_poll=self._metrics_reporter(plan),
        )
        return self._candidate(run, ended)

    def resume(self, run: RunningRound, job: JobHandle) -> Candidate | None:
        """Watch a training job a previous app process submitted to its end, then as `__call__` goes on."""
        if job.phase == "merging":
            ended = self.watch.follow(run, job)
            if ended is None:
                return None
            if not ended.ok:
                self.watch.fail(
                    run,
                    "merge_failed",
                    f"while merging the served adapter: {self.watch.failure(job, ended, run.plan.round_dir / 'train.log', 10)}",
                )
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
                self.watch.log(
                    plan.round_id,
                    f"step {step}/{plan.max_steps}",
                    progress=0.05 + 0.8 * min(1.0, step / max(1, plan.max_steps)),
                    metrics=RoundMetrics.update(phase="training", train=dict(latest)),
                )

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
            ended = self.watch.child(
                run, worker_command("merge", served.model_dir, served.adapter_dir, target), log_path, phase="merging"
            )
            if ended is None:
                return None
            if not ended.ok:
                self.watch.fail(
                    run,
                    "merge_failed",
                    f"while merging the served adapter: {self.watch.failure(run.job, ended, log_path, 10)}",
                )
                return None
        return target


def unapplied_line(output_dir: Path) -> str | None:
    """What the round did not teach, in words, from its resolved recipe (`oracle_unread_scope: report`): the
    corrections adding findings the served model cannot read, left unapplied. None when it left none out."""
    recipe = output_dir / "orapo_recipe.json"
    try:
        unapplied = json.loads(recipe.read_text()).get("unapplied_corrections") if recipe.is_file() else None
    except (OSError, ValueError):
        return None
    if not unapplied or not unapplied.get("studies"):
        return None
    findings = ", ".join(
        f"{name} ({'too few films to tell' if auc is None else f'AUC {auc:.2f}'})"
        for name, auc in sorted(unapplied.get("findings", {}).items())
    )
    return (
        f"not taught: the corrections adding {findings} on {unapplied['studies']} studies, a finding the served model "
        f"does not read on these films (below AUC {unapplied.get('min_auc')}); the signed reports keep them"
    )


class Evaluate:
    """The served model and the candidate drafted on the held-out set (`orapo rounds worker evaluate`, by default)."""

    def __init__(self, watch: RoundWatch, *, evaluator: Callable[[EvaluationSpec], Evaluation] | None = None):
        self.watch = watch
        self.evaluator = evaluator  # a hook in place of the worker (an evaluation done elsewhere)

    def __call__(self, run: RunningRound, candidate: Candidate) -> Evaluation | None:
        plan = run.plan
        untaught = unapplied_line(plan.output_dir)
        if untaught:
            self.watch.log(plan.round_id, untaught)
        self.watch.log(
            plan.round_id,
            "training finished; evaluating on the held-out set",
            progress=0.85,
            metrics=RoundMetrics.update(phase="evaluating"),
        )
        spec = EvaluationSpec(
            plan.round_dir / "heldout.json",
            Weights.of(plan.served),
            candidate,
            max_new_tokens=plan.policy.eval_max_new_tokens,
            min_agreement=plan.draft_min_agreement,
        )
        if self.evaluator is not None:
            return self.evaluator(spec)
        if not plan.policy.evaluate_in_subprocess:
            return evaluate_models(spec)
        spec_path, out_path, log_path = (
            plan.round_dir / "eval_spec.json",
            plan.round_dir / "eval.json",
            plan.round_dir / "eval.log",
        )
        spec_path.write_text(json.dumps(spec.to_dict(), indent=1))
        return self._result(
            run, self.watch.child(run, worker_command("evaluate", spec_path, out_path), log_path, phase="evaluating")
        )

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
