"""The teacher's one-page report, written next to the CSV: how the class did on each exercise,
the mistakes the checks diagnosed most often, the learners whose notebooks had errors, and the
course's notes (absent, late, extended deadlines, overrides, not on the roster, names shared).
Every learner's string is escaped.
"""

from __future__ import annotations

import html
import re
from collections import Counter
from pathlib import Path

from ..grader import statuses
from ..grader.names import escape_controls
from ..grader.statuses import Row
from .outfiles import write_text

TOP = 8  # mistakes listed
# the statuses of a submission that was not judged, or broke the grader's protocol (tampering)
ERRORS = statuses.ERRORS


MARKDOWN = re.compile(r"([\\`*\[\]|~#])")  # what makes emphasis, code, links, cells


def _cell(text: str) -> str:
    """`text` as literal Markdown on one line: no heading, link, emphasis or HTML of its own."""
    flat = html.escape(escape_controls(" ".join(str(text).split())), quote=False)
    return MARKDOWN.sub(r"\\\1", flat)


def _name(exercise: str) -> str:
    """An exercise's id as it is (a Python name), anything else escaped."""
    return exercise if re.fullmatch(r"\w+", exercise) else _cell(exercise)


def _pass_rates(exercises: dict[str, Counter]) -> list[str]:
    """The table of statuses per exercise; "not submitted" only when a roster names absentees."""
    columns = list(statuses.JUDGED)
    if any(c[Row.NOT_SUBMITTED] for c in exercises.values()):
        columns.append(Row.NOT_SUBMITTED)
    lines = ["| exercise | " + " | ".join(columns) + " | pass rate |",
             "| --- " * (len(columns) + 2) + "|"]
    for ex, c in exercises.items():
        lines.append(f"| {_name(ex)} | " + " | ".join(str(c[k]) for k in columns) +
                     f" | {100 * c['passed'] / sum(c.values()):.0f}% |")
    return lines


def report(rows: list[dict], meta: dict) -> str:
    """The report's Markdown."""
    exercises: dict[str, Counter] = {}
    mistakes: Counter = Counter()
    who: dict[str, set] = {}
    errors: dict[str, list[str]] = {}  # error -> learners
    questions = set(meta.get("questions", ()))
    for r in rows:
        if r["exercise"] and r["exercise"] not in questions:
            exercises.setdefault(r["exercise"], Counter())[r["status"]] += 1
            if r["status"] == Row.FAILED and (m := r.get("mistake")):
                mistakes[(r["exercise"], m)] += 1
                who.setdefault((r["exercise"], m), set()).add(r["learner"])
        if r["status"] in ERRORS:  # the same error of many learners is one line
            where = r["notebook"].rsplit("/", 1)[-1] or "the submission"
            errors.setdefault((r["status"], f"{where}: {r['message'][:160]}"),
                              []).append(r["learner"])
    lines = [f"# Grades: {_cell(meta.get('csv', ''))}", "",
             f"{meta.get('learners', 0)} learners, graded in {meta.get('seconds', 0):.0f} s "
             f"with {meta.get('jobs', 1)} jobs. Sandbox: {meta.get('sandbox', '')}.", "",
             "## Pass rate per exercise", "", *_pass_rates(exercises)]
    lines += ["", "## Most common diagnosed mistakes", ""]
    if mistakes:
        for (ex, m), n in mistakes.most_common(TOP):
            lines.append(f"- **{_name(ex)}**, {n} learner{'s' if n > 1 else ''}: {_cell(m)}")
    else:
        lines.append("None: no failed check named a likely mistake.")
    lines += ["", "## Learners with errors", ""]
    lines += _errors(errors) if errors else ["None."]
    return "\n".join(lines) + "\n"


def _errors(errors: dict[tuple[str, str], list[str]]) -> list[str]:
    """The learners with errors, by status (tampering and limits each get their own lines, so
    that many notebook errors never hide them), the most frequent error of each first."""
    lines = []
    for status in ERRORS:
        mine = sorted(((e, w) for (s, e), w in errors.items() if s == status),
                      key=lambda ew: -len(set(ew[1])))
        for error, learners in mine[:TOP]:
            names = list(dict.fromkeys(learners))
            who = ", ".join(f"**{_cell(n)}**" for n in names[:6]) + \
                (f" and {len(names) - 6} more" if len(names) > 6 else "")
            lines.append(f"- {who}: {_cell(error)}")
        if len(mine) > TOP:
            lines.append(f"- and {len(mine) - TOP} other {status} rows: see the CSV.")
    return lines


def course_notes(people: list, totals: list[dict], meta: dict | None = None) -> str:
    """The course's lines: totals, then who is absent, late, has an extended deadline or an
    item the teacher overrode, is not on the roster, or shares a name with another
    submission."""
    if not totals:
        return ""
    mean = sum(float(t["percent"]) for t in totals) / len(totals)
    lines = ["", "## The course", "",
             f"{len(totals)} learners, mean {mean:.1f}% of {totals[0]['maximum']} points; "
             "each learner's total is in the totals file.", ""]
    meta = meta or {}
    if meta.get("source"):
        lines[-1:-1] = [f"Lateness judged {meta['source']}.", ""]
    groups = {"Not submitted": [t["learner"] for t in totals if t["submitted"] == "no"],
              "Late": [f"{t['learner']} ({t['late']})" for t in totals if t["late"]],
              "Warning: handed in, but no time in the timestamps file (not judged late)":
                  list(meta.get("untimed", [])),
              "Extended deadline": [f"{t['learner']} (to {t['extended deadline']})"
                                    for t in totals if t.get("extended deadline")],
              "Overridden by the teacher (points per item)":
                  [f"{t['learner']} ({t['overrides']})" for t in totals if t.get("overrides")],
              "Not on the roster (graded, not in the LMS files' roster)":
                  [p.id for p in people if p.note == "not on the roster"],
              "Names shared by several submissions (kept apart, not merged)":
                  [p.id for p in people if p.note.startswith("name shared")]}
    for title, names in groups.items():
        if names:
            lines.append(f"- {title}: " + ", ".join(f"**{_cell(n)}**" for n in names))
    return "\n".join(lines) + "\n"


def write_report(path: Path, rows: list[dict], meta: dict, people: list | None = None,
                 totals: list[dict] | None = None) -> None:
    write_text(path, report(rows, meta) + course_notes(people or [], totals or [], meta))
