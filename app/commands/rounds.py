"""Run, list, show, promote, roll back and cancel training rounds, and set when they start by themselves.

Everything the admin tab does, scriptable: the same `RoundService` behind both.
`orapo rounds run` without `--wait` leaves a detached supervisor process
(`orapo rounds run --wait --round ID`) watching the round and prints its id, so
the round outlives the shell; `--wait` watches it here and prints its progress.
`orapo rounds worker evaluate|merge` (not listed in the help) is how a round
runs its helper processes; training is `orapo train`, as a user would type it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="rounds_command", metavar="ACTION", required=True)
    run = sub.add_parser("run", help="start a round on the signed, untrained corrections")
    run.add_argument(
        "--wait", action="store_true", help="watch it here until it is promoted, rejected, failed or cancelled"
    )
    run.add_argument(
        "--recipe", default=None, help="training recipe YAML (default: the configured one, round-cpu.yaml)"
    )
    run.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a recipe value (learning_rate=1e-5) or a round policy (f1_tolerance=0.01, "
        "replay_fraction=0.5); repeatable",
    )
    run.add_argument(
        "--resume",
        type=int,
        default=None,
        metavar="ROUND",
        help="resume a failed or cancelled round from its last checkpoint",
    )
    run.add_argument("--round", type=int, default=None, help=argparse.SUPPRESS)  # the detached supervisor's way in
    lst = sub.add_parser("list", help="list rounds, newest first")
    lst.add_argument("--status", action="append", default=None, help="only rounds in this status (repeatable)")
    lst.add_argument("--limit", type=int, default=20)
    lst.add_argument("--json", action="store_true")
    show = sub.add_parser("show", help="one round: status, metrics, gate, version and the tail of its log")
    show.add_argument("round", type=int)
    show.add_argument("--log-lines", type=int, default=20)
    show.add_argument("--json", action="store_true")
    versions = sub.add_parser("versions", help="list model versions (the served one marked *)")
    versions.add_argument("--json", action="store_true")
    promote = sub.add_parser("promote", help="serve a model version (a candidate or a retired one)")
    promote.add_argument("version", type=int)
    promote.add_argument("--reason", default=None)
    rollback = sub.add_parser("rollback", help="serve an earlier version again (default: the served version's parent)")
    rollback.add_argument("version", type=int, nargs="?", default=None)
    rollback.add_argument("--reason", default=None)
    cancel = sub.add_parser("cancel", help="cancel a queued or running round (its worker is stopped)")
    cancel.add_argument("round", type=int)
    cancel.add_argument("--reason", default=None)
    schedule = sub.add_parser("schedule", help="show or set when rounds start by themselves")
    schedule.add_argument("--cron", default=None, help="crontab line, e.g. '0 2 * * *' (02:00 nightly); '' clears it")
    on_off = schedule.add_mutually_exclusive_group()
    on_off.add_argument("--enable", dest="schedule_enabled", action="store_const", const=True, default=None)
    on_off.add_argument("--disable", dest="schedule_enabled", action="store_const", const=False)
    schedule.add_argument(
        "--threshold", type=int, default=None, help="start a round at this many new signed corrections"
    )
    t_on_off = schedule.add_mutually_exclusive_group()
    t_on_off.add_argument("--threshold-on", dest="threshold_enabled", action="store_const", const=True, default=None)
    t_on_off.add_argument("--threshold-off", dest="threshold_enabled", action="store_const", const=False)
    # The child processes of a round (app.services.rounds.worker); no help, so `orapo rounds --help` does not list it.
    worker = sub.add_parser("worker")
    jobs = worker.add_subparsers(dest="worker_command", required=True)
    evaluate = jobs.add_parser("evaluate")
    evaluate.add_argument("spec")
    evaluate.add_argument("out")
    merge = jobs.add_parser("merge")
    merge.add_argument("base")
    merge.add_argument("adapter")
    merge.add_argument("out")


def _actor() -> str:
    from app.commands.users import _cli_actor  # noqa: PLC0415 -- keeps `orapo --help` light

    return _cli_actor()


def _round_line(r) -> str:
    from app.services.rounds import RoundMetrics  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings

    gate = RoundMetrics.of(r).gate
    tail = f"  {gate.reason}" if gate else (f"  {r.error.splitlines()[0]}" if r.error else "")
    return f"{r.id}\t{r.status}\t{r.trigger}\t{r.progress:.0%}\t{r.created_at:%Y-%m-%d %H:%M}{tail}"


def _print_gate(gate) -> None:
    """The gate's verdict and why, then its numbers one per line, the candidate's own first."""
    from app.services.rounds import decision_lines  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings

    print(f"gate: {gate.verdict} - {gate.reason}")
    for line in decision_lines(gate):
        print(f"  {line}")


def _plain(value):
    from dataclasses import asdict, is_dataclass  # noqa: PLC0415 -- keeps `orapo --help` light
    from datetime import datetime  # noqa: PLC0415 -- keeps `orapo --help` light

    if is_dataclass(value):  # one with its own JSON layout (a gate Decision, metrics) is written as it is stored
        return _plain(value.to_dict() if hasattr(value, "to_dict") else asdict(value))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (datetime, Path)):
        return str(value)
    return value


def _watch(service, round_id: int):
    """Wait for the round here, printing its progress; the exit status says how it ended."""
    last = None
    while service.is_running_here(round_id):
        r = service.get_round(round_id)
        from app.services.rounds import RoundMetrics  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings

        line = f"round {r.id}: {RoundMetrics.of(r).phase or r.status} {r.progress:.0%}"
        if line != last:
            print(line, file=sys.stderr, flush=True)
            last = line
        service.wait(round_id, timeout=1.0)
    return service.get_round(round_id)


def _spawn_supervisor(settings, round_id: int) -> int:
    from app.services.rounds.processes import (  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
        launch,
        python_command,
    )

    folder = settings.rounds_dir / str(round_id)
    process = launch(
        python_command("-m", "app.cli", "rounds", "run", "--wait", "--round", str(round_id)), folder / "supervisor.log"
    )
    return process.pid


def _worker(args: argparse.Namespace) -> int:
    from app.services.rounds import worker  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings

    if args.worker_command == "merge":
        print(f"merged: {worker.merge_adapter(args.base, args.adapter, args.out)}", flush=True)
    else:
        worker.run_evaluate(args.spec, args.out)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.rounds_command == "worker":
        return _worker(args)  # a round's child process: no database, no settings of its own
    from app.runtime import open_database  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from app.services.rounds import (  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
        RoundService,
        get_schedule,
        heldout_metrics,
        next_run,
        parse_settings,
        set_schedule,
    )
    from orapo_core.config import Settings  # noqa: PLC0415 -- loads pydantic_settings, pydantic

    settings = Settings()
    database = open_database(settings)
    service = RoundService(database, settings)
    actor = _actor()
    command = args.rounds_command

    if command == "run":
        if args.round is not None:
            record = service.run_round(args.round, wait=False, actor=actor)
        else:
            record = service.request_round(
                actor=actor, recipe=args.recipe, settings=parse_settings(args.settings), resume_from=args.resume
            )
            if not args.wait:
                pid = _spawn_supervisor(settings, record.id)
                print(
                    f"Round {record.id} started (supervisor pid {pid}); follow it with `orapo rounds show {record.id}`."
                )
                return 0
            record = service.run_round(record.id, wait=False, actor=actor)
        try:
            record = _watch(service, record.id)
        except KeyboardInterrupt:
            service.cancel_round(record.id, actor=actor, reason="cancelled: interrupted at the terminal")
            raise
        print(_round_line(record))
        return 0 if record.status in ("promoted", "rejected") else 1
    if command == "list":
        rows = service.list_rounds(status=args.status, limit=args.limit)
        if args.json:
            print(json.dumps(_plain(rows), indent=1))
        elif not rows:
            print("No rounds yet: start one with `orapo rounds run`.")
        for r in [] if args.json else rows:
            print(_round_line(r))
        return 0
    if command == "show":
        details = service.round_details(args.round, log_lines=args.log_lines)
        if args.json:
            print(
                json.dumps(
                    _plain(
                        {
                            "round": details.round,
                            "version": details.version,
                            "log_tail": details.log_tail,
                            "metrics_history": details.metrics_history,
                        }
                    ),
                    indent=1,
                )
            )
            return 0
        r = details.round
        print(_round_line(r))
        print(f"folder: {details.round_dir}")
        if r.pid:
            print(f"worker pid: {r.pid}")
        if r.error:
            print(f"error: {r.error}")
        metrics = details.metrics
        for key in ("selection", "heldout", "train"):
            value = getattr(metrics, key)
            if value:
                print(f"{key}: {json.dumps(_plain(value), default=str)}")
        if metrics.gate is not None:
            _print_gate(metrics.gate)
        if details.version is not None:
            v = details.version
            print(f"version {v.id} ({v.name}): {v.status}{' - ' + v.reason if v.reason else ''}")
        if r.log:
            print("events:\n" + r.log.rstrip())
        if details.log_tail:
            print("train.log (tail):\n" + details.log_tail)
        return 0
    if command == "versions":
        rows = service.list_versions()
        if args.json:
            print(json.dumps(_plain(rows), indent=1))
            return 0
        for v in rows:
            heldout = heldout_metrics(v)
            numbers = (
                f"  macro-F1 {heldout.macro_f1_14:.3f}  FactS {heldout.facts_reward_mean:.3f}"
                if heldout.macro_f1_14 is not None and heldout.facts_reward_mean is not None
                else ""
            )
            mark = "*" if v.status == "promoted" else " "
            print(f"{mark}{v.id}\t{v.name}\t{v.status}\tparent {v.parent_id}\tround {v.round_id}{numbers}")
        return 0
    if command == "promote":
        v = service.promote_version(args.version, actor=actor, reason=args.reason)
        print(f"Serving version {v.id} ({v.name}).")
        return 0
    if command == "rollback":
        v = service.rollback(args.version, actor=actor, reason=args.reason)
        print(f"Rolled back: serving version {v.id} ({v.name}).")
        return 0
    if command == "cancel":
        r = service.cancel_round(args.round, actor=actor, reason=args.reason)
        print(f"Round {r.id} {r.status}.")
        return 0
    if command == "schedule":
        changes = {
            k: v
            for k, v in dict(
                schedule_enabled=args.schedule_enabled,
                corrections_threshold=args.threshold,
                threshold_enabled=args.threshold_enabled,
            ).items()
            if v is not None
        }
        if args.cron is not None:
            changes["cron"] = args.cron or None
        s = set_schedule(database, actor=actor, **changes) if changes else get_schedule(database)
        when = next_run(s.cron) if s.cron and s.schedule_enabled else None
        print(
            f"schedule: {s.cron or '-'} ({'enabled' if s.schedule_enabled else 'disabled'})"
            + (f", next {when:%Y-%m-%d %H:%M %Z}" if when else "")
        )
        print(
            f"threshold: {s.corrections_threshold or '-'} new corrections "
            f"({'enabled' if s.threshold_enabled else 'disabled'})"
        )
        if changes:
            print("A running app picks the change up within a minute.", file=sys.stderr)
        return 0
    return 2
