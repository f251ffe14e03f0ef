"""The course's adjustments, on generated classes without grading: a total is the points earned
minus the late deduction under either late rule; an extension judges a learner as a moved
deadline would; an override always wins and is marked in the rows, the totals, the LMS files
and the feedback; the teacher's files naming an unknown learner or exercise are refused.
"""

from __future__ import annotations

import csv
import math
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xenith_edu.gradebook import course, inputs, late
from xenith_edu.gradebook.inputs import LatePolicy, Person
from xenith_edu.gradebook.overrides import MARK, Override, read_overrides
from xenith_edu.gradebook.points import Part, Question
from xenith_edu.grader.statuses import Row

DUE = datetime(2026, 11, 20, 23, 59, tzinfo=timezone.utc)
ROUND = 1.5e-4  # the files show points rounded to 4 decimals (exports.num): three roundings


@st.composite
def classes(draw) -> dict:
    """A class: chapters of exercises with random points, learners with random verdicts and
    submission times, a late policy under a random rule, random extensions and overrides."""
    parts = []
    for c in range(draw(st.integers(1, 3))):
        points = {f"ex{c}_{i}": draw(st.sampled_from([0.5, 1.0, 2.0, 3.0, 7.25]))
                  for i in range(draw(st.integers(1, 3)))}
        parts.append(Part(f"ch{c}.ipynb", points, (Question(f"q{c}", 2.0, "why?"),)))
    ids = [f"l{i}" for i in range(draw(st.integers(1, 6)))]
    entries = [course.Entry(lid, f"{lid}.ipynb", i) for i, lid in enumerate(ids)]
    base = {e.key: [(e.learner, e.key, ex, draw(st.sampled_from([Row.PASSED, Row.FAILED])),
                     "msg", "") for p in parts for ex in p.points] for e in entries}
    cutoff = draw(st.none() | st.integers(1, 6))
    pol = course.Policy(
        roster=None, late=LatePolicy(DUE, draw(st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0])),
                                     None if cutoff is None else DUE + timedelta(days=cutoff)),
        times={lid: DUE + timedelta(hours=draw(st.integers(-30, 200))) for lid in ids},
        source=course.FROM_TIMESTAMPS, rule=draw(st.sampled_from(late.RULES)))
    pol.filled = {(lid, q.id): (draw(st.sampled_from([0.0, 1.0, 2.0])), "ok")
                  for lid in ids for p in parts for q in p.questions if draw(st.booleans())}
    pol.extensions = {lid: DUE + timedelta(days=draw(st.integers(0, 4)))
                      for lid in ids if draw(st.booleans())}
    items = {**{ex: pts for p in parts for ex, pts in p.points.items()},
             **{q.id: q.points for p in parts for q in p.questions}}
    pol.overrides = {(lid, item): Override(draw(st.sampled_from([0.0, items[item] / 2,
                                                                 items[item]])), "regraded")
                     for lid in ids for item in items if draw(st.integers(0, 5)) == 0}
    return {"parts": parts, "entries": entries, "base": base, "pol": pol, "items": items}


def _run(c: dict) -> tuple[list, list[dict], list[dict]]:
    people = course.learners(c["entries"], None)
    rows = course.class_rows(people, c["base"], c["parts"], c["pol"])
    return people, rows, course.totals(people, rows, c["parts"], c["pol"])


def _fraction(pol: course.Policy, lid: str) -> float:
    """The fraction lost, computed here from the learner's own deadline and cut-off."""
    due = pol.extensions.get(lid, DUE)
    when = pol.times[lid]
    if when <= due:
        return 0.0
    cutoff = pol.late.cutoff
    if cutoff is not None and when > cutoff + (due - DUE):
        return 1.0
    return min(1.0, pol.late.penalty * math.ceil((when - due).total_seconds() / 86400))


