"""Run a benchmark from `benchmarks/` (a source checkout): `orapo bench NAME [ARGS...]`.

Benchmarks are scripts, not tests: each prints its numbers and the command that
made them. `orapo bench` with no name lists them.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def benchmarks_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "benchmarks"


def available() -> dict[str, Path]:
    folder = benchmarks_dir()
    return {p.stem.removeprefix("bench_"): p for p in sorted(folder.glob("bench_*.py"))} if folder.is_dir() else {}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="benchmark name (e.g. decode, labeler, starter, learning)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the benchmark")


def run(args: argparse.Namespace) -> int:
    import subprocess
    import sys

    from orapo_core.errors import OrapoError

    found = available()
    if not args.name:
        if not found:
            raise OrapoError("no_benchmarks", "Benchmarks ship with a source checkout; none were found next to this installation.")
        import ast

        for name, path in found.items():
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            print(f"{name:12s} {doc.splitlines()[0] if doc else ''}")
        return 0
    if args.name not in found:
        raise OrapoError("unknown_benchmark", f"There is no benchmark '{args.name}'; choose one of: {', '.join(found) or 'none'}.")
    return subprocess.call([sys.executable, str(found[args.name]), *args.args])
