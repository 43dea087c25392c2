"""The `orapo` command: the composition root.

Each subcommand lives in `app.commands.<name>` with `configure(parser)` and
`run(args) -> int`. Command modules import nothing heavy at module level, so
building the parser costs a few milliseconds and `orapo label` never imports
torch. Every `OrapoError` becomes `code: message` on stderr and exit status 2
(1 is kept for "ran, but some inputs were refused"); no traceback reaches a user
unless `ORAPO_DEBUG=1`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from orapo_core.offline import enforce_offline

# name -> (module, one-line help). The order is the order `orapo --help` shows.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("app.commands.serve", "start the web app"),
    "ingest": ("app.commands.ingest", "import DICOM/PNG/JPEG files and folders (de-identified)"),
    "label": ("app.commands.label", "label reports with the FactS labeler (CheXpert-style CSV)"),
    "phantom": ("app.commands.phantom", "generate PhantomCXR synthetic studies"),
    "draft": ("app.commands.draft", "draft a report for an image"),
    "starter": ("app.commands.starter", "build the embedded starter model"),
    "train": ("app.commands.train", "run an OraPO training round from a recipe"),
    "eval": ("app.commands.eval", "evaluate a model's drafts with clinical-efficacy metrics"),
    "bench": ("app.commands.bench", "run a benchmark"),
    "rounds": ("app.commands.rounds", "run, list, promote and roll back training rounds"),
    "export": ("app.commands.export", "export preference pairs, or reports as FHIR or DICOM SR"),
    "pacs": ("app.commands.pacs", "search the archive (PACS) and pull studies from it over DICOMweb"),
    "users": ("app.commands.users", "add, list and disable users"),
    "db": ("app.commands.db", "create or upgrade the database schema"),
    "backup": ("app.commands.backup", "back up the database, images, model versions and secret into a folder"),
    "restore": ("app.commands.restore", "restore a backup into an empty data folder and check it"),
}


def _load(name: str):
    module_name, _ = SUBCOMMANDS[name]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return None
        raise


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="orapo", description="OraPO: chest X-ray report drafting, FactS and training rounds."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        # Only the named subcommand's module is imported when one is given, so
        # `orapo label` pays for nothing else.
        module = _load(name) if (only is None or only == name) else None
        if only is not None and only != name:
            sub.add_parser(name, help=help_text)
            continue
        if module is None:
            sub.add_parser(name, help=f"{help_text} (not in this build yet)")
            continue
        p = sub.add_parser(name, help=help_text, description=(module.__doc__ or help_text).strip().splitlines()[0])
        module.configure(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    enforce_offline()
    argv = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(first if first in SUBCOMMANDS else None)
    args = parser.parse_args(argv)
    module = getattr(args, "_module", None)
    if module is None:
        if args.command:
            print(f"not_available: `orapo {args.command}` is not part of this build yet.", file=sys.stderr)
            return 2
        parser.print_help()
        return 0
    from orapo_core.errors import OrapoError  # noqa: PLC0415 -- keeps `orapo --help` light

    try:
        return int(module.run(args) or 0)
    except OrapoError as exc:
        print(f"{exc.code}: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: stopped by the user.", file=sys.stderr)
        return 130
    except Exception as exc:  # the last line of defence: a code and a sentence, never a traceback
        if os.environ.get("ORAPO_DEBUG") == "1":
            raise
        said = settings_refusal(exc)
        if said is not None:
            print(f"invalid_setting: {said}", file=sys.stderr)
        else:
            print(f"internal_error: {type(exc).__name__}: {exc} (set ORAPO_DEBUG=1 for details)", file=sys.stderr)
        return 2


def settings_refusal(exc: BaseException) -> str | None:
    """The sentence for an ORAPO_* variable a settings class refused ("ORAPO_HOLDOUT_FRACTION: Input should be less
    than or equal to 0.5"), or None when `exc` is not such a refusal."""
    from pydantic import ValidationError  # noqa: PLC0415 -- keeps `orapo --help` light

    if not isinstance(exc, ValidationError) or not exc.title.endswith("Settings"):
        return None
    return "; ".join(
        f"ORAPO_{'_'.join(str(part) for part in error['loc']).upper()}: {error['msg']}"  # never the value: a secret
        for error in exc.errors()
    )


if __name__ == "__main__":
    sys.exit(main())
