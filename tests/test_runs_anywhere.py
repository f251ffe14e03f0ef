"""Chapters run from any folder: what they read is package data, never a path of the repository.
Every chapter, full and student, runs top to bottom in a folder of its own outside the repository
with the package installed from its built wheel (no clone on the path): the full version under
nbval, the student version with its checks' verdicts logged; each runs once per test session
(conftest.py, chapter_runs.py), and test_classroom.py reads the same student runs. In the
grader's sandbox, the full chapters pass every exercise (test_grading_book.py) and the student
copies, handed in untouched, give "not attempted" rows and no notebook error.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat
import pytest

from xenith_edu import chapters
from xenith_edu.booktools.student import make_student_versions
from xenith_edu.exercises import CHECKS
from xenith_edu.gradebook import grade

ROOT = Path(__file__).resolve().parents[1]
# a string literal in a chapter's code that names a file of the repository, not of the package
REPO_PATH = re.compile(r"""["'](\.\./|\./|runs/|benchmarks/|notebooks/|tests/)""")


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


@pytest.mark.parametrize("slug", [c.slug for c in chapters.CHAPTERS])
def test_full_chapter_agrees_with_its_outputs_from_a_folder_of_its_own_with_the_wheel(
        slug: str, full_runs: dict) -> None:
    """nbval's run of the chapter (conftest.py's `full_runs`, the chapter's one full run):
    every stored output agrees, the package is the wheel's, and nothing is written."""
    run = full_runs[slug]
    assert run.failures == [], "\n\n".join(run.failures)
    assert run.left == [], f"{slug} wrote into the working folder: {run.left}"


@pytest.mark.parametrize("slug", [c.slug for c in chapters.CHAPTERS])
def test_student_chapter_runs_from_an_empty_folder_with_the_wheel(slug: str,
                                                                   student_runs: dict) -> None:
    """The student version's one run (conftest.py's `student_runs`), as the grader runs it: its
    cells tagged skip-grading are the full version's own (which nbval runs), and left out."""
    run = student_runs[slug]
    assert run.not_full == [], f"{slug}: skip-grading cells that differ from the full version's"
    assert run.error is None, run.error
    assert run.left == [], f"{slug} wrote into the working folder: {run.left}"


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
