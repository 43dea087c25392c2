"""Build the starter model, or say what the installed one is.

`build` trains it here (seeded, a few minutes on 2 CPU cores, a progress bar
on stderr). `build --if-missing` is what a first start runs: it leaves an
existing model alone, and copies the model shipped under `assets/starter` when
that asset was built with the same settings, since training would only make the
same folder again. The build's architecture experiments (another image side or
patch size, a longer vision warm-up, perception batches, another rare-finding
share) are not options here: `benchmarks.bench_starter --rebuild DIR` builds
them (`orapo_core.experimental.starter`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    build = sub.add_parser("build", help="build the starter model (default into <ORAPO_DATA_DIR>/models/starter)")
    build.add_argument("--out", default=None, metavar="DIR", help="folder to write (default <data>/models/starter)")
    build.add_argument("--seed", type=int, default=0, help="same seed, same model on the same machine (default 0)")
    build.add_argument(
        "--n-train", type=int, default=None, metavar="N", help="PhantomCXR studies to warm-start on (default 2000)"
    )
    build.add_argument(
        "--steps",
        type=int,
        default=None,
        metavar="N",
        help="report training steps (default 300; after 3000 steps of the vision tower alone)",
    )
    build.add_argument(
        "--minutes",
        type=float,
        default=None,
        metavar="M",
        help="stop training when the whole build has run this long (default 20; about 9 on two idle cores)",
    )
    build.add_argument(
        "--if-missing",
        action="store_true",
        help="do nothing if the folder holds a model; copy the shipped one if it matches",
    )
    build.add_argument("--quiet", action="store_true", help="no progress bar")
    build.add_argument(
        "--no-calibration",
        action="store_true",
        help="skip the unfamiliar-film calibration written beside the weights (about a minute); the "
        "server then computes it while it warms the model up",
    )
    info = sub.add_parser("info", help="show the starter model's build card")
    info.add_argument("--model", default=None, metavar="DIR", help="folder to describe (default <data>/models/starter)")


def run(args: argparse.Namespace) -> int:
    return _build(args) if args.action == "build" else _info(args)


def _build(args: argparse.Namespace) -> int:
    from dataclasses import replace  # noqa: PLC0415 -- keeps `orapo --help` light

    from orapo_core.config import Settings  # noqa: PLC0415 -- loads pydantic_settings, pydantic
    from orapo_core.errors import OrapoError  # noqa: PLC0415 -- keeps `orapo --help` light
    from orapo_core.models.starter import WarmStartPlan, build_starter  # noqa: PLC0415 -- loads numpy
    from orapo_core.models.starter.build import copy_shipped_starter  # noqa: PLC0415 -- loads numpy

    out = Path(args.out).expanduser() if args.out else Settings().models_dir / "starter"
    plan = WarmStartPlan(seed=args.seed)
    for option, name, value in (
        ("n-train", "n_train", args.n_train),
        ("steps", "steps", args.steps),
        ("minutes", "max_minutes", args.minutes),
    ):
        if value is not None:
            if value <= 0:
                raise OrapoError("bad_option", f"--{option} must be above 0, not {value}.")
            plan = replace(plan, **{name: value})
    if args.if_missing:
        if (out / "config.json").is_file():
            print(f"starter: {out} already holds a model; nothing to do.", file=sys.stderr)
            print(out)
            return 0
        if copy_shipped_starter(out, plan) is not None:
            print(f"starter: copied the shipped model (built with these settings) into {out}.", file=sys.stderr)
            print(out)
            return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    path = build_starter(out, plan, show_progress=not args.quiet)
    if not args.no_calibration:
        _calibrate(Path(path))
    print(path)
    return 0


def _calibrate(folder: Path) -> None:
    """The unfamiliar-film calibration of a freshly built starter, beside its weights, as the shipped one has it: the
    first server start then flags unfamiliar films at once instead of after computing it."""
    from orapo_core.models import unfamiliar  # noqa: PLC0415 -- loads numpy
    from orapo_core.models.loading import load_model  # noqa: PLC0415 -- keeps `orapo --help` light

    print(
        "starter: computing the unfamiliar-film calibration (PhantomCXR films through the vision tower)...",
        file=sys.stderr,
    )
    calibration = unfamiliar.build_calibration(load_model(folder, device="cpu"))
    written = folder / unfamiliar.CALIBRATION_FILE
    where = written if written.is_file() else "nowhere (the folder is read-only)"
    print(f"starter: calibration written to {where} ({(calibration.meta or {}).get('seconds')} s).", file=sys.stderr)


def _info(args: argparse.Namespace) -> int:
    import json  # noqa: PLC0415 -- keeps `orapo --help` light

    from orapo_core.config import Settings  # noqa: PLC0415 -- loads pydantic_settings, pydantic
    from orapo_core.errors import OrapoError  # noqa: PLC0415 -- keeps `orapo --help` light
    from orapo_core.models.starter import read_card  # noqa: PLC0415 -- loads numpy

    folder = Path(args.model).expanduser() if args.model else Settings().models_dir / "starter"
    card = read_card(folder) if folder.is_dir() else None
    if card is None:
        raise OrapoError("model_not_found", f"There is no starter model in {folder}: run `orapo starter build`.")
    print(json.dumps({"folder": str(folder), **card}, indent=2))
    return 0
