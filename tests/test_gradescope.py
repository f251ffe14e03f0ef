"""The Gradescope autograder (`xenith-edu gradescope`): the archive, and run_autograder on a
fake /autograder root, judged against Gradescope's documented results.json schema.

run_autograder runs as Gradescope runs it (bash, its environment variables pointing at a root
in tmp_path) on a correct and a wrong submission of the softmax cross-entropy chapter, and on a
small lesson with a written question. Every results.json, including those of the autograder's
own failures (settings corrupted at random, no submission), must satisfy SCHEMA: the keys and
types Gradescope documents, 0 <= score <= max_score per test, the tests' scores summing to the
score.
"""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
import tempfile
import zipfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import nbformat
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from xenith_edu.cli import main
from xenith_edu.gradebook import gradescope
from xenith_edu.gradebook.gradescope import BY_HAND, SETTINGS, build, run

ROOT = Path(__file__).resolve().parents[1]
NUMBER = (int, float)
VISIBILITY = ("visible", "hidden", "after_due_date", "after_published")
FORMAT = ("text", "html", "simple_format", "md", "ansi")
# Gradescope's results.json ("Autograder Specifications", Output Format): key -> type or values
SCHEMA = {
    "required": {"score": NUMBER, "tests": list},
    "optional": {"execution_time": NUMBER, "output": str, "output_format": FORMAT,
                 "test_output_format": FORMAT, "test_name_format": FORMAT,
                 "visibility": VISIBILITY, "stdout_visibility": VISIBILITY,
                 "extra_data": dict, "leaderboard": list},
    "test": {
        "required": {"name": str, "score": NUMBER, "max_score": NUMBER, "output": str,
                     "visibility": VISIBILITY},
        "optional": {"status": ("passed", "failed"), "number": str, "tags": list,
                     "extra_data": dict, "output_format": FORMAT, "name_format": FORMAT},
    },
}


def _check(where: str, obj: dict, spec: dict) -> None:
    assert isinstance(obj, dict), where
    unknown = set(obj) - set(spec["required"]) - set(spec["optional"])
    assert not unknown, f"{where}: keys Gradescope does not document: {unknown}"
    for key, kind in {**spec["required"], **spec["optional"]}.items():
        if key not in obj:
            assert key not in spec["required"], f"{where}: no {key!r}"
            continue
        value = obj[key]
        if kind is NUMBER:
            assert isinstance(value, NUMBER) and not isinstance(value, bool), (where, key)
            assert math.isfinite(value), (where, key)
        elif isinstance(kind, tuple) and all(isinstance(k, str) for k in kind):
            assert value in kind, (where, key, value)
        else:
            assert isinstance(value, kind), (where, key, value)


def validate(results: dict) -> None:
    """results.json as Gradescope documents it, and scores that add up."""
    _check("results", results, SCHEMA)
    for i, test in enumerate(results["tests"]):
        _check(f"test {i}", test, SCHEMA["test"])
        assert 0 <= test["score"] <= test["max_score"], test
    assert math.isclose(sum(t["score"] for t in results["tests"]), results["score"],
                        abs_tol=1e-9)
    assert len({t["name"] for t in results["tests"]}) == len(results["tests"])
    # the learner's strings (messages of their exceptions) are shown as text, never markup
    assert results["output_format"] == results["test_output_format"] == "text"


def unpack(archive: Path, root: Path) -> Path:
    """The archive as Gradescope lays it out: /autograder/source and /autograder/run_autograder."""
    (root / "source").mkdir(parents=True)
    with zipfile.ZipFile(archive) as z:
        z.extractall(root / "source")
    (root / "run_autograder").write_bytes((root / "source" / "run_autograder").read_bytes())
    return root


