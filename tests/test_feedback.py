"""The learner's feedback page, as invariants over generated rows.

- The colour of a result is a function of its points and maximum alone: any two rows with the
  same points look the same whatever their status, and only all of the maximum is green.
- Every status has words for a learner, in the learner's vocabulary (no cell, grader, sandbox,
  row...), and the page shows them for every row; a check's message that speaks of cells or of
  running again ("not attempted") is never on the page.
- A written question shows its prompt, the learner's answer, the points and the comment,
  every one escaped.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from xenith_edu.exercises import SPECS
from xenith_edu.exercises.engine import _not_attempted
from xenith_edu.gradebook import course, feedback
from xenith_edu.gradebook.inputs import Person
from xenith_edu.gradebook.points import Part, Question
from xenith_edu.grader.statuses import Row

# the grader's words, which a learner reading the page has no use for
GRADER_WORDS = ("cell", "grader", "sandbox", "protocol", "status", "row", "csv", "journal",
                "frame", "worker", "spec", "delegat", "traceback", "run this", "rerun",
                "[", "]", "_")
POINTS = st.sampled_from(["0", "0.5", "1", "1.5", "2", "3"])
Q = Question("why-w", 2.0, "Why W transposed?")
PARTS = [Part("lesson.ipynb", {}, (Q,))]


def learner(answer: str | None = None) -> course.Learner:
    entry = course.Entry("ann", "ann.ipynb", 0)
    entry.answers = {"lesson.ipynb": {} if answer is None else {Q.id: answer}}
    return course.Learner("ann", entry, Person("ann", "Ann"))


LINE = {"total": "1", "maximum": "2", "percent": "50.0", "late": "", "submitted": "yes"}


@st.composite
def rows(draw) -> dict:
    most = draw(st.sampled_from(["", "1", "2", "3"]))
    points = "" if not most else draw(POINTS.filter(lambda p: float(p) <= float(most)))
    return {"learner": "ann", "notebook": "ann/lesson.ipynb",
            "exercise": draw(st.sampled_from(["linear_backward", "silu_grad", ""])),
            "status": draw(st.sampled_from(list(Row))), "points": points, "max_points": most,
            "message": draw(st.text(max_size=40)), "late": "", "mistake": ""}


def classes(page: str) -> list[str]:
    """The colour of each result of the page's table: the result's cell and its points'."""
    return re.findall(r'<td class="([a-z]*)">', page)


@settings(max_examples=150, deadline=None)
@given(row=rows(), other=st.sampled_from(list(Row)))
def test_a_result_s_colour_follows_its_points_alone(row, other):
    page = feedback.page(learner(), [row], LINE, [])
    twin = feedback.page(learner(), [{**row, "status": other}], LINE, [])
    assert classes(page) == classes(twin) == [feedback.tone(row["points"],
                                                            row["max_points"])] * 2
    if row["max_points"]:
        full = float(row["points"]) == float(row["max_points"])
        assert (classes(page)[0] == "full") is full
        assert (classes(page)[0] == "none") is (float(row["points"]) == 0)


def test_graded_at_zero_is_not_green():
    row = {"learner": "ann", "notebook": "lesson.ipynb", "exercise": Q.id, "status": "graded",
           "points": "0", "max_points": "2", "message": "no", "late": "", "mistake": ""}
    page = feedback.page(learner("because"), [row], LINE, PARTS)
    assert 'class="none"' in page and 'class="full"' not in page


def test_every_status_has_words_for_a_learner():
    for status in Row:
        w = feedback.WORDS[status]
        for text in (w.result, w.meaning):
            assert text and not any(bad in text.lower() for bad in GRADER_WORDS), (status, text)


@settings(max_examples=80, deadline=None)
@given(row=rows())
def test_the_page_says_each_result_in_the_learner_s_words(row):
    page = feedback.page(learner(), [row], LINE, [])
    w = feedback.WORDS[row["status"]]
    assert w.result in page and w.meaning.split(":")[0] in page.replace("&#x27;", "'")


@settings(max_examples=30, deadline=None)
@given(spec=st.sampled_from(sorted(SPECS)), fn=st.from_regex(r"my_[a-z]{1,8}", fullmatch=True))
def test_not_attempted_never_tells_the_learner_to_run_a_cell_again(spec, fn):
    result = _not_attempted(SPECS[spec], fn)
    assert "cell" in result.message  # the notebook's words, true in the notebook
    row = {"learner": "ann", "notebook": "lesson.ipynb", "exercise": spec,
           "status": result.status.value, "points": "0", "max_points": "1",
           "message": result.message, "late": "", "mistake": ""}
    page = feedback.page(learner(), [row], LINE, [])
    body = page.split("<body>", 1)[1]
    assert "cell" not in body.replace(spec, "") and "not attempted" in body


@settings(max_examples=60, deadline=None)
@given(answer=st.text(max_size=60), comment=st.text(max_size=60), points=POINTS,
       graded=st.booleans())
def test_a_written_question_shows_the_answer_the_points_and_the_comment(answer, comment,
                                                                        points, graded):
    points = str(min(float(points), 2.0)).removesuffix(".0")
    row = {"learner": "ann", "notebook": "lesson.ipynb", "exercise": Q.id,
           "status": "graded" if graded else "to grade", "points": points if graded else "0",
           "max_points": "2", "message": comment, "late": "", "mistake": ""}
    page = feedback.page(learner(answer), [row], LINE, PARTS)
    assert Q.prompt in page and "<script" not in page.lower().replace("&lt;script", "")
    if answer.strip():
        assert feedback._e(answer) in page
    else:
        assert "no answer was found" in page
    if graded:
        assert f"{points} of 2 points" in page
    if comment:
        assert feedback._e(comment) in page
