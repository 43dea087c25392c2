"""Run an OraPO training round from a recipe: `orapo train --config RECIPE.yaml [--key value ...]`.

Everything after `--config RECIPE.yaml` overrides the recipe, with the names of
`OraPOConfig`, `OraPOScriptArguments` and TRL's `ModelConfig` (the same names
the YAML uses), e.g. `orapo train --config smoke.yaml --max_steps 10`. Torch and
TRL are imported only when the round runs.
"""

from __future__ import annotations

import argparse
import json


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="parse and validate the recipe, print the resolved settings as JSON, and stop (put it before --config)",
    )
    parser.add_argument(
        "--config",
        nargs=argparse.REMAINDER,
        required=True,
        metavar="RECIPE.yaml [--key value ...]",
        help="the recipe (YAML), then any overrides; see orapo_core/train/recipes/",
    )


def run(args: argparse.Namespace) -> int:
    from orapo_core.errors import OrapoError  # noqa: PLC0415 -- keeps `orapo --help` light

    if not args.config:
        raise OrapoError("recipe_missing", "Give a recipe: `orapo train --config RECIPE.yaml [--key value ...]`.")
    recipe, *overrides = args.config
    dry_run = args.dry_run or "--dry-run" in overrides  # REMAINDER also swallows a --dry-run given after --config
    overrides = [o for o in overrides if o != "--dry-run"]
    from orapo_core.train.config import parse_recipe  # noqa: PLC0415 -- loads trl, peft

    try:
        script_args, training_args, model_args = parse_recipe(recipe, overrides)
    except FileNotFoundError as exc:
        raise OrapoError("recipe_missing", f"The recipe {recipe} does not exist.") from exc
    except (ValueError, SystemExit) as exc:  # argparse exits on a bad value; TRL raises on unknown keys
        raise OrapoError("recipe_invalid", f"{recipe}: {exc or 'a setting has a wrong value (see above)'}") from None
    if dry_run:
        from dataclasses import asdict  # noqa: PLC0415 -- keeps `orapo --help` light

        print(
            json.dumps(
                {"script": asdict(script_args), "model": asdict(model_args), "training": training_args.to_dict()},
                indent=2,
                default=str,
            )
        )
        return 0
    from orapo_core.train.run import train_round  # noqa: PLC0415 -- keeps `orapo --help` light

    out = train_round(script_args, training_args, model_args)
    print(f"trained: {out}")
    return 0