@settings(max_examples=150, deadline=None)
@given(classes())
def test_a_total_is_the_points_earned_minus_the_deduction_under_both_rules(c):
    people, rows, lines = _run(c)
    pol = c["pol"]
    for p, line in zip(people, lines, strict=True):
        mine = [r for r in rows if r["learner"] == p.id]
        earned = {part.chapter: sum(float(r["points"]) for r in mine
                                    if r["exercise"] in part.points or
                                    r["exercise"] in {q.id for q in part.questions})
                  for part in c["parts"]}
        frac = _fraction(pol, p.id)
        possible = {part.chapter: sum(part.points.values()) + 2.0 for part in c["parts"]}
        cut = {ch: (min(e, frac * possible[ch]) if pol.rule == "possible" else e * frac)
               for ch, e in earned.items()}
        assert abs(float(line["earned"]) - sum(earned.values())) < ROUND
        assert abs(float(line["deduction"]) - sum(cut.values())) < ROUND
        assert abs(float(line["total"]) - (float(line["earned"]) - float(line["deduction"]))) \
            < 2 * ROUND
        assert 0 <= float(line["deduction"]) <= float(line["earned"]) + ROUND
        for ch in earned:  # each chapter (an LMS assignment) is its earned minus its deduction
            assert abs(float(line[ch]) - (earned[ch] - cut[ch])) < ROUND
        assert bool(line["late"]) == (pol.times[p.id] > pol.extensions.get(p.id, DUE))


@settings(max_examples=150, deadline=None)
@given(classes())
def test_an_override_always_wins_and_is_marked(c):
    people, rows, lines = _run(c)
    pol = c["pol"]
    seen = set()
    for r in rows:
        o = pol.overrides.get((r["learner"], r["exercise"]))
        if o is None:
            assert not r["message"].startswith(MARK)
            continue
        seen.add((r["learner"], r["exercise"]))
        assert float(r["points"]) == pytest.approx(o.points, abs=ROUND)
        assert r["message"].startswith(MARK) and "regraded" in r["message"]
    assert seen == set(pol.overrides)  # every override has its row, and only one
    assert len({(r["learner"], r["exercise"]) for r in rows}) == len(rows)
    for line in lines:
        mine = {item for (who, item) in pol.overrides if who == line["learner"]}
        assert {x.split(":")[0] for x in line.get("overrides", "").split("; ") if x} == mine


def test_late_rules_side_by_side_on_the_example_of_the_walkthrough():
    """14 of 20 points earned, two days late at 10% a day: the earned rule takes 2.8, the
    possible rule 4; a learner who earned 3 loses the 3 it has, not 4."""
    frac = 0.2
    assert late.deduction("earned", frac, 14, 20) == pytest.approx(2.8)
    assert late.deduction("possible", frac, 14, 20) == pytest.approx(4.0)
    assert late.deduction("possible", frac, 3, 20) == 3
    with pytest.raises(ValueError, match="late_rule: 'canvas' is not one of earned, possible"):
        late.check_rule("canvas", LatePolicy(DUE))
    with pytest.raises(ValueError, match="late_rule needs a deadline"):
        late.check_rule("possible", LatePolicy())


@settings(max_examples=100, deadline=None)
@given(hours=st.integers(-50, 300), days=st.integers(0, 9), cutoff=st.none() | st.integers(0, 9),
       penalty=st.sampled_from([0.1, 0.3]))
def test_an_extension_judges_as_the_deadline_moved(hours, days, cutoff, penalty):
    pol = LatePolicy(DUE, penalty, None if cutoff is None else DUE + timedelta(days=cutoff))
    mine = late.for_learner(pol, DUE + timedelta(days=days))
    when = DUE + timedelta(hours=hours)
    moved = LatePolicy(DUE + timedelta(days=days), penalty,
                       None if cutoff is None else DUE + timedelta(days=cutoff + days))
    assert mine.judge(when) == moved.judge(when)
    assert late.for_learner(pol, None) == pol


def _csv(path: Path, rows: list[list[str]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    return path


NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1,
                max_size=12).filter(lambda s: s.strip() and s.strip() not in ("alice", "bob"))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=NAMES, column=st.sampled_from(["learner", "exercise"]))
