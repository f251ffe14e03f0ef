"""The statuses of the grade CSV's rows, one home for each: the grader writes them, the course,
the report and the exports read them. Imports nothing heavy (the sandbox's worker may load it).

The statuses are `xenith_edu.exercises.Status`, one enum for the exercises and the grader: a
check's own verdicts (passed, failed, not attempted) first, then those only grading reaches.
"""

from __future__ import annotations

from typing import NamedTuple

from ..exercises.outcomes import Status

Row = Status  # one enum: a check's verdicts first, then those only grading reaches


STATUSES = tuple(Row)
# a submission that was not judged, or broke the grader's protocol: the report lists these apart
ERRORS = (Row.NOTEBOOK_ERROR, Row.PROTOCOL_ERROR, Row.OVER_LIMIT, Row.UNREADABLE, Row.COLLISION)
# the columns of the report's table of statuses per exercise
JUDGED = (Row.PASSED, Row.FAILED, Row.NOT_ATTEMPTED, Row.DELEGATED, Row.MISSING,
          Row.NOTEBOOK_ERROR)


class Found(NamedTuple):
    """One row of a learner as grading finds it, before the learner's id is put in front."""

    notebook: str  # the learner's notebook, as handed in ("" when none)
    exercise: str  # the exercise's id ("" for a row of the whole notebook or submission)
    status: str  # a Row
    message: str  # what the learner and the teacher read
    mistake: str = ""  # the check's first diagnosis, as data


class GradeRow(NamedTuple):
    """One row of the grade CSV before the course adds points and late marks."""

    learner: str
    notebook: str
    exercise: str
    status: str
    message: str
    mistake: str = ""
