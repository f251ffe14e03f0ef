"""What leaves the grader: CSV cells no spreadsheet runs, the gradebook files Canvas and Moodle
import, and one self-contained feedback page per learner, every learner's string escaped.
"""

from __future__ import annotations

import csv
import html
import io
import re
from pathlib import Path

from ..grader.names import escape_controls, file_stems
from .inputs import safe_cell
from .outfiles import make_folder, write_text

CANVAS_FIXED = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
# The page asks for nothing: no script, no image, no font, no style sheet from anywhere.
CSP = "default-src 'none'; style-src 'unsafe-inline'"
STYLE = ("body{font-family:sans-serif;max-width:52em;margin:2em auto;padding:0 1em}"
         "table{border-collapse:collapse;width:100%}td,th{border:1px solid #ccc;padding:.3em;"
         "vertical-align:top;text-align:left}pre{white-space:pre-wrap;margin:0}"
         ".passed,.graded{color:#1a7f37}.late{color:#b35900}")


def csv_text(fields: tuple[str, ...] | list[str], rows: list[dict]) -> str:
    """CSV whose every cell a spreadsheet reads as text, never as a formula."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(fields), lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: safe_cell(escape_controls(v, "\n\t")) for k, v in r.items()}
                     for r in rows)
    return buf.getvalue()


def _lines(header: list[str], rows: list[list[str]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([safe_cell(escape_controls(c, "\n\t")) for c in r] for r in rows)
    return buf.getvalue()


def canvas(people: list, lines: list[dict], parts: list) -> str:
    """Canvas's gradebook import: Student, ID, SIS User ID, SIS Login ID, Section, then one
    column per assignment (a chapter here), after a "Points Possible" row."""
    header = [*CANVAS_FIXED, *(p.chapter for p in parts)]
    possible = ["Points Possible", "", "", "", "",
                *(_possible(p) for p in parts)]
    rows = [possible]
    for learner, line in zip(people, lines, strict=True):
        person = learner.person
        rows.append([person.name if person and person.name else learner.id,
                     person.canvas_id if person else "", learner.id,
                     (person.sis_login or person.email) if person else "",
                     person.section if person else "", *(line[p.chapter] for p in parts)])
    return _lines(header, rows)


def moodle(people: list, lines: list[dict], parts: list) -> str:
    """Moodle's grade import: an identifier column (the email address when the roster gives
    every learner one, else the ID number), then one grade column per chapter."""
    by_email = bool(people) and all(p.person and p.person.email for p in people)
    header = ["Email address" if by_email else "ID number", *(p.chapter for p in parts)]
    rows = [[p.person.email if by_email else p.id, *(line[c.chapter] for c in parts)]
            for p, line in zip(people, lines, strict=True)]
    return _lines(header, rows)


def num(x: float) -> str:
    """Points as the files show them: 1, 0.5, 2.25."""
    return f"{round(x, 4):g}"


def _possible(part) -> str:
    return num(sum(part.points.values()) + sum(q.points for q in part.questions))


def write_exports(files: dict[str, Path], export: tuple[str, ...], people: list,
                  lines: list[dict], parts: list) -> list[Path]:
    """The LMS files asked for, next to the CSV; returns their paths. A submission the roster
    does not name is left out: the LMS would not know that learner."""
    known = [(p, line) for p, line in zip(people, lines, strict=True)
             if p.note != "not on the roster"]
    people, lines = [p for p, _ in known], [line for _, line in known]
    written = []
    for name in export:
        make = {"canvas": canvas, "moodle": moodle}[name]
        write_text(files[name], make(people, lines, parts))
        written.append(files[name])
    return written


# ----------------------------------------------------------------------------------------------
# Feedback: one page per learner.


def _e(text: object) -> str:
    return html.escape(escape_controls(text, "\n"), quote=True)


def page(learner, rows: list[dict], line: dict) -> str:
    """One learner's feedback: the total, the late mark, then each exercise's verdict,
    points and message, and the teacher's comments on the written answers."""
    name = learner.person.name if learner.person and learner.person.name else learner.id
    title = f"Feedback for {name}"
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
           f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>",
           f"<h1>{_e(title)}</h1>",
           f"<p><strong>{_e(line['total'])} of {_e(line['maximum'])} points</strong> "
           f"({_e(line['percent'])}%)</p>"]
    if line["late"]:
        out.append(f'<p class="late">Handed in {_e(line["late"])}.</p>')
    if line["submitted"] == "no":
        out.append("<p>Nothing was handed in.</p>")
    out += ["<table><tr><th>notebook</th><th>exercise</th><th>verdict</th><th>points</th>"
            "<th>message</th></tr>"]
    for r in rows:
        points = f"{r['points']} of {r['max_points']}" if r["max_points"] else ""
        status = re.sub(r"[^a-z]", "-", r["status"])
        out.append(f"<tr><td>{_e(r['notebook'])}</td><td>{_e(r['exercise'])}</td>"
                   f'<td class="{status}">{_e(r["status"])}</td><td>{_e(points)}</td>'
                   f"<td><pre>{_e(r['message'])}</pre></td></tr>")
    out += ["</table>", "</body></html>", ""]
    return "\n".join(out)


def write_feedback(folder: Path, people: list, rows: list[dict], lines: list[dict]) -> None:
    """One page per learner into `folder`, named after the learner."""
    make_folder(folder)
    mine: dict[str, list[dict]] = {}
    for r in rows:
        mine.setdefault(r["learner"], []).append(r)
    stems = file_stems([p.id for p in people])
    for learner, line in zip(people, lines, strict=True):
        write_text(folder / f"{stems[learner.id]}.html",
                          page(learner, mine.get(learner.id, []), line))
