"""The teacher's files are foreign input, and the learners' strings are data.

A roster, timestamps file or filled sheet that is malformed, has duplicate ids or names unknown
questions stops the grader with one line naming the file, the row and what to do, before
anything is written. Learner names and messages made of Markdown, HTML and formulas reach the
report, the feedback and the CSV as text; two submissions of one name are kept apart.
"""

from __future__ import annotations

import csv
import random

import pytest
from nbformat.v4 import new_code_cell
from test_course import DUE, lesson, the_class, write

from xenith_edu import cli
from xenith_edu.gradebook import grade
from xenith_edu.gradebook.inputs import read_filled, read_roster, read_timestamps

FORGED = "# Forged <img src=x onerror=alert(1)>"
BAD = {  # file -> (content, the expected words of its one line)
    "roster": [
        ("name,email\nalice,a@x\n", "roster.csv, row 1: no column 'id'"),
        ("id,name\nalice,A\nbob,B\nalice,A2\n", "roster.csv, row 4: the id 'alice' appears twice"),
        ("id,name\n,Nobody\n", "roster.csv, row 2: the id is empty"),
        ("id,id\nalice,alice\n", "roster.csv, row 1: a column is named twice"),
        ("id\n\"alice\n", "roster.csv, row"),
        (b"id\nal\xffice\n", "roster.csv: not UTF-8"),
        ("id\nalice,extra,cells\n", "roster.csv, row 2: 3 cells under a header of 1"),
        ("id\nal\0ice\n", "roster.csv, row"),
    ],
    "timestamps": [
        ("id,submitted\nalice,yesterday\n", "timestamps.csv, row 2: 'yesterday' is not an ISO"),
        ("id,submitted\nalice,2026-11-20T10:00\nalice,2026-11-20T11:00\n",
         "timestamps.csv, row 3: the id 'alice' appears twice"),
        ("id,submitted\nzed,2026-11-20T10:00\n", "timestamps.csv, row 2: 'zed' is neither"),
        ("id,when\nalice,2026-11-20T10:00\n", "timestamps.csv, row 1: no column 'submitted'"),
    ],
    "written": [
        ("learner,question,points,comment\nalice,nope,1,\n",
         "filled.csv, row 2: no written question 'nope'"),
        ("learner,question,points,comment\nalice,why-transpose,3,\n",
         "filled.csv, row 2: points '3': write a number from 0 to 2"),
        ("learner,question,points,comment\nalice,why-transpose,lots,\n",
         "filled.csv, row 2: points 'lots'"),
        ("learner,question,points,comment\nalice,why-transpose,1,\nalice,why-transpose,2,\n",
         "filled.csv, row 3: alice's why-transpose appears twice"),
        ("learner,question,points,comment\nzed,why-transpose,1,\n",
         "filled.csv, row 2: no learner 'zed'"),
        ("learner,question,comment\nalice,why-transpose,ok\n", "filled.csv, row 1: no column"),
        ("learner,question,points,comment\nalice,why-transpose,-1,\n", "points '-1'"),
        ("learner,question,points,comment\nalice,why-transpose,nan,\n", "points 'nan'"),
    ],
}
NAMES = {"roster": "roster.csv", "timestamps": "timestamps.csv", "written": "filled.csv"}


@pytest.fixture(scope="module")
def klass(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    return {**the_class(root), "root": root}


@pytest.mark.parametrize("option,case", [(o, i) for o, cases in BAD.items()
                                         for i in range(len(cases))])
def test_a_bad_course_file_is_one_line_and_nothing_is_written(klass, option, case, capsys):
    content, expected = BAD[option][case]
    bad = klass["root"] / "bad" / NAMES[option]
    bad.parent.mkdir(exist_ok=True)
    bad.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = klass["root"] / f"out-{option}-{case}"
    out.mkdir()
    given = {"roster": klass["roster"], option: bad}
    with pytest.raises(ValueError) as err:
        grade(klass["subs"], out / "grades.csv", instructor=klass["inst"], **given)
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert list(out.iterdir()) == []  # nothing written, not even a journal
    argv = ["grade", str(klass["subs"]), "--out", str(out / "grades.csv"), "--instructor",
            str(klass["inst"]), "--roster", str(given["roster"]), f"--{option}", str(bad)]
    assert cli.main(argv) == 1
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1 and expected in err_lines[0]
    assert list(out.iterdir()) == []


def test_the_late_options_are_checked(klass):
    out = klass["root"] / "late"
    out.mkdir()
    for given, words in (({"deadline": "friday"}, "deadline: 'friday' is not an ISO 8601"),
                         ({"late_penalty": 0.1}, "need a deadline"),
                         ({"deadline": DUE.isoformat(), "late_penalty": 2}, "from 0 to 1"),
                         ({"deadline": DUE.isoformat(), "late_cutoff": "2020-01-01T00:00"},
                          "before the deadline"),
                         ({"export": ("blackboard",)}, "not one of canvas, canvas:id")):
        with pytest.raises(ValueError, match=words):
            grade(klass["subs"], out / "grades.csv", instructor=klass["inst"], **given)
    assert list(out.iterdir()) == []


def test_the_readers_survive_random_bytes(tmp_path):
    rng = random.Random(0)
    path = tmp_path / "fuzz.csv"
    alphabet = b"id,submitted,learner,question,points,comment\n\r\"'=;\0\xff 0123.-T:"
    for _ in range(300):
        path.write_bytes(bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 120))))
        for read in (lambda: read_roster(path), lambda: read_timestamps(path, {"a"}),
                     lambda: read_filled(path, {"q": 1.0}, {"a"})):
            try:
                read()
            except ValueError as exc:
                assert "\n" not in str(exc) and str(exc).startswith("fuzz.csv")


