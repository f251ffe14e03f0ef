"""A Gradescope autograder: the archive that `xenith-edu gradescope` writes, and its runner, which
grades one submission with `grade` and turns its CSV into Gradescope's results.json.

The archive holds setup.sh (installs the package from the wheel inside it), run_autograder, the
teacher's notebooks as student versions (their checks, points and written questions, never a
solution) and a settings file. In the container, run_autograder grades /autograder/submission as
a class of one, exactly as `grade` does (a child process with time and memory limits, the
verdicts judged outside the learner's process), and writes /autograder/results/results.json:
one test per exercise and per written question, whose score sums to the submission's score.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import io
import json
import math
import os
import shutil
import stat
import sys
import tempfile
import time
import traceback
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..grader.roster import teacher_exercises
from ..grader.statuses import Row
from ..tools.util import atomic_write, atomic_write_text, one_line
from .points import Part, read_parts
from .stats import read_csv

SETTINGS = "xenith_autograder.json"
INSTRUCTOR = "instructor"  # the teacher's notebooks, as student versions
ROOT_ENV = "XENITH_AUTOGRADER_ROOT"  # where the autograder's folders are: /autograder
PYTHON_ENV = "XENITH_AUTOGRADER_PYTHON"  # the interpreter that has the package installed
VISIBILITY = ("visible", "hidden", "after_due_date", "after_published")
LEARNER = "submission"  # the learner's id in the class of one
MAX_OUTPUT = 8000  # characters of one test's output
BY_HAND = "graded by hand: your teacher grades this written answer in Gradescope"
PACKAGE = "xenith-edu"

SETUP = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image: Python 3.10 or
# newer (from apt when the image has no python3 with venv), a virtual environment, and the
# package from the wheel in this archive with the notebook tooling the grader runs (nbformat,
# IPython). Each dependency comes from the wheels in dist/ when the archive holds them
# (xenith-edu gradescope --wheels), else from PyPI; with PIP_NO_INDEX=1, from dist/ alone.
set -euo pipefail
cd "$(dirname "$0")"
ROOT="${XENITH_AUTOGRADER_ROOT:-/autograder}"
if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends python3 python3-venv python3-pip
fi
python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "xenith-edu needs \
Python 3.10 or newer: choose a newer base image (Ubuntu 22.04 or later) in Gradescope")'
python3 -m venv "$ROOT/xenith-venv"
"$ROOT/xenith-venv/bin/python" -m pip install --no-cache-dir -q --find-links ./dist \
  "./dist/@WHEEL@@EXTRAS@"
"$ROOT/xenith-venv/bin/python" -I -c 'import xenith_edu.gradebook.gradescope, nbformat, IPython'
"""

RUN = """#!/usr/bin/env bash
# Gradescope runs this for every submission, in a container of its own: it grades the
# notebooks in /autograder/submission and writes /autograder/results/results.json.
# Python runs isolated (-I): no folder of the submission can stand in for the package.
ROOT="${XENITH_AUTOGRADER_ROOT:-/autograder}"
PYTHON="${XENITH_AUTOGRADER_PYTHON:-$ROOT/xenith-venv/bin/python}"
if ! "$PYTHON" -I -c 'import xenith_edu.gradebook.gradescope' 2>/dev/null; then
  mkdir -p "$ROOT/results"
  printf '%s%s%s\\n' '{"score": 0.0, "output": "The autograder is not installed (setup.sh ' \\
    'failed): tell your teacher.", "output_format": "text", "test_output_format": "text", ' \\
    '"tests": []}' > "$ROOT/results/results.json"
  exit 0
fi
exec "$PYTHON" -I -m xenith_edu.gradebook.gradescope "$ROOT"
"""


# ----------------------------------------------------------------------------------------------
# The archive.


def _selected(notebooks: Path, chapters: list[str] | None) -> list[Path]:
    """The teacher's notebooks of the assignment: those named by `chapters`, else every one."""
    if not notebooks.is_dir():
        raise ValueError(f"notebooks: {notebooks} is not a folder of the teacher's notebooks")
    found = {p.stem: p for p in sorted(notebooks.glob("*.ipynb")) if p.is_file()}
    if not found:
        raise ValueError(f"notebooks: no notebook (.ipynb) in {notebooks}")
    if not chapters:
        return list(found.values())
    missing = [c for c in chapters if c not in found]
    if missing:
        raise ValueError(f"chapters: no {missing[0]}.ipynb in {notebooks}: choose among "
                         f"{', '.join(sorted(found))}")
    return [found[c] for c in dict.fromkeys(chapters)]


