"""A clinic story's models with their finding checks set aside: what each writes by itself, on the same test studies.

Reads the data folder a clinic story left (`benchmarks.bench_round_story --data-dir DIR --seed S`) and scores,
with each version's finding checks (orapo_core.models.verifier) set aside, the model round `--round` started
from, its candidate and, when the folder has it, its GRPO twin (`benchmarks.bench_round_grpo_twin`), on the
story's test studies (the same `--seed` draws the same ones): recall, false-positive rate (broken down by the
negatives' other findings) and macro-F1 of the drafts alone.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_round_drafts_alone --finding F --data-dir DIR --seed S --json OUT
    orapo bench round_drafts_alone --data-dir DIR --seed S

The same models with their checks: `benchmarks.bench_round_rescore`.
"""

from __future__ import annotations

import argparse
import sys

from benchmarks.round_story_common import (
    command,
    finish_tool,
    grpo_twin_dir,
    make_tool_parser,
    open_round,
    outcome,
    test_dir,
    test_studies,
)


def make_parser() -> argparse.ArgumentParser:
    return make_tool_parser(__doc__, "the round whose models are scored (default 1, the story's one round)")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = make_parser().parse_args(argv)

    from app.services.reading.served import resolve_path  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings

    data_dir, settings, database, version, base = open_round(args)
    positives, negatives = test_studies(args)
    models = {"before": None, "candidate": resolve_path(settings, version.adapter_path)}
    twin = grpo_twin_dir(data_dir, args.round)
    if (twin / "adapter_config.json").is_file():
        models["grpo"] = twin
    result = {
        "command": command("bench_round_drafts_alone", argv),
        "round": args.round,
        "checks": False,
        **{
            name: outcome(base, adapter, positives, negatives, args.finding, test_dir(data_dir), checks=False)
            for name, adapter in models.items()
        },
    }
    return finish_tool(result, models, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
