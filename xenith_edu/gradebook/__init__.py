"""The gradebook: a class graded (every learner judged by `xenith_edu.grader`), and the course
made of its rows: points, totals, the journal, reports, feedback, LMS files, statistics.

`grade` (grading.py) reads the class and journals each learner's rows as soon as they are
known (journal.py), and ends as a course (course.py): points and written questions from the
teacher's notebooks (points.py), the roster, times and filled sheet read as foreign input
(inputs.py), the CSV, totals, report (report.py), feedback and LMS files (exports.py), each
written 0640 (outfiles.py). `grade_merge` (shards.py) joins the shards of a class graded with
`shard="K/N"`; stats.py writes what to re-teach, gradescope.py an autograder archive.
"""

from __future__ import annotations

UNIX_ONLY = ("fcntl", "resource", "pwd", "grp", "termios")  # modules Windows has not


def __getattr__(name: str):
    # imported on first use: the sandbox's worker imports the package and needs neither
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
    raise AttributeError(f"module 'xenith_edu.gradebook' has no attribute {name!r}")


__all__ = ["grade", "grade_merge"]
