"""The paper's ablation on PhantomCXR: starter, GRPO + accuracy reward, GRPO + FactS, OraPO at 400 and 1,000 studies, SFT instead of DPO.

    .venv/bin/python benchmarks/bench_learning.py [--quick] [--seeds 0 1 2] [--out DIR] [--model DIR]
    orapo bench learning --quick

Every trained method starts from the starter model and gets the same step
budget, batch (studies x K=4 rollouts), generation settings, learning rate and
seeds; all are scored on held-out PhantomCXR studies from a generator seed the
training pool does not use (engine: `orapo_core/train/ablation.py`). Writes
results.json, results.md (the table), macro_f1_vs_studies.html and
all_zero_groups.html (the paper's Figure 2) under --out, and prints the table
and the command.

Full (default): 3 seeds, 100 steps x 4 studies x K=4, 4 checkpoints, 500
held-out studies, a 1,500-study pool. --quick: seed 0 only, 16 steps,
2 checkpoints, 100 held-out studies (the first 100 of the same held-out
stream), max_completion_length 80: it orders the methods on little evidence and
is a smoke run of the whole pipeline, not a result.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def default_model() -> Path | None:
    from orapo_core.models.starter.build import find_starter

    return find_starter()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one seed, 16 steps, 100 held-out studies (see above)")
    parser.add_argument("--seeds", type=int, nargs="+", help="training seeds (default: 0 1 2; --quick: 0)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "learning"), help="output folder")
    parser.add_argument("--model", help="starting model (default: the starter, <ORAPO_DATA_DIR>/models/starter or assets/starter)")
    parser.add_argument("--methods", nargs="+", help="subset of methods (default: all)")
    parser.add_argument("--steps", type=int, help="optimizer steps per trained method")
    parser.add_argument("--n-eval", type=int, help="held-out studies")
    parser.add_argument("--learning-rate", type=float)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 by default: on a shared 2-core box OpenMP's spinning threads are far slower)")
    opts = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(opts.threads)

    import torch

    from orapo_core.train.ablation import AblationPlan, markdown_table, quick_plan, run_ablation

    torch.set_num_threads(opts.threads)
    model = Path(opts.model) if opts.model else default_model()
    if model is None:
        print("No starter model: build it with `orapo starter build`, or name a model with --model.", file=sys.stderr)
        return 2
    plan = AblationPlan(model_dir=str(model), out_dir=opts.out)
    if opts.quick:
        plan = quick_plan(plan)
    changes = {"seeds": tuple(opts.seeds) if opts.seeds else None, "methods": tuple(opts.methods) if opts.methods else None,
               "steps": opts.steps, "n_eval": opts.n_eval, "learning_rate": opts.learning_rate}
    plan = replace(plan, **{k: v for k, v in changes.items() if v is not None})
    command = " ".join([os.path.relpath(sys.executable), *sys.argv])
    print(f"command: {command}\nmodel: {model}\nplan: {json.dumps(plan.to_dict())}", flush=True)
    started = time.perf_counter()
    results = run_ablation(plan, log=lambda line: print(line, flush=True))
    results.update(command=command, machine=f"{platform.machine()}, {os.cpu_count()} CPUs visible, torch threads "
                   f"{torch.get_num_threads()}, torch {torch.__version__}", wall_seconds=time.perf_counter() - started)
    Path(opts.out, "results.json").write_text(json.dumps(results, indent=2, default=str))
    Path(opts.out, "results.md").write_text(markdown_table(results) + f"\nCommand: `{command}` ({results['machine']}).\n")
    print()
    print(markdown_table(results))
    print(f"outputs: {opts.out}/results.json, results.md, macro_f1_vs_studies.html, all_zero_groups.html")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