def run_autograder(root: Path, notebooks: dict[str, object]) -> dict:
    """Hand in `notebooks` ({file name: notebook}), run run_autograder, read results.json."""
    sub = root / "submission"
    sub.mkdir(exist_ok=True)
    for name, nb in notebooks.items():
        nbformat.write(nb, str(sub / name))
    env = {**os.environ, "XENITH_AUTOGRADER_ROOT": str(root),
           "XENITH_AUTOGRADER_PYTHON": sys.executable}
    done = subprocess.run(["bash", str(root / "run_autograder")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    results = json.loads((root / "results" / "results.json").read_text())
    validate(results)
    return results


def by_name(results: dict) -> dict[str, dict]:
    return {t["name"]: t for t in results["tests"]}


# ----------------------------------------------------------------------------------------------
# A chapter of the book: softmax cross-entropy, a correct and a wrong submission.


@pytest.fixture(scope="module")
def softmax_zip(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("softmax") / "autograder.zip"
    build(ROOT / "notebooks", out, ["softmax_ce"])
    return out


def _chapter(replace: tuple[str, str] | None = None):
    nb = nbformat.read(str(ROOT / "notebooks" / "softmax_ce.ipynb"), as_version=4)
    if replace is not None:
        hits = [c for c in nb.cells if replace[0] in c.source]
        assert len(hits) == 1
        hits[0].source = hits[0].source.replace(*replace)
    return nb


def test_a_correct_submission_of_a_chapter_gets_every_point(softmax_zip, tmp_path):
    results = run_autograder(unpack(softmax_zip, tmp_path / "ag"),
                             {"softmax_ce.ipynb": _chapter()})
    assert set(by_name(results)) == {"softmax_ce: softmax_cross_entropy",
                                     "softmax_ce: label_smoothing"}
    assert results["score"] == 2.0
    assert all(t["status"] == "passed" and t["score"] == t["max_score"] == 1.0
               for t in results["tests"])


def test_a_wrong_submission_of_a_chapter_fails_that_exercise_alone(softmax_zip, tmp_path):
    wrong = _chapter(("return loss, dlogits / N", "return loss, dlogits"))  # 1/N forgotten
    results = run_autograder(unpack(softmax_zip, tmp_path / "ag"),
                             {"softmax_ce.ipynb": wrong})
    tests = by_name(results)
    bad = tests["softmax_ce: softmax_cross_entropy"]
    assert (bad["status"], bad["score"], bad["max_score"]) == ("failed", 0.0, 1.0)
    assert bad["output"].startswith("[failed] softmax_cross_entropy")
    assert tests["softmax_ce: label_smoothing"]["score"] == 1.0 and results["score"] == 1.0


# ----------------------------------------------------------------------------------------------
# A small lesson: points from nbgrader metadata, a written question, the archive itself.

IMPORTS = "import numpy as np\nfrom xenith_edu.exercises import check_linear_backward, " \
          "check_silu_grad"
RIGHT = "def my_linear_backward(dY, X, W):\n    ### BEGIN SOLUTION\n    return dY @ W.T, " \
        "X.T @ dY\n    ### END SOLUTION\n"
WRONG = "def my_linear_backward(dY, X, W):\n    return dY @ W.T, 2 * X.T @ dY\n"
SILU = ("def my_silu_grad(z):\n    ### BEGIN SOLUTION\n    s = 0.5 * (1 + np.tanh(0.5 * z))\n"
        "    return s * (1 + z * (1 - s))\n    ### END SOLUTION\n")


def lesson(linear: str = RIGHT):
    """Two exercises (3 points, then 1 by default) and a written question worth 2."""
    check = new_code_cell("_ = check_linear_backward(my_linear_backward)")
    check.metadata["nbgrader"] = {"points": 3, "grade": True, "grade_id": "lin-check"}
    written = new_markdown_cell("### BEGIN SOLUTION\nThe chain rule.\n### END SOLUTION")
    written.metadata["nbgrader"] = {"solution": True, "grade": True, "grade_id": "why",
                                    "points": 2}
    return new_notebook(cells=[new_code_cell(IMPORTS), new_code_cell(linear), check,
                               new_markdown_cell("Why W transposed?"), written,
                               new_code_cell(SILU),
                               new_code_cell("_ = check_silu_grad(my_silu_grad)")])


@pytest.fixture(scope="module")
def lesson_zip(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("lesson")
    (tmp / "teacher").mkdir()
    nbformat.write(lesson(), str(tmp / "teacher" / "lesson.ipynb"))
    build(tmp / "teacher", tmp / "autograder.zip")
    return tmp / "autograder.zip"


def test_points_and_the_written_question_become_tests(lesson_zip, tmp_path):
    results = run_autograder(unpack(lesson_zip, tmp_path / "ag"),
                             {"my work.ipynb": lesson(WRONG)})  # its only notebook: matched
    tests = by_name(results)
    assert [t["name"] for t in results["tests"]] == ["lesson: linear_backward",
                                                     "lesson: silu_grad", "lesson: why"]
    assert (tests["lesson: linear_backward"]["score"],
            tests["lesson: linear_backward"]["max_score"]) == (0.0, 3.0)
    assert "factor of 2" in tests["lesson: linear_backward"]["output"]
    assert (tests["lesson: silu_grad"]["score"], tests["lesson: silu_grad"]["max_score"]) == \
        (1.0, 1.0)
    why = tests["lesson: why"]
    assert (why["score"], why["max_score"], why["output"]) == (0.0, 2.0, BY_HAND)
    assert "status" not in why and results["score"] == 1.0


def test_a_notebook_of_the_assignment_not_handed_in_is_zero_with_its_reason(tmp_path):
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    nbformat.write(lesson(), str(teacher / "lesson.ipynb"))
    other = new_notebook(cells=[
        new_code_cell("from xenith_edu.exercises import check_softmax_cross_entropy"),
        new_code_cell("def my_ce(logits, targets):\n    raise NotImplementedError()"),
        new_code_cell("_ = check_softmax_cross_entropy(my_ce)")])
    nbformat.write(other, str(teacher / "other.ipynb"))
    build(teacher, tmp_path / "a.zip")
    root = unpack(tmp_path / "a.zip", tmp_path / "ag")
    results = run_autograder(root, {"lesson.ipynb": lesson(), "notes.ipynb": new_notebook()})
    tests = by_name(results)
    assert list(tests) == ["lesson: linear_backward", "lesson: silu_grad", "lesson: why",
                           "other: softmax_cross_entropy"]
    missing = tests["other: softmax_cross_entropy"]
    assert (missing["score"], missing["max_score"], missing["status"]) == (0.0, 1.0, "failed")
    assert "no other.ipynb was submitted" in missing["output"]
    assert results["score"] == 4.0


def test_an_exercise_two_notebooks_check_is_judged_in_each(tmp_path):
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    nbformat.write(lesson(), str(teacher / "lesson.ipynb"))
    review = new_notebook(cells=[new_code_cell(IMPORTS), new_code_cell(SILU),
                                 new_code_cell("_ = check_silu_grad(my_silu_grad)")])
    nbformat.write(review, str(teacher / "review.ipynb"))
    build(teacher, tmp_path / "a.zip")
    wrong = new_notebook(cells=[new_code_cell(IMPORTS), new_code_cell(
        "def my_silu_grad(z):\n    return 1 / (1 + np.exp(-z))\n")])  # sigma alone
    results = run_autograder(unpack(tmp_path / "a.zip", tmp_path / "ag"),
                             {"lesson.ipynb": lesson(), "review.ipynb": wrong})
    tests = by_name(results)
    assert tests["lesson: silu_grad"]["score"] == 1.0
    assert (tests["review: silu_grad"]["score"], tests["review: silu_grad"]["status"]) == \
        (0.0, "failed")
    assert results["score"] == 4.0


def test_the_archive_holds_no_solution_and_installs_offline(lesson_zip, tmp_path):
    with zipfile.ZipFile(lesson_zip) as z:
        names = z.namelist()
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in z.infolist()}
        teacher = z.read("instructor/lesson.ipynb").decode()
        setup = z.read("setup.sh").decode()
        z.extractall(tmp_path / "src")
    wheel = [n for n in names if n.startswith("dist/")]
    assert len(wheel) == 1 and wheel[0].endswith("-py3-none-any.whl")
    assert f"./{wheel[0]}" in setup and modes["setup.sh"] == modes["run_autograder"] == 0o755
    assert "BEGIN SOLUTION" not in teacher and "X.T @ dY" not in teacher
    assert "The chain rule" not in teacher and '"points": 3' in teacher
    for script in ("setup.sh", "run_autograder"):
        subprocess.run(["bash", "-n", str(tmp_path / "src" / script)], check=True)
    target = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                          "--no-index", "--target", str(target), str(tmp_path / "src" / wheel[0])],
                         capture_output=True, text=True)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    probe = ("import xenith_edu, xenith_edu.gradebook.gradescope as g; "
             "from xenith_edu.tools.shipped import shipped; "
             "print(xenith_edu.__file__); print(shipped('shakespeare.txt').is_file())")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(target)}, cwd=tmp_path,
                         check=True).stdout.split()
    assert out[0].startswith(str(target)) and out[1] == "True"


