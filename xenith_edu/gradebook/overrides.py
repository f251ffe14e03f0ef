"""The teacher's overrides: a file of (learner, exercise or question, points, comment), applied at
every run after the checks, so an override always wins, and marked wherever points are shown.

Read through the one CSV reader (inputs.csv_rows); a row naming a learner or an exercise the
class has not, or points outside 0 to the item's maximum, is refused in one line.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

from .inputs import _table

MARK = "[override]"  # the message of an overridden row starts with it


class Override(NamedTuple):
    """What the teacher decided for one learner's item: the points, and why."""

    points: float
    comment: str


def read_overrides(path: Path, items: dict[str, float], learners: set[str]
                   ) -> dict[tuple[str, str], Override]:
    """(learner, item) -> Override, from a CSV with the columns learner, exercise (or
    question), points and optionally comment; `items` maps each exercise and question to its
    points."""
    rows = _table(path, "overrides file", ("learner", "points"))
    out: dict[tuple[str, str], Override] = {}
    for n, row in rows:
        where = f"{path.name}, row {n}"
        item = row.get("exercise") or row.get("question") or ""
        if "exercise" not in row and "question" not in row:
            raise ValueError(f"{path.name}, row 1: no column 'exercise' (or 'question') in the "
                             "header: the overrides file needs learner, exercise, points, comment")
        if row["learner"] not in learners:
            raise ValueError(f"{where}: no learner {row['learner']!r} in this class: give the "
                             "learner's id as the totals file shows it")
        if item not in items:
            raise ValueError(f"{where}: no exercise or question {item!r} in the teacher's "
                             "notebooks: give its id as the grades CSV shows it")
        if (row["learner"], item) in out:
            raise ValueError(f"{where}: {row['learner']}'s {item} is overridden twice: keep one "
                             "row of it")
        out[(row["learner"], item)] = Override(_points(row["points"], items[item], where),
                                               row.get("comment", ""))
    return out


def _points(text: str, most: float, where: str) -> float:
    try:
        points = float(text.replace(",", "."))
    except ValueError:
        points = math.nan
    if not (math.isfinite(points) and 0 <= points <= most):
        raise ValueError(f"{where}: points {text!r}: write a number from 0 to {most:g}")
    return points


def message(override: Override, status: str, message: str) -> str:
    """An overridden row's message: the mark, the teacher's comment, what the check said."""
    said = [f"the check said {status}" + (f": {message}" if message else "")] \
        if message or status != "graded" else []  # graded: a row only the override made
    return " ".join([MARK, "; ".join([override.comment] * bool(override.comment) + said)]
                    ).rstrip()


def summary(mine: dict[str, Override]) -> str:
    """A learner's overrides in one cell of the totals: `linear_backward: 2; why: 1`."""
    return "; ".join(f"{item}: {o.points:g}" for item, o in mine.items())
