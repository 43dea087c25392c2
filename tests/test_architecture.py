"""The house's one-direction rule: the engine imports neither the web framework, the ORM, the app nor db.

Checked twice: statically over every module's import statements (so a lazy
import inside a function is caught too), and dynamically by importing every
engine package in a fresh interpreter and looking at sys.modules. The same
static walk holds the app's tabs to translating clicks: they call services,
never a repository or the engine, and app modules stay small enough to read.
The engine's configuration names no server and no database (those are the
app's `WebSettings`), tabs build no figures, and Gradio's internals are used
in `app/gradio_internals.py` only. And one home per concept: a model's weights are loaded only by
`orapo_core/models/loading.py` (see the rule above `test_models_are_loaded_only_by_the_loader`).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[1] / "orapo_core"
APP = ENGINE.parent / "app"
FORBIDDEN = ("gradio", "sqlalchemy", "alembic", "app", "db")


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_no_engine_module_imports_the_app_layers() -> None:
    offenders = []
    for path in sorted(ENGINE.rglob("*.py")):
        for name in _imported_modules(path):
            if name.split(".")[0] in FORBIDDEN:
                offenders.append(f"{path.relative_to(ENGINE.parent)} imports {name}")
    assert not offenders, offenders
    assert len(list(ENGINE.rglob("*.py"))) > 20  # the walk really saw the engine


def test_the_static_check_catches_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from db.repositories import StudyRepository\n    import gradio as gr\n")
    assert {"db.repositories", "gradio"} <= _imported_modules(bad)


def test_tabs_reach_the_database_and_the_engine_only_through_services() -> None:
    offenders = []
    for path in sorted((APP / "tabs").glob("*.py")):
        for name in _imported_modules(path):
            top = name.split(".")[0]
            if top in ("db", "sqlalchemy") or (top == "orapo_core" and name != "orapo_core.errors"):
                offenders.append(f"{path.relative_to(APP.parent)} imports {name}")
    assert not offenders, offenders
    assert len(list((APP / "tabs").glob("*.py"))) >= 6


def test_app_modules_stay_under_400_lines() -> None:
    long = {
        str(p.relative_to(APP.parent)): n
        for p in sorted(APP.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert not long, f"split these by what changes them together: {long}"


def test_the_engine_configuration_knows_no_server_and_no_database() -> None:
    """Where the server listens, the database and the web limits are the app's settings (app/settings.py)."""
    web = {"host", "port", "database", "sqlalchemy", "url", "cookie", "cookies", "upload", "server", "web"}
    config = ENGINE / "config.py"
    names = set()
    for node in ast.walk(ast.parse(config.read_text(), filename=str(config))):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
    offenders = sorted(n for n in names if web & set(n.lower().split("_")))
    assert not offenders, f"move these to app/settings.py (WebSettings): {offenders}"
    assert {"data_dir", "model_dir", "Settings"} <= names  # the walk saw the fields


def test_tabs_place_figures_the_services_build() -> None:
    offenders = [
        f"{path.relative_to(APP.parent)} imports {name}"
        for path in sorted((APP / "tabs").glob("*.py"))
        for name in _imported_modules(path)
        if name.split(".")[0] == "plotly"
    ]
    assert not offenders, f"build figures in app/services/insight (round_charts, dashboard_charts): {offenders}"


# Gradio's internals (its token map and cookie names, the Blocks behind the running server, the cache folder's
# environment variable, the patched upload method, its private modules) are used in app/gradio_internals.py only,
# which tests/test_gradio_internals.py checks against the installed Gradio.
GRADIO_ADAPTER = APP / "gradio_internals.py"
GRADIO_PRIVATE_ATTRIBUTES = {
    "tokens",
    "cookie_id",
    "get_blocks",
    "_process_single_file",
    "_queue",
    "server_app",
    "uploaded_file_dir",
    "GRADIO_CACHE",
}
GRADIO_PRIVATE_MODULES = ("gradio.routes", "gradio.route_utils", "gradio.utils", "gradio.blocks", "gradio_client.utils")