def test_the_archive_is_the_same_bytes_each_time(tmp_path):
    (tmp_path / "t").mkdir()
    nbformat.write(lesson(), str(tmp_path / "t" / "lesson.ipynb"))
    build(tmp_path / "t", tmp_path / "a.zip")
    build(tmp_path / "t", tmp_path / "b.zip")
    assert (tmp_path / "a.zip").read_bytes() == (tmp_path / "b.zip").read_bytes()


# ----------------------------------------------------------------------------------------------
# Hostile submissions: each is that learner's verdict in a valid results.json, never a hang.

FORGE = ("import json, os, pathlib\n"
         "p = pathlib.Path(os.environ.get('XENITH_AUTOGRADER_ROOT', '/autograder'))\n"
         "for where in (p, pathlib.Path({root!r})):\n"
         "    try:\n"
         "        (where / 'results').mkdir(exist_ok=True)\n"
         "        (where / 'results' / 'results.json').write_text(json.dumps(\n"
         "            {{'score': 100, 'tests': []}}))\n"
         "    except OSError:\n"
         "        pass\n")


def _hostile(kind: str, sub: Path, root: Path) -> None:
    sub.mkdir()
    if kind == "not json":
        (sub / "lesson.ipynb").write_bytes(b"\x00\xff{not a notebook")
    elif kind == "link":
        (sub / "lesson.ipynb").symlink_to("/etc/passwd")
    elif kind == "pipe":
        os.mkfifo(sub / "lesson.ipynb")
    elif kind == "forged results":
        nb = lesson(WRONG)
        nb.cells.insert(1, new_code_cell(FORGE.format(root=str(root))))
        nbformat.write(nb, str(sub / "lesson.ipynb"))


