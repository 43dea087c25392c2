"""Training rounds: the service the app and the CLI call, and the typed steps a round runs.

    service    RoundService: request, run, cancel, recover; versions by hand
    steps      SelectData -> Train -> Evaluate -> Decide -> Install (typed in `plan`); those in the app's process
    job_steps  Train and Evaluate: the steps that run as jobs of the backend, and resume after a restart
    watch      what the steps share: the round's folder, its log, its cancel flag and its jobs
    runner     the steps chained in a round's monitor thread
    policy     RoundPolicy (pydantic) and the recipe overrides a round may be given
    data       the training CSV
    heldout    the held-out set, topped up with PhantomCXR studies at the usual prevalence
    gate       the promotion rule and its Decision
    evidence   the gate's statistics: paired bootstrap intervals, per-finding rates, what corrections changed
    metrics    the round row's metrics, typed and versioned
    versions   promote, roll back, install a candidate; a version's held-out metrics
    processes  child processes: launch, watch, stop
    backends   where a round's jobs run (ORAPO_ROUND_BACKEND): local child processes, SLURM batch jobs, Ray Jobs
    worker     `orapo rounds worker evaluate|merge`, the child processes' work
    schedule   RoundScheduler: cron and threshold rounds

Callers import from here: `from app.services.rounds import RoundService, RoundPolicy`.
"""

from app.services.rounds.gate import Decision, GatePolicy, decide, decision_lines
from app.services.rounds.metrics import RoundMetrics
from app.services.rounds.plan import Candidate, Evaluation, EvaluationSpec, ModelScores, RoundPlan
from app.services.rounds.policy import DEFAULT_RECIPE, RoundPolicy, parse_settings, recipe_names
from app.services.rounds.schedule import RoundScheduler, get_schedule, next_run, schedule_status, set_schedule
from app.services.rounds.service import RoundDetails, RoundService
from app.services.rounds.versions import heldout_metrics

__all__ = [
    "DEFAULT_RECIPE",
    "Candidate",
    "Decision",
    "Evaluation",
    "EvaluationSpec",
    "GatePolicy",
    "ModelScores",
    "RoundDetails",
    "RoundMetrics",
    "RoundPlan",
    "RoundPolicy",
    "RoundScheduler",
    "RoundService",
    "decide",
    "decision_lines",
    "get_schedule",
    "heldout_metrics",
    "next_run",
    "parse_settings",
    "recipe_names",
    "schedule_status",
    "set_schedule",
]
