"""Contracts are types, not positions (issue 43): tab handlers answer keyed by component, the page session is a dataclass.

Gradio matches a returned tuple to an event's `outputs` by position; a dict keyed by component names each output
(`app.tabs.outputs`). Checked over the real app's registered events: every event with more than one output has a
handler annotated `-> Outputs` whose annotations Gradio can read (it finds `gr.Request` through them), and
statically over app/tabs and app/server.py: every function annotated `-> Outputs` answers with a dict, `gr.skip()`,
or what another `-> Outputs` function answers, never a tuple or a list.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import inspect
import textwrap
import typing
from pathlib import Path

import gradio as gr
import pytest

APP = Path(__file__).resolve().parents[1] / "app"
SOURCES = sorted((APP / "tabs").glob("*.py")) + [APP / "server.py"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from app.runtime import open_database
    from app.server import build_app
    from app.settings import WebSettings

    settings = WebSettings(data_dir=tmp_path_factory.mktemp("outputs") / "data", deid_secret="test-secret")
    return build_app(settings=settings, database=open_database(settings))


def _own(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.AST]:
    """The function's own statements and expressions, not those of the functions defined inside it."""
    found, todo = [], list(function.body)
    while todo:
        node = todo.pop()
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            found.append(node)
            todo.extend(ast.iter_child_nodes(node))
    return found


def _answers_outputs(function) -> bool:
    return function.returns is not None and ast.unparse(function.returns) == "Outputs"


def _keyed(value: ast.expr | None, answering: set[str], assigned: dict[str, list[ast.expr]]) -> bool:
    """Whether a returned expression is outputs keyed by component: a dict, `gr.skip()`, either of two such, a call
    of a function (by name, or a method by its attribute) that answers `-> Outputs` itself, or a variable that the
    function only ever sets to one of those (`assigned`: name -> the values the function gives it)."""
    if isinstance(value, ast.Dict):
        return not any(isinstance(key, ast.Constant) for key in value.keys)
    if isinstance(value, ast.IfExp):
        return _keyed(value.body, answering, assigned) and _keyed(value.orelse, answering, assigned)
    if isinstance(value, ast.Call):
        called = value.func.id if isinstance(value.func, ast.Name) else getattr(value.func, "attr", None)
        return called == "skip" or called in answering
    if isinstance(value, ast.Name):
        values = assigned.pop(value.id, [])  # popped: a variable set from itself is not taken for keyed
        return bool(values) and all(_keyed(v, answering, assigned) for v in values)
    return False


def _assigned(nodes: list[ast.AST]) -> dict[str, list[ast.expr]]:
    out: dict[str, list[ast.expr]] = {}
    for node in nodes:
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.NamedExpr)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names = [n for n in ast.walk(target) if isinstance(n, ast.Name)]
                for name in names:  # an unpacked or augmented target counts as a value that is not keyed
                    plain = isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and target is name
                    out.setdefault(name.id, []).append(node.value if plain and node.value else ast.Tuple())
    return out


def positional_answers(trees: dict[str, ast.Module]) -> list[str]:
    """Every return of an `-> Outputs` function, in `trees` (name -> module), that is not keyed by component."""
    functions = [
        (name, node)
        for name, tree in trees.items()
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    answering = {node.name for _, node in functions if _answers_outputs(node)}
    found = []
    for name, node in functions:
        if _answers_outputs(node):
            own = _own(node)
            found += [
                f"{name}:{ret.lineno} {node.name} returns {ast.unparse(ret.value) if ret.value else 'None'}"
                for ret in own
                if isinstance(ret, ast.Return) and not _keyed(ret.value, answering, _assigned(own))
            ]
    return found


def test_every_function_that_answers_outputs_answers_them_keyed_by_component() -> None:
    trees = {str(path.relative_to(APP.parent)): ast.parse(path.read_text(), filename=str(path)) for path in SOURCES}
    assert not positional_answers(trees)
    answering = sum(
        _answers_outputs(node)
        for tree in trees.values()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
    )
    assert answering >= 40, answering  # the walk saw the handlers


def test_the_check_catches_a_positional_answer() -> None:
    source = textwrap.dedent("""
        def helper(c) -> Outputs:
            return {c.status: "ok"}

        def tuple_answer(request) -> Outputs:
            if request:
                return gr.skip()
            return "note", gr.Tab(visible=True)

        def list_answer(request) -> Outputs:
            return helper(None) if request else [1, 2]

        def named_answer(request) -> Outputs:
            values = helper(None)
            if request:
                values = [values]
            return values

        def unpacked_answer(request) -> Outputs:
            values, _ = helper(None), None
            return values

        def string_keys(request) -> Outputs:
            return {"status": "ok"}

        def unkeyed_helper(request) -> Outputs:
            return rows(request)

        def keyed(request) -> Outputs:
            def inner():
                return 1, 2  # not an answer: a function of its own
            done = {request: "done"}
            return {**helper(request), request: inner()} if request else done
    """)
    found = positional_answers({"example.py": ast.parse(source)})
    assert [line.split()[1] for line in found] == [
        "tuple_answer",
        "list_answer",
        "named_answer",
        "unpacked_answer",
        "string_keys",
        "unkeyed_helper",
    ], found


def test_every_event_with_several_outputs_has_a_handler_answering_outputs(demo) -> None:
    from app.tabs.outputs import Outputs

    several = [dep for dep in demo.fns.values() if len(dep.outputs) > 1]
    assert len(several) >= 30  # upload, draft, sign, reload, the worklist, the admin and rounds tabs, the page load
    unkeyed = []
    for dep in several:
        handler = inspect.unwrap(dep.fn)
        where = f"{handler.__module__}.{handler.__qualname__}"
        try:
            hints = typing.get_type_hints(handler)  # what Gradio reads to find gr.Request, gr.SelectData
        except NameError as exc:
            unkeyed.append(f"{where}: annotations Gradio cannot read ({exc})")
            continue
        if hints.get("return") != Outputs:
            unkeyed.append(f"{where} answers {hints.get('return')}")
    assert not unkeyed, unkeyed


def test_the_read_tab_keeps_one_page_session_a_frozen_dataclass(demo) -> None:
    from app.tabs.session import PageSession, mine

    states = [b for b in demo.blocks.values() if isinstance(b, gr.State)]
    sessions = [b for b in states if isinstance(b.value, PageSession)]
    assert len(sessions) == 1 and sessions[0].value == PageSession()
    assert not [b for b in states if isinstance(b.value, dict)]  # no free-form dict in any gr.State
    assert dataclasses.is_dataclass(PageSession) and PageSession.__dataclass_params__.frozen
    ritas = dataclasses.replace(sessions[0].value, owner="rita", study_id=3, saved_text="No effusion.")
    assert copy.deepcopy(ritas) == ritas  # what Gradio does with a State's value for each session
    with pytest.raises(dataclasses.FrozenInstanceError):
        ritas.study_id = 4  # type: ignore[misc]  # a handler answers a new session, never edits the page's
    rita, omar = (type("User", (), {"username": name})() for name in ("rita", "omar"))
    assert mine(ritas, rita) is ritas and mine(None, omar) == PageSession()
    with pytest.raises(Exception, match="belongs to another user"):
        mine(ritas, omar)