@pytest.mark.parametrize("kind", ["not json", "link", "pipe", "forged results"])
def test_a_hostile_submission_is_graded_not_obeyed(lesson_zip, tmp_path, kind):
    root = unpack(lesson_zip, tmp_path / "ag")
    _hostile(kind, root / "submission", root)
    with redirect_stderr(io.StringIO()):
        results = run(root)
    validate(results)
    assert json.loads((root / "results" / "results.json").read_text()) == results
    assert results["score"] == (1.0 if kind == "forged results" else 0.0)  # silu_grad alone
    assert len(results["tests"]) == 3


def test_the_archive_s_time_limit_stops_a_loop_and_grades_the_rest(tmp_path):
    (tmp_path / "t").mkdir()
    nbformat.write(lesson(), str(tmp_path / "t" / "lesson.ipynb"))
    made = build(tmp_path / "t", tmp_path / "a.zip", timeout=3.0, call_time=2.0)
    assert made.seconds == 2 * (3 + 10) + 2 + 2 * 2 + 30  # the budget the command prints
    root = unpack(tmp_path / "a.zip", tmp_path / "ag")
    looping = lesson()
    looping.cells.insert(2, new_code_cell("while True:\n    pass"))  # before silu's cell
    results = run_autograder(root, {"lesson.ipynb": looping})
    tests = by_name(results)
    assert "timed out after 3 s" in results["output"]
    assert tests["lesson: linear_backward"]["score"] == 3.0  # defined before the loop
    assert tests["lesson: silu_grad"]["status"] == "failed" and results["score"] == 3.0


# ----------------------------------------------------------------------------------------------
# The autograder's own failures still give the learner a results.json that Gradescope reads.


def test_nothing_handed_in_is_zero_points_on_every_test(lesson_zip, tmp_path):
    root = unpack(lesson_zip, tmp_path / "ag")
    (root / "submission").mkdir()
    results = run(root)
    validate(results)
    assert results["score"] == 0 and len(results["tests"]) == 3
    assert "Nothing was handed in" in results["output"]


