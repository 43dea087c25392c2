"""The ablation harness (`benchmarks/ablation.py`) end to end on a tiny random VLM: three methods, two steps each.

It must train through `train_round` on a recipe with the method's overrides and the shared budget, score through
`evaluate_drafter`, and write the table, the JSON and the three plots.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support.tiny_vlms import build_tiny_vlm

pytest.importorskip("trl")
pytestmark = pytest.mark.slow  # three methods trained and evaluated
ROOT = Path(__file__).resolve().parents[1]

SMOKE = ROOT / "orapo_core" / "train" / "recipes" / "smoke-cpu.yaml"
TINY = {
    "per_device_train_batch_size": 4,
    "num_generations": 2,
    "max_completion_length": 8,
    "use_peft": True,
    "lora_r": 4,
    "lora_alpha": 8,
    "lora_target_modules": ["q_proj", "v_proj"],
    "learning_rate": 1.0e-2,
}


@pytest.fixture(scope="module")
def ablation(tmp_path_factory):
    from benchmarks.ablation import AblationPlan, run_ablation

    tmp = tmp_path_factory.mktemp("ablation")
    model_dir = build_tiny_vlm(tmp / "model", family="qwen2_vl")
    plan = AblationPlan(
        out_dir=str(tmp / "out"),
        model_dir=str(model_dir),
        recipe=str(SMOKE),
        methods=("starter", "grpo_facts", "orapo_400", "orapo_corrected"),
        seeds=(0,),
        steps=2,
        learning_rate=5e-3,
        overrides=TINY,
        checkpoints=2,
        n_eval=4,
        probe_studies=3,
        pool_studies=6,
        image_size=64,
        eval_batch=4,
        eval_max_new_tokens=8,
    )
    return plan, run_ablation(plan, log=lambda line: None)


def test_each_method_trains_through_the_round_code_with_the_shared_budget(ablation):
    plan, results = ablation
    out = Path(plan.out_dir)
    saved = json.loads((out / "results.json").read_text())
    assert set(saved["methods"]) == {"starter", "grpo_facts", "orapo_400", "orapo_corrected"}
    orapo, grpo = saved["methods"]["orapo_400"], saved["methods"]["grpo_facts"]
    assert orapo["oracle_mode"] == "dpo" and grpo["oracle_mode"] == "none"
    for name, row in (("orapo_400", orapo), ("grpo_facts", grpo)):
        run = row["runs"][0]
        # train_round wrote the round's resolved recipe: the method's overrides on the recipe, the budget shared
        recipe = json.loads((out / "runs" / name / "seed0" / "orapo_recipe.json").read_text())
        assert recipe["training"]["max_steps"] == 2 and recipe["training"]["learning_rate"] == 5e-3
        assert recipe["training"]["oracle_mode"] == row["oracle_mode"] and recipe["training"]["reward_name"] == "facts"
        assert (
            recipe["model"]["use_peft"] and recipe["model"]["lora_r"] == 4
        )  # LoRA as the recipe (here: overrides) says
        assert recipe["script"]["class_balanced"] and recipe["script"]["max_studies"] == (
            400 if name == "orapo_400" else 1000
        )
        assert recipe["model"]["model_name_or_path"] == plan.model_dir
        assert run["train_studies"] == 6  # asks for 400 or 1000, the pool holds 6
        assert [p["step"] for p in run["curve"]] == [0, 1, 2]  # the starting point, then the checkpoints
        assert [p["studies_seen"] for p in run["curve"]] == [0, 2, 4]  # 4 completions / K=2 = 2 studies a step
        assert [p["step"] for p in run["oracle_logp"]] == [0, 1, 2]
        assert all(p["oracle_logp"] < 0 for p in run["oracle_logp"])
        logged = [json.loads(line) for line in Path(run["metrics_jsonl"]).read_text().splitlines()]
        assert sum("orapo/all_zero_group_frac" in line for line in logged) == 2
        assert not list((out / "runs" / name / "seed0").glob("*.safetensors"))  # only the metrics are kept
    assert results["checkpoint_steps"] == [1, 2]
    # The corrected method trains the same pool with the readers' pairs of the starter's wrong drafts, and uses them.
    recipe = json.loads((out / "runs" / "orapo_corrected" / "seed0" / "orapo_recipe.json").read_text())
    assert (
        recipe["script"]["train_csv"].endswith("corrected-by-starter.csv") and recipe["training"]["use_clinician_pairs"]
    )
    assert saved["corrections"]["studies"] == 6 and 0 <= saved["corrections"]["corrected"] <= 6
    assert (
        f"drafts of {saved['corrections']['corrected']} of 6 pool studies corrected" in (out / "results.md").read_text()
    )
    assert not json.loads((out / "runs" / "orapo_400" / "seed0" / "orapo_recipe.json").read_text())["script"][
        "train_csv"
    ].endswith("corrected-by-starter.csv")
    # the probe's oracle log-likelihood moves with training, and starts where the untrained model is
    start = saved["methods"]["starter"]["runs"][0]["oracle_logp"][0]["oracle_logp"]
    assert orapo["runs"][0]["oracle_logp"][0]["oracle_logp"] == pytest.approx(start, abs=1e-4)
    assert orapo["runs"][0]["oracle_logp"][-1]["oracle_logp"] != pytest.approx(start, abs=1e-6)


def test_the_table_reports_rare_findings_precision_recall_and_seed_noise(ablation):
    from benchmarks.ablation import RARE_FINDINGS, REPORTED

    plan, _ = ablation
    out = Path(plan.out_dir)
    saved = json.loads((out / "results.json").read_text())
    for row in saved["methods"].values():
        assert set(row["mean"]) == set(REPORTED) and set(row["std"]) == set(REPORTED)
        assert all(
            0.0 <= row["mean"][k] <= 1.0
            for k in (
                "macro_f1_14",
                "macro_precision_14",
                "macro_recall_14",
                "rare_f1",
                "rare_precision",
                "rare_recall",
            )
        )
        assert len(row["f1_per_class"]) == 14
    assert set(saved["pooled_seed_std"]) == set(REPORTED) and saved["pooled_seed_std"]["macro_f1_14"] is None  # 1 seed
    table = (out / "results.md").read_text()
    assert "| OraPO + FactS (400 studies) |" in table and "Rare-finding F1 | Rare precision | Rare recall" in table
    # per-study labels are kept, so each trained method is compared with the starter on the same studies
    assert len(saved["reference_positives"]) == len(saved["starter_positives"]) == plan.n_eval
    assert all(len(r["metrics"]["positives"]) == plan.n_eval for r in saved["methods"]["grpo_facts"]["runs"])
    paired = table.split("| Δ macro-F1 vs starter | 95 % interval | Δ rare-finding F1 | 95 % interval | seeds |")[1]
    versus_starter, between = paired.split("Between the trained methods")[0], paired.split("Rare findings")[0]
    number = r"[+-]\d\.\d{4}"
    interval = rf"{number} \| \[{number}, {number}\]"
    assert re.search(rf"\| GRPO \+ FactS \| {interval} \| {interval} \| 1 \|", versus_starter)
    assert "Starting model" not in versus_starter  # the baseline is not compared with itself
    # each trained method against each one above it: OraPO (400) minus GRPO + FactS, on the same studies
    assert re.search(
        rf"\| OraPO \+ FactS \(400 studies\) \| GRPO \+ FactS \| {interval} \| {interval} \| 1 vs 1 \|", between
    )
    assert all(name in table for name in RARE_FINDINGS) and "Pooled seed std" in table
    for plot in ("macro_f1_vs_studies.html", "all_zero_groups.html", "oracle_logp.html"):
        assert (out / plot).stat().st_size > 0


def test_held_out_and_training_studies_never_overlap(ablation):
    from orapo_core.train.dataset import load_training_records

    plan, _ = ablation
    held, pool = (load_training_records(d) for d in sorted((Path(plan.out_dir) / "data").iterdir()) if d.is_dir())
    assert len(held) + len(pool) == 10 and not {r.study_id for r in pool} & {r.study_id for r in held}
    assert not {p.read_bytes() for r in pool for p in r.image_paths} & {
        p.read_bytes() for r in held for p in r.image_paths
    }


def test_pooled_seed_std_is_the_root_mean_of_the_methods_variances():
    from benchmarks.ablation import pooled_seed_std

    def row(values):
        return {"runs": [{"seed": i, "metrics": {"macro_f1_14": v}} for i, v in enumerate(values)]}

    # variances 1.0 and 4.0 (sample variance of [1, 2, 3] and [2, 4, 6]) -> sqrt(2.5)
    assert pooled_seed_std({"a": row([1, 2, 3]), "b": row([2, 4, 6])}, "macro_f1_14") == pytest.approx(2.5**0.5)
    assert pooled_seed_std({"a": row([0.5])}, "macro_f1_14") is None


def test_the_paired_comparison_is_macro_f1_on_the_same_studies_with_a_resampled_interval():
    import random

    from benchmarks.ablation import RARE_FINDINGS, paired_delta, positives_of
    from orapo_core.facts.metrics import clinical_efficacy
    from orapo_core.facts.ontology import CHEXPERT_14

    rng = random.Random(3)

    def labels():
        return {name: rng.choice([1, 0, None, -1]) for name in CHEXPERT_14}

    reference = [labels() for _ in range(60)]
    baseline = [labels() for _ in range(60)]
    better = [dict(r) for r in reference[:30]] + [labels() for _ in range(30)]  # right on half the studies
    as_bits = [positives_of(x) for x in reference]
    d = paired_delta([[positives_of(x) for x in better]], [[positives_of(x) for x in baseline]], as_bits, resamples=200)
    # the point estimate is exactly the difference of the evaluator's macro-F1s
    expected = clinical_efficacy(better, reference).macro_f1_14 - clinical_efficacy(baseline, reference).macro_f1_14
    assert d["delta"] == pytest.approx(expected) and d["studies"] == 60 and d["runs"] == d["baseline_runs"] == 1
    assert 0 < d["low"] < d["delta"] < d["high"]  # a real gain: the interval excludes 0
    same = paired_delta(
        [[positives_of(x) for x in baseline]], [[positives_of(x) for x in baseline]], as_bits, resamples=50
    )
    assert same["delta"] == same["low"] == same["high"] == 0.0
    # seeds average: one run as good as the baseline and one better give half the gain
    two = paired_delta(
        [[positives_of(x) for x in baseline], [positives_of(x) for x in better]],
        [[positives_of(x) for x in baseline]],
        as_bits,
        resamples=50,
    )
    assert two["delta"] == pytest.approx(expected / 2) and two["runs"] == 2
    # ... on both sides: a baseline method's two seeds (one as good as `better`) average too
    method = paired_delta(
        [[positives_of(x) for x in better]],
        [[positives_of(x) for x in baseline], [positives_of(x) for x in better]],
        as_bits,
        resamples=50,
    )
    assert method["delta"] == pytest.approx(expected / 2) and method["baseline_runs"] == 2
    # narrowed to some observations, it is the difference of the evaluator's macro-F1 over those
    rare = RARE_FINDINGS
    narrowed = paired_delta(
        [[positives_of(x) for x in better]],
        [[positives_of(x) for x in baseline]],
        as_bits,
        observations=rare,
        resamples=50,
    )
    assert narrowed["delta"] == pytest.approx(
        clinical_efficacy(better, reference, observations=rare).macro_f1_14
        - clinical_efficacy(baseline, reference, observations=rare).macro_f1_14
    )
    assert narrowed["delta"] != pytest.approx(expected)


def test_runs_of_one_plan_merge_into_one_table_and_others_are_refused():
    from benchmarks.ablation import merge_results
    from orapo_core.errors import OrapoError

    def part(methods, steps=400, out="a"):
        rows = {}
        for name, values in methods.items():
            runs = [
                {"seed": None if name == "starter" else i, "metrics": {"macro_f1_14": v}} for i, v in enumerate(values)
            ]
            rows[name] = {"label": name, "reward": None if name == "starter" else "facts", "runs": runs}
        return {
            "plan": {"steps": steps, "seeds": [0, 1, 2], "methods": list(methods), "out_dir": out},
            "model": "m",
            "recipe": {"lora_r": 16},
            "methods": rows,
            "wall_seconds": 10.0 * len(methods),
        }

    merged = merge_results(
        [part({"orapo_1000": [0.4, 0.5, 0.6], "starter": [0.44]}, out="b"), part({"grpo_facts": [1, 2, 3]})]
    )
    assert list(merged["methods"]) == ["starter", "grpo_facts", "orapo_1000"]  # the table's order, not the parts'
    assert merged["plan"]["methods"] == ["starter", "grpo_facts", "orapo_1000"] and merged["wall_seconds"] == 20.0
    # sample variances 0.01 and 1.0 over the trained methods; the starter has none
    assert merged["pooled_seed_std"]["macro_f1_14"] == pytest.approx(((0.01 + 1.0) / 2) ** 0.5)
    assert "corrections" not in merged
    corrected = part({"orapo_corrected": [0.5]}) | {"corrections": {"studies": 6, "corrected": 4}}
    assert merge_results([part({"grpo_facts": [1]}), corrected])["corrections"] == corrected["corrections"]
    # one method's seeds from separate runs pool into one row: seeds 0-2 and 3-4 of grpo_facts
    later = part({"grpo_facts": [4, 5]})
    for i, run in enumerate(later["methods"]["grpo_facts"]["runs"]):
        run["seed"] = 3 + i
    pooled = merge_results([part({"grpo_facts": [1, 2, 3], "starter": [0.44]}), later])
    row = pooled["methods"]["grpo_facts"]
    assert [r["seed"] for r in row["runs"]] == [0, 1, 2, 3, 4] and pooled["plan"]["seeds"] == [0, 1, 2, 3, 4]
    assert row["mean"]["macro_f1_14"] == pytest.approx(3.0) and row["std"]["macro_f1_14"] == pytest.approx(2.5**0.5)
    # merging a merge again (a method run later) keeps the commands of every run behind it, in order
    first, second, third = (part({m: [1]}) | {"command": f"run {m}"} for m in ("grpo_facts", "orapo_1000", "starter"))
    again = merge_results([merge_results([first, second]), third])
    assert again["merged_from"] == ["run grpo_facts", "run orapo_1000", "run starter"]
    for parts, says in (
        ([part({"grpo_facts": [1]}), part({"orapo_1000": [1]}, steps=100)], "steps"),
        ([part({"grpo_facts": [1]}), part({"grpo_facts": [2]})], "grpo_facts"),
        ([], "Nothing"),
    ):
        with pytest.raises(OrapoError) as exc:
            merge_results(parts)
        assert exc.value.code == "ablation_mismatch" and says in exc.value.message


def test_quick_enriches_the_pool_and_held_out_with_the_finding_it_compares_on(tmp_path):
    """--quick is GRPO + FactS against OraPO on a pool and held-out set with pneumothorax in about half the studies;
    the split is written again when the prevalence changes (not reused from the other run's folder)."""
    from benchmarks.ablation import QUICK_PREVALENCE, AblationPlan, markdown_table, phantom_split, quick_plan

    quick = quick_plan(AblationPlan(out_dir=str(tmp_path)))
    assert quick.methods == ("starter", "grpo_facts", "orapo_1000") and quick.seeds == (0,)
    assert quick.prevalence == QUICK_PREVALENCE and quick.steps * 4 <= quick.pool_studies  # no study seen twice
    assert quick_plan(AblationPlan(out_dir=str(tmp_path), prevalence={"fracture": 0.4})).prevalence == {"fracture": 0.4}
    folder = tmp_path / "split"
    _, usual = phantom_split(folder, 40, 7, 64)
    _, enriched = phantom_split(folder, 40, 7, 64, prevalence={"pneumothorax": 0.5})
    with_it = [sum(r.labels.get("Pneumothorax") == 1 for r in records) for records in (usual, enriched)]
    assert with_it[0] <= 6 and 12 <= with_it[1] <= 28
    table = markdown_table({"plan": quick.to_dict(), "methods": {}})
    assert "prevalence set to pneumothorax 0.5 in the pool and the held-out studies" in table


def test_settings_are_chosen_on_a_development_seed_and_the_table_says_so(tmp_path):
    """--eval-seed moves the held-out studies off the evaluation set (seed 202), and the table names a development
    set and the settings every method shared, so a tuned number cannot pass for the evaluation's."""
    from benchmarks.ablation import AblationPlan, markdown_table
    from benchmarks.bench_learning import build_plan, make_parser

    parser = make_parser()
    _, usual = build_plan(parser.parse_args(["--model", str(tmp_path), "--out", str(tmp_path)]))
    _, dev = build_plan(
        parser.parse_args(
            ["--model", str(tmp_path), "--out", str(tmp_path), "--eval-seed", "303", "--set", "beta=0.04"]
        )
    )
    assert usual.eval_seed == AblationPlan.eval_seed == 202 and usual.overrides == {}
    assert dev.eval_seed == 303 and dev.overrides == {"beta": 0.04} and dev.train_seed == usual.train_seed
    tables = [markdown_table({"plan": p.to_dict(), "methods": {}}) for p in (usual, dev)]
    assert "development set" not in tables[0] and "(seed 202)" in tables[0]
    assert "(seed 303, a development set, not the evaluation set)" in tables[1]
    assert "with beta=0.04 for every method" in tables[1]


def test_a_diagnostic_reward_replaces_facts_for_the_facts_methods_only_and_the_table_says_so(tmp_path):
    from benchmarks.ablation import METHODS, markdown_table, method_label, method_recipe, run_ablation
    from benchmarks.bench_learning import build_plan, make_parser
    from orapo_core.errors import OrapoError

    reward = "benchmarks.bench_reward_alignment:label_f1_seen"
    parser = make_parser()
    _, plan = build_plan(parser.parse_args(["--model", str(tmp_path), "--out", str(tmp_path), "--reward", reward]))
    trained = {}
    for name in ("grpo_facts", "orapo_1000", "grpo_accuracy"):
        _, training, _ = method_recipe(
            plan, METHODS[name], 0, pool_csv=tmp_path / "pool.csv", model_dir=str(tmp_path), run_dir=tmp_path / name
        )
        trained[name] = (training.reward_funcs, training.oracle_mode)
    assert trained == {
        "grpo_facts": ([reward], "none"),
        "orapo_1000": ([reward], "dpo"),
        "grpo_accuracy": (["rouge_l"], "none"),
    }  # ROUGE-L is its own row's reward
    assert method_label(plan, METHODS["orapo_1000"]) == f"OraPO + `{reward}` (1,000 studies)"
    assert method_label(plan, METHODS["grpo_accuracy"]) == METHODS["grpo_accuracy"].label
    assert f"trained on the reward `{reward}` instead of FactS (a diagnostic" in markdown_table(
        {"plan": plan.to_dict(), "methods": {}}
    )
    _, usual = build_plan(parser.parse_args(["--model", str(tmp_path), "--out", str(tmp_path)]))
    assert usual.reward is None and "instead of FactS" not in markdown_table({"plan": usual.to_dict(), "methods": {}})
    _, unknown = build_plan(
        parser.parse_args(["--model", str(tmp_path), "--out", str(tmp_path / "x"), "--reward", "no_such_reward"])
    )
    with pytest.raises(OrapoError) as refused:  # before any data is written or model loaded
        run_ablation(unknown, log=lambda line: None)
    assert refused.value.code == "unknown_reward" and not (tmp_path / "x" / "data").exists()
