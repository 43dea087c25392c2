"""The paper's ablation on PhantomCXR: which part of OraPO buys what.

Every trained method starts from the same model and trains for the same number
of optimizer steps with the same batch (prompts x K rollouts), generation
settings, learning rate and seed; only the method differs: the reward (ROUGE-L
text overlap, the paper's "accuracy reward", or FactS), the oracle term (none,
DPO, or SFT on the oracle instead of DPO) and the training pool (400 or 1,000
class-balanced studies). All are scored the same way as `orapo eval` scores a
model (greedy drafts, labelled by FactS, clinical-efficacy metrics over the 14
observations) on held-out studies from a generator seed the training pool never
uses. GRPO rows are `OraPOTrainer` with ``oracle_mode='none'``: TRL's loss
untouched, with the same metrics logged, so the zero-reward curves compare.

Greedy drafts are decoded in batches of identical prompts (every phantom image
has the same size, so no padding): the same greedy decoding as `Drafter.draft`,
only faster to measure.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

RARE_FINDINGS = ("Pneumothorax", "Fracture", "Lung Lesion", "Pleural Other")
REPORTED = ("macro_f1_14", "macro_precision_14", "macro_recall_14", "micro_f1_14", "rare_f1", "mean_report_length")


@dataclass(frozen=True)
class Method:
    name: str
    label: str
    reward_name: str | None = None  # None: not trained (the starting model)
    oracle_mode: str = "none"
    train_studies: int = 1000


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("starter", "Starter (no RL)"),
        Method("grpo_accuracy", "GRPO + accuracy reward (ROUGE-L)", "rouge_l", "none", 1000),
        Method("grpo_facts", "GRPO + FactS", "facts", "none", 1000),
        Method("grpo_facts_sft", "GRPO + FactS + SFT on oracle", "facts", "sft", 1000),
        Method("orapo_400", "OraPO + FactS (400 studies)", "facts", "dpo", 400),
        Method("orapo_1000", "OraPO + FactS (1,000 studies)", "facts", "dpo", 1000),
    )
}


@dataclass
class AblationPlan:
    """Everything that is the same for every method (and the methods to run)."""

    model_dir: str
    out_dir: str
    methods: tuple[str, ...] = tuple(METHODS)
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 100
    prompts_per_step: int = 4
    num_generations: int = 4
    max_completion_length: int = 96
    temperature: float = 1.0
    # Full fine-tuning of the 6.1M-parameter starter. Quick runs (16 steps, 100 held-out) on 2026-11-30: at 3e-4
    # every RL method lost 0.13-0.23 macro-F1 against the starter, at 1e-4 0.01-0.06, at 3e-5 they held it.
    learning_rate: float = 3e-5
    checkpoints: int = 4  # evaluations spread over the run, the last one at the final step
    n_eval: int = 500
    n_eval_curve: int | None = None  # held-out studies at the intermediate checkpoints; default: n_eval
    pool_studies: int = 1500
    train_seed: int = 101  # PhantomCXR generator seed of the training pool
    eval_seed: int = 202  # ... and of the held-out studies: disjoint from the pool by construction
    image_size: int = 224
    eval_batch: int = 32
    eval_max_new_tokens: int = 128
    extra_config: dict = field(default_factory=dict)  # more OraPOConfig settings, for every trained method

    def checkpoint_steps(self) -> list[int]:
        n = max(1, min(self.checkpoints, self.steps))
        return sorted({max(1, round(self.steps * (i + 1) / n)) for i in range(n)})

    def to_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------- data


def phantom_split(folder: Path, n: int, seed: int, size: int) -> list:
    """`n` PhantomCXR studies from generator `seed` (written once, reused while seed, n and size match)."""
    from orapo_core.data.phantom import write_dataset
    from orapo_core.train.dataset import load_training_records

    stamp = folder / "ablation_split.json"
    wanted = {"n": n, "seed": seed, "size": size}
    if not (stamp.is_file() and json.loads(stamp.read_text()) == wanted):
        write_dataset(folder, n, seed=seed, size=size)
        stamp.write_text(json.dumps(wanted))
    return load_training_records(folder, kind="phantom")


def load_image(path):
    from PIL import Image

    from orapo_core.models.draft import to_rgb_image

    with Image.open(path) as image:
        return to_rgb_image(image)


# --------------------------------------------------------------------------- evaluation


def greedy_drafts(model, processor, images: Sequence, *, batch: int = 32, max_new_tokens: int = 128) -> list[str]:
    import torch

    from orapo_core.models.prompt import render_prompt

    prompt = render_prompt(processor)
    tokenizer = processor.tokenizer
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    texts = []
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(images), batch):
            chunk = list(images[start : start + batch])
            inputs = processor(text=[prompt] * len(chunk), images=chunk, return_tensors="pt").to(device)
            with torch.inference_mode():
                ids = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=pad_id)
            texts += [t.strip() for t in processor.batch_decode(ids[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)]
    finally:
        model.train(was_training)
    return texts


def score_drafts(drafts: Sequence[str], records: Sequence) -> dict:
    """Clinical efficacy of drafts against the records' labels, as `evaluate_drafter` computes it, plus rare-finding F1."""
    from orapo_core.facts import label_report
    from orapo_core.facts.metrics import clinical_efficacy

    predicted = [label_report(text) for text in drafts]
    metrics = clinical_efficacy(predicted, [r.labels for r in records], texts=list(drafts))
    metrics["rare_f1"] = sum(metrics["f1_per_class"][n] for n in RARE_FINDINGS) / len(RARE_FINDINGS)
    return metrics


