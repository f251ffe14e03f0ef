"""A course a teacher runs end to end, scripted: 40 learners hand in the softmax cross-entropy
chapter, made from the teacher's notebook by editing its solutions into right and wrong answers;
then, with the commands a teacher types, the class is graded, one learner is graded again after
a fix, the teacher overrides a grade and extends a deadline, and the statistics, both LMS files
and a Gradescope autograder's run on one submission are made.

    python benchmarks/course_40.py                 # 40 learners, 2 jobs
    python benchmarks/course_40.py --learners 8 --jobs 1

Prints each step's seconds and the seconds per learner of grading the class (on a shared
machine, a figure to compare with the same machine's, not an absolute).
tests/test_course_run.py runs the same script on 6 learners and checks every file it makes.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = "softmax_ce"
DUE = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
LATE = 20  # hours late, of every third learner
FIRST = "    ### BEGIN SOLUTION\n    N = logits.shape[0]"  # the first exercise's solution
# how each kind of learner's notebook is made from the teacher's: (the text, its replacement)
KINDS = {
    "right": None,
    "no 1/N": ("return loss, dlogits / N", "return loss, dlogits"),
    "smoothing sign": ("return loss, (np.exp(logp) - q) / N",
                       "return loss, (q - np.exp(logp)) / N"),
    "not attempted": (FIRST, "    raise NotImplementedError\n" + FIRST),
}


def learner_notebook(kind: str):
    """The teacher's chapter with its solution edited into this kind of answer."""
    nb = nbformat.read(str(ROOT / "notebooks" / f"{CHAPTER}.ipynb"), as_version=4)
    edit = KINDS[kind]
    if edit is not None:
        hits = [c for c in nb.cells if c.cell_type == "code" and edit[0] in c.source]
        assert len(hits) == 1, (kind, len(hits))
        hits[0].source = hits[0].source.replace(*edit)
    return nb


def make_course(root: Path, learners: int) -> dict:
    """The teacher's notebook, the class (kinds in turn), the roster (its extension column
    gives learner02 2 days), the LMS's timestamps (every third learner from learner02 is 20
    hours late)."""
    inst, subs = root / "teacher", root / "subs"
    inst.mkdir(parents=True)
    subs.mkdir()
    shutil.copy(ROOT / "notebooks" / f"{CHAPTER}.ipynb", inst / f"{CHAPTER}.ipynb")
    kinds = list(KINDS)
    made = {}
    for i in range(learners):
        name, kind = f"learner{i:02d}", kinds[i % len(kinds)]
        nbformat.write(learner_notebook(kind), str(subs / f"{name}.ipynb"))
        made[name] = kind
    roster = ["id,name,email,extension"] + [f"{n},Learner {n[-2:]},{n}@uni.example,"
                                           f"{'2' if i == 2 else ''}"
                                           for i, n in enumerate(made)]
    times = [DUE + timedelta(hours=LATE if i % 3 == 2 else -3) for i in range(learners)]
    stamps = ["id,submitted"] + [f"{n},{t.isoformat()}" for n, t in zip(made, times, strict=True)]
    (root / "roster.csv").write_text("\n".join(roster) + "\n", encoding="utf-8")
    (root / "timestamps.csv").write_text("\n".join(stamps) + "\n", encoding="utf-8")
    (root / "out").mkdir()
    return {"root": root, "inst": inst, "subs": subs, "kinds": made,
            "csv": root / "out" / "grades.csv"}


def course_args(c: dict) -> list[str]:
    """The course's options, the same at every run: the teacher's policy."""
    r = c["root"]
    return ["--instructor", str(c["inst"]), "--seed", "7", "--roster", str(r / "roster.csv"),
            "--timestamps", str(r / "timestamps.csv"), "--deadline", DUE.isoformat(),
            "--late-penalty", "0.1", "--late-rule", "possible", "--export", "canvas",
            "--export", "moodle", "--feedback", str(r / "out" / "feedback")]