def test_gradio_internals_are_used_in_one_module() -> None:
    offenders, seen = [], 0
    for path in sorted(APP.rglob("*.py")):
        if path == GRADIO_ADAPTER:
            continue
        seen += 1
        tree = ast.parse(path.read_text(), filename=str(path))
        where = path.relative_to(APP.parent)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in GRADIO_PRIVATE_ATTRIBUTES
                and getattr(node.value, "id", None) != "self"
            ):  # a class's own `self._queue` is its own
                offenders.append(f"{where}:{node.lineno} .{node.attr}")
            elif isinstance(node, ast.Constant) and node.value == "GRADIO_TEMP_DIR":
                offenders.append(f"{where}:{node.lineno} GRADIO_TEMP_DIR")
        offenders += [
            f"{where} imports {name}" for name in _imported_modules(path) if name.startswith(GRADIO_PRIVATE_MODULES)
        ]
    assert not offenders, f"go through app.gradio_internals: {offenders}"
    assert seen > 30


def test_importing_the_engine_loads_no_app_layer() -> None:
    packages = [
        "orapo_core",
        "orapo_core.facts",
        "orapo_core.imaging",
        "orapo_core.data",
        "orapo_core.models",
        "orapo_core.models.draft",
        "orapo_core.models.evaluate",
        "orapo_core.train",
        "orapo_core.train.pairs",
    ]
    code = (
        "import importlib, sys\n"
        f"for name in {packages!r}: importlib.import_module(name)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "print(bad)\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ENGINE.parent
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- one loader ------------------------------------------------------------------------------------------
# A model's weights are loaded in one place, `orapo_core/models/loading.py`, which refuses weights that do not
# fit their config: a second loader is how a round once trained on randomly initialised layers. The rule, over
# every module of app/, orapo_core/ and benchmarks/: a call `X.from_pretrained(...)` is a model load unless X
# names a processor, tokenizer, config or feature extractor (`AutoProcessor`, `AutoTokenizer`, `AutoConfig`,
# `GenerationConfig`, `without_video_processor(cls)`, ...); a model load (AutoModel*, *ForConditionalGeneration,
# *ForImageTextToText, PeftModel, or anything unnamed such as `model_class`) may appear only in loading.py.
# Tests are not held to it: they build tiny checkpoints and compare against transformers directly.
LOADER = ENGINE / "models" / "loading.py"
_NOT_A_MODEL = re.compile(
    r"(processor|tokenizer|tokenizerfast|config|featureextractor|feature_extractor)$", re.IGNORECASE
)


def _receiver_name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _model_loads(path: Path) -> list[str]:
    loads = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "from_pretrained":
            receiver = _receiver_name(node.func.value)
            if not _NOT_A_MODEL.search(receiver):
                loads.append(f"{receiver or '<expression>'}.from_pretrained (line {node.lineno})")
    return loads


def test_models_are_loaded_only_by_the_loader() -> None:
    offenders, seen = [], 0
    for folder in (ENGINE, APP, ENGINE.parent / "benchmarks"):
        for path in sorted(folder.rglob("*.py")):
            seen += 1
            if path != LOADER:
                offenders += [f"{path.relative_to(ENGINE.parent)}: {load}" for load in _model_loads(path)]
    assert not offenders, f"load models through orapo_core.models.loading (load_model, load_for_training): {offenders}"
    assert seen > 60 and _model_loads(LOADER)  # the walk saw the three trees, and the loader's own loads count


def test_the_loader_check_tells_a_model_load_from_a_processor_load(tmp_path: Path) -> None:
    sample = tmp_path / "loads.py"
    sample.write_text(
        "from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor, Qwen2VLForConditionalGeneration\n"
        "def f(path, model_class):\n"
        "    AutoConfig.from_pretrained(path)\n"
        "    AutoProcessor.from_pretrained(path)\n"
        "    without_video_processor(cls).from_pretrained(path)\n"
        "    transformers.AutoTokenizer.from_pretrained(path)\n"
        "    AutoModelForImageTextToText.from_pretrained(path)\n"
        "    transformers.Qwen2VLForConditionalGeneration.from_pretrained(path)\n"
        "    model_class.from_pretrained(path)\n"
        "    PeftModel.from_pretrained(model, path)\n"
    )
    assert [load.split(".")[0] for load in _model_loads(sample)] == [
        "AutoModelForImageTextToText",
        "Qwen2VLForConditionalGeneration",
        "model_class",
        "PeftModel",
    ]


def _import_graph(folder: Path, *, package: str) -> dict[str, set[str]]:
    """Module -> the modules of `package` (whose files are under `folder`, subpackages included) it imports, from
    every import statement (lazy ones too). `from pkg import sub` of a submodule counts as importing the submodule,
    not the package's `__init__`; `from pkg import name` of anything else counts as importing `pkg/__init__.py`."""
    modules: dict[str, Path] = {}
    for path in folder.rglob("*.py"):
        parts = (package,) + path.relative_to(folder).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                subs = {f"{node.module}.{alias.name}" for alias in node.names} & modules.keys()
                targets.update(subs)
                if len(subs) < len(node.names):
                    targets.add(node.module)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_in_the_app() -> None:
    """No two app modules import each other, directly or round about, not even lazily inside a function."""
    graph = _import_graph(APP, package="app")
    assert _cycles(graph) == []
    # the walk saw the services' groups: a tab imports a module of a group, not the group's `__init__`
    assert "app.services.reading.drafting" in graph["app.tabs.read"]
    assert "app.services.reading" not in graph["app.tabs.read"]


def test_no_import_circle_in_the_engine() -> None:
    """The same for `orapo_core`: what two engine modules share lives in a module both import (the picture a model
    is shown, `orapo_core.models.picture`, drafting's and the finding verifier's), not in one importing the other
    back inside a function."""
    graph = _import_graph(ENGINE, package="orapo_core")
    assert _cycles(graph) == []
    assert "orapo_core.models.verifier" in graph["orapo_core.models.draft"]  # the walk saw the imports
    assert "orapo_core.models.picture" in graph["orapo_core.models.verifier"]


def test_no_import_circle_in_the_benchmarks() -> None:
    """The same for the `benchmarks` package: what two benchmarks share lives in a module of its own
    (`round_story_common`), not in one of them importing the other back."""
    graph = _import_graph(ENGINE.parent / "benchmarks", package="benchmarks")
    assert _cycles(graph) == []
    assert "benchmarks.round_story_common" in graph["benchmarks.bench_round_story"]  # the walk saw the imports


def test_the_circle_check_finds_a_circle(tmp_path: Path) -> None:
    (tmp_path / "tabs").mkdir()
    (tmp_path / "server.py").write_text("from app.tabs import read\n")
    (tmp_path / "tabs" / "__init__.py").write_text("")
    (tmp_path / "tabs" / "read.py").write_text("def f():\n    from app.server import build\n")
    assert _cycles(_import_graph(tmp_path, package="app")) == [["app.server", "app.tabs.read"]]


def test_the_circle_check_follows_subpackages(tmp_path: Path) -> None:
    """A circle through a group of services is found whether its modules are named by their dotted path or
    imported from their group (`from app.services.reading import drafting`); the groups' empty `__init__` is no
    module anyone imports."""
    group = tmp_path / "services" / "reading"
    group.mkdir(parents=True)
    for init in (tmp_path / "services" / "__init__.py", group / "__init__.py"):
        init.write_text("")
    (group / "drafting.py").write_text("def f():\n    from app.services.reading.reports import save\n")
    (group / "reports.py").write_text("from app.services.reading import drafting\n")
    graph = _import_graph(tmp_path, package="app")
    assert graph["app.services.reading.reports"] == {"app.services.reading.drafting"}
    assert _cycles(graph) == [["app.services.reading.drafting", "app.services.reading.reports"]]


def test_no_metric_name_is_written_as_a_string_outside_its_module() -> None:
    """Metrics are read by attribute of `EvalMetrics`; a module that must pick one by name uses the names
    orapo_core/facts/metrics.py exports (MACRO_F1, FACTS_REWARD). The gate had written "macro_f1_14" again."""
    from dataclasses import fields

    from orapo_core.facts.metrics import EvalMetrics

    names = {f.name for f in fields(EvalMetrics) if f.name.endswith(("_14", "_5")) or f.name == "facts_reward_mean"}
    home = ENGINE / "facts" / "metrics.py"
    offenders = []
    for root in (ENGINE, APP, ENGINE.parent / "db"):
        for path in sorted(root.rglob("*.py")):
            if path == home:
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Constant) and node.value in names:
                    offenders.append(f"{path.relative_to(ENGINE.parent)}:{node.lineno} {node.value!r}")
    assert not offenders, offenders
