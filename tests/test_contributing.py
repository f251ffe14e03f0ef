"""CONTRIBUTING.md's layout table is the tree's: every module of the package is named in it, and
every module it names exists. The files the type checker reads (pyproject.toml's [tool.mypy])
exist, and cover the tools, the components, the model, the trainer and the command line, so a
new module there is checked from its first commit.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from xenith_edu import chapters

ROOT = Path(__file__).resolve().parents[1]
CODE = re.compile(r"`([^`]+)`")
MODULE = re.compile(r"^(<slug>|[A-Za-z_]\w*)\.py$")  # a module's file name, or the placeholder


def layout_rows() -> list[tuple[str, str]]:
    """(where, what) of each row of the table under "## Layout", up to its first blank line."""
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    section = text[text.index("## Layout"):]
    lines = section[section.index("| floor |"):].split("\n\n")[0].splitlines()[2:]
    rows = []
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 3, f"a layout row has {len(cells)} cells: {line}"
        rows.append((cells[1], cells[2]))
    return rows


def named_modules() -> set[str]:
    """Every module the table names, as a path from the repository's root."""
    names = set()
    for where, what in layout_rows():
        (folder,) = CODE.findall(where)
        assert folder.startswith("xenith_edu/") and folder.endswith("/"), where
        for name in CODE.findall(what):
            m = MODULE.match(name)
            if not m:
                continue
            if m.group(1) == "<slug>":  # one module per chapter: those the folder has
                names |= {f"{folder}{c.slug}.py" for c in chapters.CHAPTERS
                          if (ROOT / folder / f"{c.slug}.py").is_file()}
            else:
                names.add(folder + name)
    return names


def package_modules() -> set[str]:
    """Every module of the package; a sub-package's __init__.py is its folder's row."""
    found = {p.relative_to(ROOT).as_posix() for p in (ROOT / "xenith_edu").rglob("*.py")}
    return {p for p in found if not (p.endswith("/__init__.py") and p != "xenith_edu/__init__.py")}


def test_every_module_of_the_package_is_in_the_layout_table() -> None:
    missing = sorted(package_modules() - named_modules())
    assert missing == [], f"CONTRIBUTING.md's layout table does not name {missing}"


def test_every_module_the_layout_table_names_exists() -> None:
    named = named_modules()
    assert len(named) >= 60, sorted(named)  # the parser read the table
    gone = sorted(p for p in named if not (ROOT / p).is_file())
    assert gone == [], f"CONTRIBUTING.md's layout table names modules that do not exist: {gone}"


def test_the_grader_recipe_names_files_that_exist() -> None:
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    recipe = text[text.index("### Change the grader"):text.index("### Style")]
    paths = re.findall(r"`((?:booktools|grader|gradebook|exercises)/\w+\.py)", recipe)
    assert paths, "the grader recipe names no file"
    gone = [p for p in paths if not (ROOT / "xenith_edu" / p).is_file()]
    assert gone == [], gone
    # each status has one home: the grader's own are the rows' statuses
    assert "`Row` in `grader/statuses.py`" in recipe


def mypy_files() -> list[str]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return config["tool"]["mypy"]["files"]


def test_the_type_checker_reads_every_module_of_the_typed_floors() -> None:
    files = mypy_files()
    gone = [f for f in files if not (ROOT / f).is_file()]
    assert gone == [], f"[tool.mypy] files that do not exist: {gone}"
    must = {p.relative_to(ROOT).as_posix() for pattern in ("xenith_edu/*.py",
            "xenith_edu/tools/*.py", "xenith_edu/model/*.py", "xenith_edu/model/hf/*.py",
            "xenith_edu/training/*.py", "xenith_edu/cli/*.py") for p in ROOT.glob(pattern)}
    assert sorted(must - set(files)) == []


def make_recipe(target: str) -> list[str]:
    """The command lines of a Makefile target, with $(BIN)/ taken off."""
    lines = (ROOT / "Makefile").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip().replace("$(BIN)/", ""))
    return recipe


def test_the_workflow_runs_what_make_test_fast_and_make_typecheck_run() -> None:
    workflow = (ROOT / ".github" / "workflows" / "tests.yml").read_text(encoding="utf-8")
    runs = {line.strip()[len("run: "):] for line in workflow.splitlines()
            if line.strip().startswith("run: ")}
    (fast,) = make_recipe("test-fast")
    (types,) = make_recipe("typecheck")
    assert fast in runs and f"python -m {types}" in runs, (fast, types, runs)
    assert types in make_recipe("test")[:2]  # before pytest
    assert "make test" in workflow and "windows-latest" in workflow and "macos-latest" in workflow
