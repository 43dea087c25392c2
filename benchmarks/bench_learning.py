"""The paper's ablation on PhantomCXR: starter, GRPO + accuracy reward, GRPO + FactS, OraPO at 400 and 1,000 studies, SFT instead of DPO.

    .venv/bin/python -m benchmarks.bench_learning [--quick] [--recipe YAML] [--seeds 0 1 2] [--out DIR] [--model DIR]
    orapo bench learning --quick
    .venv/bin/python -m benchmarks.bench_learning --merge RUN1 RUN2 --out DIR   # one table from runs of one plan

Every trained method is trained by the code rounds use (`train_round`, with
`orapo_core.experimental`'s trainer for the oracle modes only the ablation has, on the
round recipe, `orapo_core/train/recipes/round-cpu.yaml` unless --recipe says
otherwise, LoRA as the recipe says) from the same model, with the same step
budget (--steps, --learning-rate, and any --set KEY=VALUE recipe setting for
every method), so each sees the same number of studies in the same number of
optimizer steps; only reward_name, oracle_mode and the study pool differ. All
are scored by the evaluator of `orapo eval` and the rounds' gate on held-out
PhantomCXR studies from a generator seed the training pool does not use
(harness: `benchmarks/ablation.py`). Writes results.json, results.md (the
table: macro and rare-finding F1, precision, recall, mean ± std over seeds, and
the pooled seed std), macro_f1_vs_studies.html, all_zero_groups.html (the
paper's Figure 2) and oracle_logp.html (the oracle report's log-likelihood
against steps) under --out, and prints the table and the command.

Full (default): 3 seeds, 100 steps, 4 checkpoints, 500 held-out studies, a
1,500-study pool at PhantomCXR's prevalence. --quick: the starter, GRPO + FactS
and OraPO + FactS only, seed 0, 150 steps, 2 checkpoints, an 800-study pool and
120 held-out studies with pneumothorax in half of them (--prevalence
pneumothorax=0.5; the full run's pool has 63 in 1,500), max_completion_length
80, FactS's form guard on (facts_form_guard; GRPO alone games FactS without
it): the gap on a finding the starter does not report, in the clinic's setting
(a round on corrections of one missed finding), in about 15 minutes on one core.
It is one seed on an enriched pool, not the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import yaml

from benchmarks.ablation import (
    DEFAULT_RECIPE,
    METHODS,
    AblationPlan,
    markdown_table,
    merge_results,
    quick_plan,
    run_ablation,
    write_outputs,
)

ROOT = Path(__file__).resolve().parents[1]


def default_model() -> Path | None:
    from orapo_core.models.starter.build import find_starter  # noqa: PLC0415 -- loads numpy

    return find_starter()


def parse_settings(pairs: list[str]) -> dict:
    """--set KEY=VALUE ... as recipe settings (values read as YAML: 3e-5, true, [q_proj, v_proj])."""
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set takes KEY=VALUE, got {pair!r}")
        settings[key.strip()] = yaml.safe_load(value)
    return settings


def build_plan(opts: argparse.Namespace):
    """The starting model and the `AblationPlan` the command line asks for."""
    model = Path(opts.model) if opts.model else default_model()
    prevalence = parse_settings(opts.prevalence)
    if not all(isinstance(v, (int, float)) and 0 <= v <= 1 for v in prevalence.values()):
        raise SystemExit(f"--prevalence takes FINDING=P with P between 0 and 1, got {' '.join(opts.prevalence)}")
    prevalence = {k: float(v) for k, v in prevalence.items()}
    plan = AblationPlan(
        out_dir=opts.out,
        model_dir=str(model) if model else None,
        recipe=opts.recipe,
        overrides=parse_settings(opts.settings),
        prevalence=prevalence,
    )
    if opts.quick:
        plan = quick_plan(plan)
    changes = {
        "seeds": tuple(opts.seeds) if opts.seeds else None,
        "methods": tuple(opts.methods) if opts.methods else None,
        "steps": opts.steps,
        "n_eval": opts.n_eval,
        "eval_seed": opts.eval_seed,
        "learning_rate": opts.learning_rate,
        "conspicuity": opts.conspicuity,
        "keep_weights": opts.keep_weights or None,
        "reward": opts.reward,
    }
    return model, replace(plan, **{k: v for k, v in changes.items() if v is not None})


def make_parser() -> argparse.ArgumentParser:
    from orapo_core.data.phantom_render import CONSPICUITY  # noqa: PLC0415 -- loads numpy

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="GRPO + FactS against OraPO + FactS, one seed, 150 steps, pneumothorax in half the studies (see above)",
    )
    parser.add_argument(
        "--recipe",
        default=str(DEFAULT_RECIPE),
        help=f"training recipe every method starts from (default: {DEFAULT_RECIPE.relative_to(ROOT)})",
    )
    parser.add_argument("--seeds", type=int, nargs="+", help="training seeds (default: 0 1 2; --quick: 0)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "learning"), help="output folder")
    parser.add_argument(
        "--model", help="starting model (default: the starter, <ORAPO_DATA_DIR>/models/starter or assets/starter)"
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=list(METHODS),
        help="methods to run (default: all but orapo_corrected, which drafts the pool with the starter first)",
    )
    parser.add_argument("--steps", type=int, help="optimizer steps per trained method (max_steps)")
    parser.add_argument(
        "--learning-rate", type=float, help="learning rate of every trained method (default: the recipe's)"
    )
    parser.add_argument(
        "--set",
        dest="settings",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="more recipe settings for every trained method, e.g. --set lora_r=8 num_generations=8",
    )
    parser.add_argument("--n-eval", type=int, help="held-out studies")
    parser.add_argument(
        "--eval-seed",
        type=int,
        help="PhantomCXR generator seed of the held-out studies (default: 202, the evaluation set; "
        "choose settings on another seed, e.g. 303, so the table's studies stay unlooked-at)",
    )
    parser.add_argument(
        "--conspicuity",
        choices=sorted(CONSPICUITY),
        help="PhantomCXR's rendering of the small findings for the pool and the held-out studies "
        "(default: PhantomCXR's, clear; subtle is the rendering of tables made before 2026-12-01)",
    )
    parser.add_argument(
        "--prevalence",
        nargs="+",
        default=[],
        metavar="FINDING=P",
        help="PhantomCXR prevalence overrides of the pool and the held-out studies, e.g. "
        "pneumothorax=0.5 (default: PhantomCXR's own; --quick: pneumothorax=0.5)",
    )
    parser.add_argument(
        "--reward",
        metavar="NAME",
        help="a diagnostic: train the methods that use FactS on this reward instead (a name in the "
        "reward registry or 'package.module:function'); the table says so",
    )
    parser.add_argument(
        "--keep-weights",
        action="store_true",
        help="keep each run's trained adapter in <out>/runs/METHOD/seedS (default: only its metrics)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1 by default: on a shared 2-core box OpenMP's spinning threads are far slower)",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="RUN_DIR",
        help="write one table from the results.json of runs of the same plan that each ran some of "
        "the methods or seeds (one process per method and seed on 2 cores; a method's seeds "
        "pool into one row), into --out; trains nothing",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    opts = make_parser().parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(opts.threads)
    if opts.merge:
        parts = [json.loads(Path(d, "results.json").read_text()) for d in opts.merge]
        results = merge_results(parts)
        results["command"] = " ; ".join(p.get("command", "") for p in parts)
        write_outputs(results, Path(opts.out))
        Path(opts.out, "results.md").write_text(markdown_table_of(results))
        print(markdown_table_of(results))
        return 0

    import torch

    torch.set_num_threads(opts.threads)
    model, plan = build_plan(opts)
    command = " ".join([os.path.relpath(sys.executable), "-m", "benchmarks.bench_learning", *sys.argv[1:]])
    print(
        f"command: {command}\nmodel: {model or 'the recipe or served model'}\nplan: {json.dumps(plan.to_dict())}",
        flush=True,
    )
    started = time.perf_counter()
    results = run_ablation(plan, log=lambda line: print(line, flush=True))
    results.update(
        command=command,
        machine=f"{platform.machine()}, {os.cpu_count()} CPUs visible, torch threads "
        f"{torch.get_num_threads()}, torch {torch.__version__}",
        wall_seconds=time.perf_counter() - started,
    )
    Path(opts.out, "results.json").write_text(json.dumps(results, indent=2, default=str))
    Path(opts.out, "results.md").write_text(
        markdown_table(results) + f"\nCommand: `{command}` ({results['machine']}).\n"
    )
    print()
    print(markdown_table(results))
    print(
        f"outputs: {opts.out}/results.json, results.md, macro_f1_vs_studies.html, all_zero_groups.html, oracle_logp.html"
    )
    return 0


def markdown_table_of(results: dict) -> str:
    commands = results.get("merged_from") or [results.get("command", "")]
    return (
        markdown_table(results)
        + "\nCommands (run side by side, one thread each, then merged with `--merge`): "
        + "; ".join(f"`{c}`" for c in commands)
        + f" ({results.get('machine', '')}).\n"
    )


if __name__ == "__main__":
    raise SystemExit(main())
