"""OraPOConfig validation, and recipes parsed the same way from YAML, the command line and a dict."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")

from orapo_core.train.config import OraPOConfig, parse_recipe  # noqa: E402

RECIPES = Path(__file__).parent.parent / "orapo_core" / "train" / "recipes"


def _config(tmp_path, **kwargs) -> OraPOConfig:
    return OraPOConfig(output_dir=str(tmp_path), bf16=False, use_cpu=True, report_to="none", **kwargs)


def test_paper_defaults_and_metrics_path(tmp_path):
    config = _config(tmp_path)
    assert (config.dpo_weight_min, config.dpo_weight_max, config.dpo_weight_gamma) == (0.05, 0.15, 2.0)
    assert config.zero_reward_ema_alpha == 0.5 and config.zero_reward_threshold == 0.0
    assert config.oracle_mode == "dpo" and config.loss_type == "grpo" and config.reward_funcs == ["facts"]
    assert config.metrics_jsonl == str(tmp_path / "metrics.jsonl")
    from dataclasses import fields

    new = {f.name for f in fields(OraPOConfig)} - {f.name for f in fields(__import__("trl").GRPOConfig)}
    assert {"dpo_beta", "use_clinician_pairs", "max_rejected_per_group", "dpo_length_normalize"} <= new
    assert all(f.metadata.get("help") for f in fields(OraPOConfig) if f.name in new | {"loss_type"})


@pytest.mark.parametrize(
    ("kwargs", "fix"),
    [
        ({"oracle_mode": "ppo"}, "oracle_mode must be one of dpo, got 'ppo'"),
        ({"oracle_mode": "sft"}, "'sft' and 'none' are orapo_core.experimental.AblationConfig's"),  # not the product's
        ({"dpo_weight_min": 0.2, "dpo_weight_max": 0.1}, "dpo_weight_min <= dpo_weight_max"),
        ({"dpo_weight_gamma": 0.0}, "dpo_weight_gamma must be > 0"),
        ({"zero_reward_ema_alpha": 1.0}, "zero_reward_ema_alpha must be in [0, 1)"),
        ({"zero_reward_threshold": -0.1}, "use 0.0 for 'reward exactly 0'"),
        ({"dpo_beta": 0.0}, "dpo_beta (τ) must be > 0"),
        ({"max_rejected_per_group": 0}, "max_rejected_per_group must be >= 1 or None"),
        ({"reward_name": "facts", "reward_funcs": ["rouge_l"]}, "reward_name ('facts') is an alias of reward_funcs"),
        ({"reward_funcs": ["facts", "rouge_l"], "reward_weights": [1.0]}, "give one weight per name in reward_funcs"),
        ({"loss_type": "grpo2"}, "loss_type must be one of grpo, bnpo, dr_grpo"),
        ({"importance_sampling_level": "study"}, "importance_sampling_level must be token or sequence"),
        ({"temperature": 0.0}, "temperature must be > 0"),
        ({"top_p": 1.5}, "top_p must lie in (0, 1]"),
        ({"epsilon": -0.2}, "epsilon and epsilon_high (the clipping range) must be >= 0"),
        ({"max_completion_length": 0}, "max_completion_length must be at least 1 token"),
    ],
)
def test_bad_combinations_are_refused_with_a_fix(tmp_path, kwargs, fix):
    with pytest.raises(ValueError) as info:
        _config(tmp_path, **kwargs)
    assert fix in str(info.value)


def test_studies_per_step_is_a_steps_rows_over_each_studys_rollouts(tmp_path):
    # 16 rows a step, 4 rollouts a study: 4 studies; accumulation multiplies the rows
    assert _config(tmp_path, per_device_train_batch_size=16, num_generations=4).studies_per_step == 4
    assert (
        _config(
            tmp_path, per_device_train_batch_size=8, num_generations=4, gradient_accumulation_steps=3
        ).studies_per_step
        == 6
    )
    assert OraPOConfig.studies_per_step_of(4, 1, 8) == 1  # never 0: a step trains on at least one study
    assert OraPOConfig.studies_per_step_of(16, 2, 4) == 8
    # the steps a round takes: max_steps when set, else every epoch's steps, a partial step counted
    config = _config(tmp_path, per_device_train_batch_size=16, num_generations=4, num_train_epochs=3)
    assert config.optimizer_steps(10) == 3 * 3 and config.optimizer_steps(1) == 3
    assert _config(tmp_path, per_device_train_batch_size=16, num_generations=4, max_steps=7).optimizer_steps(100) == 7
    _, round_recipe, _ = parse_recipe(RECIPES / "round-cpu.yaml", ["--output_dir", str(tmp_path), "--bf16", "false"])
    assert round_recipe.studies_per_step == 4  # 4 studies x 4 rollouts, as the recipe says


def test_rewards_are_named_as_in_trls_grpo_script_and_reward_name_is_an_alias(tmp_path):
    assert _config(tmp_path, reward_name="rouge_l").reward_funcs == ["rouge_l"]
    both = _config(tmp_path, reward_funcs=["facts", "token_f1"], reward_weights=[1.0, 0.5])
    assert both.reward_funcs == ["facts", "token_f1"] and both.reward_weights == [1.0, 0.5]
    _, from_cli, _ = parse_recipe(
        RECIPES / "smoke-cpu.yaml",
        [
            "--output_dir",
            str(tmp_path),
            "--reward_name",
            "",
            "--reward_funcs",
            "facts",
            "rouge_l",
            "--reward_weights",
            "1",
            "0.25",
        ],
    )
    assert from_cli.reward_funcs == ["facts", "rouge_l"] and from_cli.reward_weights == [1.0, 0.25]


def test_yaml_cli_and_dict_build_the_same_config(tmp_path):
    recipe = RECIPES / "smoke-cpu.yaml"
    out = str(tmp_path / "out")
    _, from_cli, model_cli = parse_recipe(
        recipe,
        ["--output_dir", out, "--dpo_beta", "0.3", "--max_rejected_per_group", "2", "--model_name_or_path", "/m"],
    )
    _, from_dict, model_dict = parse_recipe(
        recipe, {"output_dir": out, "dpo_beta": 0.3, "max_rejected_per_group": 2, "model_name_or_path": "/m"}
    )
    assert from_cli.to_dict() == from_dict.to_dict()
    assert from_cli.dpo_beta == 0.3 and from_cli.max_rejected_per_group == 2 and from_cli.num_generations == 2
    assert model_cli.model_name_or_path == model_dict.model_name_or_path == "/m"
    # a dict alone is a recipe too
    script, alone, _ = parse_recipe(
        None, {"output_dir": out, "use_cpu": True, "bf16": False, "dpo_beta": 0.25, "train_csv": "x.csv"}
    )
    assert alone.dpo_beta == 0.25 and script.train_csv == "x.csv"


def test_unknown_or_invalid_recipe_keys_are_refused(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("output_dir: x\nuse_cpu: true\nbf16: false\ndpo_betta: 0.1\n")
    with pytest.raises(ValueError, match="dpo_betta"):
        parse_recipe(bad)
    with pytest.raises(ValueError, match="oracle_mode"):
        parse_recipe(RECIPES / "smoke-cpu.yaml", ["--oracle_mode", "nope", "--output_dir", str(tmp_path)])


@pytest.mark.parametrize("name", ["smoke-cpu.yaml", "phantomcxr.yaml", "round-cpu.yaml", "qwen2.5-vl-3b-paper.yaml"])
def test_every_recipe_parses(tmp_path, name):
    # bf16 is refused on a machine without a GPU; everything else in the recipe must be a known, valid setting
    _, config, model = parse_recipe(RECIPES / name, ["--output_dir", str(tmp_path), "--bf16", "false"])
    assert config.num_generations >= 2
    if name.startswith("qwen"):
        assert (
            config.num_generations == 8
            and model.use_peft
            and config.per_device_train_batch_size * 4 * config.gradient_accumulation_steps == 16 * 8
        )


def test_accelerate_configs_name_their_zero_stage():
    import yaml

    for stage in (2, 3):
        config = yaml.safe_load((RECIPES / f"accelerate_zero{stage}.yaml").read_text())
        assert config["distributed_type"] == "DEEPSPEED" and config["deepspeed_config"]["zero_stage"] == stage


def test_recipes_parse_in_parallel_threads():
    """Two admins starting rounds at once parse recipes in two threads; HfArgumentParser rewrites shared dataclass
    fields while it builds a parser, which without the parse lock failed as "Only `Union[X, NoneType]` ... 'debug'"."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(
            pool.map(
                lambda _: parse_recipe(RECIPES / "round-cpu.yaml", ["--model_name_or_path", "m", "--output_dir", "o"]),
                range(16),
            )
        )
    assert {r[1].learning_rate for r in results} == {results[0][1].learning_rate}
    assert results[0][1].num_train_epochs == 3


@pytest.mark.parametrize(
    "value, expected", [("false", "none"), ("False", "none"), ("true", "group"), ("batch", "batch")]
)
def test_scale_rewards_given_as_text_is_read_before_training(tmp_path, value, expected):
    _, args, _ = parse_recipe(RECIPES / "round-cpu.yaml", ["--output_dir", str(tmp_path), "--scale_rewards", value])
    assert args.scale_rewards == expected


def test_a_bad_scale_rewards_is_refused_before_a_round_starts(tmp_path):
    with pytest.raises(ValueError, match="scale_rewards must be group, batch or none"):
        parse_recipe(RECIPES / "round-cpu.yaml", ["--output_dir", str(tmp_path), "--scale_rewards", "sometimes"])
