"""Every chapter is gradable: a learner who hands in the book's own notebooks (every solution
right) gets a passed row for every exercise of every chapter, and no notebook error.

The chapters read nothing outside the installed package (the memory chapter's figures and the
training chapter's run are package data), and the cells tagged `skip-grading` (long training
runs) are not run by the grader, so the whole book grades in well under a minute.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from xenith_edu.chapters import CHAPTERS
from xenith_edu.exercises import CHECKS
from xenith_edu.gradebook import grade

ROOT = Path(__file__).resolve().parents[1]


def test_the_book_s_own_notebooks_pass_every_exercise_with_no_notebook_error(tmp_path):
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed: the grader would run unsandboxed")
    learner = tmp_path / "subs" / "ada"
    learner.mkdir(parents=True)
    for c in CHAPTERS:
        shutil.copy(ROOT / f"{c.notebook}.ipynb", learner / f"{c.slug}.ipynb")
    rows = grade(tmp_path / "subs", tmp_path / "grades.csv", instructor=ROOT / "notebooks",
                 jobs=2, seed=0)
    bad = [(r["notebook"], r["exercise"], r["status"], r["message"][:200]) for r in rows
           if r["status"] != "passed"]
    assert bad == []
    graded = {r["exercise"] for r in rows if r["exercise"]}
    assert graded == set(CHECKS)  # every exercise of the book was graded
