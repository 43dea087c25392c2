"""Run a benchmark from `benchmarks/` (a source checkout): `orapo bench NAME [ARGS...]`.

Benchmarks are modules of the checkout's `benchmarks` package, not tests: each prints its numbers and the command
that made them. `orapo bench NAME ARGS` is `python -m benchmarks.bench_NAME ARGS` (or `benchmarks.NAME` for a
tool without the prefix) run from anywhere, with the checkout importable. `orapo bench` with no name lists them.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from pathlib import Path


def benchmarks_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "benchmarks"


def _runnable(path: Path) -> bool:
    """Whether a module of the package has a command line (`if __name__ == "__main__":` at its top level)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return any(
        isinstance(node, ast.If) and ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"'
        for node in tree.body
    )


def available() -> dict[str, str]:
    """Benchmark name -> its module (`decode` -> `benchmarks.bench_decode`): every runnable module of the package."""
    folder = benchmarks_dir()
    if not (folder / "__init__.py").is_file():
        return {}
    return {
        p.stem.removeprefix("bench_"): f"benchmarks.{p.stem}"
        for p in sorted(folder.glob("*.py"))
        if not p.stem.startswith("_") and _runnable(p)
    }


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="benchmark name (e.g. decode, labeler, starter, learning)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the benchmark")


def run(args: argparse.Namespace) -> int:
    import subprocess  # noqa: PLC0415 -- keeps `orapo --help` light

    from orapo_core.errors import OrapoError  # noqa: PLC0415 -- keeps `orapo --help` light

    found = available()
    if not args.name:
        if not found:
            raise OrapoError(
                "no_benchmarks", "Benchmarks ship with a source checkout; none were found next to this installation."
            )
        for name, module in found.items():
            path = benchmarks_dir() / f"{module.rsplit('.', 1)[1]}.py"
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            print(f"{name:20s} {doc.splitlines()[0] if doc else ''}")
        return 0
    # `decode`, `bench_decode` and `benchmarks.bench_decode` name the same benchmark; `round-matrix` is `round_matrix`
    names = {**{m: m for m in found.values()}, **{m.rsplit(".", 1)[1]: m for m in found.values()}, **found}
    module = names.get(args.name) or names.get(args.name.replace("-", "_"))
    if module is None:
        raise OrapoError(
            "unknown_benchmark", f"There is no benchmark '{args.name}'; choose one of: {', '.join(found) or 'none'}."
        )
    # the checkout's root, where `benchmarks` (and `tests.support`, which some benchmarks use) import from; the
    # working directory stays the caller's, so relative paths in ARGS mean what they say
    root = str(benchmarks_dir().parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    return subprocess.call([sys.executable, "-m", module, *args.args], env=env)
