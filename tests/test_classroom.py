"""The classroom: student versions of the notebooks run to the end; an ordinary class graded.

Kernels are slow to start, so the graded sample is small and its time limit short.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from xenith_edu.booktools import make_student_versions
from xenith_edu.exercises import GRADE_LOG_ENV
from xenith_edu.gradebook import grade

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "notebooks").glob("*.ipynb"))

SOLUTION = """\
def my_linear_backward(dY, X, W):
    \"\"\"dX and dW of Y = X @ W.\"\"\"
    ### BEGIN SOLUTION
    dX = dY @ W.T  # (N, n)
    dW = X.T @ dY  # (n, m)
    ### END SOLUTION
    return dX, dW


def my_memory(B, H, S, hd, itemsize):
    def count():
        ### BEGIN SOLUTION
        return B * H * (3 * S * hd + S * (S + 1) // 2)
        ### END SOLUTION
    return count() * itemsize"""


def chapter(body: str = SOLUTION, before: list | None = None) -> nbformat.NotebookNode:
    """A small chapter in the book's exercise layout, with outputs as if executed."""
    solved = new_code_cell(body, metadata={"tags": ["hide-input", "keep-me"]})
    done = new_code_cell("print('the notebook went on')", execution_count=7,
                         outputs=[new_output("stream", name="stdout", text="old output\n")])
    return new_notebook(cells=[
        new_markdown_cell("# A chapter"),
        new_code_cell("import numpy as np\nfrom xenith_edu.exercises import "
                      "check_attention_cache_bytes, check_linear_backward"),
        *(before or []),
        new_markdown_cell("```{exercise} The linear layer\n:label: ex-linear\nWrite it.\n```"),
        solved,
        new_markdown_cell("```{solution} ex-linear\n:class: dropdown\nThe transpose.\n```"),
        new_markdown_cell("Also:\n\n````{solution} ex-linear\n```python\nW.T\n```\n````\n"
                          "\nTry it."),
        new_markdown_cell("```{solution-start} ex-linear\n```"),
        new_code_cell("print('gated solution code')"),
        new_markdown_cell("```{solution-end}\n```"),
        new_markdown_cell("Why?\n\n### BEGIN SOLUTION\nBecause.\n### END SOLUTION\n"),
        new_code_cell("x = 1\n### BEGIN HIDDEN TESTS\nassert x == 1\n### END HIDDEN TESTS"),
        new_code_cell("check_linear_backward(my_linear_backward);\n"
                      "check_attention_cache_bytes(my_memory);"),
        done,
    ], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                "language": "python"}})


def write(nb: nbformat.NotebookNode, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def execute(path: Path, log: Path, monkeypatch, cwd: Path | None = None,
            timeout: int = 300) -> nbformat.NotebookNode:
    """Run a notebook top to bottom in a fresh kernel; the checks log to `log`."""
    monkeypatch.setenv(GRADE_LOG_ENV, str(log))
    nb = nbformat.read(str(path), as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(cwd or path.parent)}}).execute()
    return nb


# ---------------------------------------------------------------- student versions
def test_student_version_strips_solutions_and_keeps_the_rest(tmp_path):
    src = write(chapter(), tmp_path / "inst" / "01_demo.ipynb")
    (out,) = make_student_versions(src, tmp_path / "student")
    assert out == tmp_path / "student" / "01_demo.ipynb"
    nb = nbformat.read(str(out), as_version=4)
    text = json.dumps(nb)
    for gone in ("BEGIN SOLUTION", "END SOLUTION", "dY @ W.T", "The transpose.", "Because.",
                 "W.T",
                 "gated solution code", "{solution", "HIDDEN TESTS", "assert x == 1",
                 "old output"):
        assert gone not in text, gone
    sources = [c.source for c in nb.cells]
    assert ('def my_linear_backward(dY, X, W):\n    """dX and dW of Y = X @ W."""\n'
            "    raise NotImplementedError()\n    return dX, dW") in sources[3]
    assert "    def count():\n        raise NotImplementedError()\n" in sources[3]
    assert sources[4] == "Also:\n\n\nTry it."  # a solution inside a cell of other text
    assert sources[5] == "Why?\n\nYOUR ANSWER HERE\n"
    assert sources[6] == "x = 1"
    assert "```{exercise} The linear layer" in sources[2]
    assert len(nb.cells) == 9  # the three solution cells and the gated code cell are gone
    assert nb.cells[3].metadata["tags"] == ["keep-me"]  # hide-input goes: the stub is shown
    assert all(c.outputs == [] and c.execution_count is None
               for c in nb.cells if c.cell_type == "code")
    nbformat.validate(nb)


def test_student_version_of_a_folder_writes_nothing_if_one_notebook_is_bad(tmp_path):
    write(chapter(), tmp_path / "inst" / "a.ipynb")
    unclosed = "def f():\n    ### BEGIN SOLUTION\n    return 1\n"
    write(chapter(unclosed), tmp_path / "inst" / "b.ipynb")
    with pytest.raises(ValueError, match=r"b.ipynb, cell 4: line 2 opens a region that no "
                                         r"### END SOLUTION closes"):
        make_student_versions(tmp_path / "inst", tmp_path / "student")
    assert not (tmp_path / "student").exists()


