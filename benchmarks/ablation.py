"""The paper's ablation on PhantomCXR, trained the way rounds train and scored the way rounds score.

Which part of OraPO buys what: the reward (ROUGE-L text overlap, the paper's
"accuracy reward", or FactS), the oracle term (none, DPO, or SFT on the oracle
instead of DPO) and the training pool (400 or 1,000 class-balanced studies).

Each trained method is one `orapo_core.train.run.train_round`, the function
`orapo train` and every round run (through `orapo_core.experimental`'s
`train_ablation_round`, whose trainer also has the ablation's oracle modes, SFT
on the oracle and none), on a recipe parsed by `parse_ablation_recipe`
(default: the round recipe, `orapo_core/train/recipes/round-cpu.yaml`, LoRA
and all) with three layers of overrides, later ones winning: the plan's
`overrides` (any recipe setting, for every method), the budget every method
shares (max_steps, learning rate, seed), and the method's own (reward_name,
oracle_mode, its study pool). So every method starts from the same model and
sees the same number of studies in the same number of optimizer steps, with the
recipe's batch, rollouts and generation settings. A method that is not DPO
trains with use_clinician_pairs off (a pair is a DPO signal; PhantomCXR has
none anyway). One method, `orapo_corrected` (run only when named), trains on
the pool as the app's readers would leave it: the starting model's wrong
drafts corrected to the reference (`corrected_pool`), so rounds' clinician
pairs and finding verifier are in the comparison too.

Every model is scored by `orapo_core.models.evaluate.evaluate_drafter`, the
evaluator of `orapo eval` and of the rounds' gate (greedy drafts, batched,
FactS labels, clinical-efficacy metrics), on held-out studies from a generator
seed the training pool never uses: at the start, at the plan's checkpoints and
at the last step. Beside it, at every step, the oracle's log-likelihood on a
fixed probe of held-out studies (mean per-token log-prob of each study's
reference report after the prompt and image, under the policy): the same
measure for every method, so GRPO's curve and OraPO's compare (the trainer's own
`orapo/oracle_logp` is over each batch's failed studies, and GRPO logs none).

This is a benchmark, not engine code: it writes plots with plotly.
`benchmarks.bench_learning` is its command line.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from orapo_core.errors import OrapoError
from orapo_core.facts import label_report
from orapo_core.facts.metrics import EvalMetrics, clinical_efficacy, is_positive
from orapo_core.facts.ontology import CHEXPERT_14
from orapo_core.models.evaluate import load_study_image
from orapo_core.models.loading import LoadedModel, resolve_model_dir
from orapo_core.models.picture import to_rgb_image
from orapo_core.models.scoring import answer_token_logps
from orapo_core.train.rewards import get_reward

ROOT = Path(__file__).resolve().parents[1]

DEFAULT_RECIPE = ROOT / "orapo_core" / "train" / "recipes" / "round-cpu.yaml"
RARE_FINDINGS = ("Pneumothorax", "Fracture", "Lung Lesion", "Pleural Other")
#: The numbers results.json keeps per run and averages per method: `EvalMetrics` keys, and the rare findings' own
#: (`evaluate`). They are the keys of every recorded results.json, so they are written out here as stored.
REPORTED = (
    "macro_f1_14",
    "macro_precision_14",
    "macro_recall_14",
    "micro_f1_14",
    "rare_f1",
    "rare_precision",
    "rare_recall",
    "facts_reward_mean",
    "mean_report_length",
)
PER_CLASS = "f1_per_class"  # results.json's per-class F1 of a run and of a method, `EvalMetrics.f1_per_class`
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")
# The recipe settings a reader of the results needs to know (the rest is in each run's orapo_recipe.json).
RECIPE_KEYS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_generations",
    "max_completion_length",
    "temperature",
    "learning_rate",
    "lr_scheduler_type",
    "use_peft",
    "lora_r",
    "lora_alpha",
    "zero_reward_threshold",
    "dpo_weight_min",
    "dpo_weight_max",
    "dpo_beta",
    "beta",
    "max_steps",
)


@dataclass(frozen=True)
class Method:
    name: str
    label: str
    reward_name: str | None = None  # None: not trained (the starting model)
    oracle_mode: str = "none"
    train_studies: int = 1000
    # Train on the pool as the app's readers would leave it (`corrected_pool`): each study's draft by the starting
    # model, corrected to the reference report where it is wrong, as the clinician pair rounds train on; the
    # finding verifier the round fits from those pairs is then used for the final scores, as the app drafts.
    corrections: bool = False


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("starter", "Starting model (no RL)"),
        Method("grpo_accuracy", "GRPO + accuracy reward (ROUGE-L)", "rouge_l", "none", 1000),
        Method("grpo_facts", "GRPO + FactS", "facts", "none", 1000),
        Method("grpo_facts_sft", "GRPO + FactS + SFT on oracle", "facts", "sft", 1000),
        Method("orapo_400", "OraPO + FactS (400 studies)", "facts", "dpo", 400),
        Method("orapo_1000", "OraPO + FactS (1,000 studies)", "facts", "dpo", 1000),
        # GRPO on the corrected pool OraPO (below) trains on, at the same budget: its round fits the same finding
        # checks from the same rows (train_round fits them whatever the oracle mode), so the two differ only by the
        # oracle term
        Method(
            "grpo_corrected",
            "GRPO + FactS, drafts corrected as in rounds (1,000 studies)",
            "facts",
            "none",
            1000,
            corrections=True,
        ),
        Method(
            "orapo_corrected",
            "OraPO + FactS, drafts corrected as in rounds (1,000 studies)",
            "facts",
            "dpo",
            1000,
            corrections=True,
        ),
    )
}


#: What a plan runs unless told: the paper's Table 4 rows (the corrected pool is asked for by name).
DEFAULT_METHODS = tuple(m for m in METHODS if not METHODS[m].corrections)


@dataclass
class AblationPlan:
    """Everything that is the same for every method (and the methods to run)."""

    out_dir: str
    model_dir: str | None = None  # None: the recipe's model_name_or_path, else the served model (resolve_model_dir)
    recipe: str = str(DEFAULT_RECIPE)
    methods: tuple[str, ...] = DEFAULT_METHODS
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 100  # optimizer steps of every trained method (max_steps)
    learning_rate: float | None = None  # None: the recipe's
    overrides: dict = field(default_factory=dict)  # more recipe settings, for every trained method
    checkpoints: int = 4  # evaluations spread over the run, the last one at the final step
    n_eval: int = 500
    n_eval_curve: int | None = None  # held-out studies at the intermediate checkpoints; default: n_eval
    probe_studies: int = 16  # held-out studies whose reference report's log-likelihood is followed step by step
    pool_studies: int = 1500
    train_seed: int = 101  # PhantomCXR generator seed of the training pool
    eval_seed: int = 202  # ... and of the held-out studies: disjoint from the pool by construction
    image_size: int = 224
    conspicuity: str | None = None  # PhantomCXR's rendering of small findings; None: its default ("clear")
    # PhantomCXR prevalence overrides of the pool and the held-out studies ({"pneumothorax": 0.5}); {}: its own
    prevalence: dict = field(default_factory=dict)
    eval_batch: int = 32
    eval_max_new_tokens: int = 128
    keep_weights: bool = False  # keep each run's saved model or adapter (off: only its metrics stay)
    # a diagnostic: the methods that train on FactS train on this reward of the registry instead (a name or a dotted
    # path, `orapo_core.train.rewards.get_reward`); None: FactS, as the paper's table has it
    reward: str | None = None

    def checkpoint_steps(self) -> list[int]:
        n = max(1, min(self.checkpoints, self.steps))
        return sorted({max(1, round(self.steps * (i + 1) / n)) for i in range(n)})

    def to_dict(self) -> dict:
        return asdict(self)


#: The finding `--quick` enriches, and its prevalence in the quick pool and held-out studies.
QUICK_PREVALENCE = {"pneumothorax": 0.5}


def quick_plan(plan: AblationPlan) -> AblationPlan:
    """What `--quick` changes: GRPO + FactS against OraPO + FactS (and the starter) on one seed, 150 steps, with
    pneumothorax in half the pool and half of 120 held-out studies, shorter rollouts: the gap on a finding the
    starter does not report, in the clinic's setting (the corrections of one missed finding), in about 15 minutes.
    With FactS's form guard on for both: without it GRPO alone games FactS with degenerate text
    (docs/pages/research/learning.md, "With the form guard")."""
    return replace(
        plan,
        methods=("starter", "grpo_facts", "orapo_1000"),
        seeds=plan.seeds[:1],
        steps=150,
        checkpoints=2,
        n_eval=120,
        n_eval_curve=None,
        pool_studies=800,
        eval_max_new_tokens=112,
        prevalence=plan.prevalence or dict(QUICK_PREVALENCE),
        overrides={"max_completion_length": 80, "facts_form_guard": True, **plan.overrides},
    )


# --------------------------------------------------------------------------- data


def phantom_split(
    folder: Path, n: int, seed: int, size: int, conspicuity: str | None = None, prevalence: dict | None = None
) -> tuple[Path, list]:
    """`n` PhantomCXR studies from generator `seed` (written once, reused while seed, n, size, conspicuity and
    prevalence overrides match): CSV, records."""
    from orapo_core.data.phantom import write_dataset  # noqa: PLC0415 -- loads numpy
    from orapo_core.train.dataset import load_training_records  # noqa: PLC0415 -- loads numpy

    stamp = folder / "ablation_split.json"
    wanted = {
        "n": n,
        "seed": seed,
        "size": size,
        **({"conspicuity": conspicuity} if conspicuity else {}),
        **({"prevalence": dict(sorted(prevalence.items()))} if prevalence else {}),
    }
    if not (stamp.is_file() and json.loads(stamp.read_text()) == wanted):
        write_dataset(folder, n, seed=seed, size=size, conspicuity=conspicuity, prevalence=prevalence or None)
        stamp.write_text(json.dumps(wanted))
    from orapo_core.data.phantom_io import CSV_NAME  # noqa: PLC0415 -- loads numpy

    return folder / CSV_NAME, load_training_records(folder, kind="phantom")


CORRECTED_CSV = "corrected-by-starter.csv"  # beside the pool's own CSV, so its relative image paths still resolve


def corrected_pool(
    pool_csv: Path, records: Sequence, drafter, *, threshold: float, batch: int = 32, max_new_tokens: int = 128
) -> tuple[Path, dict]:
    """The pool as the app's readers would leave it: every study drafted once, greedily, by the starting model, and
    each draft whose FactS against the study's labels is below `threshold` (the recipe's zero_reward_threshold,
    what a round counts as a failure) corrected to the reference report. The CSV is the pool's with the columns a
    round's CSV adds for a correction (clinician_chosen = the reference report, clinician_rejected = the draft);
    written once per starting model and threshold. Returns its path and a summary (how many were corrected, and
    per rare finding how many corrections added it)."""
    from orapo_core.models.evaluate import evaluate_drafter  # noqa: PLC0415 -- tests patch evaluate_drafter

    out = pool_csv.with_name(CORRECTED_CSV)
    stamp = out.with_suffix(".json")
    wanted = {
        "model": str(drafter.loaded.model_dir),
        "threshold": threshold,
        "max_new_tokens": max_new_tokens,
        "studies": len(records),
    }
    if out.is_file() and stamp.is_file() and json.loads(stamp.read_text()).get("wanted") == wanted:
        return out, json.loads(stamp.read_text())["summary"]
    result = evaluate_drafter(drafter, records, batch_size=batch, max_new_tokens=max_new_tokens)
    pairs = {}
    added = dict.fromkeys(RARE_FINDINGS, 0)
    for record, row in zip(records, result.predictions, strict=True):
        if (
            row["facts_score"] is not None
            and row["facts_score"] < threshold
            and row["draft"].strip() != record.report.strip()
        ):
            pairs[record.study_id] = (record.report, row["draft"])
            chosen = label_report(record.report)
            for name in RARE_FINDINGS:
                if chosen.get(name) in (1, -1) and row["labels"].get(name) not in (1, -1):
                    added[name] += 1
    with pool_csv.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        fields = [*(reader.fieldnames or []), "clinician_chosen", "clinician_rejected"]
        rows = list(reader)
    with out.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            chosen, rejected = pairs.get(row["id"], ("", ""))
            writer.writerow({**row, "clinician_chosen": chosen, "clinician_rejected": rejected})
    summary = {
        "studies": len(records),
        "corrected": len(pairs),
        "rare_findings_added": added,
        "draft_seconds": result.metrics.seconds,
    }
    stamp.write_text(json.dumps({"wanted": wanted, "summary": summary}, indent=2))
    return out, summary


class HeldOut:
    """The held-out studies, their images decoded once, as `evaluate_drafter` decodes them."""

    def __init__(self, records: Sequence):
        self.records = list(records)
        self.images = [load_study_image(r.image_paths[0]) for r in self.records]


# --------------------------------------------------------------------------- evaluation


def evaluate(drafter, held_out: HeldOut, *, n: int | None = None, batch: int = 32, max_new_tokens: int = 128) -> dict:
    """`evaluate_drafter` on the first `n` held-out studies, plus the rare findings' macro precision, recall and F1:
    a run's record in results.json (its `EvalMetrics.to_dict()` and the rare findings', the first draft, and each
    study's positives)."""
    from orapo_core.models.evaluate import evaluate_drafter  # noqa: PLC0415 -- tests patch evaluate_drafter

    n = len(held_out.records) if n is None else min(n, len(held_out.records))
    result = evaluate_drafter(
        drafter, held_out.records[:n], images=held_out.images[:n], batch_size=batch, max_new_tokens=max_new_tokens
    )
    # the rare findings' macro values: over "all the observations given", here the four
    rare = clinical_efficacy(
        [p["labels"] for p in result.predictions],
        [p["reference"] for p in result.predictions],
        observations=RARE_FINDINGS,
    )
    return {
        **result.metrics.to_dict(),
        "rare_f1": rare.macro_f1_14,
        "rare_precision": rare.macro_precision_14,
        "rare_recall": rare.macro_recall_14,
        "example_draft": result.predictions[0]["draft"] if result.predictions else "",
        # per study, which of the 14 the draft and the reference call positive: for paired comparisons
        # (paired_delta)
        "positives": [positives_of(p["labels"]) for p in result.predictions],
        "reference_positives": [positives_of(p["reference"]) for p in result.predictions],
    }