def _clone_requirements() -> list[str] | None:
    """The Requires-Dist and Provides-Extra lines of the clone's pyproject.toml when the
    package runs from a clone (an editable install, whose installed metadata may be older than
    its files: a dependency added since is missing there); None elsewhere."""
    try:
        import tomllib  # Python 3.11 or newer; on 3.10 the installed metadata stands
    except ImportError:
        return None
    import xenith_edu  # where the package's files are

    path = Path(xenith_edu.__file__).resolve().parent.parent / "pyproject.toml"
    try:
        project = tomllib.loads(path.read_text(encoding="utf-8"))["project"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(project, dict) or project.get("name") != PACKAGE:
        return None
    lines = [f"Requires-Dist: {r}" for r in project.get("dependencies", [])]
    for extra, reqs in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        for req in reqs:
            spec, _, marker = req.partition(";")
            when = f"({marker.strip()}) and " if marker.strip() else ""
            lines.append(f'Requires-Dist: {spec.strip()}; {when}extra == "{extra}"')
    return lines


def package_metadata() -> str:
    """The METADATA of the package's wheel: the installed one, with the version of the files
    and, in a clone, the dependencies and extras of its pyproject.toml."""
    import xenith_edu  # the package itself, whose version the files state

    dist = importlib.metadata.distribution(PACKAGE)
    # an editable install's metadata may be found as an egg-info (PKG-INFO, the same format)
    meta = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    if not any(line.startswith("Name:") for line in meta.splitlines()):
        raise ValueError(f"the installed {PACKAGE} has no readable metadata: reinstall it, or "
                         "give its wheel with --dist")
    head, blank, body = meta.partition("\n\n")
    lines = [f"Version: {xenith_edu.__version__}" if line.startswith("Version:") else line
             for line in head.splitlines()]
    clone = _clone_requirements()
    if clone is not None:
        lines = [line for line in lines
                 if not line.startswith(("Requires-Dist:", "Provides-Extra:"))] + clone
    return "\n".join(lines) + "\n" + (blank + body if blank else "")


def package_wheel() -> tuple[str, bytes]:
    """A wheel of the package as it is installed here (its files and their metadata): built
    without a network, a build backend or a write to the source tree."""
    import xenith_edu  # the package itself, whose files the wheel holds

    dist = importlib.metadata.distribution(PACKAGE)
    name, version = "xenith_edu", xenith_edu.__version__
    info = f"{name}-{version}.dist-info"
    root = Path(xenith_edu.__file__).parent
    files = {f"{name}/{p.relative_to(root).as_posix()}": p.read_bytes()
             for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts
             and p.suffix not in (".pyc", ".pyo")}
    files[f"{info}/METADATA"] = package_metadata().encode()
    files[f"{info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: xenith-edu gradescope\n"
                              b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    files[f"{info}/entry_points.txt"] = (dist.read_text("entry_points.txt") or "").encode()
    record = [f"{path},sha256={_digest(data)},{len(data)}" for path, data in files.items()]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            z.writestr(_entry(path), data)
    return f"{name}-{version}-py3-none-any.whl", buf.getvalue()


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _entry(path: str, mode: int = 0o644) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))  # the same bytes each time
    info.external_attr = (0o100000 | mode) << 16
    info.compress_type = zipfile.ZIP_STORED if path.endswith(".whl") else zipfile.ZIP_DEFLATED
    return info  # (a wheel is a zip already: deflating it again costs time and saves nothing)


def _dist(dist: Path | None) -> tuple[str, bytes]:
    if dist is None:
        return package_wheel()
    if not dist.is_file() or not (dist.name.endswith(".whl") or dist.name.endswith(".tar.gz")):
        raise ValueError(f"dist: {dist} is not a wheel (.whl) or sdist (.tar.gz) file of "
                         f"{PACKAGE}")
    if not dist.name.replace("-", "_").startswith("xenith_edu"):
        raise ValueError(f"dist: {dist.name} is not a wheel or sdist of {PACKAGE}")
    return dist.name, dist.read_bytes()


