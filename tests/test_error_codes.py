"""One catalogue of error codes: every code the code raises is in it, every code in it is raised, and the docs table is current.

The scan is over the syntax tree, so a code built at run time has to be one of the
forms read here (a literal, `a if c else b` of literals, or an f-string whose fixed
parts match catalogued codes); anything else fails the test and says where.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

from orapo_core.error_codes import CATALOGUE, ERROR_CODES, markdown

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("app", "orapo_core", "db", "benchmarks")
DOCS = ROOT / "docs" / "pages" / "reference" / "errors.md"


def _python_files():
    for folder in SOURCES:
        yield from sorted((ROOT / folder).rglob("*.py"))


def _codes(node: ast.AST) -> list[str] | str:
    """The codes a code argument can take, or a regex for an f-string, or '' when it cannot be read."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        body, orelse = _codes(node.body), _codes(node.orelse)
        if isinstance(body, list) and isinstance(orelse, list):
            return body + orelse
        return ""
    if isinstance(node, ast.JoinedStr):
        return "".join(re.escape(v.value) if isinstance(v, ast.Constant) else "[a-z_]+" for v in node.values)
    return ""


@functools.cache
def raised_codes() -> tuple[dict[str, list[str]], dict[str, list[str]], list[str]]:
    """(literal code -> where, f-string pattern -> where, unreadable call sites) of every OrapoError(...) and
    every round failure (`_fail(run, "code", ...)`)."""
    literal: dict[str, list[str]] = {}
    patterns: dict[str, list[str]] = {}
    unreadable = []
    for path in _python_files():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", None))
            if name == "OrapoError" and node.args:
                arg = node.args[0]
            elif name == "_fail" and len(node.args) >= 2:
                arg = node.args[1]
            else:
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            codes = _codes(arg)
            if isinstance(codes, list):
                for code in codes:
                    literal.setdefault(code, []).append(where)
            elif codes:
                patterns.setdefault(codes, []).append(where)
            else:
                unreadable.append(where)
    return literal, patterns, unreadable


def test_every_raised_code_is_catalogued() -> None:
    literal, patterns, unreadable = raised_codes()
    assert len(literal) > 100  # the scan really saw the code
    missing = {code: where for code, where in literal.items() if code not in ERROR_CODES}
    assert not missing, f"catalogue these in orapo_core/error_codes.py: {missing}"
    unmatched = {p: where for p, where in patterns.items() if not any(re.fullmatch(p, c) for c in ERROR_CODES)}
    assert not unmatched, unmatched
    assert not unreadable, f"write the code as a literal (or `a if c else b`) at {unreadable}"


def test_every_catalogued_code_is_used() -> None:
    """No code is kept after the last place that reported it is gone."""
    files = [p for p in _python_files() if p.name != "error_codes.py"] + sorted((ROOT / "app").rglob("*.js"))
    words = set(re.findall(r"[a-z][a-z0-9_]*", "\n".join(p.read_text() for p in files)))
    _, patterns, _ = raised_codes()  # `invalid_{what}` makes invalid_round and invalid_version
    unused = [code for code in ERROR_CODES if code not in words and not any(re.fullmatch(p, code) for p in patterns)]
    assert not unused, f"remove these from the catalogue, nothing reports them: {unused}"


def test_each_code_has_one_sentence_and_one_area() -> None:
    seen = [code for codes in CATALOGUE.values() for code in codes]
    assert len(seen) == len(set(seen))
    for code, sentence in ERROR_CODES.items():
        assert re.fullmatch(r"[a-z]+(_[a-z0-9]+)*", code), code
        assert sentence.endswith(".") and sentence[0].isupper(), (code, sentence)


def test_the_docs_table_is_generated_and_current() -> None:
    assert DOCS.read_text() == markdown(), (
        "regenerate it: python -m orapo_core.error_codes > docs/pages/reference/errors.md"
    )
    printed = subprocess.run(
        [sys.executable, "-m", "orapo_core.error_codes"], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout
    assert printed == markdown()
    assert all(f"`{code}`" in printed for code in ERROR_CODES)
