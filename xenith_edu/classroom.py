"""The classroom: student versions of the chapter notebooks, and grading of learners' notebooks.

`make_student_versions` strips the nbgrader-marked solutions; `grade` runs every submission in a
fresh kernel, in a process of its own with a time limit, and writes the checks' verdicts to CSV.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .exercises import CHECKS, GRADE_LOG_ENV

# nbgrader's markers. Code between BEGIN and END SOLUTION becomes a stub that raises
# NotImplementedError; markdown between them becomes TEXT_STUB; hidden tests are dropped.
BEGIN_SOLUTION = re.compile(r"^(\s*)#+\s*BEGIN SOLUTION\s*$")
END_SOLUTION = re.compile(r"^\s*#+\s*END SOLUTION\s*$")
BEGIN_HIDDEN = re.compile(r"^\s*#+\s*BEGIN HIDDEN TESTS\s*$")
END_HIDDEN = re.compile(r"^\s*#+\s*END HIDDEN TESTS\s*$")
CODE_STUB = "raise NotImplementedError()"
TEXT_STUB = "YOUR ANSWER HERE"
# sphinx-exercise solutions: a {solution} directive (one cell), or a gated pair
# {solution-start} ... {solution-end} spanning cells.
SOLUTION_DIRECTIVE = re.compile(r"^\s*(`{3,}|:{3,})\s*\{solution\}")
SOLUTION_START = re.compile(r"^\s*(`{3,}|:{3,})\s*\{solution-start\}", re.MULTILINE)
SOLUTION_END = re.compile(r"^\s*(`{3,}|:{3,})\s*\{solution-end\}", re.MULTILINE)
CHECK_CALL = re.compile(r"\bcheck_(\w+)\s*\(")

STATUSES = ("passed", "failed", "not attempted", "notebook error")
CSV_FIELDS = ("learner", "notebook", "exercise", "status", "message")
DEFAULT_TIMEOUT = 120.0  # seconds per notebook
KILL_GRACE = 30.0  # seconds past the time limit before the grader kills a stuck worker
PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)  # put on the worker's sys.path


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _as_path(value: object, name: str) -> Path:
    if isinstance(value, str | os.PathLike):
        return Path(value)
    raise TypeError(f"{name} must be a path (str or pathlib.Path), got {type(value).__name__}")


def _write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and os.replace."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ----------------------------------------------------------------------------------------------
# Student versions.


def _strip_regions(source: str, where: str, code: bool) -> tuple[str, bool]:
    """Replace every solution region of one cell's source; drop hidden tests."""
    out: list[str] = []
    lines = source.split("\n")
    changed = False
    i = 0
    while i < len(lines):
        line = lines[i]
        begin = BEGIN_SOLUTION.match(line)
        if begin or BEGIN_HIDDEN.match(line):
            end_re = END_SOLUTION if begin else END_HIDDEN
            j = i + 1
            while j < len(lines) and not end_re.match(lines[j]):
                j += 1
            if j == len(lines):
                marker = "### END SOLUTION" if begin else "### END HIDDEN TESTS"
                raise ValueError(f"{where}: line {i + 1} opens a region that no {marker} closes")
            if begin:
                indent = begin.group(1)
                if code and not indent:
                    raise ValueError(f"{where}: the solution at line {i + 1} is not inside a "
                                     "function body; the stub that replaces it would stop the "
                                     "notebook (indent it inside the exercise's function)")
                out.append(indent + (CODE_STUB if code else TEXT_STUB))
            changed = True
            i = j + 1
            continue
        if END_SOLUTION.match(line) or END_HIDDEN.match(line):
            raise ValueError(f"{where}: line {i + 1} closes a region that was never opened")
        out.append(line)
        i += 1
    return "\n".join(out), changed


def _drop_solution_blocks(source: str) -> str:
    """The markdown `source` without its {solution} directives (fence to closing fence)."""
    out: list[str] = []
    fence = ""
    for line in source.split("\n"):
        if fence:  # inside a solution: a line of at least as many fence characters closes it
            bare = line.strip()
            if len(bare) >= len(fence) and set(bare) == {fence[0]}:
                fence = ""
            continue
        opening = SOLUTION_DIRECTIVE.match(line)
        if opening:
            fence = opening.group(1)
            continue
        out.append(line)
    return "\n".join(out)


