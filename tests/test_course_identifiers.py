"""The LMS files and the roster match, as invariants over generated rosters.

- An LMS file has one identifier for the whole file, the one the teacher chose (`moodle:email`,
  `canvas:sis_login`, ...); a roster where a learner lacks it, or two learners share it (with
  or without case), is refused in one line before anything is graded or written.
- Every row of a file fills the chosen identifier's column and no other identifier column.
- The roster, the timestamps and the sheet find a learner by the canonical id compared as a
  disk that ignores case compares it (names.fold), the same rule the submissions' walk keeps.
"""

from __future__ import annotations

import csv
import io
from datetime import datetime, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_course import lesson, write

from xenith_edu import cli
from xenith_edu.gradebook import course, grade
from xenith_edu.gradebook.exports import (
    CANVAS_FIXED,
    EXPORT_CHOICES,
    IDENTIFIERS,
    Export,
    canvas,
    check_exports,
    moodle,
    parse_export,
)
from xenith_edu.gradebook.inputs import LatePolicy, Person, read_roster
from xenith_edu.gradebook.points import Part
from xenith_edu.grader.names import fold

FIELDS = ("id", "name", "email", "section", "sis_login", "canvas_id")
PARTS = [Part("lesson.ipynb", {"linear_backward": 3.0, "silu_grad": 1.0})]

ids = st.lists(st.from_regex(r"[A-Za-zé][A-Za-z0-9é_]{0,7}", fullmatch=True), min_size=1,
               max_size=6, unique_by=fold)
values = st.from_regex(r"[a-zA-Z0-9]{1,6}(@uni\.example)?", fullmatch=True)


@st.composite
def rosters(draw) -> list[Person]:
    """A roster whose every learner has every field, each unique without case."""
    names = draw(ids)
    taken: set[str] = set()
    people = []
    for i, lid in enumerate(names):
        row = {"id": lid}
        for f in FIELDS[1:]:
            v = draw(values.filter(lambda v: fold(v) not in taken))
            taken.add(fold(v))
            row[f] = v
        row["email"] = f"m{i}.{row['email'].split('@')[0]}@uni.example"
        people.append(Person(**row))
    return people


def roster_text(people: list[Person]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(FIELDS)
    w.writerows([getattr(p, f) for f in FIELDS] for p in people)
    return buf.getvalue()


def class_of(people: list[Person]) -> list[course.Learner]:
    return course.learners([], people)


@st.composite
def broken(draw) -> tuple[list[Person], str, str]:
    """A roster, an identifier that can be missing, and a flaw of it: one learner without
    it, or two learners with one (the second a case variant of the first)."""
    people = draw(rosters())
    spec = draw(st.sampled_from([c for c in EXPORT_CHOICES if parse_export(c).field != "id"]))
    export = parse_export(spec)
    flaw = draw(st.sampled_from(["missing", "blank", "duplicate"]))
    if flaw == "duplicate":
        assume(len(people) > 1)
    i = draw(st.integers(0, len(people) - 1))
    j = draw(st.integers(0, len(people) - 1).filter(lambda j: j != i or len(people) == 1))
    value = {"missing": "", "blank": "   ",
             "duplicate": getattr(people[j], export.field).swapcase()}[flaw]
    people[i] = Person(**{**{f: getattr(people[i], f) for f in FIELDS}, export.field: value})
    return people, spec, flaw


@pytest.fixture(scope="module")
def klass(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ids")
    write(lesson(), root / "inst" / "lesson.ipynb")
    write(lesson(), root / "subs" / "someone.ipynb")
    return {"root": root, "inst": root / "inst", "subs": root / "subs"}


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=broken())
def test_a_missing_or_shared_identifier_is_one_line_and_nothing_is_written(klass, case):
    people, spec, flaw = case
    n = len(list(klass["root"].iterdir()))
    roster = klass["root"] / f"roster{n}.csv"
    roster.write_text(roster_text(people), encoding="utf-8")
    out = klass["root"] / f"out{n}"
    out.mkdir()
    with pytest.raises(ValueError) as err:
        grade(klass["subs"], out / "grades.csv", instructor=klass["inst"], roster=roster,
              export=(spec,))
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"export: {spec.split(':')[0]} by ")
    assert ("have no" if flaw != "duplicate" else "is the") in text
    assert list(out.iterdir()) == []
    argv = ["grade", str(klass["subs"]), "--out", str(out / "grades.csv"), "--instructor",
            str(klass["inst"]), "--roster", str(roster), "--export", spec]
    assert cli.main(argv) == 1
    assert list(out.iterdir()) == []