def test_an_override_of_an_unknown_learner_or_exercise_is_refused_in_one_line(tmp_path, name,
                                                                              column):
    row = {"learner": "alice", "exercise": "ex0", "points": "1", "comment": "c"}
    row[column] = name
    path = _csv(tmp_path / "overrides.csv", [list(row), list(row.values())])
    with pytest.raises(ValueError) as info:
        read_overrides(path, {"ex0": 2.0}, {"alice", "bob"})
    text = str(info.value)
    assert "\n" not in text and text.startswith("overrides.csv, row 2: no ")


@pytest.mark.parametrize(("cells", "says"), [
    (["alice", "ex0", "3", ""], "write a number from 0 to 2"),
    (["alice", "ex0", "-1", ""], "write a number from 0 to 2"),
    (["alice", "ex0", "nan", ""], "write a number from 0 to 2"),
    (["alice", "ex0", "one", ""], "write a number from 0 to 2"),
])
def test_override_points_outside_the_item_are_refused(tmp_path, cells, says):
    path = _csv(tmp_path / "o.csv", [["learner", "exercise", "points", "comment"], cells])
    with pytest.raises(ValueError, match=says):
        read_overrides(path, {"ex0": 2.0}, {"alice"})
    path = _csv(tmp_path / "o.csv", [["learner", "points"], ["alice", "1"]])
    with pytest.raises(ValueError, match="no column 'exercise'"):
        read_overrides(path, {"ex0": 2.0}, {"alice"})


def test_extensions_from_a_file_and_a_roster_column(tmp_path):
    ids = {"alice", "bob", "carol"}
    roster = _csv(tmp_path / "roster.csv", [["id", "name", "extension"], ["alice", "A", "2"],
                                            ["bob", "B", ""], ["carol", "C", ""]])
    got = late.read_extensions(roster, ids, DUE, roster=True)
    assert got == {"alice": DUE + timedelta(days=2)}
    file = _csv(tmp_path / "ext.csv", [["id", "extension"], ["bob", "2026-11-25T12:00+00:00"]])
    assert late.read_extensions(file, ids, DUE) == \
        {"bob": datetime(2026, 11, 25, 12, tzinfo=timezone.utc)}
    with pytest.raises(ValueError, match="'alice' has an extension in the roster and in"):
        late.merge_extensions(got, {"alice": DUE})
    for bad, says in ((["zed", "1"], "neither a submission nor on the roster"),
                      (["bob", "2026-11-01T00:00+00:00"], "before the deadline"),
                      (["bob", "soon"], "not an ISO 8601 time"),
                      (["bob", "99999"], "at most 3650 days")):
        path = _csv(tmp_path / "bad.csv", [["id", "extension"], bad])
        with pytest.raises(ValueError, match=says):
            late.read_extensions(path, ids, DUE)
    with pytest.raises(ValueError, match="an extension needs a deadline"):
        late.read_extensions(file, ids, None)
    plain = _csv(tmp_path / "plain.csv", [["id"], ["alice"]])
    assert late.read_extensions(plain, ids, DUE, roster=True) == {}


