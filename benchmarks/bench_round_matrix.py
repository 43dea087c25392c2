"""The findings x clinics matrix of issue 40: one default round per cell, what the model writes alone, then the checks.

Each cell is a finding and a clinic seed (written down before running). For each, a fresh data folder runs the
clinic story (`benchmarks.bench_round_story`: ~170 corrections of the finding uploaded, drafted, signed; one round
with the default recipe, or `--set` overrides) and then scores the served model and the round's candidate with
their finding checks set aside (`benchmarks.bench_round_drafts_alone`), then fits the candidate's finding checks
again with this checkout's rules and scores it with them, as the app drafts, and judges the round again with this
checkout's gate on the round's own held-out set and on the 325 test studies (`benchmarks.bench_round_rescore
--fit-verifier --gate`): how often the gate's verdict is the one the test set would give. The table leads with the drafts alone; what the checks change comes second. Every cell is
reported, met or not.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_round_matrix \\
        --cells pleural_other:501 pleural_other:511 pneumothorax:521 pneumothorax:531 \\
        --out benchmarks/results/round-matrix-DATE [--parallel 2] [--set KEY=VALUE ...] [--reuse] [--starter DIR] \\
        [--holdout-fraction 0.25]
    orapo bench round_matrix --cells ... --out ...

Writes `matrix.json` and `matrix.md` under `--out`, and each cell's story, drafts-alone and checks JSON and logs
under `--out/cells/`. `--reuse` keeps each step whose JSON is already there (a matrix run in parts). The data
folders (models, images) go under `--work` (default: a temporary folder), not into the repository.

Goals per cell (issue 40): from the drafts alone, recall >= 0.6, false positives <= 5 % on films without the
finding and <= 10 % within each group of them that carries one other finding (groups of at least
`MIN_GROUP` films; smaller ones are printed but not judged), macro-F1 not lower than the served model's, the
round promoted by the gate (this checkout's, judged again on the round's own held-out set; the round's own
verdict when not judged again), in <= 30 min; the checks (as the app drafts) add >= 0.1 recall over the drafts alone
within the same false-positive limits.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.round_story_common import LABEL, command, shown
from orapo_core.facts.metrics import EvalMetrics

MIN_GROUP = 10  # a group of negatives smaller than this is shown, not judged (one false positive is > 10 %)
MAX_FPR, MAX_GROUP_FPR, MIN_RECALL, MIN_ADDED_RECALL, MAX_MINUTES = 0.05, 0.10, 0.6, 0.1, 30.0


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cells",
        nargs="+",
        required=True,
        metavar="FINDING:SEED",
        help=f"the matrix's cells; findings: {', '.join(sorted(LABEL))}",
    )
    parser.add_argument("--out", required=True, help="results folder (matrix.json, matrix.md, cells/)")
    parser.add_argument("--work", default=None, help="where the cells' data folders go (default: a temporary folder)")
    parser.add_argument("--parallel", type=int, default=1, help="cells run at once (each on one thread)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="round settings, every cell")
    parser.add_argument("--reuse", action="store_true", help="keep cells whose results are already in --out/cells")
    parser.add_argument(
        "--starter",
        default=None,
        metavar="DIR",
        help="serve this starter in every cell (copied into each new data folder as models/starter) instead of the "
        "shipped one, e.g. a `benchmarks.bench_starter --build-only --rebuild DIR` variant",
    )
    parser.add_argument(
        "--holdout-fraction",
        type=float,
        default=None,
        metavar="F",
        help="share of each clinic's uploads held out for the gate (ORAPO_HOLDOUT_FRACTION in every cell; default: "
        "the app's, 0.1)",
    )
    return parser


def parse_cell(text: str) -> tuple[str, int]:
    finding, sep, seed = text.partition(":")
    if not sep or finding not in LABEL or not seed.isdigit():
        raise SystemExit(f"bad cell {text!r}: FINDING:SEED with FINDING one of {', '.join(sorted(LABEL))}")
    return finding, int(seed)


def run_cell(
    finding: str,
    seed: int,
    cells: Path,
    work: Path,
    sets: list[str],
    reuse: bool,
    starter: Path | None = None,
    holdout_fraction: float | None = None,
) -> dict:
    """One cell: the clinic story, the drafts alone, the checks fitted again and scored, each a child process with
    its log; their JSON read back. `starter`: copied in as the data folder's served starter before the story;
    `holdout_fraction`: the clinic's ORAPO_HOLDOUT_FRACTION."""
    name = f"{finding}-{seed}"
    data = work / name
    if starter is not None and not (data / "models" / "starter").exists():
        shutil.copytree(starter, data / "models" / "starter")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if holdout_fraction is not None:
        env["ORAPO_HOLDOUT_FRACTION"] = str(holdout_fraction)
    common = ["--finding", finding, "--seed", str(seed), "--data-dir", str(data)]
    steps = (
        ("bench_round_story", "story", [a for s in sets for a in ("--set", s)]),
        ("bench_round_drafts_alone", "alone", []),
        ("bench_round_rescore", "checks", ["--fit-verifier", "--gate"]),
    )
    found = {}
    for module, step, extra in steps:
        out = cells / f"{name}.{step}.json"
        if not (reuse and out.is_file()):
            with open(cells / f"{name}.{step}.log", "w") as log:
                done = subprocess.run(
                    [sys.executable, "-m", f"benchmarks.{module}", *common, *extra, "--json", str(out)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    check=False,
                )
            if done.returncode != 0 or not out.is_file():
                return {"finding": finding, "seed": seed, "error": f"{module} exited {done.returncode}; see its log"}
        found[step] = json.loads(out.read_text())
    return summarise(finding, seed, found["story"], found["alone"], found["checks"])


def starter_card(starter: Path | None) -> dict:
    """Which starter the cells served: the shipped one, or the --starter folder with its card's plan."""
    if starter is None:
        return {"folder": "assets/starter (shipped)"}
    card = starter / "starter_card.json"
    plan = json.loads(card.read_text()).get("plan") if card.is_file() else None
    return {"folder": str(starter), "plan": plan}


def worst_group(scores: dict) -> tuple[str, int, int] | None:
    """The group of negatives (normal films, or those with one other finding) with the highest false-positive
    rate among groups of at least MIN_GROUP films: (name, false positives, films)."""
    groups = dict(scores.get("false_positives_by_finding") or {})
    groups["normal"] = scores.get("false_positives_on_normal") or [0, 0]
    judged = [(k, a, n) for k, (a, n) in groups.items() if n >= MIN_GROUP]
    return max(judged, key=lambda g: g[1] / g[2]) if judged else None


def rates(scores: dict) -> dict:
    """Recall, false-positive rate, worst judged group and macro-F1 of one model's scores, with counts."""
    worst = worst_group(scores)
    return {
        "recall": scores["recall"],
        "said": round(scores["recall"] * scores["n_positive"]),
        "n_positive": scores["n_positive"],
        "fpr": scores["false_positive_rate"],
        "false_positives": round(scores["false_positive_rate"] * scores["n_negative"]),
        "n_negative": scores["n_negative"],
        "worst_group": list(worst) if worst else None,
        "macro_f1": EvalMetrics.from_dict(scores).macro_f1_14,
    }


def within_limits(r: dict) -> bool:
    worst = r["worst_group"]
    return r["fpr"] <= MAX_FPR and (worst is None or worst[1] / worst[2] <= MAX_GROUP_FPR)


def summarise(finding: str, seed: int, story: dict, alone: dict, checks: dict | None = None) -> dict:
    """One cell's numbers and goals. `checks` (the candidate scored with checks fitted by this checkout's rules)
    gives the "with its checks" column; without it, the checks the round itself fitted (the story's own scores)."""
    at = story.get("draft_min_agreement") or 0
    cell = {
        "finding": finding,
        "seed": seed,
        "story_command": story.get("command"),
        "alone_command": alone.get("command"),
        "checks_command": (checks or {}).get("command"),
        "round": story.get("round", {}),
        "before_alone": rates(alone["before"]),
    }
    if "candidate" not in alone:
        cell["error"] = "the round made no candidate"
        return cell
    cell["alone"] = rates(alone["candidate"])
    cell["with_checks"] = rates(
        checks["candidate"] if checks and "candidate" in checks else shown(story["candidate"], at)
    )
    cell["with_round_checks"] = rates(shown(story["candidate"], at))
    gate = (checks or {}).get("gate")
    if gate:
        cell["gate_now"] = {
            "own": gate["own_verdict"],
            "test_set": gate["test_verdict"],
            "agree": gate["agree"],
            "own_reason": gate["own"]["reason"],
            "test_reason": gate["test_set"]["reason"],
            "heldout": gate.get("heldout"),
        }
    a, c, b = cell["alone"], cell["with_checks"], cell["before_alone"]
    minutes = (story.get("round", {}).get("seconds") or 0) / 60
    cell["goals"] = {
        "alone: recall >= 0.6": a["recall"] >= MIN_RECALL,
        "alone: false positives within limits": within_limits(a),
        "alone: macro-F1 not lower": a["macro_f1"] >= b["macro_f1"],
        # by the gate of this checkout (judged again on the round's own held-out set) where it was, else the round's
        "promoted": (
            gate["own_verdict"] == "promote" if gate else story.get("round", {}).get("version_status") == "promoted"
        ),
        "round <= 30 min": minutes <= MAX_MINUTES,
        "checks add >= 0.1 recall within limits": c["recall"] - a["recall"] >= MIN_ADDED_RECALL and within_limits(c),
    }
    return cell


def fmt(r: dict | None) -> str:
    if not r:
        return "–"
    worst = r["worst_group"]
    group = f"; worst group {worst[0]} {worst[1]}/{worst[2]}" if worst else ""
    return (
        f"{r['recall']:.3f} ({r['said']}/{r['n_positive']}) / {100 * r['fpr']:.1f} % "
        f"({r['false_positives']}/{r['n_negative']}{group}) / {r['macro_f1']:.3f}"
    )


def table(cells: list[dict]) -> str:
    lines = [
        "| finding | clinic | round | served, alone | **candidate, alone** | candidate with its checks | "
        "gate now: own set / 325 test studies | goals missed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        rnd = c.get("round") or {}
        gate = (rnd.get("gate") or "").replace("|", "/")
        said = f"{(rnd.get('seconds') or 0) / 60:.1f} min, {rnd.get('version_status') or rnd.get('status')}: {gate}"
        missed = ", ".join(k for k, v in (c.get("goals") or {}).items() if not v) or ("none" if c.get("goals") else "–")
        now = c.get("gate_now")
        gate_now = f"{now['own']} / {now['test_set']}" if now else "–"
        lines.append(
            f"| {c['finding']} | {c['seed']} | {c.get('error') or said} | {fmt(c.get('before_alone'))} | "
            f"**{fmt(c.get('alone'))}** | {fmt(c.get('with_checks'))} | {gate_now} | {missed} |"
        )
    judged = [c["gate_now"]["agree"] for c in cells if c.get("gate_now")]
    if judged:
        lines += [
            "",
            f"The gate's verdict on its own held-out set agrees with its verdict on the 325 test studies in "
            f"{sum(judged)} of {len(judged)} rounds.",
        ]
    return "\n".join(lines) + (
        "\n\nEach model cell: recall (said/with) / false positives (called/without; the worst "
        f"group of at least {MIN_GROUP} films) / macro-F1 (14).\n"
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = make_parser().parse_args(argv)
    cells = [parse_cell(c) for c in args.cells]
    out = Path(args.out)
    (out / "cells").mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="orapo-matrix-"))
    work.mkdir(parents=True, exist_ok=True)
    starter = Path(args.starter).resolve() if args.starter else None
    if starter is not None and not (starter / "config.json").is_file():
        raise SystemExit(f"--starter {args.starter}: no model there (config.json missing)")
    if args.holdout_fraction is not None and not 0.0 <= args.holdout_fraction <= 0.5:
        raise SystemExit(f"--holdout-fraction {args.holdout_fraction}: a share from 0 to 0.5")
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        results = list(
            pool.map(
                lambda fs: run_cell(*fs, out / "cells", work, args.set, args.reuse, starter, args.holdout_fraction),
                cells,
            )
        )
    report = {
        "command": command("bench_round_matrix", argv),
        "settings": args.set,
        "starter": starter_card(starter),
        "holdout_fraction": args.holdout_fraction,  # None: the app's default
        "cells": results,
        "minutes": round((time.perf_counter() - started) / 60, 1),
    }
    (out / "matrix.json").write_text(json.dumps(report, indent=1, default=str))
    served = report["starter"]["folder"]
    held = (
        "" if args.holdout_fraction is None else f"Held-out share (ORAPO_HOLDOUT_FRACTION): {args.holdout_fraction}\n\n"
    )
    text = f"# Round matrix\n\n`{report['command']}`\n\nStarter: {served}\n\n{held}" + table(results)
    (out / "matrix.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