def _corrupt(text: str, data) -> str:
    how = data.draw(st.sampled_from(["cut", "flip", "key", "value", "empty", "list", "points"]))
    if how == "cut":
        return text[:data.draw(st.integers(0, len(text) - 1))]
    if how == "flip":
        i = data.draw(st.integers(0, len(text) - 1))
        return text[:i] + data.draw(st.characters(codec="utf-8")) + text[i + 1:]
    settings_ = json.loads(text)
    if how == "key":
        settings_.pop(data.draw(st.sampled_from(sorted(settings_))))
    elif how == "value":
        key = data.draw(st.sampled_from(sorted(settings_)))
        settings_[key] = data.draw(st.sampled_from([None, -1, "x", [], {}, 1e309, True]))
    elif how == "points":  # inside a part: an exercise's or a question's points
        part = settings_["parts"][0]
        hostile = data.draw(st.sampled_from([None, -1, "x", [], 1e309, -1e309]))
        if data.draw(st.booleans()):
            part["points"][data.draw(st.sampled_from(sorted(part["points"])))] = hostile
        else:
            part["questions"][0][1] = hostile
    elif how == "list":
        settings_ = [settings_]
    else:
        settings_ = {}
    return json.dumps(settings_)


@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_corrupted_settings_still_give_a_valid_results_json(lesson_zip, tmp_path, data):
    root = unpack(lesson_zip, Path(tempfile.mkdtemp(dir=tmp_path)) / "ag")  # one per example
    (root / "submission").mkdir()  # nothing handed in: no notebook runs, whatever the settings
    path = root / "source" / SETTINGS
    path.write_text(_corrupt(path.read_text(), data))
    with redirect_stderr(io.StringIO()):
        results = run(root)
    validate(results)
    assert json.loads((root / "results" / "results.json").read_text()) == results
    assert results["score"] == 0


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"),
                                   RuntimeError("the sandbox could not start"),
                                   KeyboardInterrupt()])
def test_an_error_of_the_grader_is_every_test_at_zero_and_said(lesson_zip, tmp_path,
                                                               monkeypatch, error):
    import xenith_edu.gradebook.grading as grading

    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(grading, "grade", broken)
    root = unpack(lesson_zip, tmp_path / "ag")
    _hostile("not json", root / "submission", root)
    with redirect_stderr(io.StringIO()):
        results = run(root)
    validate(results)
    assert results["score"] == 0 and len(results["tests"]) == 3
    assert "could not grade this submission" in results["output"]
    assert all(t["output"] in (BY_HAND, "not graded: no verdict for this exercise")
               for t in results["tests"])


def test_without_the_package_run_autograder_still_writes_results(lesson_zip, tmp_path):
    root = unpack(lesson_zip, tmp_path / "ag")
    env = {**os.environ, "XENITH_AUTOGRADER_ROOT": str(root),
           "XENITH_AUTOGRADER_PYTHON": str(tmp_path / "no-python")}  # setup.sh failed
    done = subprocess.run(["bash", str(root / "run_autograder")], env=env, capture_output=True)
    assert done.returncode == 0
    results = json.loads((root / "results" / "results.json").read_text())
    validate(results)
    assert results["score"] == 0 and "not installed" in results["output"]


def test_a_package_in_the_submission_cannot_stand_in_for_the_grader(lesson_zip, tmp_path):
    root = unpack(lesson_zip, tmp_path / "ag")
    fake = root / "submission" / "xenith_edu"
    (fake / "gradebook").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "gradebook" / "__init__.py").write_text("")
    (fake / "gradebook" / "gradescope.py").write_text(  # full marks, if it were run
        "import json, pathlib, sys\n"
        "out = pathlib.Path(sys.argv[1]) / 'results'\nout.mkdir(exist_ok=True)\n"
        "(out / 'results.json').write_text(json.dumps({'score': 99, 'tests': []}))\n")
    nbformat.write(lesson(WRONG), str(root / "submission" / "lesson.ipynb"))
    env = {**os.environ, "XENITH_AUTOGRADER_ROOT": str(root),
           "XENITH_AUTOGRADER_PYTHON": sys.executable, "PYTHONPATH": str(root / "submission")}
    done = subprocess.run(["bash", str(root / "run_autograder")], env=env, capture_output=True,
                          text=True, cwd=root / "submission", timeout=300)
    assert done.returncode == 0, done.stderr
    results = json.loads((root / "results" / "results.json").read_text())
    validate(results)
    assert results["score"] == 1.0  # silu_grad alone: the grader's own verdicts