def test_the_files_mark_overrides_and_itemize_the_deduction(tmp_path):
    """Through `finish`: the totals' columns, the LMS files' notes column, the feedback page's
    line of earned, deduction and total."""
    parts = [Part("ch.ipynb", {"a": 10.0, "b": 4.0})]
    entries = [course.Entry("alice", "alice.ipynb", 0), course.Entry("bob", "bob.ipynb", 1)]
    base = {e.key: [(e.learner, e.key, ex, Row.PASSED, "ok", "") for ex in ("a", "b")]
            for e in entries}
    pol = course.Policy([Person("alice", "Alice", "a@x"), Person("bob", "Bob", "b@x")],
                        LatePolicy(DUE, 0.1), {"alice": DUE + timedelta(hours=30),
                                               "bob": DUE + timedelta(hours=30)},
                        feedback=tmp_path / "fb", export=("canvas", "moodle"),
                        source=course.FROM_TIMESTAMPS, rule="possible",
                        extensions={"bob": DUE + timedelta(days=2)},
                        overrides={("alice", "b"): Override(1.0, "partly right")})
    course.finish(tmp_path / "g.csv", entries, base, parts, pol, {})
    totals = list(csv.DictReader((tmp_path / "g.totals.csv").open(encoding="utf-8")))
    assert [t["deduction"] for t in totals] == ["2.8", "0"]  # 20% of 14 possible, on 11 earned
    assert [t["total"] for t in totals] == ["8.2", "14"]
    assert totals[0]["overrides"] == "b: 1" and totals[1]["extended deadline"].startswith(
        "2026-11-22")
    page = (tmp_path / "fb" / "alice.html").read_text(encoding="utf-8")
    assert "Points earned 11, late deduction &minus;2.8 (20% of the points possible, capped " \
        "at the points earned), total 8.2." in page
    assert "override" in page and "[override] partly right" in page
    assert "extended to 2026-11-22" in (tmp_path / "fb" / "bob.html").read_text()
    for name, column in (("canvas", "Notes"), ("moodle", "Feedback")):
        rows = list(csv.DictReader((tmp_path / f"g.{name}.csv").open(encoding="utf-8")))
        assert rows[-2][column] == "override: b: 1" and rows[-1][column] == ""


CELLS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.lists(CELLS, min_size=0, max_size=5), max_size=4),
       header=st.sampled_from([["id", "extension"], ["learner", "exercise", "points", "comment"],
                               ["learner", "question", "points"], ["id", "submitted"],
                               ["id"], []]))
def test_any_teachers_file_is_read_or_refused_in_one_line(tmp_path, rows, header):
    """Fuzzed extensions and overrides files (and, through the same gate, the roster, the
    timestamps and the filled sheet; short rows included): each is read into checked values,
    or refused with one line naming the file; never another exception."""
    path = _csv(tmp_path / "f.csv", [header, *rows])
    ids = {"alice", "bob"}
    for other in (lambda: inputs.read_roster(path), lambda: inputs.read_timestamps(path, ids),
                  lambda: inputs.read_filled(path, {"q0": 1.0}, ids)):
        try:
            other()
        except ValueError as e:
            assert "\n" not in str(e) and str(e).startswith("f.csv")
    for read in (lambda: late.read_extensions(path, ids, DUE),
                 lambda: late.read_extensions(path, ids, DUE, roster=True),
                 lambda: read_overrides(path, {"ex0": 2.0, "q0": 1.0}, ids)):
        try:
            got = read()
        except ValueError as e:
            assert "\n" not in str(e) and str(e).startswith("f.csv")
            continue
        for key, value in got.items():
            if isinstance(value, datetime):
                assert key in ids and value >= DUE
            else:
                assert key[0] in ids and 0 <= value.points <= {"ex0": 2.0, "q0": 1.0}[key[1]]


@settings(max_examples=60, deadline=None)
@given(classes())
def test_the_report_names_every_extension_and_every_override(c):
    """The teacher's page lists each learner with an extended deadline (and the date) and each
    learner with an overridden item (the item and its points), and no one else under either."""
    from xenith_edu.gradebook.report import course_notes

    people, _, lines = _run(c)
    page = course_notes(people, lines)
    pol = c["pol"]

    def listed(title: str) -> str:
        return next((ln for ln in page.splitlines() if ln.startswith(f"- {title}")), "")

    extended = listed("Extended deadline")
    for p in people:
        due = pol.extensions.get(p.id)
        assert (f"**{p.id} (to" in extended) == (due is not None)
        if due is not None:
            assert f"**{p.id} (to {due.isoformat(timespec='minutes')})**" in extended
    overridden = listed("Overridden by the teacher")
    for p in people:
        mine = [(item, o.points) for (who, item), o in pol.overrides.items() if who == p.id]
        assert (f"**{p.id} (" in overridden) == bool(mine)
        for item, pts in mine:
            assert f"{item}: {pts:g}" in overridden
