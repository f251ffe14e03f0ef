"""The sheet of written answers, as invariants over generated classes.

- The sheet names no learner: no id, name or e-mail of the roster (three characters or more)
  is in it, and its rows are in the order of the random sheet ids, not the roster's.
- The key maps sheet ids to the learners who handed in one to one, and keeps each learner's
  sheet id from one run to the next; what the teacher fills on the sheet comes back to the
  right learner, whatever it is.
- An answer handed back as the student version holds it is flagged untouched, for any text of
  the teacher's answer cell (the student version made by `make_student_versions` itself); any
  other answer is not.
"""

from __future__ import annotations

import csv
import io
import string

import nbformat
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from nbformat.v4 import new_markdown_cell, new_notebook

from xenith_edu.booktools.student import TEXT_STUB, make_student_versions
from xenith_edu.gradebook import course, written
from xenith_edu.gradebook.inputs import Person
from xenith_edu.gradebook.points import Part, Question, read_part
from xenith_edu.grader.names import fold

QUESTIONS = (Question("why", 2.0, "Why is dX = dY W^T?"), Question("how", 1.0, "How?"))
PARTS = [Part("lesson.ipynb", {}, QUESTIONS)]

# what a teacher types (the grader escapes control characters in every file it writes)
PRINTABLE = st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Zl", "Zp"))
words = st.text(string.ascii_letters + "éß", min_size=3, max_size=8)


@st.composite
def klasses(draw) -> tuple[list[course.Learner], dict]:
    """A roster (ids, names, e-mails), who handed in, and each one's answers (made of digits
    and punctuation: no roster string can be in them)."""
    ids = draw(st.lists(words, min_size=1, max_size=7, unique_by=fold))
    people = [Person(i, draw(words) + " " + draw(words), draw(words) + "@uni.example")
              for i in ids]
    handed = draw(st.lists(st.booleans(), min_size=len(ids), max_size=len(ids)))
    answers = st.text("0123456789 .,;=+-*/()\n", max_size=30)
    out = []
    for p, h in zip(people, handed, strict=True):
        entry = course.Entry(p.id, f"{p.id}.ipynb", len(out)) if h else None
        if entry is not None:
            entry.answers = {"lesson.ipynb": {q.id: draw(answers) for q in QUESTIONS
                                              if draw(st.booleans())}}
        out.append(course.Learner(p.id, entry, p))
    return out, {"seed": draw(st.integers(0, 2**32))}


def read(path) -> list[dict]:
    from xenith_edu.gradebook.inputs import unsafe_cell

    with path.open(newline="", encoding="utf-8") as f:
        return [{k: unsafe_cell(v) for k, v in r.items()} for r in csv.DictReader(f)]


@settings(max_examples=60, deadline=None)
@given(case=klasses())
def test_the_sheet_names_no_learner_and_its_key_maps_back_one_to_one(tmp_path_factory, case):
    people, extra = case
    out = tmp_path_factory.mktemp("sheet") / "grades.written.csv"
    written.write_sheet(out, people, PARTS, {}, {}, str(extra["seed"]))
    text = out.read_text(encoding="utf-8").casefold()
    fixed = " ".join([*written.SHEET_FIELDS, "lesson.ipynb", written.UNTOUCHED,
                      written.NO_ANSWER, *(f"{q.id} {q.prompt}" for q in QUESTIONS)]).casefold()
    for p in people:
        for s in (p.id, p.person.name, *p.person.name.split(), p.person.email):
            assume(s.casefold() not in fixed)  # a name that is a word of the sheet's own
            assert s.casefold() not in text, s
    key = written.read_key(written.key_path(out))
    handed = [p.id for p in people if p.entry is not None]
    assert sorted(key.values()) == sorted(handed) and len(set(key)) == len(key)
    rows = read(out)
    assert [r["sheet_id"] for r in rows] == sorted(r["sheet_id"] for r in rows)
    assert len(rows) == len(handed) * len(QUESTIONS)
    for r in rows:  # each row is the answer of the learner its key names
        learner = next(p for p in people if p.id == key[r["sheet_id"]])
        assert r["answer"] == learner.entry.answers["lesson.ipynb"].get(r["question"], "")


