"""The chapters' runs that several test files read, made once per test session (conftest.py).

The full version runs once: under nbval (every stored output compared, notebooks/sanitize.cfg)
from a folder that holds only it, with the package installed from its built wheel. The student
version runs once: from an empty folder with the wheel, its checks' verdicts logged, without
the cells tagged skip-grading (the long training runs), as the grader runs it; those cells must
be the full version's own, which nbval runs and compares. test_runs_anywhere.py and
test_classroom.py judge these runs. With bubblewrap installed, the grader runs each version
once more, in its sandbox (test_grading_book.py, test_runs_anywhere.py): twice in all.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import NamedTuple

import nbformat
from nbclient import NotebookClient

from xenith_edu import chapters
from xenith_edu.booktools.student import make_student_versions
from xenith_edu.exercises import GRADE_LOG_ENV
from xenith_edu.exercises.progress import FILE_NAME as PROGRESS_FILE  # the learner's own record
from xenith_edu.gradebook.points import SKIP_TAG

ROOT = Path(__file__).resolve().parents[1]

# One BLAS thread in each kernel, as the grader's sandbox gives it: the runs share the machine
# with each other (three kernels at once) and with the suite's two processes, and on two threads
# each kernel's products spin waiting for a thread that another process holds. The outputs that
# nbval compares do not depend on it (notebooks/sanitize.cfg: the BLAS's rounding noise).
ONE_BLAS_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

# the first cell of every run: the package must be the wheel's, not the clone's
WHICH_PACKAGE = """import xenith_edu, pathlib
here = pathlib.Path(xenith_edu.__file__).resolve()
assert here.is_relative_to(pathlib.Path({site!r}).resolve()), here"""


def build_wheel_site(out: Path) -> Path:
    """The package as `pip install` of its built wheel puts it: a folder holding only it."""
    # built from a copy of what the wheel is made of: the build leaves nothing in the clone
    src = out / "src"
    shutil.copytree(ROOT / "xenith_edu", src / "xenith_edu",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
             "--no-index", "-q", "-w", str(out / "dist"), str(src)]
    subprocess.run(build, check=True, capture_output=True, cwd=out)
    (wheel,) = (out / "dist").glob("xenith_edu-*.whl")
    site = out / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                    "--target", str(site), str(wheel)], check=True, capture_output=True, cwd=out)
    return site


def wheel_env(site: Path) -> dict[str, str]:
    """This process's environment with the wheel's folder as the only PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", GRADE_LOG_ENV)}
    env["PYTHONPATH"] = str(site)
    env.update(ONE_BLAS_THREAD)
    return env


def with_package_check(nb: nbformat.NotebookNode, site: Path) -> nbformat.NotebookNode:
    nb.cells.insert(0, nbformat.v4.new_code_cell(WHICH_PACKAGE.format(site=str(site))))
    return nb


class StudentRun(NamedTuple):
    """One student version run top to bottom from an empty folder with the wheel."""

    error: str | None  # the failing cell's error, None when every cell ran
    left: list[str]  # what the run left in its working folder but the learner's progress file
    # (nothing, rightly)
    statuses: list[str]  # the verdicts its checks logged, in order
    not_full: list[str]  # skip-grading cells that are not the full version's (none, rightly)


def without_skipped(nb: nbformat.NotebookNode, full: nbformat.NotebookNode) -> list[str]:
    """Take the cells tagged skip-grading out of `nb`; return those whose source is not one of
    `full`'s skip-grading cells (the full run would not stand for them)."""
    def skipped(cell: nbformat.NotebookNode) -> bool:
        return cell.cell_type == "code" and SKIP_TAG in cell.metadata.get("tags", [])
    covered = {c.source for c in full.cells if skipped(c)}
    not_full = [c.source for c in nb.cells if skipped(c) and c.source not in covered]
    nb.cells = [c for c in nb.cells if not skipped(c)]
    return not_full


def run_student_versions(out: Path, site: Path) -> dict[str, StudentRun]:
    """slug -> the run of its student version, as the grader runs it (no skip-grading cell)."""
    runs = {}
    for c in chapters.CHAPTERS:
        folder = out / c.slug
        full = ROOT / f"{c.notebook}.ipynb"
        (path,) = make_student_versions(full, folder / "student")
        nb = nbformat.read(str(path), as_version=4)
        not_full = without_skipped(nb, nbformat.read(str(full), as_version=4))
        nb = with_package_check(nb, site)
        empty, log = folder / "empty", folder / "log.jsonl"
        empty.mkdir()
        env = wheel_env(site)
        env[GRADE_LOG_ENV] = str(log)
        error = None
        try:
            NotebookClient(nb, timeout=300, kernel_name="python3",
                           resources={"metadata": {"path": str(empty)}}
                           ).execute(env=env, cwd=str(empty))
        except Exception as e:  # noqa: BLE001 - the test of this chapter reports it
            error = f"{type(e).__name__}: {str(e)[-3000:]}"
        lines = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
        runs[c.slug] = StudentRun(error, sorted(p.name for p in empty.iterdir()
                                                if p.name != PROGRESS_FILE),
                                  [json.loads(line)["status"] for line in lines], not_full)
    return runs


