"""The statuses of the grade CSV's rows, one home for each: the grader writes them, the course,
the report and the exports read them. Imports nothing heavy (the sandbox's worker may load it).

A check's own verdicts (passed, failed, not attempted) are `xenith_edu.exercises.Status`; the
same words stand first here, then those that only grading reaches.
"""

from __future__ import annotations

from enum import Enum


class Row(str, Enum):
    """A row's status. A `str`, so that the CSV and the journal hold its value ("passed")."""

    PASSED = "passed"
    FAILED = "failed"
    NOT_ATTEMPTED = "not attempted"
    DELEGATED = "delegated"  # the learner's function handed the work to the package's own
    MISSING = "missing"  # the function, or the notebook, is not in the submission
    NOTEBOOK_ERROR = "notebook error"  # the notebook did not run to its end
    PROTOCOL_ERROR = "protocol error"  # the sandbox's reply broke the protocol: tampering
    UNREADABLE = "unreadable file"  # a file the walk refuses (a link, a pipe, a bad name)
    OVER_LIMIT = "over the limit"  # a submission too deep, too many files or too large
    COLLISION = "name collision"  # several submissions would be one learner
    NOT_SUBMITTED = "not submitted"  # a learner of the roster who handed nothing in
    TO_GRADE = "to grade"  # a written answer the teacher has not graded yet
    GRADED = "graded"  # a written answer the teacher graded

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


STATUSES = tuple(Row)
# a submission that was not judged, or broke the grader's protocol: the report lists these apart
ERRORS = (Row.NOTEBOOK_ERROR, Row.PROTOCOL_ERROR, Row.OVER_LIMIT, Row.UNREADABLE, Row.COLLISION)
# the columns of the report's table of statuses per exercise
JUDGED = (Row.PASSED, Row.FAILED, Row.NOT_ATTEMPTED, Row.DELEGATED, Row.MISSING,
          Row.NOTEBOOK_ERROR)
