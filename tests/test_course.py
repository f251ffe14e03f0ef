"""A course, not only a grader: points, totals, a roster with an absent learner and an unknown
submission, a late learner, written answers graded and merged, feedback pages, the Canvas and
Moodle files, and hostile strings that stay data.

One small class is graded once (the `course` fixture); the tests read its files. The readers
of the teacher's files (roster, timestamps, filled sheet) are fed bad input without grading.
"""

from __future__ import annotations

import csv
import os
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from xenith_edu.gradebook import grade
from xenith_edu.gradebook.inputs import safe_cell, unsafe_cell

IMPORTS = "import numpy as np\nfrom xenith_edu.exercises import check_linear_backward, " \
          "check_silu_grad"
LINEAR = "def my_linear_backward(dY, X, W):\n    return dY @ W.T, X.T @ dY\n"
WRONG = "def my_linear_backward(dY, X, W):\n    return dY @ W.T, 2 * X.T @ dY\n"
SILU = ("def my_silu_grad(z):\n    s = 0.5 * (1 + np.tanh(0.5 * z))\n"
        "    return s * (1 + z * (1 - s))\n")
DUE = datetime(2026, 11, 20, 23, 59, tzinfo=timezone.utc)
HOSTILE = '=HYPERLINK("evil.example","click")'


def lesson(linear: str = LINEAR, answer: str = "YOUR ANSWER HERE", slow: bool = False):
    """The lesson: two exercises (3 and 1 points), one written question worth 2."""
    check = new_code_cell("_ = check_linear_backward(my_linear_backward)")
    check.metadata["nbgrader"] = {"points": 3, "grade": True, "grade_id": "lin-check"}
    written = new_markdown_cell(answer)
    written.metadata["nbgrader"] = {"solution": True, "grade": True, "grade_id": "why-transpose",
                                    "points": 2}
    cells = [new_code_cell(IMPORTS), new_code_cell(linear), check,
             new_markdown_cell("Explain in two lines why dX uses W transposed."), written,
             new_code_cell(SILU), new_code_cell("_ = check_silu_grad(my_silu_grad)")]
    if slow:  # a long cell the teacher tagged: grading skips it
        skipped = new_code_cell("import time\ntime.sleep(60)\nraise RuntimeError('ran')")
        skipped.metadata["tags"] = ["skip-grading"]
        cells.insert(1, skipped)
    return new_notebook(cells=cells)