@settings(max_examples=60, deadline=None)
@given(people=rosters(), spec=st.sampled_from(EXPORT_CHOICES))
def test_every_row_fills_the_chosen_identifier_and_no_other(people, spec):
    learners = class_of(people)
    (chosen,) = check_exports((spec,), learners)
    export = parse_export(chosen)
    lines = [{"lesson": "1"} for _ in learners]
    if export.lms == "moodle":
        rows = list(csv.reader(io.StringIO(moodle(learners, lines, PARTS, export.key))))
        assert rows[0][0] == export.column
        assert [r[0] for r in rows[1:]] == [export.value(p) for p in learners]
        return
    rows = list(csv.reader(io.StringIO(canvas(learners, lines, PARTS, export.key))))
    others = {c for c, _ in IDENTIFIERS["canvas"].values()} - {export.column}
    for p, row in zip(learners, rows[2:], strict=True):
        cells = dict(zip(CANVAS_FIXED, row, strict=False))
        assert cells[export.column] == export.value(p) != ""
        assert all(cells[c] == "" for c in others)


def test_the_identifiers_the_command_offers_are_the_table_s():
    assert set(EXPORT_CHOICES) == {"canvas", "moodle"} | {f"{lms}:{k}" for lms in IDENTIFIERS
                                                          for k in IDENTIFIERS[lms]}
    assert parse_export("moodle") == Export("moodle", "email")
    assert parse_export("canvas") == Export("canvas", "id")
    for bad in ("blackboard", "moodle:phone", "moodle:", ":email", "canvas:id:x"):
        with pytest.raises(ValueError, match="not one of canvas, canvas:id"):
            parse_export(bad)
    with pytest.raises(ValueError, match="choose one identifier for the whole file"):
        check_exports(("moodle", "moodle:id"), class_of([Person("a", email="a@x")]))
    with pytest.raises(ValueError, match="give a roster"):  # no roster: no e-mail to know
        check_exports(("moodle:email",), course.learners([course.Entry("a", "a.ipynb", 0)],
                                                         None))


def flip(text: str, mask: int) -> str:
    return "".join(c.swapcase() if mask >> (i % 16) & 1 else c for i, c in enumerate(text))


@settings(max_examples=60, deadline=None)
@given(names=ids, masks=st.lists(st.integers(0, 2**16 - 1), min_size=7, max_size=7))
def test_the_roster_finds_a_submission_whatever_the_case_of_either(names, masks):
    """A roster id and a submission's name equal without case are one learner: matched, with
    the roster's spelling, neither absent nor off the roster."""
    people = [Person(flip(n, masks[0])) for n in names]
    entries = [course.Entry(flip(n, m), f"{flip(n, m)}.ipynb", k)
               for k, (n, m) in enumerate(zip(names, masks[1:len(names) + 1], strict=True))]
    found = course.learners(entries, people)
    assert [p.id for p in found] == [p.id for p in people]
    assert all(p.entry is not None and not p.note for p in found)
    assert [p.entry.learner for p in found] == [e.learner for e in entries]


def test_two_roster_ids_equal_without_case_are_refused(tmp_path):
    roster = tmp_path / "roster.csv"
    roster.write_text("id\nAnn\nbob\nann\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"roster.csv, row 4: the id 'ann' appears twice"):
        read_roster(roster)


def test_timestamps_and_the_sheet_find_the_learner_without_case(tmp_path):
    entries = [course.Entry("Alice", "Alice.ipynb", 0)]
    roster = tmp_path / "roster.csv"
    roster.write_text("id,email\nalice,a@x\n", encoding="utf-8")
    stamps = tmp_path / "stamps.csv"
    stamps.write_text("id,submitted\nALICE,2026-11-21T00:30+00:00\n", encoding="utf-8")
    pol = course.policy(roster, LatePolicy(datetime(2026, 11, 20, tzinfo=timezone.utc)),
                        stamps, [], entries, PARTS, export=("moodle",))
    assert set(pol.times) == {"alice"} and pol.export == ("moodle:email",)
