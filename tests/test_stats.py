"""The class's statistics (`xenith-edu grade-stats`): figures over the class alone, counts of the
diagnosed mistakes, and one line for any file grade did not write.

Classes are generated (hypothesis): learners of the class, absent, on no roster or sharing a
name; exercises and written questions of random points; every status; mistakes from a pool
with hostile and multi-sentence text. The files are written with the course's own columns and
CSV writer, as `grade` writes them. The figures are recomputed here by another route
(`statistics.quantiles`), and metamorphic rules hold: learners counted apart, and the order of
the rows, change nothing of the class's figures. One small class is graded for real.
"""

from __future__ import annotations

import csv
import io
import re
import statistics
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import nbformat
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from xenith_edu.cli import main
from xenith_edu.gradebook import grade
from xenith_edu.gradebook.course import CSV_FIELDS, TOTAL_FIELDS
from xenith_edu.gradebook.exports import csv_text, num
from xenith_edu.gradebook.stats import (
    FILES,
    NO_DIAGNOSIS,
    class_stats,
    figure_rows,
    first_sentence,
    item_rows,
    mistake_rows,
    report,
    write_stats,
)

FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
HOSTILE = ["=HYPERLINK(\"x\")", "<script>alert(1)</script>", "a|b", "[link](http://x)",
           "**bold**", "new\nline", "x`y`", "#", "\u00e9l\u00e8ve"]
MISTAKES = ["dW is off by a constant factor of 2.", "The 1/N is missing. It is in the mean.",
            "Did you forget the 1/N? The mean divides by N.", "x" * 200,
            "Transposed: dX = W dY. Not dY W^T.", "<b>html</b> mistake.", "a | pipe. Then",
            ""]
STATUSES = ["passed", "failed", "not attempted", "delegated", "missing", "notebook error"]
KINDS = ["class", "class", "class", "absent", "off", "shared"]


@st.composite
def classes(draw) -> dict:
    """A graded class as its two files hold it: {learner: kind}, rows, totals lines."""
    n_ex = draw(st.integers(1, 3))
    items = [(f"ex{i}", draw(st.sampled_from([0.5, 1.0, 2.0, 3.0]))) for i in range(n_ex)]
    if draw(st.booleans()):  # an exercise that a second notebook of the teacher checks too
        items.append((items[0][0], draw(st.sampled_from([0.5, 1.0]))))
    questions = [(f"q-{i}", draw(st.sampled_from([1.0, 2.0])))
                 for i in range(draw(st.integers(0, 2)))]
    names = draw(st.lists(st.sampled_from(HOSTILE) | st.text("abcdefgh", min_size=1,
                                                             max_size=5),
                          min_size=1, max_size=8, unique=True))
    kinds = {n: draw(st.sampled_from(KINDS)) for n in names}
    rows, lines = [], []
    maximum = sum(p for _, p in items + questions)
    for lid, kind in kinds.items():
        total = 0.0
        for ex, most in items:
            status = "not submitted" if kind == "absent" else draw(st.sampled_from(STATUSES))
            got = most if status == "passed" else 0.0
            mistake = draw(st.sampled_from(MISTAKES)) if status == "failed" else ""
            rows.append(_row(lid, ex, status, got, most, mistake))
            total += got
        for q, most in questions:
            status = "not submitted" if kind == "absent" else \
                draw(st.sampled_from(["to grade", "graded"]))
            got = draw(st.sampled_from([0.0, most / 2, most])) if status == "graded" else 0.0
            rows.append(_row(lid, q, status, got, most, ""))
            total += got
        if kind != "absent" and draw(st.booleans()):  # a notebook's error row: no exercise
            rows.append(_row(lid, "", "notebook error", None, None, ""))
        factor = draw(st.sampled_from([1.0, 1.0, 0.8]))  # a late learner's penalty
        submitted = {"class": "yes", "absent": "no", "off": "yes, not on the roster",
                     "shared": "yes, name shared with another submission"}[kind]
        lines.append({"learner": lid, "name": "", "email": "", "submitted": submitted,
                      "late": "", "total": num(total * factor), "maximum": num(maximum),
                      "percent": f"{100 * total * factor / maximum:.1f}"})
    if draw(st.booleans()):  # a collision: a row of the CSV, no learner of the totals
        rows.append(_row("dup", "", "name collision", None, None, ""))
    return {"kinds": kinds, "rows": rows, "lines": lines, "maximum": maximum}


def _row(lid, ex, status, got, most, mistake) -> dict:
    return {"learner": lid, "notebook": "", "exercise": ex, "status": status,
            "points": "" if got is None else num(got), "max_points": "" if most is None
            else num(most), "late": "", "message": f"[{status}] {ex}", "mistake": mistake}


