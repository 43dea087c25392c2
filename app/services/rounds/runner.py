"""One round's run, in its monitor thread: the steps of `app.services.rounds.steps` and `job_steps`, chained.

`RoundService` decides whether a round may run and owns the thread; a
`RoundRunner` runs the steps inside it, each handing the next its typed
output: select the data (before the thread starts, so a refusal reaches the
caller), train, evaluate, decide, install. A step that stops the round (a
failed child, a cancel) records why and returns None, and the chain ends there;
only `Install` writes the outcome, in one transaction.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from app.services.operations.leader import this_process
from app.services.rounds.backends import Backends, JobHandle
from app.services.rounds.job_steps import Evaluate, Train
from app.services.rounds.metrics import RoundMetrics
from app.services.rounds.plan import Candidate, Evaluation, EvaluationSpec, RoundPlan, RunningRound
from app.services.rounds.policy import RoundPolicy
from app.services.rounds.steps import Decide, Install, SelectData
from app.services.rounds.watch import RoundWatch

if TYPE_CHECKING:
    from db import Database
    from db.records import RoundRecord
    from db.repositories.base import Actor
    from orapo_core.config import Settings


def evaluation_candidate(plan: RoundPlan) -> Candidate:
    """The candidate an evaluation job drafted, from the spec it was given (`eval_spec.json`)."""
    spec = EvaluationSpec.from_dict(json.loads((plan.round_dir / "eval_spec.json").read_text()))
    return Candidate(spec.candidate.base, spec.candidate.adapter)


class RoundRunner:
    """Runs rounds inside their monitor threads; holds no state of its own beyond the database and the settings."""

    def __init__(
        self,
        database: Database,
        settings: Settings,
        *,
        evaluator: Callable[[EvaluationSpec], Evaluation] | None = None,
        backends: Backends | None = None,
    ) -> None:
        self.watch = RoundWatch(database, backends)
        self.select = SelectData(database, settings, self.watch)
        self.train = Train(settings, self.watch)
        self.evaluate = Evaluate(self.watch, evaluator=evaluator)
        self.decide = Decide()
        self.install = Install(database, settings, self.watch)

    def prepare(self, record: RoundRecord, actor: Actor, policy: RoundPolicy) -> RoundPlan:
        """A queued round's data written to its folder and the round marked running; `policy` is the service's."""
        plan = self.select(record, actor, policy)
        # several servers, on several machines, may share the database: a pid alone does not say who watches
        me = this_process()
        self.watch.log(plan.round_id, f"watched by {me}", metrics=RoundMetrics.update(supervisor=me.as_dict()))
        return plan

    def execute(self, run: RunningRound, *, job: JobHandle | None = None) -> None:
        """The monitor thread's work, to the round's end; a failure of its own is recorded on the round, never raised.

        With `job`, the round goes on from that job, which an earlier app process submitted and did not see end."""
        try:
            if job is not None and job.phase == "evaluating":
                candidate, evaluation = None, self.evaluate.resume(run, job)
            else:
                candidate = self.train.resume(run, job) if job is not None else self.train(run)
                if candidate is None:
                    return
                evaluation = self.evaluate(run, candidate)
            if evaluation is None:
                return
            if candidate is None:
                candidate = evaluation_candidate(run.plan)
            decision = self.decide(run.plan, evaluation)
            verdict = "promote" if decision.promote else "hold" if decision.hold else "reject"
            self.watch.log(run.plan.round_id, f"gate: {verdict} ({decision.reason})", progress=0.99)
            self.install(run, candidate, evaluation, decision)
        except Exception as exc:  # a monitor thread never dies silently: the round says why
            self.watch.fail(run, "internal_error", f"{type(exc).__name__}: {exc}")