def _check_settings(timeout: float, call_time: float, memory: int | None, visibility: str
                    ) -> None:
    for name, value in (("timeout", timeout), ("call_time", call_time)):
        if isinstance(value, bool) or not isinstance(value, int | float) or \
                not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int)
                               or memory <= 0):
        raise ValueError(f"memory must be a positive number of bytes, got {memory!r}")
    if visibility not in VISIBILITY:
        raise ValueError(f"visibility: {visibility!r} is not one of {', '.join(VISIBILITY)}")


@dataclass(frozen=True)
class Archive:
    """What `build` wrote: the assignment's parts, and the grader's longest run per submission
    (Gradescope's own autograder timeout must be longer)."""

    parts: list[Part]
    seconds: float


GRADER_EXTRA = "notebooks"  # what the grader itself runs: nbformat, IPython's transformation


def _extras(extras: list[str] | None) -> str:
    """The package's extras that setup.sh installs, as pip's suffix: the grader's own, then
    the teacher's ([notebooks,torch,hf])."""
    known = [line.split(":", 1)[1].strip() for line in package_metadata().splitlines()
             if line.startswith("Provides-Extra:")]
    for extra in extras or []:
        if extra not in known:
            raise ValueError(f"extras: {extra!r} is not an extra of {PACKAGE}: choose among "
                             f"{', '.join(known)}")
    return "[" + ",".join(dict.fromkeys([GRADER_EXTRA, *(extras or [])])) + "]"


def _wheels(wheels: Path | None) -> list[tuple[str, bytes]]:
    """The dependency wheels the archive carries into dist/ (setup.sh installs from them
    first): every *.whl of the folder `wheels`."""
    if wheels is None:
        return []
    found = sorted(p for p in wheels.glob("*.whl") if p.is_file()) if wheels.is_dir() else []
    if not found:
        raise ValueError(f"wheels: no wheel (.whl) in {wheels}: fill it with pip download "
                         f"\"{PACKAGE}[{GRADER_EXTRA}]\" -d {wheels} (on the platform of "
                         "Gradescope's image), or leave --wheels out")
    return [(p.name, p.read_bytes()) for p in found]


def build(notebooks: Path, out: Path, chapters: list[str] | None = None, *,
          dist: Path | None = None, extras: list[str] | None = None,
          wheels: Path | None = None, timeout: float = 120.0,
          call_time: float = 10.0, memory: int | None = None, visibility: str = "visible"
          ) -> Archive:
    """Write the autograder archive `out` (a .zip) for the teacher's notebooks in `notebooks`
    (those of `chapters`, by file name without .ipynb; default all). `dist`: the package's
    wheel or sdist to install (default: a wheel of the package installed here), with its
    `extras` (the torch chapter needs "torch"); `wheels`: a folder of the dependencies' wheels
    for dist/, so that setup.sh needs no index. Returns the assignment's parts (points and
    written questions) and the grader's longest run. Raises ValueError naming the argument.
    """
    from ..booktools.student import make_student_versions  # nbformat, only when an archive is made
    from ..grader.judging import Options, sandbox_seconds  # the grader's own budget

    _check_settings(timeout, call_time, memory, visibility)
    suffix = _extras(extras)
    if out.is_dir() or out.suffix != ".zip":
        raise ValueError(f"out: {out} is not a .zip file name: give one such as autograder.zip")
    if not out.parent.is_dir():
        raise ValueError(f"out: the folder {out.parent} does not exist")
    paths = _selected(notebooks, chapters)
    wheel, data = _dist(dist)
    carried = [(f"dist/{name}", blob, 0o644) for name, blob in _wheels(wheels) if name != wheel]
    with tempfile.TemporaryDirectory(prefix="xenith-gradescope-") as tmp:
        teacher, student = Path(tmp) / "teacher", Path(tmp) / INSTRUCTOR
        teacher.mkdir()
        for p in paths:
            shutil.copyfile(p, teacher / p.name)
        make_student_versions(teacher, student)
        exercises = teacher_exercises(student, [])  # raises when no notebook checks anything
        parts = read_parts(student, exercises)
        names = [name for name, _ in exercises]
        settings = {"timeout": float(timeout), "call_time": float(call_time),
                    "memory": memory, "visibility": visibility,
                    "parts": [p.as_dict() for p in parts]}
        setup = SETUP.replace("@WHEEL@", wheel).replace("@EXTRAS@", suffix)
        members = [("setup.sh", setup.encode(), 0o755),
                   ("run_autograder", RUN.encode(), 0o755),
                   (SETTINGS, (json.dumps(settings, indent=1) + "\n").encode(), 0o644),
                   (f"dist/{wheel}", data, 0o644), *carried]
        members += [(f"{INSTRUCTOR}/{n}", (student / n).read_bytes(), 0o644) for n in names]

    def write(f) -> None:
        with zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as z:
            for name, blob, mode in members:
                z.writestr(_entry(name, mode), blob)

    atomic_write(out, write)
    plan = [(name, name, ex) for name, ex in exercises]
    return Archive(parts, sandbox_seconds(plan, Options(float(timeout), float(call_time))))


