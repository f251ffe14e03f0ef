"""The learner's feedback page: the total, each exercise's result in words for a learner, and
each written question with the learner's answer, the points and the teacher's comment.

The colour of a result follows its points alone (all, some, none of the maximum), never the
status's name; every status has its words here (`WORDS`), and every learner's string is escaped.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import NamedTuple

from ..grader.names import escape_controls, file_stems
from ..grader.statuses import Row
from .outfiles import make_folder, write_text
from .overrides import MARK

# The page asks for nothing: no script, no image, no font, no style sheet from anywhere.
CSP = "default-src 'none'; style-src 'unsafe-inline'"
STYLE = ("body{font-family:sans-serif;max-width:52em;margin:2em auto;padding:0 1em}"
         "table{border-collapse:collapse;width:100%}td,th{border:1px solid #ccc;padding:.3em;"
         "vertical-align:top;text-align:left}pre{white-space:pre-wrap;margin:0}"
         ".full{color:#1a7f37}.some{color:#9a6700}.none{color:#cf222e}.late{color:#b35900}"
         "blockquote{border-left:3px solid #ccc;margin:.5em 0;padding-left:1em}")


class Words(NamedTuple):
    """What a learner reads for one status: the result, then what it means and what to do."""

    result: str
    meaning: str
    details: bool  # whether the check's own message follows (the learner can act on it)


WORDS: dict[str, Words] = {
    Row.PASSED: Words("passed", "Your function gives the right answer on every case it was "
                      "tried on.", False),
    Row.FAILED: Words("not right yet", "Your function gave a wrong answer; below, the first "
                      "case it got wrong and, when it can be told, the likely mistake.", True),
    Row.NOT_ATTEMPTED: Words("not attempted", "Your function was still the placeholder that "
                             "raises NotImplementedError when you handed in: write it, try it "
                             "in your notebook, and hand the notebook in again.", False),
    Row.DELEGATED: Words("not your own computation", "Your function called the package's own "
                         "answer to this exercise instead of computing it. Write the "
                         "computation yourself (a forward function of the package is "
                         "allowed).", True),
    Row.MISSING: Words("missing", "Your function, or your notebook, was not in what you "
                       "handed in: check the names against the assignment's.", True),
    Row.NOTEBOOK_ERROR: Words("your notebook stopped", "Your notebook did not run from top "
                              "to bottom, so this could not be tried. Restart it, run "
                              "everything in order, fix the first error, and hand it in "
                              "again.", True),
    Row.PROTOCOL_ERROR: Words("could not be checked", "Your answer could not be read back "
                              "safely, so it was not marked: ask your teacher.", False),
    Row.UNREADABLE: Words("could not be opened", "A file you handed in could not be opened (a "
                          "link, a pipe, or a name that is not text): hand in plain notebooks "
                          "and folders.", True),
    Row.OVER_LIMIT: Words("over the limits", "Your work took too long, needed too much "
                          "memory, or is too large, and was stopped: make it lighter and hand "
                          "it in again.", True),
    Row.COLLISION: Words("handed in twice", "Two of your hand-ins have one name; each was "
                         "marked on its own: tell your teacher which one counts.", True),
    Row.NOT_SUBMITTED: Words("not handed in", "Nothing was handed in for this.", False),
    Row.TO_GRADE: Words("waiting for your teacher", "Your teacher has not marked this answer "
                        "yet.", False),
    Row.GRADED: Words("marked by your teacher", "Your teacher marked this answer.", False),
}


def words(status: str) -> Words:
    """The learner's words for a status (a status the page does not know: said plainly)."""
    return WORDS.get(status, Words(str(status), "Ask your teacher what this means.", True))


def tone(points: str, most: str) -> str:
    """The colour of a result, from its points alone: all of the maximum, some, none; "" when
    nothing is at stake (a row of the whole notebook)."""
    try:
        got, top = float(points or 0), float(most)
    except ValueError:
        return ""
    if not top > 0:
        return ""
    return "full" if got >= top else "some" if got > 0 else "none"


def _e(text: object) -> str:
    return html.escape(escape_controls(text, "\n"), quote=True)


def _points(r: dict) -> str:
    return f"{r['points']} of {r['max_points']}" if r["max_points"] else ""