def positives_of(labels: dict) -> str:
    """The 14 observations as '0'/'1' (positive or uncertain, as the clinical-efficacy metrics count them)."""
    return "".join("1" if is_positive(labels, name) else "0" for name in CHEXPERT_14)


def _as_array(positives: Sequence[str]):
    import numpy as np

    return np.array([[c == "1" for c in row] for row in positives], dtype=bool)


def macro_f1_from_counts(tp, fp, fn) -> float:
    """Mean over observations of F1 from per-observation (possibly weighted, expected) counts; an observation with
    no true positive scores 0, as `clinical_efficacy` scores it. The one formula of the benchmarks' paired and
    reweighted comparisons."""
    import numpy as np

    tp, fp, fn = (np.asarray(x, dtype=float) for x in (tp, fp, fn))
    f1 = np.divide(2 * tp, 2 * tp + fp + fn, out=np.zeros_like(tp), where=tp > 0)
    return float(f1.mean())


def _macro_f1_of(predicted, reference, index, columns=None) -> float:
    """Macro-F1 over the 14 (or the observations at `columns`) of the studies `index` (repeats allowed); arrays from
    `_as_array`."""
    p, r = predicted[index], reference[index]
    if columns is not None:
        p, r = p[:, columns], r[:, columns]
    return macro_f1_from_counts((p & r).sum(0), (p & ~r).sum(0), (~p & r).sum(0))