def _student_notebook(nb, name: str):  # nb: nbformat.NotebookNode
    """The student version of one notebook, built in place on `nb` (a private copy)."""
    cells = []
    in_gated = False
    for index, cell in enumerate(nb.cells):
        where = f"{name}, cell {index + 1}"
        source = cell.source
        if cell.cell_type == "markdown":
            if in_gated:
                in_gated = not SOLUTION_END.search(source)
                continue
            if SOLUTION_START.search(source):
                in_gated = not SOLUTION_END.search(source)
                continue
            source = _drop_solution_blocks(source)
            if not source.strip():
                continue  # a solution cell: removed from the student version
        elif in_gated:
            continue  # code inside a gated solution goes with it
        new_source, changed = _strip_regions(source, where, code=cell.cell_type == "code")
        cell.source = new_source
        if changed:
            tags = [t for t in cell.metadata.get("tags", []) if t != "hide-input"]
            if tags:
                cell.metadata["tags"] = tags
            else:
                cell.metadata.pop("tags", None)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
            cell.metadata.pop("execution", None)
        cells.append(cell)
    if in_gated:
        raise ValueError(f"{name}: a {{solution-start}} is never closed by a {{solution-end}}")
    nb.cells = cells
    return nb


def _require(*modules: str) -> None:
    """Import the notebook machinery, or say in one line how to install it."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            raise ImportError(f"the classroom needs the package {name}: pip install nbformat "
                              "nbclient ipykernel") from None


def _read_notebook(path: Path):
    import nbformat

    try:
        nb = nbformat.read(str(path), as_version=4)
        nbformat.validate(nb)
    except Exception as exc:  # invalid JSON, not a notebook, unsupported version...
        raise ValueError(f"{path.name} is not a valid notebook: {_one_line(exc)[:200]}") from None
    return nb


def make_student_versions(src: Path, out: Path) -> list[Path]:
    """Write student copies of the notebook `src` (or of every *.ipynb in the folder `src`).

    In each copy, code between `### BEGIN SOLUTION` and `### END SOLUTION` becomes
    `raise NotImplementedError()` at the same indentation; markdown solution regions become
    "YOUR ANSWER HERE"; cells holding a `{solution}` directive (or between `{solution-start}`
    and `{solution-end}`) are removed; `### BEGIN/END HIDDEN TESTS` regions are dropped; outputs
    are cleared. The copies keep their file names, in the folder `out` (created if needed).
    Returns their paths. Raises ValueError naming what is wrong; nothing is written then.
    """
    _require("nbformat")
    import nbformat

    src, out = _as_path(src, "src"), _as_path(out, "out")
    if not src.exists():
        raise ValueError(f"src: {src} does not exist (give a notebook .ipynb or a folder of them)")
    if src.is_file():
        if src.suffix != ".ipynb":
            raise ValueError(f"src: {src} is not a notebook (.ipynb)")
        sources = [src]
    else:
        sources = sorted(p for p in src.glob("*.ipynb") if p.is_file())
        if not sources:
            raise ValueError(f"src: no notebook (.ipynb) in the folder {src}")
    if out.exists() and not out.is_dir():
        raise ValueError(f"out: {out} exists and is not a folder")
    if out.resolve() in {p.parent.resolve() for p in sources}:
        raise ValueError(f"out: {out} is the folder of the source notebooks; the student "
                         "versions would overwrite the solutions (choose another folder)")

    versions = []  # transform everything first: one bad notebook writes nothing
    for path in sources:
        nb = _student_notebook(_read_notebook(path), path.name)
        versions.append((out / path.name, nbformat.writes(nb) + "\n"))
    out.mkdir(parents=True, exist_ok=True)
    for target, text in versions:
        _write_atomic(target, text)
    return [target for target, _ in versions]


# ----------------------------------------------------------------------------------------------
# Grading.


def _worker() -> None:
    """Runs in the grading subprocess: execute one notebook cell by cell before a deadline.

    argv: notebook, result file, time limit in seconds, working folder, kernel pgid file.
    The checks append their verdicts to the file named by XENITH_EDU_GRADE_LOG themselves.
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb_path, result_path, limit, workdir, pgid_path = sys.argv[1:6]
    # A kernel spec of our own, first on JUPYTER_PATH: the kernel runs this very interpreter
    # (which has xenith_edu), whatever "python3" kernels the machine has.
    spec_dir = Path(workdir).parent / "jupyter" / "kernels" / "xenith-grader"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-Xfrozen_modules=off", "-m", "ipykernel_launcher", "-f",
                 "{connection_file}"],
        "display_name": "xenith-edu grader", "language": "python"}))
    os.environ["JUPYTER_PATH"] = os.pathsep.join(
        [str(spec_dir.parent.parent)] + [p for p in [os.environ.get("JUPYTER_PATH")] if p])
    limit_s = float(limit)
    deadline = time.monotonic() + limit_s
    error = None
    index = -1
    try:
        import nbformat

        nb = nbformat.read(nb_path, as_version=4)
        client = NotebookClient(
            nb, timeout=max(1, math.ceil(limit_s)), startup_timeout=max(10, math.ceil(limit_s)),
            kernel_name="xenith-grader", allow_errors=False, shutdown_kernel="immediate",
            resources={"metadata": {"path": workdir}},
        )
        client.reset_execution_trackers()
        with client.setup_kernel():
            pgid = getattr(getattr(client.km, "provisioner", None), "pgid", None)
            if pgid:
                Path(pgid_path).write_text(str(pgid))
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CellTimeoutError("the time limit was reached between cells")
                client.timeout = max(1, math.ceil(remaining))
                client.execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
    except CellTimeoutError:
        error = (f"timed out after {limit_s:g} s in cell {index + 1} (an infinite loop, or too "
                 "slow?)")
    except CellExecutionError as exc:
        error = f"cell {index + 1} raised {exc.ename}: {_one_line(exc.evalue)[:300]}"
    except DeadKernelError:
        error = f"the kernel died in cell {index + 1} (out of memory, or the process exited?)"
    except Exception as exc:
        error = f"could not run the notebook: {type(exc).__name__}: {_one_line(exc)[:300]}"
    _write_atomic(Path(result_path), json.dumps({"error": error}))