def write(nb, path: Path, when: datetime | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    if when is not None:
        os.utime(path, (when.timestamp(), when.timestamp()))
    return path


def table(path: Path) -> list[dict]:
    """The rows of a CSV the grader wrote, as the grader meant them (neutralising undone)."""
    with path.open(newline="", encoding="utf-8") as f:
        return [{k: unsafe_cell(v) for k, v in r.items()} for r in csv.DictReader(f)]


def the_class(root: Path) -> dict:
    inst, subs = root / "inst", root / "subs"
    write(lesson(), inst / "lesson.ipynb")
    early = DUE - timedelta(hours=1)
    write(lesson(answer="Because dY = dX W, so dX = dY W^T."), subs / "alice.ipynb", early)
    write(lesson(WRONG, answer="<script>alert(1)</script> no idea"), subs / "bob.ipynb", early)
    write(lesson(slow=True), subs / "dan.ipynb", DUE + timedelta(days=1, hours=2))  # 2 days
    write(lesson(), subs / f"{HOSTILE}.ipynb", early)  # on no roster
    roster = root / "roster.csv"
    roster.write_text("id,name,email,section\nalice,Alice A,alice@uni.edu,S1\n"
                      "bob,Bob <b>B</b>,bob@uni.edu,S1\ncarol,Carol C,carol@uni.edu,S2\n"
                      "dan,Dan D,dan@uni.edu,S2\n", encoding="utf-8")
    return {"inst": inst, "subs": subs, "roster": roster, "csv": root / "out" / "grades.csv"}


MTIME_LATE = "late by 2 days, by the file's modification time"


def run(paths: dict, **more) -> list[dict]:
    paths["csv"].parent.mkdir(exist_ok=True)
    if "timestamps" not in more:  # the files' times, as the teacher asks for them
        more["late_from_mtime"] = True
    return grade(paths["subs"], paths["csv"], 20, instructor=paths["inst"], jobs=2, seed=3,
                 call_time=5.0, roster=paths["roster"], deadline=DUE.isoformat(),
                 late_penalty=0.1, export=("canvas", "moodle"),
                 feedback=paths["csv"].parent / "feedback", **more)


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    paths = the_class(root)
    rows = run(paths)
    out = paths["csv"].parent
    return {**paths, "rows": rows, "root": root, "out": out,
            "totals": {t["learner"]: t for t in table(out / "grades.totals.csv")}}


def rows_of(course, learner: str) -> dict[str, dict]:
    return {r["exercise"]: r for r in course["rows"] if r["learner"] == learner}


def test_points_come_from_the_nbgrader_metadata_and_default_to_one(course):
    alice = rows_of(course, "alice")
    assert (alice["linear_backward"]["points"], alice["linear_backward"]["max_points"]) == \
        ("3", "3")
    assert (alice["silu_grad"]["points"], alice["silu_grad"]["max_points"]) == ("1", "1")
    bob = rows_of(course, "bob")
    assert bob["linear_backward"]["status"] == "failed" and bob["linear_backward"]["points"] == "0"
    assert table(course["csv"]) == course["rows"]
    assert list(course["rows"][0]) == ["learner", "notebook", "exercise", "status", "points",
                                       "max_points", "late", "message", "mistake"]


def test_totals_have_a_line_per_learner_with_a_subtotal_per_chapter(course):
    t = course["totals"]
    assert (t["alice"]["total"], t["alice"]["maximum"], t["alice"]["percent"]) == \
        ("4", "6", "66.7")  # the written answer is not graded yet
    assert t["alice"]["lesson"] == "4" and t["bob"]["total"] == "1"
    assert list(t["alice"])[:8] == ["learner", "name", "email", "submitted", "late", "total",
                                    "maximum", "percent"]


def test_an_absent_learner_of_the_roster_gets_not_submitted_rows_and_zero(course):
    carol = rows_of(course, "carol")
    assert {r["status"] for r in carol.values()} == {"not submitted"}
    assert set(carol) == {"linear_backward", "silu_grad", "why-transpose"}
    assert course["totals"]["carol"]["total"] == "0"
    assert course["totals"]["carol"]["submitted"] == "no"


def test_a_submission_on_no_roster_is_graded_and_reported(course):
    t = course["totals"][HOSTILE]
    assert t["submitted"] == "yes, not on the roster" and t["total"] == "4"
    report = (course["out"] / "grades.md").read_text()
    assert "Not on the roster" in report
    assert "HYPERLINK" in report and "[" not in report.split("Not on the roster")[1].split(
        "HYPERLINK")[0].replace("\\[", "")


def test_late_work_is_marked_and_loses_its_penalty_per_day(course):
    dan = rows_of(course, "dan")
    assert {r["late"] for r in dan.values()} == {MTIME_LATE}
    assert dan["linear_backward"]["status"] == "passed"  # the tagged sleep was skipped
    assert "ran" not in " ".join(r["message"] for r in dan.values())
    t = course["totals"]["dan"]
    assert t["late"] == MTIME_LATE and t["total"] == "3.2"  # 4 points, less 20%
    assert all(r["late"] == "" for r in rows_of(course, "alice").values())
    assert "late by 2 days" in (course["out"] / "feedback" / "dan.html").read_text()


def test_canvas_and_moodle_files_have_their_documented_headers(course):
    with (course["out"] / "grades.canvas.csv").open(newline="") as f:
        canvas = list(csv.reader(f))
    assert canvas[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "lesson"]
    assert canvas[1][0] == "Points Possible" and canvas[1][5] == "6"
    assert ["Alice A", "", "alice", "", "S1", "4"] in canvas  # one identifier: SIS User ID
    with (course["out"] / "grades.moodle.csv").open(newline="") as f:
        moodle = list(csv.reader(f))
    assert moodle[0] == ["Email address", "lesson"]  # the roster gives every e-mail
    assert ["alice@uni.edu", "4"] in moodle and ["carol@uni.edu", "0"] in moodle
    assert len(canvas) == 2 + 4 and len(moodle) == 1 + 4  # the roster's, not the unknown one


def test_feedback_is_one_self_contained_page_per_learner_with_strings_escaped(course):
    pages = sorted(p.name for p in (course["out"] / "feedback").iterdir())
    assert len(pages) == 5 and "alice.html" in pages and "carol.html" in pages
    for name in pages:
        text = (course["out"] / "feedback" / name).read_text()
        assert "default-src 'none'" in text
        assert not re.search(r"(src|href)\s*=|<script|<img|<link|url\(", text, re.I), name
    bob = (course["out"] / "feedback" / "bob.html").read_text()
    assert "Bob &lt;b&gt;B&lt;/b&gt;" in bob and "dW is wrong" in bob


def test_written_answers_are_gathered_graded_and_merged_without_losing_anything(course):
    sheet = course["out"] / "grades.written.csv"
    key = {r["sheet_id"]: r["learner"] for r in table(course["out"] / "grades.written.key.csv")}
    lines = table(sheet)
    assert "learner" not in lines[0]  # the sheet is anonymous: its key is a file apart
    by = {key[r["sheet_id"]]: r for r in lines}
    assert set(by) == {"alice", "bob", "dan", HOSTILE}
    assert by["alice"]["answer"].startswith("Because dY") and by["alice"]["max_points"] == "2"
    assert by["alice"]["prompt"].startswith("Explain in two lines")
    assert (by["alice"]["untouched"], by["bob"]["untouched"], by["dan"]["untouched"]) == \
        ("", "", "yes")  # dan handed the answer cell back as it was
    by["alice"]["points"], by["alice"]["comment"] = "1.5", "=right, but say why W^T"
    by["bob"]["comment"] = "see me"  # commented, not yet graded
    with sheet.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(lines[0]))
        w.writeheader()
        w.writerows(by.values())
    filled = course["root"] / "filled.csv"
    filled.write_bytes(sheet.read_bytes())
    rows = run(course, written=filled, resume=True)  # every learner kept from the journal
    alice = {r["exercise"]: r for r in rows if r["learner"] == "alice"}
    assert alice["why-transpose"]["status"] == "graded" and alice["why-transpose"]["points"] == \
        "1.5" and alice["why-transpose"]["message"] == "=right, but say why W^T"
    assert table(course["out"] / "grades.totals.csv")[0]["total"] == "5.5"
    page = (course["out"] / "feedback" / "alice.html").read_text()
    assert "=right, but say why W^T" in page
    raw = sheet.read_text()
    assert "'=right, but say why W^T" in raw  # neutralised in the CSV
    run(course, resume=True)  # again, without --written: the sheet keeps what was filled
    again = {key[r["sheet_id"]]: r for r in table(sheet)}  # the same sheet ids
    assert again["alice"]["points"] == "1.5" and again["bob"]["comment"] == "see me"
    assert table(course["out"] / "grades.totals.csv")[0]["total"] == "5.5"