def files(tmp: Path, cls: dict, rows: list | None = None, lines: list | None = None
          ) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "grades.totals.csv").write_text(csv_text(TOTAL_FIELDS, cls["lines"]
                                                    if lines is None else lines))
    (tmp / "grades.csv").write_text(csv_text(CSV_FIELDS, cls["rows"] if rows is None else rows))
    return tmp / "grades.csv"


def members(cls: dict) -> set[str]:
    return {lid for lid, k in cls["kinds"].items() if k in ("class", "shared")}


def everything(stats) -> tuple:
    """The class's figures, items and mistakes, in an order the rows' order does not set."""
    key = lambda r: sorted(r.items())  # noqa: E731
    return (stats.figures(), sorted(item_rows(stats), key=key),
            sorted(mistake_rows(stats), key=key))


@FUZZ
@given(cls=classes(), data=st.data())
def test_figures_are_the_class_alone_and_agree_with_another_route(tmp_path, cls, data):
    stats = class_stats(files(Path(tempfile.mkdtemp(dir=tmp_path)), cls))
    totals = [float(t["total"]) for t in cls["lines"] if t["learner"] in members(cls)]
    assert sorted(stats.totals) == sorted(members(cls))
    figs = stats.figures()
    assert figs["learners"] == len(totals)
    if len(totals) >= 2:
        q1, median, q3 = statistics.quantiles(totals, n=4, method="inclusive")
        assert figs["median"] == pytest.approx(statistics.median(totals), abs=1e-12)
        assert (figs["q1"], figs["q3"]) == pytest.approx((q1, q3), abs=1e-12)
        assert figs["mean"] == pytest.approx(statistics.fmean(totals), abs=1e-12)
        assert figs["min"] <= figs["q1"] <= figs["median"] <= figs["q3"] <= figs["max"]
    assert sorted(stats.absent) == sorted(k for k, v in cls["kinds"].items() if v == "absent")
    assert sorted(stats.off_roster) == sorted(k for k, v in cls["kinds"].items() if v == "off")


@FUZZ
@given(cls=classes(), data=st.data())
def test_mistakes_are_counted_once_per_learner_of_the_class(tmp_path, cls, data):
    stats = class_stats(files(Path(tempfile.mkdtemp(dir=tmp_path)), cls))
    want: dict[tuple[str, str], set] = {}
    for r in cls["rows"]:
        if r["status"] == "failed" and r["learner"] in members(cls):
            key = (r["exercise"], first_sentence(r["mistake"]) or NO_DIAGNOSIS)
            want.setdefault(key, set()).add(r["learner"])
    got = {(m["exercise"], m["mistake"]): m["learners"] for m in mistake_rows(stats)}
    assert got == {k: len(v) for k, v in want.items()}
    for _, mistake in got:  # a first sentence, never two; the CSV's own value is its key
        assert not re.search(r"\.\s", mistake) and first_sentence(mistake) == mistake
    for r in item_rows(stats):
        assert 0 <= r["passed"] <= r["learners"] == len(members(cls))
        if r["pass_rate"]:
            assert float(r["pass_rate"]) == pytest.approx(r["passed"] / r["learners"],
                                                          abs=5e-4)
        assert 0 <= float(r["mean_points"]) <= float(r["max_points"])


@FUZZ
@given(cls=classes(), data=st.data())
def test_learners_apart_and_the_rows_order_change_nothing_of_the_class(tmp_path, cls, data):
    tmp_path = Path(tempfile.mkdtemp(dir=tmp_path))  # one per example
    base = everything(class_stats(files(tmp_path / "a", cls)))
    shuffled = data.draw(st.permutations(cls["rows"]))
    assert everything(class_stats(files(tmp_path / "b", cls, shuffled,
                                        data.draw(st.permutations(cls["lines"]))))) == base
    resaved = Path(tempfile.mkdtemp(dir=tmp_path))  # as a spreadsheet saves it again
    for name in ("grades.csv", "grades.totals.csv"):
        rows = list(csv.reader(io.StringIO((tmp_path / "a" / name).read_text(), newline="")))
        buf = io.StringIO(newline="")
        csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\r\n").writerows(rows)
        (resaved / name).write_bytes(b"\xef\xbb\xbf" + buf.getvalue().encode())
    assert everything(class_stats(resaved / "grades.csv")) == base
    kind = data.draw(st.sampled_from(["absent", "off"]))
    extra = dict(cls["lines"][0], learner="zz-extra", total="0" if kind == "absent" else
                 cls["lines"][0]["maximum"], submitted="no" if kind == "absent" else
                 "yes, not on the roster")
    status = "not submitted" if kind == "absent" else "failed"
    more = [_row("zz-extra", r["exercise"], status, 0.0, float(r["max_points"]),
                 "A mistake nobody in the class made.") for r in cls["rows"]
            if r["exercise"] and r["learner"] == cls["lines"][0]["learner"]]  # a row per item
    apart = class_stats(files(tmp_path / "c", cls, cls["rows"] + more,
                              cls["lines"] + [extra]))
    assert everything(apart) == base


