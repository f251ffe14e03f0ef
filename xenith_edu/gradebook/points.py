"""The teacher's notebooks, read for the course: each exercise's points, the written questions
the teacher grades by hand, and the cells that grading skips.

Points and written questions use nbgrader's cell metadata, so notebooks made for nbgrader carry
over: `metadata.nbgrader.points` on the check cell (or the cell of the function), and a markdown
cell with `solution` and `grade` set (or the tag `written-answer`) for a written answer.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from ..booktools.student import TEXT_STUB
from ..grader import nbread
from ..grader.nbread import SKIP_TAG, _nbgrader, _source, blank_skipped, cell_key, is_written  # noqa: F401
from ..grader.roster import Exercise
from .written import student_answer

DEFAULT_POINTS = 1.0


@dataclass(frozen=True)
class Question:
    """A written answer the teacher grades by hand: its key in the notebook, its points."""

    id: str
    points: float
    prompt: str
    stub: str = TEXT_STUB  # the answer cell as the student version hands it out


@dataclass(frozen=True)
class Part:
    """One teacher's notebook as the course counts it: its exercises' points, its questions."""

    notebook: str
    points: dict[str, float]  # exercise id -> points, in the notebook's order
    questions: tuple[Question, ...] = ()

    @property
    def chapter(self) -> str:
        """The name of the notebook's subtotal: its file name without .ipynb."""
        return self.notebook.removesuffix(".ipynb")

    def as_dict(self) -> dict:
        return {"notebook": self.notebook, "points": self.points,
                "questions": [[q.id, q.points, q.prompt, q.stub] for q in self.questions]}

    @classmethod
    def from_dict(cls, d: dict) -> Part:
        return cls(str(d["notebook"]), {str(k): float(v) for k, v in d["points"].items()},
                   tuple(Question(str(i), float(p), str(t), *map(str, stub))
                         for i, p, t, *stub in d["questions"]))


def _points(cell: dict, where: str) -> float | None:
    points = _nbgrader(cell).get("points")
    if points is None:
        return None
    if isinstance(points, bool) or not isinstance(points, int | float) or \
            not math.isfinite(points) or points < 0:
        raise ValueError(f"{where}: metadata.nbgrader.points is {points!r}: give a number of "
                         "points, 0 or more")
    return float(points)


def read_part(path: Path, exercises: list[Exercise]) -> Part:
    """The points of `exercises` in the teacher's notebook `path`, and its written questions."""
    from ..tools.notebook import read_notebook  # nbformat: only when notebooks are read

    cells = read_notebook(path).cells
    found: dict[str, float] = {}
    questions, prompt = [], ""
    for n, cell in enumerate(cells, start=1):
        where = f"{path.name}, cell {n}"
        if cell.get("cell_type") == "code":
            for ex in exercises:
                calls = re.search(rf"\bcheck_{ex.id}\s*\(", _source(cell))
                defines = re.search(rf"^\s*def\s+{ex.fn}\s*\(", _source(cell), re.MULTILINE)
                if (calls or (defines and ex.id not in found)) and \
                        (points := _points(cell, where)) is not None:
                    found[ex.id] = points
        elif is_written(cell):
            key = cell_key(cell) or f"cell-{n}"
            if any(q.id == key for q in questions):
                raise ValueError(f"{where}: a second written answer with the id {key!r}: give "
                                 "each its own nbgrader grade_id")
            points = _points(cell, where)
            questions.append(Question(key, DEFAULT_POINTS if points is None else points, prompt,
                                      student_answer(_source(cell))))
        elif cell.get("cell_type") == "markdown":
            prompt = " ".join(_source(cell).split())[:300]
    return Part(path.name, {e.id: found.get(e.id, DEFAULT_POINTS) for e in exercises},
                tuple(questions))


def read_parts(instructor: Path | None, teacher: list[tuple[str, list[Exercise]]]
               ) -> list[Part]:
    """The course's parts: one per teacher's notebook that is graded."""
    from ..grader.roster import _instructor  # the one rule of where the teacher's notebooks are

    paths = {p.name: p for p in _instructor(instructor)}
    return [read_part(paths[name], exercises) for name, exercises in teacher]


def answers(path: Path, questions: tuple[Question, ...]) -> dict[str, str]:
    """The learner's answer to each written question found in their notebook `path`."""
    return nbread.answers(path, {q.id for q in questions})