def _kill_group(pgid: int) -> None:
    if hasattr(os, "killpg"):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _run_notebook(path: Path, timeout: float) -> tuple[dict[str, tuple[str, str]], str | None]:
    """Execute one notebook in a fresh kernel under a separate worker process.

    Returns the verdicts the checks logged {exercise: (status, message)} (the last one of each
    exercise wins) and the notebook's own error (None if it ran to the end).
    """
    with tempfile.TemporaryDirectory(prefix="xenith-grade-") as tmp:
        tmpdir = Path(tmp)
        log, result, pgid_file = tmpdir / "grades.jsonl", tmpdir / "result.json", tmpdir / "pgid"
        workdir = tmpdir / "work"  # the kernel's working folder: empty, thrown away after
        workdir.mkdir()
        env = dict(os.environ, **{GRADE_LOG_ENV: str(log)})
        # the worker and the kernel import xenith_edu from where the grader found it
        env["PYTHONPATH"] = os.pathsep.join(
            [PACKAGE_PARENT] + [p for p in [os.environ.get("PYTHONPATH")] if p])
        cmd = [sys.executable, "-c", "from xenith_edu.classroom import _worker; _worker()",
               str(path.resolve()), str(result), repr(float(timeout)), str(workdir),
               str(pgid_file)]
        popen_kw = {"start_new_session": True} if hasattr(os, "killpg") else {}
        with open(tmpdir / "worker.err", "wb") as err:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=err, env=env, cwd=workdir, **popen_kw)
            try:
                proc.wait(timeout=timeout + KILL_GRACE)
            except subprocess.TimeoutExpired:  # the worker is stuck: stop it and its kernel
                _kill_group(proc.pid)
                proc.kill()
                proc.wait()
                if pgid_file.exists():  # the kernel runs in a process group of its own
                    try:
                        _kill_group(int(pgid_file.read_text()))
                    except ValueError:
                        pass
        verdicts: dict[str, tuple[str, str]] = {}
        if log.exists():
            for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    entry = json.loads(line)
                    exercise, status = str(entry["exercise"]), str(entry["status"])
                    message = str(entry.get("message", ""))
                except (ValueError, KeyError, TypeError):
                    continue
                if status in STATUSES[:3]:
                    verdicts[exercise] = (status, message)
        error: str | None
        try:
            error = json.loads(result.read_text(encoding="utf-8"))["error"]
        except (OSError, ValueError, KeyError):
            if proc.returncode is not None and proc.returncode < 0:
                error = f"timed out after {timeout:g} s and was stopped"
            else:
                tail = (tmpdir / "worker.err").read_text(errors="replace").strip().splitlines()
                error = "the grading process failed" + (f": {tail[-1]}" if tail else "")
    return verdicts, error