def test_every_csv_cell_that_a_spreadsheet_would_run_is_neutralised(course):
    for name in ("grades.csv", "grades.totals.csv", "grades.canvas.csv", "grades.moodle.csv",
                 "grades.written.csv"):
        with (course["out"] / name).open(newline="") as f:
            for row in csv.reader(f):
                assert not any(c.startswith(("=", "+", "-", "@", "\t", "\r")) for c in row), name
    with (course["out"] / "grades.csv").open(newline="") as f:
        assert "'" + HOSTILE in {row[0] for row in csv.reader(f)}
    for text in ("=1+1", "+1", "-1", "@SUM(A1)", "\tx", "\rx"):
        assert safe_cell(text) == "'" + text and unsafe_cell(safe_cell(text)) == text
    assert safe_cell("alice") == "alice" and unsafe_cell("'quoted") == "'quoted"
    for text in ("'=x", "''", "'", "'quoted", "a'=b", ""):  # a quote of the learner's own
        assert unsafe_cell(safe_cell(text)) == text


def test_an_lms_timestamps_file_and_a_cut_off_decide_lateness(course):
    stamps = course["root"] / "timestamps.csv"
    stamps.write_text("id,submitted\nalice,2026-11-21T00:30+00:00\n"
                      f"dan,{(DUE - timedelta(minutes=5)).isoformat()}\ncarol,\n")
    rows = run(course, timestamps=stamps, resume=True,
               late_cutoff=(DUE + timedelta(hours=12)).isoformat())
    late = {r["learner"]: r["late"] for r in rows}
    assert late["alice"] == "late by 1 day, by the LMS's timestamps" and late["dan"] == ""
    assert late["bob"] == ""  # not in the file: reported, not judged by the file's time
    report = (course["out"] / "grades.md").read_text()
    assert "no time in the timestamps file" in report and "**bob**" in report
    assert "Lateness judged by the LMS's timestamps" in report
    t = {line["learner"]: line for line in table(course["out"] / "grades.totals.csv")}
    assert t["alice"]["total"] == "4.95" and t["dan"]["total"] == "4"  # (4 + 1.5) x 0.9
    stamps.write_text(f"id,submitted\nalice,{(DUE + timedelta(days=1)).isoformat()}\n")
    run(course, timestamps=stamps, resume=True,
        late_cutoff=(DUE + timedelta(hours=12)).isoformat())
    t = {line["learner"]: line for line in table(course["out"] / "grades.totals.csv")}
    assert t["alice"]["total"] == "0" and t["alice"]["late"] == \
        "late by 1 day, after the cut-off, by the LMS's timestamps"


def test_bad_points_in_the_teacher_s_notebook_are_one_line(tmp_path):
    nb = lesson()
    nb.cells[2].metadata["nbgrader"]["points"] = "three"
    write(nb, tmp_path / "inst" / "lesson.ipynb")
    write(lesson(), tmp_path / "subs" / "a.ipynb")
    with pytest.raises(ValueError, match=r"lesson.ipynb, cell 3: metadata.nbgrader.points is "
                                         r"'three': give a number"):
        grade(tmp_path / "subs", tmp_path / "g.csv", instructor=tmp_path / "inst")
    assert not (tmp_path / "g.csv").exists()
