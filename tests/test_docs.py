"""The documentation: a README of one screen, a docs site whose generated pages are current, and links that resolve.

`make docs` (which `make test` runs first) builds the site with `--strict`, so a broken link or anchor, or a page
left out of the nav, fails; the slow test here builds it too. The generated pages are compared with what their
generators write now, as tests/test_error_codes.py does for the error catalogue: regenerate them with the command
each failure prints.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.reference import OTHER_VARIABLES, cli_markdown, configuration_markdown, settings_classes, variable
from benchmarks.headline_table import markdown as headline_markdown

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = DOCS / "pages"

# committed file -> (module run with -m, its argument, the function that writes it)
GENERATED = {
    "docs/pages/reference/configuration.md": ("app.reference", "configuration", configuration_markdown),
    "docs/pages/reference/cli.md": ("app.reference", "cli", cli_markdown),
    "docs/snippets/headline-table.md": ("benchmarks.headline_table", None, headline_markdown),
}


@pytest.mark.parametrize("path", sorted(GENERATED))
def test_each_generated_page_is_current_and_its_command_needs_no_torch(path: str) -> None:
    module, argument, write = GENERATED[path]
    command = f"python -m {module}{f' {argument}' if argument else ''} > {path}"
    assert (ROOT / path).read_text() == write(), f"regenerate it: {command}"
    printed = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", module, *([argument] if argument else [])],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
        timeout=120,
    )
    assert printed.stdout == write()
    imported = {line.rsplit("|", 1)[-1].strip() for line in printed.stderr.splitlines() if "|" in line}
    assert "pydantic" in imported or module.startswith("benchmarks")  # -X importtime really listed the imports
    assert not {"torch", "transformers", "gradio"} & imported


def test_the_configuration_reference_has_every_setting_and_every_variable_the_code_reads() -> None:
    page = (PAGES / "reference" / "configuration.md").read_text()
    rows = set(re.findall(r"`(ORAPO_[A-Z_]+)`", page))
    for _, _, cls, names in settings_classes():
        for name in names:
            assert cls.model_fields[name].description, f"{cls.__name__}.{name} needs a description"
            assert variable(cls, name) in rows
    read = {
        match
        for folder in ("app", "orapo_core", "db")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for match in re.findall(
            r"""(?:environ(?:\.get)?|getenv)\s*[(\[]\s*["'](ORAPO_[A-Z0-9_]+)["']""", path.read_text()
        )
    }
    assert "ORAPO_DICOMWEB_URL" in read  # the scan sees the archive's variables
    listed = {name for names, _, _ in OTHER_VARIABLES for name in names}
    fields = {variable(cls, name) for _, _, cls, names in settings_classes() for name in names}
    assert read <= fields | listed, f"document these in app.reference.OTHER_VARIABLES: {sorted(read - fields - listed)}"
    assert listed <= rows


def test_the_cli_reference_has_every_command_and_option() -> None:
    from app.cli import SUBCOMMANDS

    page = (PAGES / "reference" / "cli.md").read_text()
    for name in SUBCOMMANDS:
        assert f"## `orapo {name}`" in page
    for option in ("--min-agreement", "--if-missing", "--allow-aet", "--format", "--send", "--dry-run"):
        assert f"`{option}" in page, option
    assert "rounds worker" not in page  # the rounds' own helper processes are not listed, as in --help


def test_the_readme_is_one_screen_and_its_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    assert "## Security" in readme and "make run" in readme and "make test" in readme
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    assert any(t.startswith("docs/pages/") for t in targets)
    missing = [t for t in targets if not t.startswith(("http://", "https://")) and not (ROOT / t).is_file()]
    assert not missing, missing


def test_every_page_is_in_the_nav_and_no_old_docs_path_is_named() -> None:
    config = (DOCS / "mkdocs.yml").read_text()
    pages = {p.relative_to(PAGES).as_posix() for p in PAGES.rglob("*.md")}
    assert pages == set(re.findall(r"([\w/.-]+\.md)\s*$", config.split("\nnav:", 1)[1], re.MULTILINE))
    old = re.compile(r"docs/(errors\.md|scaling-out-(backends|servers)\.md|screenshots/)")
    offenders = [
        f"{path.relative_to(ROOT)}"
        for folder in ("app", "orapo_core", "db", "tests", "docs")
        for path in sorted((ROOT / folder).rglob("*"))
        if path.suffix in (".py", ".md", ".yml", ".yaml")
        and "build" not in path.relative_to(ROOT).parts
        and old.search(path.read_text())
    ]
    offenders += ["README.md"] if old.search((ROOT / "README.md").read_text()) else []
    assert not offenders, f"these still name a docs file by its old path: {offenders}"


@pytest.mark.slow
def test_the_site_builds_with_strict_checks(tmp_path: Path) -> None:
    """What `make docs` runs, into a temporary folder: any warning (a broken link or anchor) fails it."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(DOCS / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    research = (tmp_path / "site" / "research" / "index.html").read_text()
    assert "OraPO + FactS" in research  # the headline table was included, not left as a snippet marker
    assert "--8&lt;--" not in research and "--8<--" not in research
