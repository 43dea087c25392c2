"""The suite's own house rules: fixtures in conftest, helpers in tests.support, no test module leaning on another.

A test file is free to change without breaking others; `tests` is importable from
the checkout (pyproject's `pythonpath`), so nothing edits `sys.path`; browser tests
start Chromium through `tests.support.browser.launch`, which sets explicit waits.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SHARED_FIXTURES = ("tiny_model", "phantom", "database", "blank_database", "backend", "browser", "data_dir")
SCRIPTS = ("measure_facts_attributes.py",)  # run as `python tests/<name>`: they put the checkout on sys.path themselves


def _modules():
    return [p for p in sorted(TESTS.rglob("*.py")) if p.name not in SCRIPTS and "artifacts" not in p.parts]


def _imports(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_test_module_imports_another_or_edits_sys_path() -> None:
    offenders = []
    for path in _modules():
        tree = ast.parse(path.read_text(), filename=str(path))
        for name in _imports(tree):
            last = name.split(".")[-1]
            if (
                last.startswith("test_")
                or last == "conftest"
                or name in ("tiny_vlms", "db_fixtures", "browser_harness")
            ):
                offenders.append(f"{path.name} imports {name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", None) == "sys":
                offenders.append(f"{path.name}:{node.lineno} uses sys.path")
    assert not offenders, offenders


def test_shared_fixtures_are_defined_once_in_conftest() -> None:
    defined: dict[str, list[str]] = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef) and node.name in SHARED_FIXTURES:
                defined.setdefault(node.name, []).append(path.relative_to(TESTS).as_posix())
    assert defined == {name: ["conftest.py"] for name in SHARED_FIXTURES}


def test_browser_tests_start_chromium_through_the_harness() -> None:
    """`tests.support.browser.launch` sets `expect`'s wait; Playwright's own 5 s default fails on a busy machine."""
    offenders = [
        path.name for path in _modules() if "chromium" + ".launch(" in path.read_text() and path.name != "browser.py"
    ]
    assert not offenders, offenders


def test_every_test_the_fast_tier_leaves_out_by_measure_exists() -> None:
    """tests/slow_by_measure.txt names modules and tests; a renamed or removed one must leave the list, or the fast
    tier would silently gain it back under its new name."""
    from tests.support.tiers import slow_by_measure

    root = Path(__file__).resolve().parent.parent
    missing = []
    for entry in sorted(slow_by_measure()):
        module, _, name = entry.partition("::")
        path = root / module
        if not path.is_file():
            missing.append(entry)
            continue
        if name:
            names = {
                n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef | ast.ClassDef)
            }
            if any(part not in names for part in name.split("::")):
                missing.append(entry)
    assert not missing, missing