@settings(max_examples=40, deadline=None)
@given(case=klasses(), data=st.data())
def test_what_the_teacher_fills_comes_back_to_its_learner(tmp_path_factory, case, data):
    people, extra = case
    out = tmp_path_factory.mktemp("filled") / "grades.written.csv"
    written.write_sheet(out, people, PARTS, {}, {}, str(extra["seed"]))
    key = written.read_key(written.key_path(out))
    rows = read(out)
    wanted = {}
    for r in rows:
        q = next(q for q in QUESTIONS if q.id == r["question"])
        points = data.draw(st.none() | st.sampled_from([0, 0.5, q.points]))
        comment = data.draw(st.text(PRINTABLE, max_size=20).filter(lambda t: t.strip() == t))
        r["points"] = "" if points is None else f"{points:g}"
        r["comment"] = comment
        wanted[(key[r["sheet_id"]], q.id)] = (None if points is None else float(points), comment)
    data.draw(st.randoms()).shuffle(rows)  # the teacher sorts the sheet as they like
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(written.SHEET_FIELDS), lineterminator="\n")
    w.writeheader()
    from xenith_edu.gradebook.inputs import safe_cell
    w.writerows({k: safe_cell(v) for k, v in r.items()} for r in rows)
    filled = out.with_name("filled.csv")
    filled.write_text(buf.getvalue(), encoding="utf-8")
    ids = {p.id for p in people}
    got = written.read_sheet(filled, {q.id: q.points for q in QUESTIONS}, ids, key)
    assert got == wanted
    # the next run: the same sheet ids, and what was filled is on the new sheet
    written.write_sheet(out, people, PARTS, got, key, str(extra["seed"] + 1))
    assert written.read_key(written.key_path(out)) == key
    again = {(key[r["sheet_id"]], r["question"]): r for r in read(out)}
    for (learner, q), (points, comment) in wanted.items():
        assert again[(learner, q)]["comment"] == comment
        assert again[(learner, q)]["points"] == ("" if points is None else f"{points:g}")


