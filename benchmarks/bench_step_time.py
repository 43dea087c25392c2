"""Step time of OraPO against plain TRL GRPOTrainer: same model, batch, seed, reward and generation settings.

    .venv/bin/python -m benchmarks.bench_step_time [--model DIR] [--steps 8] [--warmup 2] [--rounds 2] [--threads 1]

Both trainers are measured side by side in one process, alternating (GRPO,
OraPO, OraPO, GRPO, ...) so that load from anything else on the machine falls
on both alike. Each run trains `--steps` optimizer steps from the same starting
weights; the first `--warmup` steps of each run are dropped, and the step time
is the wall time of an optimizer step (generation, reward, loss, backward and
update) from the Trainer's step callbacks. The ratio is of the medians.

Each step's CPU time (`time.process_time`) is recorded beside its wall time,
and its ratio printed too: with one torch thread a step's CPU time is the
work it did, which others' load on a shared machine barely changes, while its
wall time also holds the time the step waited for a core.

The model is the starter (`<ORAPO_DATA_DIR>/models/starter`, else the shipped
`assets/starter`) unless `--model` names another; both trainers do full
fine-tuning with beta = 0 (no KL), so OraPO's extra cost is all its own: pair
mining, the reference forwards (a frozen copy, as a DPO term needs one) and the
policy's chosen/rejected forwards on the rows that carry a pair.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from orapo_core.facts import make_facts_reward
from orapo_core.models.loading import load_for_training
from tests.support.tiny_vlms import build_tiny_vlm


def default_model() -> Path | None:
    from orapo_core.models.starter.build import find_starter  # noqa: PLC0415 -- loads numpy

    return find_starter()


def make_trainer(kind: str, model_dir: Path, dataset, args: dict, out: Path):
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from orapo_core.train.config import OraPOConfig  # noqa: PLC0415 -- loads trl, peft
    from orapo_core.train.trainer import OraPOTrainer  # noqa: PLC0415 -- loads trl, peft

    torch.manual_seed(args["seed"])
    policy = load_for_training(model_dir)
    model, processor = policy.model, policy.processor
    reward = make_facts_reward()
    if kind == "grpo":
        return GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=GRPOConfig(output_dir=str(out), **args),
            train_dataset=dataset,
            processing_class=processor,
        )
    return OraPOTrainer(
        model=model,
        reward_funcs=reward,
        args=OraPOConfig(output_dir=str(out), oracle_mode="dpo", **args),
        train_dataset=dataset,
        processing_class=processor,
    )


def timed_run(trainer) -> tuple[list[float], list[float], dict]:
    from transformers import TrainerCallback

    times: list[float] = []
    cpu_times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.start, self.cpu_start = time.perf_counter(), time.process_time()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.start)
            cpu_times.append(time.process_time() - self.cpu_start)

    trainer.add_callback(Clock())
    trainer.train()
    logged = [h for h in trainer.state.log_history if "orapo/pairs" in h]
    extra = {"pairs_per_step": statistics.fmean(h["orapo/pairs"] for h in logged)} if logged else {}
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    extra["mean_completion_length"] = statistics.fmean(lengths) if lengths else None
    return times, cpu_times, extra


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (default: the starter; a tiny test VLM if there is none)")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="steps dropped at the start of each run")
    parser.add_argument("--rounds", type=int, default=2, help="runs per trainer (alternating)")
    parser.add_argument("--prompts", type=int, default=4, help="studies per step")
    parser.add_argument("--k", type=int, default=4, help="rollouts per study (num_generations)")
    parser.add_argument("--max-completion-length", type=int, default=96)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1 by default: on a shared 2-core box OpenMP's spinning threads are far slower)",
    )
    parser.add_argument("--json", help="write the numbers here too")
    opts = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(opts.threads)

    import torch

    torch.set_num_threads(opts.threads)

    from orapo_core.data.phantom import write_dataset  # noqa: PLC0415 -- loads numpy
    from orapo_core.train.dataset import build_training_dataset, load_training_records  # noqa: PLC0415 -- loads numpy

    work = Path(tempfile.mkdtemp(prefix="orapo-steptime-"))
    model_dir = Path(opts.model) if opts.model else default_model()
    if model_dir is None:
        model_dir = build_tiny_vlm(work / "tiny-vlm")
        print("no starter model found: using a tiny random test VLM (build one with `orapo starter build`)")
    write_dataset(work / "phantom", 64, seed=303, size=224)
    dataset = build_training_dataset(load_training_records(work / "phantom"))
    args = dict(
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=opts.prompts * opts.k,
        num_generations=opts.k,
        max_completion_length=opts.max_completion_length,
        temperature=1.0,
        max_steps=opts.steps,
        learning_rate=5e-5,
        lr_scheduler_type="constant",
        beta=0.0,
        loss_type="grpo",
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=opts.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    measured: dict[str, list[float]] = {"grpo": [], "orapo": []}
    measured_cpu: dict[str, list[float]] = {"grpo": [], "orapo": []}
    extras: dict[str, list[dict]] = {"grpo": [], "orapo": []}
    order = []
    for r in range(opts.rounds):
        order += ["grpo", "orapo"] if r % 2 == 0 else ["orapo", "grpo"]
    for i, kind in enumerate(order):
        trainer = make_trainer(kind, model_dir, dataset, args, work / f"{kind}-{i}")
        times, cpu_times, extra = timed_run(trainer)
        measured[kind] += times[opts.warmup :]
        measured_cpu[kind] += cpu_times[opts.warmup :]
        extras[kind].append(extra)
        print(
            f"run {i + 1}/{len(order)} {kind:5s}: steps {', '.join(f'{t:.2f}' for t in times)} s "
            f"(CPU {', '.join(f'{t:.2f}' for t in cpu_times)} s)  {json.dumps(extra)}"
        )
        del trainer

    grpo, orapo = statistics.median(measured["grpo"]), statistics.median(measured["orapo"])
    grpo_cpu, orapo_cpu = statistics.median(measured_cpu["grpo"]), statistics.median(measured_cpu["orapo"])
    result = {
        "command": " ".join([os.path.relpath(sys.executable), "-m", "benchmarks.bench_step_time", *sys.argv[1:]]),
        "model": str(model_dir),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs visible, torch threads {torch.get_num_threads()}",
        "settings": {
            k: args[k] for k in ("per_device_train_batch_size", "num_generations", "max_completion_length", "max_steps")
        },
        "grpo_median_s": grpo,
        "orapo_median_s": orapo,
        "ratio": orapo / grpo,
        "grpo_cpu_median_s": grpo_cpu,
        "orapo_cpu_median_s": orapo_cpu,
        "cpu_ratio": orapo_cpu / grpo_cpu,
        "grpo_steps_s": measured["grpo"],
        "orapo_steps_s": measured["orapo"],
        "grpo_steps_cpu_s": measured_cpu["grpo"],
        "orapo_steps_cpu_s": measured_cpu["orapo"],
        "runs": extras,
    }
    print(f"\ncommand: {result['command']}")
    print(
        f"model: {model_dir}; {result['machine']}; batch {opts.prompts} studies x K={opts.k}, "
        f"max_completion_length {opts.max_completion_length}; {len(measured['grpo'])} timed steps each "
        f"({opts.rounds} runs x ({opts.steps} - {opts.warmup} warm-up))"
    )
    print(f"median step time: TRL GRPOTrainer {grpo:.3f} s, OraPOTrainer {orapo:.3f} s, ratio {orapo / grpo:.2f}x")
    print(
        f"median step CPU time: TRL GRPOTrainer {grpo_cpu:.3f} s, OraPOTrainer {orapo_cpu:.3f} s, "
        f"ratio {orapo_cpu / grpo_cpu:.2f}x"
    )
    if opts.json:
        Path(opts.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