class HeldOut:
    """The held-out studies, their images decoded once."""

    def __init__(self, records: Sequence):
        self.records = list(records)
        self.images = [load_image(r.image_paths[0]) for r in self.records]

    def evaluate(self, model, processor, *, n: int | None = None, batch: int = 32, max_new_tokens: int = 128) -> dict:
        n = len(self.records) if n is None else min(n, len(self.records))
        started = time.perf_counter()
        drafts = greedy_drafts(model, processor, self.images[:n], batch=batch, max_new_tokens=max_new_tokens)
        metrics = score_drafts(drafts, self.records[:n])
        metrics["seconds"] = time.perf_counter() - started
        metrics["example_draft"] = drafts[0] if drafts else ""
        return metrics


# --------------------------------------------------------------------------- training


def load_model(model_dir: str | Path):
    from transformers import AutoConfig, AutoModelForImageTextToText

    from orapo_core.models.compat import load_processor

    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, config=config, local_files_only=True)
    return model, load_processor(Path(model_dir), config)


def training_config(plan: AblationPlan, method: Method, seed: int, run_dir: Path):
    from orapo_core.train.config import OraPOConfig

    settings = dict(
        output_dir=str(run_dir), use_cpu=True, bf16=False, gradient_checkpointing=False,
        per_device_train_batch_size=plan.prompts_per_step * plan.num_generations, num_generations=plan.num_generations,
        max_completion_length=plan.max_completion_length, temperature=plan.temperature, max_steps=plan.steps,
        learning_rate=plan.learning_rate, lr_scheduler_type="constant", beta=0.0, loss_type="grpo", logging_steps=1,
        save_strategy="no", report_to="none", seed=seed, data_seed=seed, reward_name=method.reward_name,
        oracle_mode=method.oracle_mode, dataloader_num_workers=0, disable_tqdm=True,
    )
    settings.update(plan.extra_config)
    return OraPOConfig(**settings)


def train_method(plan: AblationPlan, method: Method, seed: int, pool: Sequence, held_out: HeldOut,
                 log: Callable[[str], None] = print) -> dict:
    """Train one method with one seed; evaluate at the plan's checkpoints; return its record."""
    import torch
    from transformers import TrainerCallback

    from orapo_core.train.dataset import build_training_dataset, select_studies
    from orapo_core.train.trainer import OraPOTrainer

    run_dir = Path(plan.out_dir) / "runs" / method.name / f"seed{seed}"
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    studies = select_studies(pool, max_studies=method.train_studies, class_balanced=True, seed=0)
    dataset = build_training_dataset(studies)
    torch.manual_seed(seed)
    model, processor = load_model(plan.model_dir)
    args = training_config(plan, method, seed, run_dir)
    checkpoints = plan.checkpoint_steps()
    curve: list[dict] = []

    class Checkpoints(TrainerCallback):
        def on_step_end(self, _args, state, control, model=None, **kwargs):
            if state.global_step not in checkpoints:
                return
            final = state.global_step == plan.steps
            n = plan.n_eval if final else (plan.n_eval_curve or plan.n_eval)
            metrics = held_out.evaluate(trainer.model, processor, n=n, batch=plan.eval_batch,
                                        max_new_tokens=plan.eval_max_new_tokens)
            curve.append({"step": state.global_step, "studies_seen": state.global_step * plan.prompts_per_step,
                          "n_eval": n, **{k: metrics[k] for k in REPORTED}})
            log(f"  {method.name} seed {seed} step {state.global_step}: macro-F1 {metrics['macro_f1_14']:.3f} "
                f"(n={n}, {metrics['seconds']:.0f}s)")
            if final:
                curve[-1]["metrics"] = metrics

    trainer = OraPOTrainer(model=model, args=args, train_dataset=dataset, processing_class=processor)
    trainer.add_callback(Checkpoints())
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started
    final = curve[-1].pop("metrics")
    steps = read_metrics(run_dir / "metrics.jsonl")
    return {"seed": seed, "train_studies": len(studies), "wall_seconds": wall, "metrics": final, "curve": curve,
            "step_seconds": statistics.median(s["step_time"] for s in steps if s.get("step_time")) if steps else None,
            "metrics_jsonl": str(run_dir / "metrics.jsonl")}