def test_a_sheet_id_the_key_does_not_hold_is_one_line(tmp_path):
    sheet = tmp_path / "filled.csv"
    sheet.write_text("sheet_id,question,points,comment\nzzzz,why,1,\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"filled.csv, row 2: no sheet id 'zzzz' in the key"):
        written.read_sheet(sheet, {"why": 2.0}, {"alice"}, {"bcd": "alice"})
    with pytest.raises(ValueError, match=r"row 2: no sheet id 'zzzz' .* the key .* is gone"):
        written.read_sheet(sheet, {"why": 2.0}, {"alice"}, {})
    key = tmp_path / "grades.written.key.csv"
    key.write_text("sheet_id,learner\nbcd,alice\nbcd,bob\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"grades.written.key.csv, row 3: not the key"):
        written.read_key(key)


def test_a_sheet_id_avoids_every_roster_string(tmp_path):
    """Even a roster whose names are every pair of the id alphabet's letters."""
    letters = written.ALPHABET
    shown = [a + b + c for a in letters[:6] for b in letters[:6] for c in letters[:6]]
    ids = written.assign([f"l{i}" for i in range(20)], {}, shown, "class")
    assert len(set(ids.values())) == 20
    assert not any(s in sid for sid in ids.values() for s in shown)
    # a spreadsheet would read digits alone as a number, and the key would not find it
    assert not written.usable("2345678923", set(), set())
    assert written.usable("23456789b3", set(), set())
    assert not written.usable("23456789b3", {"23456789b3"}, set())


# ----------------------------------------------------------------------------------------------
# Untouched answers, against the student version the package itself makes.

markdown = st.text(string.ascii_letters + string.digits + " *_`#$\\^{}()[]!?.,:;'\"-+=<>\n",
                   max_size=60)


@st.composite
def answer_cells(draw) -> str:
    """A teacher's answer cell: free text, or text around a solution region."""
    before, solution, after = draw(markdown), draw(markdown), draw(markdown)
    if draw(st.booleans()):
        return before
    return f"{before}\n### BEGIN SOLUTION\n{solution}\n### END SOLUTION\n{after}"


def student_cell(tmp_path, source: str) -> tuple[str, Question]:
    """The answer cell of the student version, and the question as the course reads it."""
    cell = new_markdown_cell(source)
    cell.metadata["nbgrader"] = {"solution": True, "grade": True, "grade_id": "q", "points": 1}
    teacher = tmp_path / "teacher"
    teacher.mkdir(exist_ok=True)
    nbformat.write(new_notebook(cells=[new_markdown_cell("Why?"), cell]),
                   str(teacher / "n.ipynb"))
    (made,) = make_student_versions(teacher / "n.ipynb", tmp_path / "student")
    cells = [c for c in nbformat.read(str(made), 4).cells if c.metadata.get("nbgrader")]
    (q,) = read_part(teacher / "n.ipynb", []).questions
    return (cells[0].source if cells else ""), q


@settings(max_examples=40, deadline=None)
@given(source=answer_cells(), spaces=st.sampled_from(["", " ", "\n", "  \n "]),
       extra=st.text(string.ascii_letters + string.digits, min_size=1, max_size=10))
def test_an_answer_cell_handed_back_as_handed_out_is_flagged(tmp_path_factory, source, spaces,
                                                              extra):
    handed_out, q = student_cell(tmp_path_factory.mktemp("q"), source)
    assume(handed_out.strip())  # a cell the student version removes holds no answer
    assert written.flag(spaces + handed_out + spaces, q.stub) == written.UNTOUCHED
    assert written.flag(handed_out + " " + extra, q.stub) == ""
    assert written.flag(extra + " " + handed_out, q.stub) == ""
    assert written.flag("", q.stub) == written.flag(None, q.stub) == written.NO_ANSWER
    assert written.flag(" \n ", q.stub) == written.NO_ANSWER


def test_the_stub_of_a_question_travels_with_the_parts():
    part = Part("n.ipynb", {"ex": 1.0}, (Question("q", 1.0, "Why?", "**A:** " + TEXT_STUB),))
    assert Part.from_dict(part.as_dict()) == part
    old = {"notebook": "n.ipynb", "points": {}, "questions": [["q", 1.0, "Why?"]]}
    assert Part.from_dict(old).questions[0].stub == TEXT_STUB  # settings written before


@settings(max_examples=30, deadline=None)
@given(names=st.lists(words, min_size=1, max_size=8, unique_by=fold),
       secrets=st.lists(st.text(min_size=1, max_size=12), min_size=2, max_size=2, unique=True))
def test_sheet_ids_are_the_class_s_not_the_id_s(names, secrets):
    """Under one class's identity the ids are the same in every run (a run and the merge of its
    shards write one sheet); under another they are others: never a function of the id alone."""
    first = written.assign(names, {}, [], secrets[0])
    assert written.assign(names, {}, [], secrets[0]) == first
    other = written.assign(names, {}, [], secrets[1])
    assert all(first[n] != other[n] for n in names)
    assert len(set(first.values())) == len(names)


@settings(max_examples=30, deadline=None)
@given(before=markdown, after=markdown, marked=st.booleans(),
       answer=st.from_regex(r"Model answer [a-z]{6}", fullmatch=True))
def test_no_student_version_holds_a_model_answer(tmp_path_factory, before, after, marked,
                                                  answer):
    """nbgrader's rule: a written answer's cell is stubbed where it is marked, and replaced
    whole where it is not (it is the model answer then)."""
    source = f"{before}\n### BEGIN SOLUTION\n{answer}\n### END SOLUTION\n{after}" if marked \
        else f"{before}\n{answer}\n{after}"
    handed_out, q = student_cell(tmp_path_factory.mktemp("m"), source)
    assert answer not in handed_out and TEXT_STUB in handed_out
    assert written.flag(handed_out, q.stub) == written.UNTOUCHED
    if not marked:
        assert handed_out == TEXT_STUB