# ----------------------------------------------------------------------------------------------
# The command line.


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_the_command_writes_the_archive_and_says_its_points(tmp_path):
    (tmp_path / "t").mkdir()
    nbformat.write(lesson(), str(tmp_path / "t" / "lesson.ipynb"))
    code, out, err = _cli("gradescope", str(tmp_path / "t"), "--out", str(tmp_path / "a.zip"),
                          "--chapters", "lesson", "--visibility", "after_due_date")
    assert code == 0, err
    assert "1 notebook(s), 2 exercise(s) worth 4 points, 2 points of written answers" in out
    assert "autograder timeout above 320 s" in out  # 2 x (120 + 10) + 10 x (2 + 1) + 30
    with zipfile.ZipFile(tmp_path / "a.zip") as z:
        assert json.loads(z.read(SETTINGS))["visibility"] == "after_due_date"
        assert '.whl[notebooks]"\n' in z.read("setup.sh").decode()  # the grader's own extra
    code, out, err = _cli("gradescope", str(tmp_path / "t"), "--out", str(tmp_path / "b.zip"),
                          "--extras", "torch", "hf", "torch")
    assert code == 0, err
    with zipfile.ZipFile(tmp_path / "b.zip") as z:
        assert '-py3-none-any.whl[notebooks,torch,hf]"\n' in z.read("setup.sh").decode()


def test_bad_input_to_the_command_is_one_line(tmp_path):
    (tmp_path / "t").mkdir()
    nbformat.write(lesson(), str(tmp_path / "t" / "lesson.ipynb"))
    (tmp_path / "none").mkdir()
    nbformat.write(new_notebook(cells=[new_code_cell("x = 1")]),
                   str(tmp_path / "none" / "plain.ipynb"))
    (tmp_path / "junk.whl").write_bytes(b"not a wheel")
    out = str(tmp_path / "a.zip")
    cases = {"is not a folder": ("gradescope", str(tmp_path / "missing"), "--out", out),
             "no rmsnorm.ipynb": ("gradescope", str(tmp_path / "t"), "--out", out,
                                  "--chapters", "rmsnorm"),
             "not a .zip": ("gradescope", str(tmp_path / "t"), "--out", str(tmp_path / "a")),
             "call no check_": ("gradescope", str(tmp_path / "none"), "--out", out),
             "not a wheel or sdist of": ("gradescope", str(tmp_path / "t"), "--out", out,
                                         "--dist", str(tmp_path / "junk.whl")),
             "does not exist": ("gradescope", str(tmp_path / "t"), "--out",
                                str(tmp_path / "no" / "a.zip")),
             "is not an extra of": ("gradescope", str(tmp_path / "t"), "--out", out,
                                    "--extras", "gpu")}
    for words, argv in cases.items():
        code, _, err = _cli(*argv)
        assert code == 1 and words in err and err.count("\n") == 1, (words, err)
    assert not (tmp_path / "a.zip").exists()


def test_the_runner_is_what_run_autograder_calls():
    assert "-m xenith_edu.gradebook.gradescope" in gradescope.RUN
    assert gradescope.main.__doc__ and "run_autograder" in gradescope.main.__doc__


def test_the_teaching_page_s_commands_are_the_command_line_s():
    """Every `grade-stats` and `gradescope` command the teaching page shows parses as written."""
    import shlex

    from xenith_edu.cli.main import build_parser

    page = (ROOT / "book" / "teaching.md").read_text("utf-8").replace("\\\n", " ")
    shown = [line[2:] for line in page.splitlines()
             if line.startswith(("$ xenith-edu grade-stats", "$ xenith-edu gradescope"))]
    assert {shlex.split(c)[1] for c in shown} == {"grade-stats", "gradescope"}
    for command in shown:
        args = build_parser().parse_args(shlex.split(command)[1:])
        assert args.func.__name__ in ("_cmd_grade_stats", "_cmd_gradescope"), command
