"""`benchmarks/` is a package: no import-path edits, no scripts among the results, public names only, and every
benchmark starts as `python -m benchmarks.NAME` and as `orapo bench NAME`.

The scan is over the syntax tree of every module of the package. A private name is one with a leading underscore
that is not a dunder: imported from the project's packages (`from orapo_core.facts.metrics import _positive`), or
read as an attribute of anything but a class's own `self` / `cls` (`verifier._auc`, `drafter._prompt_text`).
Where a benchmark needs an engine helper, the helper is made public in its module.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
PROJECT = ("orapo_core", "app", "db", "tests", "benchmarks")


def _modules() -> list[Path]:
    return sorted(BENCHMARKS.rglob("*.py"))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(path: Path) -> list[str]:
    """Where a module imports a private name of the project's packages, or reads a private attribute of a module,
    class or object (a class's own, `self._x` / `cls._x`, is its own)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PROJECT:
                    found += [f"{node.lineno}: import {alias.name}" for part in alias.name.split(".") if _private(part)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in PROJECT:
            if any(_private(part) for part in node.module.split(".")):
                found.append(f"{node.lineno}: from {node.module} import ...")
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return sorted(found, key=lambda use: int(use.split(":")[0]))


def test_no_benchmark_edits_the_import_path() -> None:
    offenders = [str(p.relative_to(ROOT)) for p in _modules() if "sys.path" in p.read_text()]
    assert not offenders, f"run benchmarks as `python -m benchmarks.NAME` from the root instead: {offenders}"
    assert (BENCHMARKS / "__init__.py").is_file() and len(_modules()) > 15  # the walk saw the package


def test_results_hold_no_scripts() -> None:
    scripts = sorted(str(p.relative_to(ROOT)) for p in (BENCHMARKS / "results").rglob("*.py"))
    assert not scripts, f"a tool belongs in benchmarks/ as a module; a one-off script in git history: {scripts}"


def test_benchmarks_use_only_public_names() -> None:
    offenders = {str(p.relative_to(ROOT)): uses for p in _modules() if (uses := private_uses(p))}
    assert not offenders, f"make the helper public in its module (one definition, every caller updated): {offenders}"


def test_the_private_name_check_catches_each_form(tmp_path: Path) -> None:
    sample = tmp_path / "bench_sample.py"
    sample.write_text(
        "import orapo_core.models.verifier as verifier\n"
        "import orapo_core.facts\n"
        "from orapo_core.facts.metrics import _positive, clinical_efficacy\n"
        "from app.services.reading import reading_order as ro\n"
        "from orapo_core.models.draft import Drafter\n"
        "class Guard:\n"
        "    def check(self):\n"
        "        return self._own\n"
        "def f(drafter, x):\n"
        "    verifier._auc(x, x)\n"
        "    orapo_core.facts._positive({}, 'x')\n"
        "    ro.__doc__, ro.WEIGHTS, clinical_efficacy.__name__\n"
        "    Drafter._prompt_text\n"
        "    return drafter._prompt_text\n"
    )
    assert [use.split(": ", 1)[1] for use in private_uses(sample)] == [
        "from orapo_core.facts.metrics import _positive",
        "verifier._auc",
        "orapo_core.facts._positive",
        "Drafter._prompt_text",
        "drafter._prompt_text",
    ]


@pytest.mark.slow  # every benchmark started in a subprocess
def test_every_benchmark_starts_as_a_module_and_through_orapo_bench(tmp_path: Path) -> None:
    from app.commands.bench import available

    found = available()
    assert {
        "decode",
        "round_story",
        "round_rescore",
        "round_drafts_alone",
        "round_grpo_twin",
        "round_matrix",
        "walk_screenshots",
    } <= found.keys()
    assert not {"ablation", "round_story_common"} & found.keys()  # shared code, no command line
    # each one's --help, run as `python -m` runs it (as __main__, from the package), in one interpreter; a tool
    # with no flags to ask about (no argparse) is imported only, not run
    with_flags = sorted(m for m in found.values() if "argparse" in (ROOT / (m.replace(".", "/") + ".py")).read_text())
    assert len(with_flags) > 15
    code = (
        "import importlib, runpy, sys\n"
        f"for module in {sorted(set(found.values()) - set(with_flags))!r}:\n"
        "    importlib.import_module(module)\n"
        f"for module in {with_flags!r}:\n"
        "    sys.argv = [module, '--help']\n"
        "    try:\n"
        "        runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
        "    except SystemExit as exit:\n"
        "        assert exit.code in (0, None), (module, exit.code)\n"
        "    else:\n"
        "        raise AssertionError(f'{module} --help did not exit')\n"
        "print('all started')\n"
    )
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0 and "all started" in result.stdout, result.stderr[-3000:]
    # `orapo bench NAME` from another folder: the checkout is importable, the caller's folder stays the caller's
    env.pop("PYTHONPATH", None)
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "bench", "round_story", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0 and "--finding" in result.stdout and "--rescore-round" not in result.stdout, (
        result.stderr[-3000:]
    )
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "bench", "round-matrix", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0 and "--cells" in result.stdout, result.stderr[-3000:]