def command(*argv: str) -> tuple[int, str]:
    """One `xenith-edu` command, as the teacher types it: (exit code, what it printed)."""
    from xenith_edu import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = cli.main(list(argv))
    return code, out.getvalue()


def run_course(c: dict, jobs: int) -> dict[str, float]:
    """Every step of the course, timed; each command must succeed."""
    seconds, r, grade = {}, c["root"], ["grade", str(c["subs"]), "--out", str(c["csv"])]

    def step(name: str, *argv: str) -> str:
        t0 = time.perf_counter()
        code, said = command(*argv)
        seconds[name] = time.perf_counter() - t0
        assert code == 0, (name, said)
        if c["csv"].exists():  # what each step left, for the test to compare
            c.setdefault("after", {})[name] = c["csv"].read_text(encoding="utf-8")
            totals = c["csv"].with_name("grades.totals.csv").read_text(encoding="utf-8")
            c.setdefault("totals", {})[name] = totals
        return said

    c["said"] = {"grade": step("grade", *grade, "--jobs", str(jobs), *course_args(c))}
    fixed = next(n for n, k in c["kinds"].items() if k == "no 1/N")  # the learner fixes it
    nbformat.write(learner_notebook("right"), str(c["subs"] / f"{fixed}.ipynb"))
    c["fixed"] = fixed
    c["said"]["regrade"] = step("regrade", *grade, "--regrade", fixed, *course_args(c))
    other = next(n for n, k in c["kinds"].items() if k == "smoothing sign")
    (r / "overrides.csv").write_text("learner,exercise,points,comment\n"
                                     f"{other},label_smoothing,0.5,sign slip only\n")
    late = [n for i, n in enumerate(c["kinds"]) if i % 3 == 2][-1]  # the roster extends the first
    (r / "extensions.csv").write_text(f"id,extension\n{late},2026-12-03T12:00+00:00\n")
    c["overridden"], c["extended"] = other, late
    c["said"]["adjust"] = step("override and extension", *grade, "--resume", *course_args(c),
                               "--overrides", str(r / "overrides.csv"), "--extensions",
                               str(r / "extensions.csv"))
    step("statistics", "grade-stats", str(c["csv"]), "--out", str(r / "stats"))
    step("Gradescope archive", "gradescope", str(c["inst"]), "--out", str(r / "autograder.zip"))
    t0 = time.perf_counter()
    c["gradescope"] = gradescope_run(r / "autograder.zip", r / "ag",
                                     c["subs"] / f"{fixed}.ipynb")
    seconds["Gradescope run (one submission)"] = time.perf_counter() - t0
    return seconds


def gradescope_run(archive: Path, root: Path, notebook: Path) -> str:
    """run_autograder on one submission, laid out as Gradescope lays it: results.json's text."""
    (root / "source").mkdir(parents=True)
    with zipfile.ZipFile(archive) as z:
        z.extractall(root / "source")
    (root / "submission").mkdir()
    shutil.copy(notebook, root / "submission" / f"{CHAPTER}.ipynb")
    env = {**os.environ, "XENITH_AUTOGRADER_ROOT": str(root),
           "XENITH_AUTOGRADER_PYTHON": sys.executable}
    subprocess.run(["bash", str(root / "source" / "run_autograder")], env=env, check=True,
                   capture_output=True, timeout=600)
    return (root / "results" / "results.json").read_text(encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--learners", type=int, default=40, help="learners in the class (40)")
    parser.add_argument("--jobs", type=int, default=2, help="learners graded at once (2)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="course-") as tmp:
        c = make_course(Path(tmp), args.learners)
        seconds = run_course(c, args.jobs)
    for name, s in seconds.items():
        print(f"{name}: {s:.1f} s")
    print(f"grading: {seconds['grade'] / args.learners:.2f} s per learner ({args.learners} "
          f"learners, {args.jobs} jobs); regrade of one learner {seconds['regrade']:.1f} s")


if __name__ == "__main__":
    main()