def observation_columns(observations: Sequence[str]) -> list[int]:
    """The columns of `positives_of` strings that hold these observations."""
    return [list(CHEXPERT_14).index(name) for name in observations]


def paired_delta(
    runs: Sequence[Sequence[str]],
    baselines: Sequence[Sequence[str]],
    reference: Sequence[str],
    *,
    observations: Sequence[str] | None = None,
    resamples: int = 1000,
    seed: int = 0,
) -> dict:
    """A method's macro-F1 minus a baseline's on the same held-out studies, each averaged over its seeds' runs, with
    a 95 % interval from resampling the studies (the same resample for every run of both): the held-out set's own
    noise, which the seed std does not show. `baselines` is the baseline's runs: the starting model's one, or
    another method's seeds. `observations` narrows the macro-F1 to those (say, the rare findings). Arguments are
    `positives_of` strings, one per study."""
    import numpy as np

    ref = _as_array(reference)
    preds, bases = [_as_array(r) for r in runs], [_as_array(b) for b in baselines]
    columns = observation_columns(observations) if observations else None
    n = len(ref)

    def delta(index) -> float:
        return statistics.fmean(_macro_f1_of(p, ref, index, columns) for p in preds) - statistics.fmean(
            _macro_f1_of(b, ref, index, columns) for b in bases
        )

    rng = np.random.default_rng(seed)
    draws = sorted(delta(rng.integers(0, n, n)) for _ in range(resamples))
    return {
        "delta": delta(np.arange(n)),
        "low": draws[int(0.025 * resamples)],
        "high": draws[int(0.975 * resamples) - 1],
        "studies": n,
        "runs": len(runs),
        "baseline_runs": len(bases),
    }


def drafter_for(model, processor, model_dir: str | Path):
    """A `Drafter` around a model being trained (the trainer's, PEFT-wrapped or not)."""
    from orapo_core.models.draft import Drafter  # noqa: PLC0415 -- loads numpy

    parameter = next(model.parameters())
    return Drafter(
        LoadedModel(
            model=model,
            processor=processor,
            model_dir=Path(model_dir),
            adapter_dir=None,
            device=str(parameter.device),
            dtype=parameter.dtype,
        )
    )


