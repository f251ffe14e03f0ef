"""The classroom: student versions of the chapter notebooks, and grading a class in a sandbox.

`make_student_versions` (student.py) strips the nbgrader-marked solutions. `grade` (grading.py)
takes the exercises from the teacher's notebooks (roster.py), runs each learner's notebooks in
a sandbox (sandbox.py, worker.py, over the channel of wire.py, with the teacher's helpers of
material.py and without the exercise catalogue), judges the returned values in
the grader's own process, journals each learner's rows as soon as they are known (journal.py),
and writes the CSV and a report (report.py).
"""

from __future__ import annotations


def __getattr__(name: str):
    # imported on first use: the sandbox's worker imports this package and needs neither
    if name == "make_student_versions":
        from .student import make_student_versions

        return make_student_versions
    if name == "grade":
        from .grading import grade

        return grade
    raise AttributeError(f"module 'xenith_edu.classroom' has no attribute {name!r}")


__all__ = ["grade", "make_student_versions"]