@pytest.mark.parametrize("body,message", [
    ("x = 1\n### END SOLUTION", "line 2 closes a region that was never opened"),
    ("### BEGIN SOLUTION\nx = 1\n### END SOLUTION", "not inside a function body"),
])
def test_student_version_rejects_bad_markers(tmp_path, body, message):
    src = write(chapter(body), tmp_path / "inst" / "c.ipynb")
    with pytest.raises(ValueError, match=message):
        make_student_versions(src, tmp_path / "student")


def test_student_version_bad_arguments(tmp_path):
    src = write(chapter(), tmp_path / "inst" / "a.ipynb")
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "junk.ipynb").write_text("{not json")
    cases = [
        (tmp_path / "missing", tmp_path / "s", "src: .* does not exist"),
        (tmp_path / "file.txt", tmp_path / "s", "src: .* is not a notebook"),
        (tmp_path / "empty", tmp_path / "s", "src: no notebook"),
        (tmp_path / "junk.ipynb", tmp_path / "s", "junk.ipynb is not a valid notebook"),
        (src, tmp_path / "file.txt", "out: .* is not a folder"),
        (tmp_path / "inst", tmp_path / "inst", "would overwrite the solutions"),
        (src, tmp_path / "inst", "would overwrite the solutions"),
    ]
    for s, o, message in cases:
        with pytest.raises(ValueError, match=message) as err:
            make_student_versions(s, o)
        assert "\n" not in str(err.value)
    with pytest.raises(TypeError, match="src must be a path"):
        make_student_versions(42, tmp_path / "s")


def test_student_version_runs_top_to_bottom_and_says_not_attempted(tmp_path, monkeypatch):
    src = write(chapter(), tmp_path / "inst" / "demo.ipynb")
    (out,) = make_student_versions(src, tmp_path / "student")
    assert [p.name for p in (tmp_path / "student").iterdir()] == ["demo.ipynb"]  # no temp files
    log = tmp_path / "log.jsonl"
    nb = execute(out, log, monkeypatch)
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["exercise"], e["status"]) for e in entries] == [
        ("linear_backward", "not attempted"), ("attention_cache_bytes", "not attempted")]
    assert "the notebook went on" in nb.cells[-1].outputs[0]["text"]


@pytest.mark.skipif(not CHAPTERS, reason="no chapter notebooks yet")
@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_student_version_of_each_chapter_runs_top_to_bottom(path, tmp_path, student_runs):
    """The student version's run (conftest.py's `student_runs`, its one run per session, from
    an empty folder with the wheel): every cell runs, and a stub is never "failed"."""
    (out,) = make_student_versions(path, tmp_path)
    text = out.read_text()
    assert "BEGIN SOLUTION" not in text and "{solution}" not in text
    run = student_runs[path.stem]
    assert run.error is None, run.error
    assert "failed" not in run.statuses  # a stub says "not attempted", never "failed"


# ---------------------------------------------------------------- grading
# The adversaries are in test_grading.py; here, an ordinary class and the boundaries.
def test_grade_a_small_class(tmp_path):
    subs, inst = tmp_path / "submissions", write(chapter(), tmp_path / "inst" / "week1.ipynb")
    write(chapter(), subs / "alice" / "week1.ipynb")  # a learner's folder
    write(chapter(SOLUTION.replace("dY @ W.T", "dY @ W")), subs / "bob.ipynb")
    make_student_versions(write(chapter(), tmp_path / "inst2" / "carol.ipynb"), subs)
    write(chapter(before=[new_code_cell("1 / 0")]), subs / "dan.ipynb")
    write(chapter(before=[new_code_cell("while True:\n    pass")]), subs / "erin.ipynb")
    write(chapter(before=[new_code_cell("import os\nos._exit(3)")]), subs / "ivan.ipynb")
    (subs / "frank.txt").write_text("I did it on paper")
    (subs / "gina.ipynb").write_text("{ this is not json")
    (subs / "hank").mkdir()
    out = tmp_path / "grades.csv"

    rows = grade(subs, out, timeout=4, instructor=inst, jobs=2)

    with out.open(newline="") as f:
        assert list(csv.DictReader(f)) == rows
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # atomic write
    got = {(r["learner"], r["exercise"]): (r["status"], r["message"]) for r in rows}
    assert list(dict.fromkeys(r["learner"] for r in rows)) == [
        "alice", "bob", "carol", "dan", "erin", "frank", "gina", "hank", "ivan"]
    assert {r["notebook"] for r in rows if r["learner"] == "alice"} == {"alice/week1.ipynb"}
    for ex in ("linear_backward", "attention_cache_bytes"):
        assert got[("alice", ex)][0] == "passed"
        assert got[("carol", ex)][0] == "not attempted"
        assert got[("dan", ex)][0] == "passed"  # an error in another cell: noted, not fatal
        assert got[("erin", ex)][0] == "missing"  # its cells stopped before the function
        assert got[("ivan", ex)][0] == "notebook error"
        assert "ended its own process" in got[("ivan", ex)][1]
        assert got[("gina", ex)][0] == "notebook error"
        assert "gina.ipynb is not a valid notebook" in got[("gina", ex)][1]
    assert got[("dan", "")] == ("notebook error", "cell 3 raised ZeroDivisionError: division "
                                                  "by zero (line 1: `1 / 0`)")
    assert "timed out after 4 s in cell 3" in got[("erin", "")][1]
    status, message = got[("bob", "linear_backward")]
    assert status == "failed" and "matrix shapes don't match" in message
    assert got[("bob", "attention_cache_bytes")][0] == "passed"
    assert got[("frank", "")] == ("notebook error", "not a notebook: frank.txt")
    assert got[("hank", "")] == ("notebook error", "no notebook (.ipynb) in this folder")
    report = (tmp_path / "grades.md").read_text()
    assert "| linear_backward | 2 | 1 | 1 | 0 | 1 | 2 | 29% |" in report and "**ivan**" in report


