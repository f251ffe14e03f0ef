"""The scripted course (benchmarks/course_40.py) on 6 learners, with the real sandbox: graded,
one learner graded again after a fix (the others' rows byte for byte), an override and an
extension applied at the next run, the statistics, both LMS files and a Gradescope run; every
file checked, every total the points earned minus the deduction.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import course_40  # noqa: E402

LEARNERS = 6
VERDICTS = {"right": ("passed", "passed"), "no 1/N": ("failed", "passed"),
            "smoothing sign": ("passed", "failed"), "not attempted": ("not attempted", "passed")}


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    c = course_40.make_course(tmp_path_factory.mktemp("course40"), LEARNERS)
    c["seconds"] = course_40.run_course(c, jobs=2)
    return c


def _rows(text: str) -> dict[str, list[list[str]]]:
    """Each learner's rows of a CSV the grader wrote, every cell as written."""
    out: dict[str, list[list[str]]] = {}
    for row in list(csv.reader(io.StringIO(text, newline="")))[1:]:
        out.setdefault(row[0], []).append(row)
    return out


def _table(path: Path) -> list[dict]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_each_kind_of_answer_gets_its_verdict(course):
    first = csv.DictReader(io.StringIO(course["after"]["grade"], newline=""))
    got: dict[str, dict[str, str]] = {}
    for r in first:
        got.setdefault(r["learner"], {})[r["exercise"]] = r["status"]
    for name, kind in course["kinds"].items():
        assert (got[name]["softmax_cross_entropy"], got[name]["label_smoothing"]) == \
            VERDICTS[kind], name


def test_a_regrade_grades_the_named_learner_and_keeps_every_other_row(course):
    before, after = _rows(course["after"]["grade"]), _rows(course["after"]["regrade"])
    fixed = course["fixed"]
    assert all(r[3] == "passed" for r in after[fixed]) and after[fixed] != before[fixed]
    assert {n: v for n, v in after.items() if n != fixed} == \
        {n: v for n, v in before.items() if n != fixed}
    assert f"1 named learner(s) graded again; {LEARNERS - 1} kept" in course["said"]["regrade"]
    assert f"no check changed; {LEARNERS} kept" in course["said"]["adjust"]


def test_the_override_and_the_extension_apply_at_the_next_run(course):
    out = course["root"] / "out"
    who, late = course["overridden"], course["extended"]
    rows = {(r["learner"], r["exercise"]): r for r in _table(out / "grades.csv")}
    mine = rows[(who, "label_smoothing")]
    assert (mine["status"], mine["points"]) == ("failed", "0.5")
    assert mine["message"].startswith("[override] sign slip only; the check said failed")
    totals = {t["learner"]: t for t in _table(out / "grades.totals.csv")}
    assert totals[who]["overrides"] == "label_smoothing: 0.5"
    assert totals[late]["extended deadline"] == "2026-12-03T12:00+00:00"
    assert totals[late]["late"] == "" and totals[late]["deduction"] == "0"
    assert totals["learner02"]["extended deadline"].startswith("2026-12-03T12:00")  # roster's
    before = {t["learner"]: t for t in csv.DictReader(
        io.StringIO(course["after"]["grade"], newline=""))}  # the first run: late marks
    assert before[late]["late"].startswith("late by 1 day")
    for t in totals.values():  # every late learner of the six now has an extension
        assert t["deduction"] == "0" and t["late"] == ""
    canvas = _table(out / "grades.canvas.csv")
    moodle = _table(out / "grades.moodle.csv")
    assert [r["Notes"] for r in canvas if r["SIS User ID"] == who] == \
        ["override: label_smoothing: 0.5"]
    assert [r["Feedback"] for r in moodle if r["Email address"].startswith(who)] == \
        ["override: label_smoothing: 0.5"]
    page = (out / "feedback" / f"{who}.html").read_text(encoding="utf-8")
    assert "Points set by your teacher (override): label_smoothing: 0.5" in page
    assert "extended to 2026-12-03T12:00" in (out / "feedback" / f"{late}.html").read_text()


def test_the_first_run_itemized_the_late_deduction_under_the_possible_rule(course):
    first = {}
    for r in csv.DictReader(io.StringIO(course["after"]["grade"], newline="")):
        first.setdefault(r["learner"], []).append(r)
    late = course["extended"]
    assert all(r["late"].startswith("late by 1 day, by the LMS's timestamps")
               for r in first[late])
    assert all(r["late"] == "" for r in first["learner02"])  # the roster's extension
    totals = {t["learner"]: t for t in csv.DictReader(course["totals"]["grade"].splitlines())}
    for name, t in totals.items():  # earned - deduction; 10% of the 2 points possible a day
        earned = sum(float(r["points"]) for r in first[name])
        cut = min(earned, 0.2) if name == late else 0.0
        assert float(t["deduction"]) == pytest.approx(cut)
        assert float(t["total"]) == pytest.approx(earned - cut) == float(t["softmax_ce"])


def test_statistics_exports_and_gradescope_were_made(course):
    root = course["root"]
    for name in ("stats.md", "stats.csv", "mistakes.csv"):
        assert (root / "stats" / name).is_file(), name
    for name in ("grades.canvas.csv", "grades.moodle.csv", "grades.totals.csv"):
        assert len(_table(root / "out" / name)) >= LEARNERS, name
    results = json.loads(course["gradescope"])
    assert results["score"] == 2.0  # the fixed learner's notebook, graded as Gradescope runs it
    assert set(course["seconds"]) >= {"grade", "regrade", "statistics", "Gradescope archive"}


def test_after_a_fixed_check_resume_regrades_its_rows_alone_in_the_real_sandbox(course,
                                                                                 monkeypatch):
    """Last (it grades the course again): one check's digest changed, `--resume` asks each
    learner's sandbox for that exercise alone, and the merged rows are the whole run's, byte
    for byte (the same notebooks, the same cases)."""
    from xenith_edu.gradebook import grading, regrade

    r = course["root"]
    before = (r / "out" / "grades.csv").read_text(encoding="utf-8")
    asked, real, digest = [], grading.grade_learner, regrade.check_digest

    def recorded(learner, source, teacher, *rest):
        asked.append((learner, [ex.id for _, exs in teacher for ex in exs]))
        return real(learner, source, teacher, *rest)

    monkeypatch.setattr(grading, "grade_learner", recorded)
    monkeypatch.setattr(regrade, "check_digest", lambda spec, seed: digest(spec, seed) + (
        "fixed" if spec.id == "label_smoothing" else ""))
    code, said = course_40.command(
        "grade", str(course["subs"]), "--out", str(course["csv"]), "--resume",
        *course_40.course_args(course), "--overrides", str(r / "overrides.csv"),
        "--extensions", str(r / "extensions.csv"))
    assert code == 0, said
    assert sorted(asked) == [(n, ["label_smoothing"]) for n in sorted(course["kinds"])]
    assert f"{LEARNERS} learner(s) re-graded for the check(s) that changed since the journal " \
        "(softmax_ce.ipynb/label_smoothing); 0 kept" in said
    assert (r / "out" / "grades.csv").read_text(encoding="utf-8") == before