class FullRun(NamedTuple):
    """One full chapter under nbval, from a folder that holds only it, with the wheel."""

    failures: list[str]  # nbval's failing cells, with its report; [] when every cell agreed
    left: list[str]  # what the folder holds afterwards besides the notebook and the learner's
    # progress file (nothing, rightly)


class _Nbval(NamedTuple):
    """nbval running on copies of full chapters, one folder each."""

    proc: subprocess.Popen
    paths: dict[str, Path]  # slug -> its copy
    report: Path  # nbval's JUnit report


def _weight(nb: nbformat.NotebookNode) -> int:
    """How long a chapter runs, roughly: its long runs are the cells tagged skip-grading."""
    return 1 + 10 * sum(SKIP_TAG in c.metadata.get("tags", []) for c in nb.cells)


def start_full_under_nbval(out: Path, site: Path, processes: int = 2) -> list[_Nbval]:
    """Start nbval on every full chapter, each in a folder of its own holding only its copy,
    which opens with the check that the package is the wheel's. The chapters are shared among
    `processes` pytest processes, the long ones first, each to the least loaded."""
    books = {c.slug: nbformat.read(str(ROOT / f"{c.notebook}.ipynb"), as_version=4)
             for c in chapters.CHAPTERS}
    groups: list[list[str]] = [[] for _ in range(processes)]
    loads = [0] * processes
    for slug in sorted(books, key=lambda s: -_weight(books[s])):
        i = loads.index(min(loads))
        groups[i].append(slug)
        loads[i] += _weight(books[slug])
    return [_start_nbval(out / f"group{i}", {s: books[s] for s in group}, site)
            for i, group in enumerate(groups) if group]


def _start_nbval(out: Path, books: dict[str, nbformat.NotebookNode], site: Path) -> _Nbval:
    paths = {}
    for slug, nb in books.items():
        paths[slug] = out / slug / f"{slug}.ipynb"
        paths[slug].parent.mkdir(parents=True)
        nbformat.write(with_package_check(nb, site), str(paths[slug]))
    report = out / "nbval.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval",
           "--nbval-current-env", "--nbval-sanitize-with", str(ROOT / "notebooks/sanitize.cfg"),
           f"--junitxml={report}", "--rootdir", str(out), *map(str, paths.values())]
    with open(out / "nbval.log", "wb") as log:  # a file, not a pipe that could fill
        proc = subprocess.Popen(cmd, cwd=out, env=wheel_env(site), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT)
    return _Nbval(proc, paths, report)


def finish_full_under_nbval(runs: list[_Nbval]) -> dict[str, FullRun]:
    """slug -> nbval's verdict on its full chapter, once every nbval has ended."""
    verdicts = {}
    for run in runs:
        verdicts.update(_verdicts(run))
    return verdicts


def _verdicts(run: _Nbval) -> dict[str, FullRun]:
    run.proc.wait()
    said = (run.report.parent / "nbval.log").read_text(encoding="utf-8", errors="replace")
    failures: dict[str, list[str]] = {slug: [] for slug in run.paths}
    cases = ET.parse(run.report).getroot().iter("testcase") if run.report.exists() else []
    seen = set()
    for case in cases:
        slug = case.get("classname", "").split(".")[0]  # <slug>.<slug>.ipynb: its folder first
        seen.add(slug)
        for bad in list(case.iter("failure")) + list(case.iter("error")):
            failures.setdefault(slug, []).append(
                f"{case.get('name')}: {(bad.text or bad.get('message') or '')[-3000:]}")
    for slug in run.paths:
        if slug not in seen:  # nbval never reported on it: say what pytest said
            failures[slug].append(f"not run (exit {run.proc.returncode}):\n{said[-3000:]}")
    return {slug: FullRun(failures[slug], sorted(p.name for p in path.parent.iterdir()
                                                  if p != path and p.name != PROGRESS_FILE))
            for slug, path in run.paths.items()}


def run_all(out: Path) -> dict[str, dict]:
    """The wheel, then nbval on the full chapters (two processes) while the student versions
    run beside them."""
    site = build_wheel_site(out / "wheel")
    nbval = start_full_under_nbval(out / "full", site)
    try:
        students = run_student_versions(out / "students", site)
    finally:
        full = finish_full_under_nbval(nbval)
    return {"full": {k: v._asdict() for k, v in full.items()},
            "student": {k: v._asdict() for k, v in students.items()}}


def main(argv: list[str]) -> int:
    """python tests/chapter_runs.py OUT: every run, its verdicts in OUT/runs.json."""
    out = Path(argv[1])
    runs = run_all(out)
    (out / "runs.part").write_text(json.dumps(runs), encoding="utf-8")
    os.replace(out / "runs.part", out / "runs.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