def _result(r: dict) -> list[str]:
    w, cls = words(r["status"]), tone(r["points"], r["max_points"])
    said = f"<p>{_e(w.meaning)}</p>"
    if r["message"].startswith(MARK):  # the teacher's points win: their comment is shown
        said += f"<p>Your teacher set these points:</p><pre>{_e(r['message'])}</pre>"
    elif w.details and r["message"]:
        said += f"<pre>{_e(r['message'])}</pre>"
    return [f"<tr><td>{_e(r['notebook'])}</td><td>{_e(r['exercise'])}</td>",
            f'<td class="{cls}">{_e(w.result)}</td><td class="{cls}">{_e(_points(r))}</td>',
            f"<td>{said}</td></tr>"]


def _written(r: dict, question, answer: str | None) -> list[str]:
    """One written question: its prompt, the learner's answer, the points, the comment."""
    w, cls = words(r["status"]), tone(r["points"], r["max_points"])
    out = [f"<h3>{_e(r['exercise'])}</h3>"]
    if question is not None and question.prompt:
        out.append(f"<p>{_e(question.prompt)}</p>")
    out.append("<p>Your answer:</p>")
    out.append(f"<blockquote><pre>{_e(answer)}</pre></blockquote>" if answer and answer.strip()
               else "<blockquote>(no answer was found in your notebook)</blockquote>")
    out.append(f'<p><span class="{cls}">{_e(w.result)}</span>'
               + (f': <span class="{cls}">{_e(_points(r))} points</span>' if _points(r) else "")
               + f". {_e(w.meaning)}</p>")
    if r["message"]:  # the teacher's comment, or why the answer waits (nothing written)
        said = "Your teacher's comment" if r["status"] == Row.GRADED else "Note"
        out.append(f"<p>{said}:</p><blockquote><pre>{_e(r['message'])}</pre></blockquote>")
    return out


def page(learner, rows: list[dict], line: dict, parts: list = ()) -> str:
    """One learner's feedback: the total, the late mark, each exercise's result, and each
    written question with the learner's answer, the points and the teacher's comment."""
    name = learner.person.name if learner.person and learner.person.name else learner.id
    title = f"Feedback for {name}"
    asked = {q.id: (part.notebook, q) for part in parts for q in part.questions}
    answers = learner.entry.answers if learner.entry is not None else {}
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
           f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>",
           f"<h1>{_e(title)}</h1>",
           f'<p class="{tone(line["total"], line["maximum"])}"><strong>{_e(line["total"])} of '
           f"{_e(line['maximum'])} points</strong> ({_e(line['percent'])}%)</p>"]
    if line["late"]:
        out.append(f'<p class="late">Handed in {_e(line["late"])}.</p>')
    out += _adjustments(line)
    if line["submitted"] == "no":
        out.append("<p>Nothing was handed in.</p>")
    checked = [r for r in rows if r["exercise"] not in asked]
    if checked:
        out += ["<h2>Exercises</h2>", "<table><tr><th>notebook</th><th>exercise</th>"
                "<th>result</th><th>points</th><th>what it means</th></tr>"]
        for r in checked:
            out += _result(r)
        out.append("</table>")
    written = [r for r in rows if r["exercise"] in asked]
    if written:
        out.append("<h2>Written answers</h2>")
    for r in written:
        notebook, question = asked[r["exercise"]]
        out += _written(r, question, answers.get(notebook, {}).get(question.id))
    out += ["</body></html>", ""]
    return "\n".join(out)


def _adjustments(line: dict) -> list[str]:
    """The page's lines of the course's adjustments: the late deduction itemized (earned,
    deduction, total), the learner's extended deadline, the teacher's overrides."""
    out = []
    if line.get("deduction") and float(line["deduction"]):
        out.append(f'<p class="late">Points earned {_e(line["earned"])}, late deduction '
                   f'&minus;{_e(line["deduction"])} ({_e(line["rule"])}), total '
                   f'{_e(line["total"])}.</p>')
    if line.get("extended deadline"):
        out.append(f"<p>Your deadline was extended to {_e(line['extended deadline'])}.</p>")
    if line.get("overrides"):
        out.append(f"<p>Points set by your teacher (override): {_e(line['overrides'])}.</p>")
    return out


def write_feedback(folder: Path, people: list, rows: list[dict], lines: list[dict],
                   parts: list = ()) -> None:
    """One page per learner into `folder`, named after the learner."""
    make_folder(folder)
    mine: dict[str, list[dict]] = {}
    for r in rows:
        mine.setdefault(r["learner"], []).append(r)
    stems = file_stems([p.id for p in people])
    for learner, line in zip(people, lines, strict=True):
        write_text(folder / f"{stems[learner.id]}.html",
                   page(learner, mine.get(learner.id, []), line, parts))