def oracle_logp(model, processor, images: Sequence, oracles: Sequence[str], *, batch: int = 8) -> float:
    """Mean over studies of the mean per-token log-prob of each oracle after the drafting prompt and its image.

    The answer is tokenised as the trainer tokenises an oracle: the text, then the end-of-turn token.
    """
    tokenizer = processor.tokenizer
    eos = getattr(model.generation_config, "eos_token_id", None) or tokenizer.eos_token_id
    eos = eos[-1] if isinstance(eos, (list, tuple)) else eos
    values: list[float] = []
    training = model.training
    model.eval()
    try:
        for start in range(0, len(oracles), batch):
            pictures = [to_rgb_image(x) for x in images[start : start + batch]]
            answers = [
                tokenizer(text, add_special_tokens=False)["input_ids"] + ([eos] if eos is not None else [])
                for text in oracles[start : start + batch]
            ]
            token, _, mask = answer_token_logps(model, processor, pictures, answers)
            values += ((token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).tolist()
    finally:
        model.train(training)
    return statistics.fmean(values) if values else float("nan")


# --------------------------------------------------------------------------- training


def method_recipe(plan: AblationPlan, method: Method, seed: int, *, pool_csv: Path, model_dir: str, run_dir: Path):
    """The three configs of one method's round: recipe, then plan overrides, then the shared budget, then the method."""
    from orapo_core.experimental.ablation import parse_ablation_recipe  # noqa: PLC0415 -- loads trl, peft

    settings = dict(plan.overrides)
    settings.update(max_steps=plan.steps, seed=seed, data_seed=seed)
    if plan.learning_rate is not None:
        settings["learning_rate"] = plan.learning_rate
    settings.update(
        model_name_or_path=model_dir,
        train_csv=str(pool_csv),
        dataset_kind="phantom",
        max_studies=method.train_studies,
        class_balanced=True,
        selection_seed=0,
        reward_name=trained_reward(plan, method),
        oracle_mode=method.oracle_mode,
        output_dir=str(run_dir),
        save_strategy="no",
        logging_steps=1,
        report_to="none",
    )
    if method.oracle_mode != "dpo":
        settings["use_clinician_pairs"] = False
    elif method.corrections:
        settings["use_clinician_pairs"] = True  # the method is the corrections: a recipe that ignores them is not it
    return parse_ablation_recipe(plan.recipe, settings)


def trained_reward(plan: AblationPlan, method: Method) -> str | None:
    """The reward the method trains on: its own, or the plan's diagnostic `reward` where its own is FactS."""
    return plan.reward if plan.reward and method.reward_name == "facts" else method.reward_name


def method_label(plan: AblationPlan, method: Method) -> str:
    """The method's row name: FactS named as the reward it trained on when the plan replaced it (`plan.reward`)."""
    reward = trained_reward(plan, method)
    return method.label if reward == method.reward_name else method.label.replace("FactS", f"`{reward}`")


def train_method(
    plan: AblationPlan,
    method: Method,
    seed: int,
    *,
    pool_csv: Path,
    pool_size: int,
    model_dir: str,
    held_out: HeldOut,
    log: Callable[[str], None] = print,
) -> dict:
    """Train one method with one seed through `train_round`; evaluate at the plan's checkpoints; return its record."""
    from transformers import TrainerCallback, set_seed

    from orapo_core.experimental.ablation import train_ablation_round  # noqa: PLC0415 -- loads trl, peft

    run_dir = Path(plan.out_dir) / "runs" / method.name / f"seed{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    script_args, training_args, model_args = method_recipe(
        plan, method, seed, pool_csv=pool_csv, model_dir=model_dir, run_dir=run_dir
    )
    per_step = training_args.studies_per_step
    checkpoints = plan.checkpoint_steps()
    probe = held_out.records[: plan.probe_studies]
    probe_images, probe_oracles = held_out.images[: len(probe)], [r.report for r in probe]
    curve: list[dict] = []
    likelihood: list[dict] = []
    final: dict = {}
    trained: dict = {}

    class Checkpoints(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
            likelihood.append(
                {"step": 0, "oracle_logp": oracle_logp(model, processing_class, probe_images, probe_oracles)}
            )

        def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
            step = state.global_step
            likelihood.append(
                {"step": step, "oracle_logp": oracle_logp(model, processing_class, probe_images, probe_oracles)}
            )
            if step not in checkpoints:
                return
            last = step == plan.steps
            n = plan.n_eval if last else (plan.n_eval_curve or plan.n_eval)
            metrics = evaluate(
                drafter_for(model, processing_class, model_dir),
                held_out,
                n=n,
                batch=plan.eval_batch,
                max_new_tokens=plan.eval_max_new_tokens,
            )
            curve.append(
                {"step": step, "studies_seen": step * per_step, "n_eval": n, **{k: metrics.get(k) for k in REPORTED}}
            )
            scores = EvalMetrics.from_dict(metrics)
            log(
                f"  {method.name} seed {seed} step {step}: macro-F1 {scores.macro_f1_14:.3f}, "
                f"oracle log-prob {likelihood[-1]['oracle_logp']:.3f} (n={n}, {scores.seconds:.0f}s)"
            )
            if last:
                final.update(metrics)
                trained["model"], trained["processor"] = model, processing_class

    set_seed(seed)  # the LoRA initialisation happens before the trainer seeds itself
    started = time.perf_counter()
    train_ablation_round(script_args, training_args, model_args, callbacks=[Checkpoints()])
    wall = time.perf_counter() - started
    unverified = None
    if method.corrections and trained:
        # As the app drafts with the version: with the finding verifier its round fitted (none: the drafts as they are).
        from orapo_core.models.verifier import FindingVerifier, describe  # noqa: PLC0415 -- loads numpy

        verifier = FindingVerifier.load(run_dir)
        log(f"  {method.name} seed {seed}: finding verifier {describe(verifier) or 'none'}")
        if verifier is not None:
            drafter = drafter_for(trained["model"], trained["processor"], model_dir)
            drafter.verifier = verifier
            unverified = {k: final.get(k) for k in REPORTED} | {PER_CLASS: EvalMetrics.from_dict(final).f1_per_class}
            final.update(
                evaluate(
                    drafter, held_out, n=plan.n_eval, batch=plan.eval_batch, max_new_tokens=plan.eval_max_new_tokens
                )
            )
            log(
                f"  {method.name} seed {seed}, with the verifier: macro-F1 {EvalMetrics.from_dict(final).macro_f1_14:.3f}, "
                f"rare-finding F1 {final['rare_f1']:.3f} (without: {EvalMetrics.from_dict(unverified).macro_f1_14:.3f}, "
                f"{unverified['rare_f1']:.3f})"
            )
    trained.clear()
    if not plan.keep_weights:
        for pattern in WEIGHT_FILES:
            for path in run_dir.glob(pattern):
                path.unlink()
    steps = read_metrics(run_dir / "metrics.jsonl")
    step_times = [s["step_time"] for s in steps if s.get("step_time")]
    return {
        "seed": seed,
        "train_studies": min(method.train_studies, pool_size),
        "studies_per_step": per_step,
        "wall_seconds": wall,
        "metrics": final,
        "curve": curve,
        "oracle_logp": likelihood,
        "step_seconds": statistics.median(step_times) if step_times else None,
        "metrics_jsonl": str(run_dir / "metrics.jsonl"),
        **({"metrics_without_verifier": unverified} if unverified is not None else {}),
    }


def read_metrics(path: Path) -> list[dict]:
    """The training steps of a run's metrics.jsonl (the lines that carry OraPO's per-step metrics)."""
    if not Path(path).is_file():
        return []
    return [
        r
        for r in (json.loads(line) for line in Path(path).read_text().splitlines() if line.strip())
        if "orapo/zero_reward_frac" in r
    ]


# --------------------------------------------------------------------------- the whole ablation


def _mean_std(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def pooled_seed_std(rows: dict, key: str) -> float | None:
    """sqrt of the mean over trained methods of each method's variance across seeds: the noise a difference
    between two methods has to clear. None with fewer than two seeds."""
    variances = []
    for row in rows.values():
        values = [r["metrics"][key] for r in row["runs"] if r["seed"] is not None and r["metrics"].get(key) is not None]
        if len(values) > 1:
            variances.append(statistics.variance(values))
    return math.sqrt(statistics.fmean(variances)) if variances else None


def resolve_model(plan: AblationPlan) -> str:
    """The starting model: the plan's, else the recipe's model_name_or_path, else the served model."""
    from orapo_core.train.config import parse_recipe  # noqa: PLC0415 -- loads trl, peft

    if plan.model_dir:
        return str(plan.model_dir)
    _, _, model_args = parse_recipe(plan.recipe)
    return str(resolve_model_dir(model_args.model_name_or_path))


def run_ablation(plan: AblationPlan, log: Callable[[str], None] = print) -> dict:
    """Run every method of the plan, write results.json, results.md and the plots, and return the results."""
    from orapo_core.models.draft import Drafter  # noqa: PLC0415 -- loads numpy

    unknown = [m for m in plan.methods if m not in METHODS]
    if unknown:
        raise OrapoError("unknown_method", f"Unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}.")
    _, recipe_args, _ = shared_recipe(plan)  # a bad recipe or override fails here, before any work
    if plan.reward:
        get_reward(plan.reward)  # ... and so does an unknown reward
    out = Path(plan.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    model_dir = resolve_model(plan)
    data_dir = out / "data"
    # A method that asks for more studies than the pool holds trains on the whole pool (its record says how many).
    tag = "".join(f"-{k}{v:g}" for k, v in sorted(plan.prevalence.items()))
    pool_csv, pool = phantom_split(
        data_dir / f"train-seed{plan.train_seed}-n{plan.pool_studies}{tag}",
        plan.pool_studies,
        plan.train_seed,
        plan.image_size,
        plan.conspicuity,
        plan.prevalence,
    )
    _, held = phantom_split(
        data_dir / f"heldout-seed{plan.eval_seed}-n{plan.n_eval}{tag}",
        plan.n_eval,
        plan.eval_seed,
        plan.image_size,
        plan.conspicuity,
        plan.prevalence,
    )
    held_out = HeldOut(held)
    log(
        f"data: {len(pool)} training-pool studies (seed {plan.train_seed}), {len(held)} held-out (seed {plan.eval_seed}), "
        f"{time.perf_counter() - started:.0f}s"
    )

    drafter = Drafter.from_dir(model_dir)
    curve_n = plan.n_eval_curve or plan.n_eval
    start_eval = {
        n: evaluate(drafter, held_out, n=n, batch=plan.eval_batch, max_new_tokens=plan.eval_max_new_tokens)
        for n in sorted({plan.n_eval, curve_n})
    }
    probe = held_out.records[: plan.probe_studies]
    start_logp = oracle_logp(
        drafter.loaded.model, drafter.loaded.processor, held_out.images[: len(probe)], [r.report for r in probe]
    )
    corrected = None
    if any(METHODS[m].corrections for m in plan.methods):
        corrected = corrected_pool(
            pool_csv,
            pool,
            drafter,
            threshold=recipe_args["zero_reward_threshold"],
            batch=plan.eval_batch,
            max_new_tokens=plan.eval_max_new_tokens,
        )
        log(
            f"corrections: the starting model's drafts of {corrected[1]['corrected']} of {len(pool)} pool studies "
            f"corrected to the reference (rare findings added: {corrected[1]['rare_findings_added']}), "
            f"{corrected[1]['draft_seconds']:.0f}s"
        )
    del drafter
    start_point = {"step": 0, "studies_seen": 0, "n_eval": curve_n, **{k: start_eval[curve_n].get(k) for k in REPORTED}}
    starter_scores = EvalMetrics.from_dict(start_eval[plan.n_eval])
    log(
        f"starting model ({model_dir}): macro-F1 {starter_scores.macro_f1_14:.3f} on {plan.n_eval} held-out "
        f"studies ({starter_scores.seconds:.0f}s)"
    )

    results: dict = {
        "plan": plan.to_dict(),
        "model": model_dir,
        "checkpoint_steps": plan.checkpoint_steps(),
        "recipe": {k: recipe_args[k] for k in RECIPE_KEYS if k in recipe_args},
        "methods": {},
    }
    results["reference_positives"] = start_eval[plan.n_eval]["reference_positives"]
    results["starter_positives"] = start_eval[plan.n_eval]["positives"]
    if corrected is not None:
        results["corrections"] = corrected[1]

    def record_method(name: str, method: Method, runs: list[dict]) -> None:
        summary = {k: _mean_std([r["metrics"].get(k) for r in runs]) for k in REPORTED}
        per_class = [EvalMetrics.from_dict(r["metrics"]).f1_per_class for r in runs]
        results["methods"][name] = {
            "label": method_label(plan, method),
            "reward": method.reward_name,
            "oracle_mode": method.oracle_mode if method.reward_name else None,
            "train_studies": min(method.train_studies, len(pool)) if method.reward_name else 0,
            "mean": {k: v[0] for k, v in summary.items()},
            "std": {k: v[1] for k, v in summary.items()},
            PER_CLASS: {c: _mean_std([p[c] for p in per_class])[0] for c in per_class[0]},
            "runs": [
                {k: v for k, v in r.items() if k != "metrics"}
                | {
                    "metrics": {
                        k: r["metrics"][k]
                        for k in (*REPORTED, PER_CLASS, "example_draft", "positives")
                        if k in r["metrics"]
                    }
                }
                for r in runs
            ],
        }
        trained = {k: v for k, v in results["methods"].items() if v["reward"] is not None}
        results["pooled_seed_std"] = {k: pooled_seed_std(trained, k) for k in REPORTED}
        results["wall_seconds"] = time.perf_counter() - started
        write_outputs(results, out)  # after every seed, so a long run can be read (or stopped) while it goes on

    for name in plan.methods:
        method = METHODS[name]
        if method.reward_name is None:
            record_method(
                name,
                method,
                [
                    {
                        "seed": None,
                        "wall_seconds": 0.0,
                        "metrics": start_eval[plan.n_eval],
                        "curve": [start_point],
                        "oracle_logp": [{"step": 0, "oracle_logp": start_logp}],
                    }
                ],
            )
            continue
        runs = []
        for seed in plan.seeds:
            log(f"{name} (seed {seed}) ...")
            record = train_method(
                plan,
                method,
                seed,
                pool_csv=corrected[0] if method.corrections else pool_csv,
                pool_size=len(pool),
                model_dir=model_dir,
                held_out=held_out,
                log=log,
            )
            record["curve"].insert(0, start_point)
            runs.append(record)
            log(
                f"{name} seed {seed}: macro-F1 {EvalMetrics.from_dict(record['metrics']).macro_f1_14:.3f}, "
                f"{record['wall_seconds']:.0f}s"
            )
            record_method(name, method, runs)
    return results


def merge_results(parts: Sequence[dict]) -> dict:
    """One ablation from runs of the same plan that each ran some of its methods or seeds (say, one process per
    method and seed on a 2-core machine): their methods side by side, a method's seeds from several parts pooled
    into one row, the pooled seed std over all, the wall time the longest part's. Refused (`ablation_mismatch`)
    when the parts differ in anything but their methods, seeds and output folder, or when two parts ran the same
    method on the same seed."""
    if not parts:
        raise OrapoError("ablation_mismatch", "Nothing to merge: give the results.json of at least one run.")

    def shared(part: dict) -> dict:
        return {k: v for k, v in part["plan"].items() if k not in ("methods", "out_dir", "seeds")} | {
            "model": part.get("model"),
            "recipe": part.get("recipe"),
        }

    first = shared(parts[0])
    merged = {k: v for k, v in parts[0].items() if k not in ("methods", "pooled_seed_std")}
    merged["methods"] = {}
    for part in parts:
        if shared(part) != first:
            differs = sorted(k for k in first if shared(part).get(k) != first[k])
            raise OrapoError(
                "ablation_mismatch",
                f"These runs do not share one plan (they differ in "
                f"{', '.join(differs)}); only runs of one plan can be merged.",
            )
        for name, row in part["methods"].items():
            if name in merged["methods"]:
                had = {r["seed"] for r in merged["methods"][name]["runs"]}
                if had & {r["seed"] for r in row["runs"]}:
                    raise OrapoError(
                        "ablation_mismatch", f"Two of the runs trained {name} on the same seed; keep one of them."
                    )
                row = pooled_runs(merged["methods"][name], row)
            merged["methods"][name] = row
    seeds = sorted({r["seed"] for row in merged["methods"].values() for r in row["runs"] if r["seed"] is not None})
    merged["plan"] = dict(
        parts[0]["plan"],
        methods=[m for m in METHODS if m in merged["methods"]],
        seeds=seeds or parts[0]["plan"].get("seeds"),
    )
    merged["methods"] = {m: merged["methods"][m] for m in METHODS if m in merged["methods"]}
    trained = {k: v for k, v in merged["methods"].items() if v["reward"] is not None}
    merged["pooled_seed_std"] = {k: pooled_seed_std(trained, k) for k in REPORTED}
    merged["wall_seconds"] = max(part.get("wall_seconds", 0.0) for part in parts)
    # A part that is itself a merge brings its own runs' commands, so merging again keeps every command.
    merged["merged_from"] = [
        command
        for part in parts
        for command in part.get("merged_from") or [part.get("command", part["plan"].get("out_dir"))]
    ]
    corrections = next((part["corrections"] for part in parts if part.get("corrections")), None)
    if corrections is not None:  # the part that ran the corrected method, whichever it is
        merged["corrections"] = corrections
    return merged


def pooled_runs(row: dict, other: dict) -> dict:
    """One method's row from two rows of it on different seeds: the runs together (by seed), mean and std again."""
    runs = sorted(row["runs"] + other["runs"], key=lambda r: r["seed"])
    summary = {k: _mean_std([r["metrics"].get(k) for r in runs]) for k in REPORTED}
    per_class = [EvalMetrics.from_dict(r["metrics"]).f1_per_class for r in runs]
    per_class = [p for p in per_class if p]
    return row | {
        "runs": runs,
        "mean": {k: v[0] for k, v in summary.items()},
        "std": {k: v[1] for k, v in summary.items()},
        PER_CLASS: {c: _mean_std([p[c] for p in per_class])[0] for c in per_class[0]} if per_class else {},
    }


def shared_recipe(plan: AblationPlan) -> tuple[dict, dict, dict]:
    """The recipe with the plan's overrides and budget (no method), as plain dicts: what every method shares."""
    from orapo_core.experimental.ablation import parse_ablation_recipe  # noqa: PLC0415 -- loads trl, peft

    settings = dict(plan.overrides, max_steps=plan.steps, output_dir=str(Path(plan.out_dir) / "runs"))
    if plan.learning_rate is not None:
        settings["learning_rate"] = plan.learning_rate
    script_args, training_args, model_args = parse_ablation_recipe(plan.recipe, settings)
    training = training_args.to_dict() | {
        "use_peft": model_args.use_peft,
        "lora_r": model_args.lora_r,
        "lora_alpha": model_args.lora_alpha,
    }
    return asdict(script_args), training, asdict(model_args)


# --------------------------------------------------------------------------- outputs


def markdown_table(results: dict) -> str:
    from orapo_core.train.config import OraPOConfig  # noqa: PLC0415 -- loads trl, peft

    plan, recipe = results["plan"], results.get("recipe", {})
    seeds = len(plan["seeds"])
    per_step = OraPOConfig.studies_per_step_of(
        recipe.get("per_device_train_batch_size", 0),
        recipe.get("gradient_accumulation_steps", 1),
        recipe.get("num_generations", 1),
    )
    lora = (f"LoRA r={recipe.get('lora_r')}" if recipe.get("use_peft") else "full fine-tuning") if recipe else ""
    lines = [
        f"Recipe: {Path(plan['recipe']).name} ({lora}, learning rate {recipe.get('learning_rate')}); "
        f"every trained method: {plan['steps']} optimizer steps x {per_step} studies x K={recipe.get('num_generations')} "
        f"rollouts, trained by `train_round`"
        + (
            f", with {', '.join(f'{k}={v}' for k, v in plan['overrides'].items())} for every method"
            if plan.get("overrides")
            else ""
        )
        + (
            f"; the FactS methods trained on the reward `{plan['reward']}` instead of FactS (a diagnostic, not the "
            f"paper's table)"
            if plan.get("reward")
            else ""
        )
        + f". Held-out: {plan['n_eval']} PhantomCXR studies (seed {plan['eval_seed']}"
        + ("" if plan["eval_seed"] == AblationPlan.eval_seed else ", a development set, not the evaluation set")
        + "), "
        + (
            f"with PhantomCXR's prevalence set to {', '.join(f'{k} {v:g}' for k, v in plan['prevalence'].items())} "
            f"in the pool and the held-out studies, "
            if plan.get("prevalence")
            else ""
        )
        + f"scored by `evaluate_drafter`; mean ± std over {seeds} seed(s).",
        "",
        "| Method | Macro-F1 (14) | Precision | Recall | Rare-finding F1 | Rare precision | Rare recall | Micro-F1 (14) "
        "| FactS reward | Words |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["methods"].values():
        m, s = row["mean"], row["std"]

        def cell(key, digits=3, m=m, s=s, row=row):
            if m.get(key) is None or (isinstance(m[key], float) and math.isnan(m[key])):
                return "–"
            return f"{m[key]:.{digits}f}" + (f" ± {s[key]:.{digits}f}" if len(row["runs"]) > 1 else "")

        lines.append(
            f"| {row['label']} | {cell('macro_f1_14')} | {cell('macro_precision_14')} | {cell('macro_recall_14')} "
            f"| {cell('rare_f1')} | {cell('rare_precision')} | {cell('rare_recall')} | {cell('micro_f1_14')} "
            f"| {cell('facts_reward_mean')} | {cell('mean_report_length', 1)} |"
        )
    pooled = results.get("pooled_seed_std") or {}
    if any(v is not None for v in pooled.values()):
        names = {
            "macro_f1_14": "macro-F1",
            "macro_precision_14": "precision",
            "macro_recall_14": "recall",
            "rare_f1": "rare-finding F1",
            "rare_precision": "rare precision",
            "rare_recall": "rare recall",
        }
        shown = ", ".join(f"{label} {pooled[k]:.3f}" for k, label in names.items() if pooled.get(k) is not None)
        lines += [
            "",
            f"Pooled seed std over the trained methods (√ of the mean per-method variance): {shown}. "
            "A difference between two methods smaller than about twice this is seed noise.",
        ]
    else:
        lines += ["", "Pooled seed std: needs at least two seeds."]
    paired = paired_lines(results)
    if paired:
        lines += ["", *paired]
    lines += [
        "",
        "Rare findings, F1 per class (mean over seeds):",
        "",
        "| Method | " + " | ".join(RARE_FINDINGS) + " |",
        "|---|" + "---|" * len(RARE_FINDINGS),
    ]
    for row in results["methods"].values():
        lines.append(
            f"| {row['label']} | "
            + " | ".join(f"{row[PER_CLASS].get(c, float('nan')):.3f}" for c in RARE_FINDINGS)
            + " |"
        )
    corrections = results.get("corrections")
    if corrections:
        added = ", ".join(f"{k.lower()} {v}" for k, v in corrections["rare_findings_added"].items())
        lines += [
            "",
            f"Corrections (the corrected method's pool): the starting model's drafts of "
            f"{corrections['corrected']} of {corrections['studies']} pool studies corrected to the reference; "
            f"they added {added}. Its final scores draft with the finding verifier its round fitted, if any.",
        ]
    lines += ["", f"Wall time: {results.get('wall_seconds', 0) / 60:.1f} min."]
    return "\n".join(lines) + "\n"


def paired_lines(results: dict, *, resamples: int = 1000) -> list[str]:
    """Each trained method's macro-F1 and rare-finding F1 against the starting model's on the same held-out studies,
    then each trained method's against each one above it in the table (seeds averaged on both sides; `paired_delta`),
    for the runs that kept their per-study labels (results from before 2026-12-05 did not)."""
    reference, starter = results.get("reference_positives"), results.get("starter_positives")
    if not reference or not starter:
        return []
    trained = []
    for row in results["methods"].values():
        runs = [
            r["metrics"]["positives"]
            for r in row["runs"]
            if r["seed"] is not None and len(r["metrics"].get("positives") or ()) == len(reference)
        ]
        if runs:
            trained.append((row["label"], runs))

    def cells(runs, baselines) -> str:
        out = []
        for observations in (None, RARE_FINDINGS):
            d = paired_delta(runs, baselines, reference, observations=observations, resamples=resamples)
            out.append(f"{d['delta']:+.4f} | [{d['low']:+.4f}, {d['high']:+.4f}]")
        return " | ".join(out)

    if not trained:
        return []
    lines = [
        f"Minus the starting model's, on the same {len(reference)} held-out studies, averaged over the seeds, "
        f"with a 95 % interval from resampling the studies ({resamples:,} resamples): the held-out set's noise, which the "
        "seed std above does not include. An interval that holds 0 is no difference.",
        "",
        "| Method | Δ macro-F1 vs starter | 95 % interval | Δ rare-finding F1 | 95 % interval | seeds |",
        "|---|---|---|---|---|---|",
        *(f"| {label} | {cells(runs, [starter])} | {len(runs)} |" for label, runs in trained),
    ]
    pairs = [(trained[j], trained[i]) for i in range(len(trained)) for j in range(i)]
    if pairs:
        lines += [
            "",
            "Between the trained methods, each minus one above it in the table, on the same studies (both "
            "sides averaged over their seeds, the same resamples):",
            "",
            "| Method | minus | Δ macro-F1 | 95 % interval | Δ rare-finding F1 | 95 % interval | seeds |",
            "|---|---|---|---|---|---|---|",
            *(f"| {b[0]} | {a[0]} | {cells(b[1], a[1])} | {len(b[1])} vs {len(a[1])} |" for a, b in pairs),
        ]
    return lines


def _by_step(rows: list[list[dict]], key: str) -> tuple[list[int], list[float]]:
    """Per step, the mean of `key` over the runs that logged it."""
    values: dict[int, list[float]] = {}
    for run in rows:
        for r in run:
            if r.get(key) is not None:
                values.setdefault(int(r["step"]), []).append(float(r[key]))
    steps = sorted(values)
    return steps, [statistics.fmean(values[s]) for s in steps]


def _smooth(values: list[float], window: int = 5) -> list[float]:
    return [statistics.fmean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def write_outputs(results: dict, out: Path, *, include_plotlyjs: bool | str = True) -> None:
    """results.json, results.md and the three plots; `include_plotlyjs="directory"` shares one plotly.min.js
    beside the plots instead of inlining it in each (as the published results in `benchmarks/results/` do)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (out / "results.md").write_text(markdown_table(results))
    try:
        import plotly.graph_objects as go
    except ImportError:  # plots are optional; the numbers are not
        return
    curves, zeros, likelihood = go.Figure(), go.Figure(), go.Figure()
    for row in results["methods"].values():
        runs = row["runs"]
        steps, f1 = _by_step(
            [
                [{"step": p["studies_seen"], "f1": EvalMetrics.from_dict(p).macro_f1_14} for p in r["curve"]]
                for r in runs
            ],
            "f1",
        )
        curves.add_trace(go.Scatter(x=steps, y=f1, mode="lines+markers", name=row["label"]))
        if row["reward"] is None:
            continue
        logged = [read_metrics(Path(r["metrics_jsonl"])) for r in runs if r.get("metrics_jsonl")]
        if any(logged):
            x, y = _by_step(logged, "orapo/all_zero_group_frac")
            zeros.add_trace(go.Scatter(x=x, y=_smooth(y), mode="lines", name=row["label"]))
        x, y = _by_step([r.get("oracle_logp", []) for r in runs], "oracle_logp")
        likelihood.add_trace(go.Scatter(x=x, y=y, mode="lines", name=row["label"]))
    threshold = results.get("recipe", {}).get("zero_reward_threshold", 0.0)
    fails = "score 0" if not threshold else f"fail (FactS ≤ {threshold:g}, the recipe's zero_reward_threshold)"
    curves.update_layout(
        title="Macro-F1 (14 observations, held-out PhantomCXR) against training studies seen",
        xaxis_title="training studies seen (steps x studies per step)",
        yaxis_title="macro-F1",
    )
    zeros.update_layout(
        title="Fraction of all-fail groups per step (mean over seeds, moving average of 5)",
        xaxis_title="optimizer step",
        yaxis_title=f"fraction of groups whose K rollouts all {fails}",
    )
    likelihood.update_layout(
        title="Log-likelihood of the oracle report under the policy (held-out probe, mean over seeds)",
        xaxis_title="optimizer step",
        yaxis_title="mean per-token log-prob of the reference report",
    )
    curves.write_html(out / "macro_f1_vs_studies.html", include_plotlyjs=include_plotlyjs)
    zeros.write_html(out / "all_zero_groups.html", include_plotlyjs=include_plotlyjs)
    likelihood.write_html(out / "oracle_logp.html", include_plotlyjs=include_plotlyjs)
