"""The classroom: student versions of the chapter notebooks, and grading a class in a sandbox.

`make_student_versions` (student.py) strips the nbgrader-marked solutions. `grade` (grading.py)
takes the exercises from the teacher's notebooks (roster.py, learners' names made canonical by
names.py), reads each learner's notebooks under limits (nbread.py), runs them in a sandbox
(sandbox.py, worker.py, cells as IPython transforms them in cells.py, over the channel of
wire.py, with the teacher's helpers of material.py and without the exercise catalogue),
watches the calls into what computes each answer (delegation.py), judges the returned values in
the grader's own process, journals each learner's rows as soon as they are known (journal.py),
and ends as a course (course.py): points and written questions from the teacher's notebooks
(points.py), the roster, times and filled sheet read as foreign input (inputs.py), the CSV,
totals, report (report.py), feedback and LMS files (exports.py), each written 0640
(outfiles.py). `grade_merge` (shards.py) joins the shards of a class graded with `shard="K/N"`.
"""

from __future__ import annotations

UNIX_ONLY = ("fcntl", "resource", "pwd", "grp", "termios")  # modules Windows has not


def __getattr__(name: str):
    # imported on first use: the sandbox's worker imports this package and needs neither
    if name == "make_student_versions":
        from .student import make_student_versions  # on first use (see above)

        return make_student_versions
    if name == "grade":
        try:
            from .grading import grade  # on first use (see above)
        except ImportError as e:  # the sandbox is Linux's (bubblewrap, rlimits, flock)
            if e.name not in UNIX_ONLY:
                raise
            raise OSError(f"grading runs notebooks in a Linux sandbox (bubblewrap), and this "
                          f"system has no {e.name}: grade on Linux") from None
        return grade
    if name == "grade_merge":
        from .shards import merge  # on first use (see above)

        return merge
    raise AttributeError(f"module 'xenith_edu.classroom' has no attribute {name!r}")


__all__ = ["grade", "grade_merge", "make_student_versions"]
