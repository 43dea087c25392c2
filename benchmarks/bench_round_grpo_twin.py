"""A clinic story's GRPO twin: GRPO on exactly the rows and steps the story's OraPO round trained on, scored alike.

Reads the data folder a clinic story left (`benchmarks.bench_round_story --data-dir DIR --seed S`), trains GRPO
(`oracle_mode none`, no clinician pairs) from the model round `--round` started from, on that round's own
train.csv with its recipe and step budget (`orapo train`'s round, through `orapo_core.experimental.ablation`,
whose trainer has the ablation's oracle modes), keeps it in the folder (`grpo-from-round-ID`, which
`bench_round_drafts_alone` scores beside the candidate), and scores it on the story's test studies (the same
`--seed` draws the same ones) with the story's measures: OraPO against GRPO.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_round_grpo_twin --finding F --data-dir DIR --seed S --json OUT
    orapo bench round_grpo_twin --data-dir DIR --seed S
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.round_story_common import (
    command,
    grpo_twin_dir,
    make_tool_parser,
    open_story,
    outcome,
    round_version,
    test_dir,
    test_studies,
)
from orapo_core.facts.metrics import EvalMetrics


def make_parser() -> argparse.ArgumentParser:
    return make_tool_parser(
        __doc__, "the OraPO round whose rows, recipe and steps GRPO trains on (default 1, the story's one round)"
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = make_parser().parse_args(argv)

    from app.services.reading.served import resolve_path  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from app.services.rounds.processes import override_argv  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from db import RoundRepository  # noqa: PLC0415 -- loads sqlalchemy

    data_dir = Path(args.data_dir)
    settings, database = open_story(data_dir)
    record = RoundRepository(database).get(args.round)
    folder = data_dir / "rounds" / str(record.id)
    version = round_version(database, record.id)
    base = resolve_path(settings, version.base_model_path)
    out = grpo_twin_dir(data_dir, record.id)
    overrides = {
        **record.config.get("overrides", {}),
        "model_name_or_path": base,
        "train_csv": str(folder / "train.csv"),
        "output_dir": str(out),
        "oracle_mode": "none",
        "use_clinician_pairs": False,
    }
    started = time.perf_counter()
    # `orapo train` with the ablation's oracle modes (the product trains only OraPO's): orapo_core.experimental
    subprocess.run(
        [
            sys.executable,
            "-m",
            "orapo_core.experimental.ablation",
            "--config",
            record.config["recipe"],
            *override_argv(overrides),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    seconds = time.perf_counter() - started
    positives, negatives = test_studies(args)
    result = {
        "grpo": outcome(base, out, positives, negatives, args.finding, test_dir(data_dir)),
        "grpo_seconds": round(seconds, 1),
        "oraPO_round": record.id,
        "command": command("bench_round_grpo_twin", argv),
    }
    r = result["grpo"]
    print(
        f"GRPO, same rows and steps as round {record.id}: recall {r['recall']:.3f}, false-positive rate "
        f"{r['false_positive_rate']:.3f}, macro-F1(14) {EvalMetrics.from_dict(r).macro_f1_14:.3f} ({seconds / 60:.1f} min training)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