def _expected_exercises(nb) -> list[str]:
    """The exercises whose checks the notebook's code calls, in order of appearance."""
    found: list[str] = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            for name in CHECK_CALL.findall(cell.source):
                if name in CHECKS and name not in found:
                    found.append(name)
    return found


def _grade_notebook(path: Path, timeout: float) -> list[tuple[str, str, str]]:
    """Rows (exercise, status, message) for one submitted notebook."""
    try:
        nb = _read_notebook(path)
    except ValueError as exc:
        return [("", "notebook error", str(exc))]
    expected = _expected_exercises(nb)
    verdicts, error = _run_notebook(path, timeout)
    rows = []
    for exercise in expected + [e for e in verdicts if e not in expected]:
        if exercise in verdicts:
            rows.append((exercise, *verdicts[exercise]))
        elif error:
            rows.append((exercise, "notebook error", f"the check did not run: {error}"))
        else:
            rows.append((exercise, "notebook error", "the check did not run (its call is in "
                                                     "the notebook but was never executed)"))
    if error and all(status != "notebook error" for _, status, _ in rows):
        rows.append(("", "notebook error", error))
    if not rows:
        rows.append(("", "notebook error", "no exercise check ran in this notebook"))
    return rows


def _submissions(root: Path, skip: set[Path]) -> list[tuple[str, Path | None, str]]:
    """(learner, notebook or None, problem) for every submission in `root`."""
    found = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith((".", "__")) or entry.resolve() in skip:
            continue
        if entry.is_dir():
            notebooks = sorted(p for p in entry.rglob("*.ipynb")
                               if ".ipynb_checkpoints" not in p.parts and p.is_file())
            if not notebooks:
                found.append((entry.name, None, "no notebook (.ipynb) in this folder"))
            found += [(entry.name, nb, "") for nb in notebooks]
        elif entry.suffix == ".ipynb":
            found.append((entry.stem, entry, ""))
        elif entry.is_file():
            found.append((entry.stem, None, f"not a notebook: {entry.name}"))
    return found


def grade(submissions_dir: Path, out_csv: Path, timeout: float | None = DEFAULT_TIMEOUT
          ) -> list[dict]:
    """Run every submitted notebook and write one CSV row per learner and exercise.

    Learners: a notebook `alice.ipynb` directly in `submissions_dir` is learner "alice"; a
    subfolder `bob/` is learner "bob", and every notebook inside it is graded. Each notebook runs
    top to bottom in a fresh kernel, in a worker process of its own, stopped after `timeout`
    seconds (None means DEFAULT_TIMEOUT). The columns are learner, notebook (its path relative
    to `submissions_dir`), exercise, status ("passed", "failed", "not attempted" or "notebook
    error") and message (the check's verdict, or what stopped the notebook). A notebook that
    crashes, loops or is not a notebook gets a "notebook error" row; grading goes on. The CSV
    is written atomically at the end. Returns the rows as dicts.
    """
    root, out_csv = _as_path(submissions_dir, "submissions_dir"), _as_path(out_csv, "out_csv")
    if timeout is None:
        timeout = DEFAULT_TIMEOUT
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or \
            not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if not root.is_dir():
        raise ValueError(f"submissions_dir: {root} is not a folder")
    if out_csv.is_dir():
        raise ValueError(f"out_csv: {out_csv} is a folder; give a file name such as grades.csv")
    if not out_csv.parent.is_dir():
        raise ValueError(f"out_csv: the folder {out_csv.parent} does not exist")
    _require("nbformat", "nbclient", "ipykernel")

    rows: list[dict] = []
    for learner, notebook, problem in _submissions(root, {out_csv.resolve()}):
        rel = notebook.relative_to(root).as_posix() if notebook else ""
        if notebook is None:
            graded = [("", "notebook error", problem)]
        else:
            graded = _grade_notebook(notebook, float(timeout))
        for exercise, status, message in graded:
            rows.append({"learner": learner, "notebook": rel, "exercise": exercise,
                         "status": status, "message": message})

    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    _write_atomic(out_csv, buf.getvalue())
    return rows


__all__ = ["grade", "make_student_versions"]