@FUZZ
@given(cls=classes(), data=st.data())
def test_the_report_keeps_every_learners_string_as_text(tmp_path, cls, data):
    md = report(class_stats(files(Path(tempfile.mkdtemp(dir=tmp_path)), cls)))
    assert "<script" not in md and "<b>" not in md
    assert not re.search(r"(?<!\\)\]\(http", md)  # no link: its bracket is escaped
    table = [ln for ln in md.splitlines() if ln.startswith("| ")]
    for line in table:  # a learner's pipe never makes a cell
        assert len(re.findall(r"(?<!\\)\|", line)) == 8, line


def test_the_files_are_written_with_a_histogram_even_for_an_empty_class(tmp_path):
    cls = {"rows": [_row("a", "ex", "not submitted", 0.0, 1.0, "")],
           "lines": [{"learner": "a", "name": "", "email": "", "submitted": "no", "late": "",
                      "total": "0", "maximum": "1", "percent": "0.0"}]}
    stats = write_stats(files(tmp_path, cls), tmp_path / "stats")
    assert stats.figures() == {"learners": 0}
    assert {r["figure"]: r["value"] for r in figure_rows(stats)} == \
        {"learners": 0, "maximum": "1", "absent": 1, "not_on_roster": 0}
    for name in FILES:
        assert (tmp_path / "stats" / name).stat().st_size > 0
    assert (tmp_path / "stats" / "totals.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "No learner of the class handed anything in" in \
        (tmp_path / "stats" / "stats.md").read_text()


# ----------------------------------------------------------------------------------------------
# Bad input: any file grade did not write is one line, through the API and the command line.


def _mutants(cls: dict, rng) -> list[tuple[str, bytes | str | None, bytes | None]]:
    """(what, grades bytes, totals bytes): hostile versions of a good pair of files."""
    g = csv_text(CSV_FIELDS, cls["rows"]).encode()
    t = csv_text(TOTAL_FIELDS, cls["lines"]).encode()
    graded = [r for r in cls["rows"] if r["exercise"]]
    cut = int(rng.integers(1, len(g)))
    bad_points = [dict(graded[0], points=v) for v in ("x", "nan", "-1", "inf", "1e999")]
    return [
        ("empty grades", b"", t), ("empty totals", g, b""),
        ("no such grades", None, t), ("no totals", g, None),
        ("cut", g[:cut] + b'"', t), ("bytes", bytes(rng.integers(0, 256, 300, dtype="u1")), t),
        ("nul", g.replace(b",", b"\0", 1), t), ("latin-1", g + "\u00e9".encode("latin-1"), t),
        ("no column", g.replace(b"max_points", b"most", 1), t),
        ("extra cell", g + b"a,b,c,d,e,f,g,h,i,j\n", t),
        *[(f"points {r['points']}", csv_text(CSV_FIELDS, [r]).encode(), t) for r in bad_points],
        ("points above", csv_text(CSV_FIELDS, [dict(graded[0], points="99")]).encode(), t),
        ("status?", csv_text(CSV_FIELDS, [dict(graded[0], status="passed ")]).encode(), t),
        ("unknown learner", csv_text(CSV_FIELDS, [dict(graded[0], learner="nobody-x")]
                                     ).encode(), t),
        ("twice", g, csv_text(TOTAL_FIELDS, cls["lines"] * 2).encode()),
        ("total above", g, csv_text(TOTAL_FIELDS, [dict(cls["lines"][0], total="999")]
                                    ).encode()),
        ("submitted?", g, csv_text(TOTAL_FIELDS, [dict(cls["lines"][0], submitted="maybe")]
                                   ).encode()),
        ("two maxima", g, csv_text(TOTAL_FIELDS, [cls["lines"][0], dict(
            cls["lines"][0], learner="other", maximum="1000")]).encode()),
        ("swapped", t, g), ("a folder", "folder", t)]


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(cls=classes(), seed=st.integers(0, 2**32 - 1))
def test_a_file_grade_did_not_write_is_one_line(tmp_path, cls, seed):
    import numpy as np

    for what, g, t in _mutants(cls, np.random.default_rng(seed)):
        folder = Path(tempfile.mkdtemp(dir=tmp_path))  # one per example and mutant
        for name, blob in (("grades.csv", g), ("grades.totals.csv", t)):
            if blob == "folder":
                (folder / name).mkdir()
            elif blob is not None:
                (folder / name).write_bytes(blob)
        try:
            write_stats(folder / "grades.csv", folder / "stats")
        except ValueError as exc:
            assert "\n" not in str(exc) and str(exc), what
            code, _, err = _cli("grade-stats", str(folder / "grades.csv"), "--out",
                                str(folder / "stats"))
            assert code == 1 and err.count("\n") == 1, (what, err)
            assert err.startswith("xenith-edu grade-stats: error: "), err
        else:  # only a mutant that leaves a well-formed class may pass
            assert what in ("cut", "extra cell") or what.startswith("points"), what


def test_the_command_line_says_what_it_wrote_and_refuses_a_file_as_out(tmp_path):
    cls = {"rows": [_row("a", "ex", "passed", 1.0, 1.0, "")],
           "lines": [{"learner": "a", "name": "", "email": "", "submitted": "yes", "late": "",
                      "total": "1", "maximum": "1", "percent": "100.0"}]}
    grades = files(tmp_path, cls)
    code, out, _ = _cli("grade-stats", str(grades), "--out", str(tmp_path / "s"))
    assert code == 0 and "1 learner(s) in the class, 0 absent" in out
    code, _, err = _cli("grade-stats", str(grades), "--out", str(grades))
    assert code == 1 and "is a file: give a folder" in err and err.count("\n") == 1


# ----------------------------------------------------------------------------------------------
# One class graded for real: the files grade writes are what the statistics read.

IMPORTS = "import numpy as np\nfrom xenith_edu.exercises import check_linear_backward"
RIGHT = "def my_linear_backward(dY, X, W):\n    return dY @ W.T, X.T @ dY\n"
TWICE = "def my_linear_backward(dY, X, W):\n    return dY @ W.T, 2 * X.T @ dY\n"
FLIPPED = "def my_linear_backward(dY, X, W):\n    return dY @ W.T, (X.T @ dY).T.T * -1\n"


def lesson(body: str):
    check = new_code_cell("_ = check_linear_backward(my_linear_backward)")
    check.metadata["nbgrader"] = {"points": 2, "grade": True, "grade_id": "lin"}
    written = new_markdown_cell("because")
    written.metadata["nbgrader"] = {"solution": True, "grade": True, "grade_id": "why",
                                    "points": 1}
    return new_notebook(cells=[new_code_cell(IMPORTS), new_code_cell(body), check,
                               new_markdown_cell("Why?"), written])


def test_a_graded_class_gives_its_statistics(tmp_path):
    inst, subs = tmp_path / "inst", tmp_path / "subs"
    for folder, name, body in ((inst, "lesson", RIGHT), (subs, "ann", RIGHT),
                               (subs, "ben", TWICE), (subs, "cy", TWICE),
                               (subs, "dee", FLIPPED), (subs, "zed", RIGHT)):
        folder.mkdir(exist_ok=True)
        nbformat.write(lesson(body), str(folder / f"{name}.ipynb"))
    roster = tmp_path / "roster.csv"
    roster.write_text("id\nann\nben\ncy\ndee\nabe\n")
    (tmp_path / "out").mkdir()
    grade(subs, tmp_path / "out" / "grades.csv", 30, instructor=inst, jobs=2, seed=1,
          call_time=5.0, roster=roster)
    code, out, err = _cli("grade-stats", str(tmp_path / "out" / "grades.csv"), "--out",
                          str(tmp_path / "stats"))
    assert code == 0, err
    stats = class_stats(tmp_path / "out" / "grades.csv")
    assert stats.totals == {"ann": 2.0, "ben": 0.0, "cy": 0.0, "dee": 0.0}
    assert stats.absent == ["abe"] and stats.off_roster == {"zed": 2.0}
    assert stats.figures()["mean"] == 0.5 and stats.figures()["median"] == 0.0
    lin = {r["item"]: r for r in item_rows(stats)}["linear_backward"]
    assert (lin["learners"], lin["passed"], lin["pass_rate"]) == (4, 1, "0.250")
    twice = [m for m in mistake_rows(stats) if m["learners"] == 2]
    assert len(twice) == 1 and "factor of 2" in twice[0]["mistake"], mistake_rows(stats)
    md = (tmp_path / "stats" / "stats.md").read_text()
    assert "- Absent (not submitted): 1: abe" in md and "zed (2)" in md
    assert "- **linear\\_backward**: 1 of 4 passed, 3 failed" in md
    assert "| why | written | 4 | 0 | 0 graded, 4 to grade | 0 | 1 |" in md
