"""Seconds per learner of grading a class: N learners, each handing in the book's own notebooks
(every solution right), graded with `xenith-edu grade` as a teacher runs it.

    python benchmarks/grade_class.py --learners 30 --jobs 2

Prints the wall time, the seconds per learner, and the rows by status (all should pass: a row
that does not is a chapter the grader cannot grade, which tests/test_grading_book.py also holds).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import tempfile
import time
from pathlib import Path

from xenith_edu.chapters import CHAPTERS
from xenith_edu.classroom import grade

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--learners", type=int, default=30, help="learners in the class (30)")
    parser.add_argument("--jobs", type=int, default=2, help="learners graded at once (2)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="grade-class-") as tmp:
        subs = Path(tmp) / "subs"
        for i in range(args.learners):
            folder = subs / f"learner{i:03d}"
            folder.mkdir(parents=True)
            for c in CHAPTERS:
                shutil.copy(ROOT / f"{c.notebook}.ipynb", folder / f"{c.slug}.ipynb")
        t0 = time.perf_counter()
        rows = grade(subs, Path(tmp) / "grades.csv", instructor=ROOT / "notebooks",
                     jobs=args.jobs)
        seconds = time.perf_counter() - t0
    statuses = collections.Counter(r["status"] for r in rows)
    print(f"{args.learners} learners x {len(CHAPTERS)} chapters, {args.jobs} jobs: "
          f"{seconds:.0f} s, {seconds / args.learners:.1f} s per learner")
    print("rows by status:", dict(statuses))


if __name__ == "__main__":
    main()