def test_markup_and_formulas_from_learners_stay_text(tmp_path):
    inst, subs = tmp_path / "inst", tmp_path / "subs"
    write(lesson(), inst / "lesson.ipynb")
    hostile = lesson()
    hostile.cells.insert(1, new_code_cell(f"raise ValueError({FORGED + chr(10) + '# Again'!r})"))
    write(hostile, subs / f"{FORGED}.ipynb")
    write(lesson(), subs / "dup.ipynb")  # and a folder of the same name
    write(lesson(), subs / "dup" / "lesson.ipynb")
    out = tmp_path / "grades.csv"
    rows = grade(subs, out, 20, instructor=inst, jobs=2, seed=1, feedback=tmp_path / "fb")
    # not merged: graded apart, and a row of the shared name says so
    assert {r["learner"] for r in rows} == {FORGED, "dup.ipynb", "dup/", "dup"}
    assert [r["status"] for r in rows if r["learner"] == "dup"] == ["name collision"]
    report = out.with_name("grades.md").read_text()
    assert "<img" not in report and "&lt;img src=x onerror=alert(1)&gt;" in report
    assert not [ln for ln in report.splitlines() if ln.startswith("# ") and "Forged" in ln]
    assert "\\# Forged" in report
    assert "Names shared by several submissions" in report and "dup/" in report
    pages = list((tmp_path / "fb").iterdir())
    assert len(pages) == 3 and all("<img" not in p.read_text() for p in pages)
    assert all(p.name.endswith(".html") and "<" not in p.name for p in pages)
    with out.with_name("grades.totals.csv").open(newline="") as f:
        totals = {r["learner"]: r for r in csv.DictReader(f)}
    assert totals["dup.ipynb"]["total"] == totals["dup/"]["total"] == "4"
    assert "name shared" in totals["dup/"]["submitted"]


def test_a_learner_notebook_read_by_the_grader_is_bounded_and_never_followed(tmp_path):
    from xenith_edu.gradebook.points import Question, answers, blank_skipped

    q = (Question("q1", 1.0, ""),)
    secret = tmp_path / "teacher.ipynb"
    write(lesson(slow=True), secret)
    before = secret.read_bytes()
    link = tmp_path / "link.ipynb"
    link.symlink_to(secret)
    assert blank_skipped(link) == 0 and answers(link, q) == {}
    assert secret.read_bytes() == before  # the link was not followed
    for junk in (b"", b"{ not json", b"[" * 100_000 + b"]" * 100_000, b'{"cells": 3}',
                 b'{"cells": [1, "x", {"cell_type": "code", "metadata": 7}]}',
                 b'{"cells": [{"cell_type": "code", "metadata": {"tags": "skip-grading"}}]}',
                 b'{"cells": [{"cell_type": "markdown", "id": "q1", "source": 5}]}'):
        path = tmp_path / "junk.ipynb"
        path.write_bytes(junk)
        assert blank_skipped(path) in (0,) and isinstance(answers(path, q), dict)
    copy = tmp_path / "copy.ipynb"
    write(lesson(slow=True), copy)
    assert blank_skipped(copy) == 1
    assert "time.sleep" not in copy.read_text() and "time.sleep" in secret.read_text()


def test_the_book_tags_its_long_training_cells_and_no_exercise(tmp_path):
    import json

    from xenith_edu.gradebook.points import SKIP_TAG
    from xenith_edu.grader.roster import PACKAGE_ROOT

    for name in ("training", "parallel"):
        cells = json.loads((PACKAGE_ROOT / "notebooks" / f"{name}.ipynb").read_text())["cells"]
        tagged = [c for c in cells if SKIP_TAG in c.get("metadata", {}).get("tags", [])]
        assert tagged, name
        for c in tagged:
            source = "".join(c["source"])
            assert "check_" not in source and "def my_" not in source, source[:80]