def read_metrics(path: Path) -> list[dict]:
    if not Path(path).is_file():
        return []
    return [r for r in (json.loads(line) for line in Path(path).read_text().splitlines() if line.strip())
            if "orapo/zero_reward_frac" in r]


# --------------------------------------------------------------------------- the whole ablation


def _mean_std(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def run_ablation(plan: AblationPlan, log: Callable[[str], None] = print) -> dict:
    """Run every method of the plan, write results.json, results.md and the plots, and return the results."""
    unknown = [m for m in plan.methods if m not in METHODS]
    if unknown:
        from orapo_core.errors import OrapoError

        raise OrapoError("unknown_method", f"Unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}.")
    out = Path(plan.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    data_dir = out / "data"
    # A method that asks for more studies than the pool holds trains on the whole pool (its record says how many).
    pool = phantom_split(data_dir / f"train-seed{plan.train_seed}-n{plan.pool_studies}", plan.pool_studies, plan.train_seed,
                         plan.image_size)
    held = phantom_split(data_dir / f"heldout-seed{plan.eval_seed}-n{plan.n_eval}", plan.n_eval, plan.eval_seed, plan.image_size)
    held_out = HeldOut(held)
    log(f"data: {len(pool)} training-pool studies (seed {plan.train_seed}), {len(held)} held-out (seed {plan.eval_seed}), "
        f"{time.perf_counter() - started:.0f}s")

    model, processor = load_model(plan.model_dir)
    start_eval = {n: held_out.evaluate(model, processor, n=n, batch=plan.eval_batch, max_new_tokens=plan.eval_max_new_tokens)
                  for n in sorted({plan.n_eval, plan.n_eval_curve or plan.n_eval})}
    del model
    start_point = {"step": 0, "studies_seen": 0, "n_eval": plan.n_eval_curve or plan.n_eval,
                   **{k: start_eval[plan.n_eval_curve or plan.n_eval][k] for k in REPORTED}}
    log(f"starting model: macro-F1 {start_eval[plan.n_eval]['macro_f1_14']:.3f} on {plan.n_eval} held-out studies "
        f"({start_eval[plan.n_eval]['seconds']:.0f}s)")

    results: dict = {"plan": plan.to_dict(), "checkpoint_steps": plan.checkpoint_steps(), "methods": {}}
    for name in plan.methods:
        method = METHODS[name]
        if method.reward_name is None:
            runs = [{"seed": None, "wall_seconds": 0.0, "metrics": start_eval[plan.n_eval], "curve": [start_point]}]
        else:
            runs = []
            for seed in plan.seeds:
                log(f"{name} (seed {seed}) ...")
                record = train_method(plan, method, seed, pool, held_out, log=log)
                record["curve"].insert(0, start_point)
                runs.append(record)
                log(f"{name} seed {seed}: macro-F1 {record['metrics']['macro_f1_14']:.3f}, {record['wall_seconds']:.0f}s")
        summary = {k: _mean_std([r["metrics"][k] for r in runs]) for k in REPORTED}
        results["methods"][name] = {
            "label": method.label, "reward": method.reward_name, "oracle_mode": method.oracle_mode if method.reward_name else None,
            "train_studies": method.train_studies if method.reward_name else 0,
            "mean": {k: v[0] for k, v in summary.items()}, "std": {k: v[1] for k, v in summary.items()},
            "f1_per_class": {c: _mean_std([r["metrics"]["f1_per_class"][c] for r in runs])[0]
                             for c in runs[0]["metrics"]["f1_per_class"]},
            "runs": [{k: v for k, v in r.items() if k != "metrics"} | {"metrics": {k: r["metrics"][k] for k in (*REPORTED, "f1_per_class", "example_draft")}}
                     for r in runs],
        }
        results["wall_seconds"] = time.perf_counter() - started
        write_outputs(results, out)  # after every method, so a long run can be read while it goes on
    return results


# --------------------------------------------------------------------------- outputs


def markdown_table(results: dict) -> str:
    plan = results["plan"]
    seeds = len(plan["seeds"])
    lines = [
        f"Held-out: {plan['n_eval']} PhantomCXR studies (seed {plan['eval_seed']}); {plan['steps']} optimizer steps x "
        f"{plan['prompts_per_step']} studies x K={plan['num_generations']} for every trained method; "
        f"mean ± std over {seeds} seed(s).",
        "",
        "| Method | Macro-F1 (14) | Precision | Recall | Rare-finding F1 | Micro-F1 (14) | Words |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in results["methods"].values():
        m, s = row["mean"], row["std"]

        def cell(key, digits=3):
            return f"{m[key]:.{digits}f}" + (f" ± {s[key]:.{digits}f}" if len(row["runs"]) > 1 else "")

        lines.append(f"| {row['label']} | {cell('macro_f1_14')} | {cell('macro_precision_14')} | {cell('macro_recall_14')} "
                     f"| {cell('rare_f1')} | {cell('micro_f1_14')} | {cell('mean_report_length', 1)} |")
    lines.append("")
    lines.append(f"Wall time: {results['wall_seconds'] / 60:.1f} min.")
    return "\n".join(lines) + "\n"


def _by_step(rows: list[list[dict]], key: str) -> tuple[list[int], list[float]]:
    """Per step, the mean of `key` over the runs that logged it."""
    values: dict[int, list[float]] = {}
    for run in rows:
        for r in run:
            if r.get(key) is not None:
                values.setdefault(int(r["step"]), []).append(float(r[key]))
    steps = sorted(values)
    return steps, [statistics.fmean(values[s]) for s in steps]


def write_outputs(results: dict, out: Path, *, include_plotlyjs: bool | str = True) -> None:
    """results.json, results.md and the two plots; `include_plotlyjs="directory"` shares one plotly.min.js
    beside the plots instead of inlining it in each (as the published results in `benchmarks/results/` do)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (out / "results.md").write_text(markdown_table(results))
    try:
        import plotly.graph_objects as go
    except ImportError:  # plots are optional; the numbers are not
        return
    curves = go.Figure()
    zeros = go.Figure()
    for name, row in results["methods"].items():
        steps, f1 = _by_step([[{"step": p["studies_seen"], "f1": p["macro_f1_14"]} for p in r["curve"]] for r in row["runs"]], "f1")
        curves.add_trace(go.Scatter(x=steps, y=f1, mode="lines+markers", name=row["label"]))
        logged = [read_metrics(Path(r["metrics_jsonl"])) for r in row["runs"] if r.get("metrics_jsonl")]
        if any(logged):
            x, y = _by_step(logged, "orapo/all_zero_group_frac")
            zeros.add_trace(go.Scatter(x=x, y=_smooth(y), mode="lines", name=row["label"]))
    curves.update_layout(title="Macro-F1 (14 observations, held-out PhantomCXR) against training studies seen",
                         xaxis_title="training studies seen (steps x studies per step)", yaxis_title="macro-F1")
    zeros.update_layout(title="Fraction of all-zero-reward groups per step (mean over seeds, moving average of 5)",
                        xaxis_title="optimizer step", yaxis_title="fraction of groups whose K rollouts all score 0")
    curves.write_html(out / "macro_f1_vs_studies.html", include_plotlyjs=include_plotlyjs)
    zeros.write_html(out / "all_zero_groups.html", include_plotlyjs=include_plotlyjs)


def _smooth(values: list[float], window: int = 5) -> list[float]:
    return [statistics.fmean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def quick_plan(plan: AblationPlan) -> AblationPlan:
    """What `--quick` changes: one seed, fewer steps, fewer held-out studies, a smaller pool."""
    return replace(plan, seeds=plan.seeds[:1], steps=16, checkpoints=2, n_eval=100, n_eval_curve=None, pool_studies=1000,
                   max_completion_length=80, eval_max_new_tokens=112)
