"""Chapters run from any folder: what they read is package data, never a path of the repository.
Every chapter, full and student, runs top to bottom in an empty folder outside the repository
with the package installed from its built wheel (no clone on the path); the training chapter's
long cells are left out. In the grader's sandbox, the full chapters pass every exercise
(test_grading_book.py) and the student copies, handed in untouched, give "not attempted" rows
and no notebook error.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from xenith_edu import chapters
from xenith_edu.classroom import grade
from xenith_edu.classroom.student import SETUP_TAG, make_student_versions
from xenith_edu.exercises import CHECKS

ROOT = Path(__file__).resolve().parents[1]
# a string literal in a chapter's code that names a file of the repository, not of the package
REPO_PATH = re.compile(r"""["'](\.\./|\./|runs/|benchmarks/|notebooks/|tests/)""")
# the training chapter trains for a minute: of it, the first code cell (the imports), the setup
# cell and the cells that read the shipped run
READS_SHIPPED = re.compile(r"\b(shipped|book_run)\b")


def code_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [c for c in nb.cells if c.cell_type == "code"]


@pytest.mark.parametrize("c", chapters.CHAPTERS, ids=lambda c: c.slug)
def test_no_chapter_names_a_file_of_the_repository(c: chapters.Chapter) -> None:
    nb = nbformat.read(str(ROOT / f"{c.notebook}.ipynb"), as_version=4)
    hits = [line.strip() for cell in code_cells(nb) for line in cell.source.splitlines()
            if REPO_PATH.search(line.split("#")[0])]
    assert hits == [], f"{c.slug} reads files of the repository (make them package data): {hits}"


def test_the_check_finds_a_repository_path() -> None:
    assert REPO_PATH.search('json.loads(Path("../benchmarks/memory.json").read_text())')
    assert REPO_PATH.search("read_log('runs/book/log.jsonl')")
    assert not REPO_PATH.search('shipped("memory.json")')


def shortened(nb: nbformat.NotebookNode, slug: str) -> nbformat.NotebookNode:
    """The training chapter without its long cells; any other chapter whole."""
    if slug != "training":
        return nb
    first = code_cells(nb)[0] if SETUP_TAG not in code_cells(nb)[0].metadata.get("tags", []) \
        else code_cells(nb)[1]
    nb.cells = [cell for cell in nb.cells if cell.cell_type == "code" and (
        cell is first or SETUP_TAG in cell.metadata.get("tags", [])
        or READS_SHIPPED.search(cell.source))]
    assert len(nb.cells) >= 4, "the training chapter no longer reads its shipped run"
    return nb


@pytest.fixture(scope="module")
def wheel_site(tmp_path_factory) -> Path:
    """The package as `pip install` of its built wheel puts it: a folder holding only it."""
    out = tmp_path_factory.mktemp("wheel")
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
             "--no-index", "-q", "-w", str(out / "dist"), str(ROOT)]
    subprocess.run(build, check=True, capture_output=True, cwd=out)
    (wheel,) = (out / "dist").glob("xenith_edu-*.whl")
    site = out / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                    "--target", str(site), str(wheel)], check=True, capture_output=True, cwd=out)
    return site


# the first cell of every run: the package must be the wheel's, not the clone's
WHICH_PACKAGE = """import xenith_edu, pathlib
here = pathlib.Path(xenith_edu.__file__).resolve()
assert here.is_relative_to(pathlib.Path({site!r}).resolve()), here"""


@pytest.mark.parametrize("version", ["full", "student"])
@pytest.mark.parametrize("slug", [c.slug for c in chapters.CHAPTERS])
def test_chapter_runs_from_an_empty_folder_with_the_wheel(slug: str, version: str,
                                                          wheel_site: Path,
                                                          tmp_path: Path) -> None:
    path = ROOT / f"{chapters.chapter(slug).notebook}.ipynb"
    if version == "student":
        (path,) = make_student_versions(path, tmp_path / "student")
    nb = shortened(nbformat.read(str(path), as_version=4), slug)
    nb.cells.insert(0, nbformat.v4.new_code_cell(WHICH_PACKAGE.format(site=str(wheel_site))))
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(wheel_site)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(empty)}}).execute(env=env, cwd=str(empty))
    assert list(empty.iterdir()) == [], f"{slug} wrote into the working folder"


def test_untouched_student_copies_grade_as_not_attempted_in_the_sandbox(tmp_path: Path) -> None:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed: the grader would run unsandboxed")
    learner = tmp_path / "subs" / "ada"
    make_student_versions(ROOT / "notebooks", learner)
    rows = grade(tmp_path / "subs", tmp_path / "grades.csv", instructor=ROOT / "notebooks",
                 jobs=2, seed=0)
    statuses = {(r["notebook"], r["exercise"]): r["status"] for r in rows}
    assert {s for s in statuses.values()} == {"not attempted"}, [
        (k, s, r["message"][:200]) for (k, s), r in zip(statuses.items(), rows, strict=True)
        if s != "not attempted"]
    assert {e for _, e in statuses} == set(CHECKS)