# ----------------------------------------------------------------------------------------------
# The runner, in Gradescope's container.


@dataclass(frozen=True)
class Settings:
    """The archive's settings, as `build` wrote them and the runner's one gate checked them."""

    parts: tuple[Part, ...]
    timeout: float
    call_time: float
    memory: int | None
    visibility: str


def read_settings(source: Path) -> Settings:
    """The settings file of the archive unpacked in `source`; ValueError in one line if it is
    not the one `build` wrote."""
    bad = f"{SETTINGS} is not the settings that xenith-edu gradescope wrote: upload its archive"
    try:
        raw = json.loads((source / SETTINGS).read_text(encoding="utf-8"))
        parts = tuple(Part.from_dict(d) for d in raw["parts"])
        memory = raw["memory"]
        found = Settings(parts, raw["timeout"], raw["call_time"], memory, raw["visibility"])
        _check_settings(found.timeout, found.call_time, memory, found.visibility)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"{bad} ({one_line(exc)[:200]})") from None
    if not parts or not all(p.points or p.questions for p in parts):
        raise ValueError(f"{bad} (a notebook without exercises)")
    worth = [x for p in parts for x in [*p.points.values(), *(q.points for q in p.questions)]]
    if not all(math.isfinite(x) and x >= 0 for x in worth):
        raise ValueError(f"{bad} (points that are not a number, 0 or more)")
    return found


def _copy_submission(submission: Path, subs: Path) -> bool:
    """The learner's files into the class of one (links kept as links: the walk refuses them);
    False when nothing was handed in."""
    if not submission.is_dir() or not any(submission.iterdir()):
        return False
    shutil.copytree(submission, subs / LEARNER, symlinks=True, ignore=_special)
    return True


def _special(folder: str, names: list[str]) -> set[str]:
    """The entries a copy would block on or cannot make (a pipe, a socket, a device): left
    out, as the grader's walk leaves them out."""
    out = set()
    for name in names:
        try:
            mode = os.lstat(os.path.join(folder, name)).st_mode
        except OSError:
            out.add(name)
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
            out.add(name)
    return out


def grade_submission(root: Path, work: Path, settings: Settings
                     ) -> tuple[list[dict], list[str]]:
    """Grade root/submission with the archive's settings: the learner's rows of the CSV, and
    the lines about the submission as a whole."""
    from .grading import grade  # the grader, only when a submission is graded

    subs, out = work / "subs", work / "out"
    subs.mkdir()
    out.mkdir()
    if not _copy_submission(root / "submission", subs):
        names = ", ".join(p.notebook for p in settings.parts)
        return [], [f"Nothing was handed in: upload your notebook(s), named as the "
                    f"assignment's: {names}."]
    grade(subs, out / "grades.csv", settings.timeout, instructor=root / "source" / INSTRUCTOR,
          jobs=1, progress=False, call_time=settings.call_time, memory=settings.memory)
    rows = [r for _, r in read_csv(out / "grades.csv", "grades CSV",
                                   ("learner", "exercise", "status", "points", "message"))]
    rows = [r for r in rows if r["learner"] == LEARNER]
    return rows, [f"{r['status']}: {r['message']}" for r in rows if not r["exercise"]]


