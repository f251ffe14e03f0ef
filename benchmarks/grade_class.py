"""Seconds per learner of grading a class: N learners, each handing in the book's own notebooks
(every solution right), graded with `xenith-edu grade` as a teacher runs it.

    python benchmarks/grade_class.py --learners 30 --jobs 2
    python benchmarks/grade_class.py --learners 4 --against /path/to/an/older/checkout

Prints the wall time, the seconds per learner, and the rows by status (all should pass: a row
that does not is a chapter the grader cannot grade, which tests/test_grading_book.py also holds).
With `--against SRC` (another checkout of the package, a folder holding `xenith_edu/`), the same
class is graded by both, one after the other, and the two are printed side by side with their
ratio: on a shared machine only the ratio means much.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_class(subs: Path, learners: int) -> None:
    from xenith_edu.chapters import CHAPTERS  # the book's chapters, as this checkout has them

    for i in range(learners):
        folder = subs / f"learner{i:03d}"
        folder.mkdir(parents=True)
        for c in CHAPTERS:
            shutil.copy(ROOT / f"{c.notebook}.ipynb", folder / f"{c.slug}.ipynb")


def run(src: Path, subs: Path, out: Path, jobs: int) -> tuple[float, dict]:
    """Grade the class with the package of `src`, in a fresh process: (seconds, statuses)."""
    code = ("import json, sys, time, collections; sys.path.insert(0, sys.argv[1]); "
            "from xenith_edu.gradebook import grade; t0 = time.perf_counter(); "
            "rows = grade(sys.argv[2], sys.argv[3], instructor=sys.argv[4], jobs=int(sys.argv[5]),"
            " seed=0); print(json.dumps([time.perf_counter() - t0, "
            "collections.Counter(r['status'] for r in rows)]))")
    done = subprocess.run([sys.executable, "-c", code, str(src), str(subs), str(out),
                           str(ROOT / "notebooks"), str(jobs)], capture_output=True, text=True,
                          check=True)
    seconds, statuses = json.loads(done.stdout.strip().splitlines()[-1])
    return seconds, statuses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--learners", type=int, default=30, help="learners in the class (30)")
    parser.add_argument("--jobs", type=int, default=2, help="learners graded at once (2)")
    parser.add_argument("--against", type=Path, default=None, metavar="SRC",
                        help="another checkout (a folder holding xenith_edu/) to compare with")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="grade-class-") as tmp:
        subs = Path(tmp) / "subs"
        make_class(subs, args.learners)
        runs = {"this checkout": ROOT}
        if args.against is not None:
            runs["--against"] = args.against.resolve()
        found = {}
        for name, src in runs.items():
            found[name] = run(src, subs, Path(tmp) / f"grades-{len(found)}.csv", args.jobs)
    for name, (seconds, statuses) in found.items():
        print(f"{name}: {args.learners} learners, {args.jobs} jobs: {seconds:.0f} s, "
              f"{seconds / args.learners:.1f} s per learner; rows by status: {statuses}")
    if len(found) == 2:
        (mine, _), (theirs, _) = found.values()
        print(f"ratio, this checkout / --against: {mine / theirs:.2f}")


if __name__ == "__main__":
    main()