def test_grade_bad_arguments(tmp_path):
    (tmp_path / "subs").mkdir()
    (tmp_path / "subs" / "x.txt").write_text("x")
    inst = write(chapter(), tmp_path / "inst.ipynb")
    for timeout in (0, -1.0, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ValueError, match="timeout must be a positive number"):
            grade(tmp_path / "subs", tmp_path / "g.csv", timeout=timeout, instructor=inst)
    for jobs in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="jobs must be a positive integer"):
            grade(tmp_path / "subs", tmp_path / "g.csv", jobs=jobs, instructor=inst)
    with pytest.raises(ValueError, match="submissions_dir: .* is not a folder"):
        grade(tmp_path / "nope", tmp_path / "g.csv")
    with pytest.raises(ValueError, match="out_csv: .* is a folder"):
        grade(tmp_path / "subs", tmp_path / "subs")
    with pytest.raises(ValueError, match="out_csv: the folder .* does not exist"):
        grade(tmp_path / "subs", tmp_path / "missing" / "g.csv")
    with pytest.raises(ValueError, match="instructor: .* neither a notebook nor a folder"):
        grade(tmp_path / "subs", tmp_path / "g.csv", instructor=tmp_path / "subs" / "x.txt")
    with pytest.raises(ValueError, match="no submitted notebook is named as a chapter"):
        grade(tmp_path / "subs", tmp_path / "g.csv")  # the default: the book's chapters
    assert not (tmp_path / "g.csv").exists()


def test_grade_skips_its_own_files_inside_the_folder(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "x.txt").write_text("x")
    inst = write(chapter(), tmp_path / "inst.ipynb")
    rows = grade(subs, subs / "grades.csv", timeout=None, instructor=inst)  # the default limit
    rows_again = grade(subs, subs / "grades.csv", timeout=5, instructor=inst)
    assert rows == rows_again == [{"learner": "x", "notebook": "", "exercise": "",
                                   "status": "notebook error", "points": "",
                                   "max_points": "", "late": "",
                                   "message": "not a notebook: x.txt", "mistake": ""}]


def test_without_bubblewrap_the_grader_says_so_and_still_judges(tmp_path, monkeypatch, capsys):
    from xenith_edu.grader import sandbox

    monkeypatch.setattr(sandbox, "bwrap", lambda: None)
    inst = write(chapter(), tmp_path / "inst.ipynb")
    write(chapter(SOLUTION.replace("dY @ W.T", "dY @ W")), tmp_path / "subs" / "bob.ipynb")
    rows = grade(tmp_path / "subs", tmp_path / "g.csv", instructor=inst, timeout=10)
    err = capsys.readouterr().err
    assert err.count("bubblewrap (bwrap) is not installed") == 1 and "NOT isolated" in err
    assert [(r["exercise"], r["status"]) for r in rows] == [("linear_backward", "failed"),
                                                           ("attention_cache_bytes", "passed")]


def test_command_line_student_and_grade(tmp_path, capsys):
    cli = pytest.importorskip("xenith_edu.cli")
    src = write(chapter(), tmp_path / "inst" / "a.ipynb")
    assert cli.main(["student", str(src), "--out", str(tmp_path / "student")]) == 0
    assert (tmp_path / "student" / "a.ipynb").exists()
    write(chapter(), tmp_path / "subs" / "x.ipynb")
    out = tmp_path / "grades.csv"
    assert cli.main(["grade", str(tmp_path / "subs"), "--out", str(out), "--instructor",
                     str(src), "--jobs", "1", "--timeout", "20"]) == 0
    assert out.read_text().count(",passed,") == 2
    assert cli.main(["grade", str(tmp_path / "subs"), "--out", str(out), "--instructor",
                     str(src), "--resume"]) == 0
    assert "wrote 2 grade row(s), 2 passed" in capsys.readouterr().out
    assert cli.main(["student", str(tmp_path / "nope"), "--out", str(tmp_path / "s")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err and "Traceback" not in err