def _test(part: Part, item: str, most: float, mine: list[dict], written: bool,
          visibility: str) -> dict:
    """One Gradescope test: an exercise's verdict and points (from its rows `mine`), or a
    written question's place."""
    test = {"name": f"{part.chapter}: {item}", "max_score": most, "visibility": visibility}
    if written:
        return {**test, "score": 0.0, "output": BY_HAND}
    passed = bool(mine) and all(r["status"] == Row.PASSED.value for r in mine)
    output = "\n".join(r["message"] for r in mine) or "not graded: no verdict for this exercise"
    score = min(most, sum(float(r["points"] or 0) for r in mine))  # the course's points
    return {**test, "score": score, "status": "passed" if passed else "failed",
            "output": output[:MAX_OUTPUT]}


def rows_per_part(rows: list[dict], parts: list[Part]) -> list[dict[str, list[dict]]]:
    """Each part's rows, by exercise. An exercise that several of the teacher's notebooks
    check has a row per notebook, in the teacher's order (grade writes them so): the k-th
    goes to the k-th notebook, never one row to two tests."""
    by_exercise: dict[str, list[dict]] = {}
    for r in rows:
        if r["exercise"]:
            by_exercise.setdefault(r["exercise"], []).append(r)
    shared = {ex for ex in by_exercise if sum(ex in p.points for p in parts) > 1}
    out = []
    for part in parts:
        found = {}
        for ex in part.points:
            mine = by_exercise.get(ex, [])
            found[ex] = mine[:1] if ex in shared else mine
            if ex in shared:
                by_exercise[ex] = mine[1:]
        out.append(found)
    return out


def results(rows: list[dict], lines: list[str], parts: list[Part], visibility: str,
            seconds: float) -> dict:
    """Gradescope's results.json: a test per exercise and written question, in the teacher's
    order; the score is the sum of the tests' scores."""
    tests = []
    for part, found in zip(parts, rows_per_part(rows, parts), strict=True):
        tests += [_test(part, ex, most, found.get(ex, []), False, visibility)
                  for ex, most in part.points.items()]
        tests += [_test(part, q.id, q.points, [], True, visibility) for q in part.questions]
    score = sum(t["score"] for t in tests)
    auto = sum(t["max_score"] for t in tests if t["output"] != BY_HAND)
    summary = f"{score:g} of {auto:g} points from the checks; the written answers are graded " \
        "by hand." if any(t["output"] == BY_HAND for t in tests) else \
        f"{score:g} of {auto:g} points."
    return {"score": score, "execution_time": round(seconds, 1),
            "output": "\n".join([summary, *lines])[:MAX_OUTPUT], "visibility": visibility,
            "stdout_visibility": "hidden", "output_format": "text",
            "test_output_format": "text", "test_name_format": "text",  # no markup from a learner
            "tests": tests}


def run(root: Path) -> dict:
    """Grade root/submission and write root/results/results.json; an error of the autograder
    itself is said there too (every test at 0), never only in a log the learner cannot see."""
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="xenith-autograder-"))
    parts: list[Part] = []
    visibility = "visible"
    try:
        settings = read_settings(root / "source")
        parts, visibility = list(settings.parts), settings.visibility
        rows, lines = grade_submission(root, work, settings)
    except (Exception, KeyboardInterrupt) as exc:  # whatever happens, Gradescope gets a JSON
        traceback.print_exc()
        rows, lines = [], [f"The autograder could not grade this submission "
                           f"({one_line(exc)[:500]}); tell your teacher."]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = results(rows, lines, parts, visibility, time.monotonic() - started)
    atomic_write_text(root / "results" / "results.json", json.dumps(out, indent=1) + "\n")
    return out


def main(argv: list[str]) -> int:
    """`python -m xenith_edu.gradebook.gradescope [ROOT]`: what run_autograder calls."""
    root = Path(argv[0] if argv else os.environ.get(ROOT_ENV, "/autograder"))
    out = run(root)
    print(f"score {out['score']:g}; wrote {root / 'results' / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
