"""The teacher's one-page report, written next to the CSV: how the class did on each exercise,
the mistakes the checks diagnosed most often, and the learners whose notebooks had errors.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from ..tools.util import atomic_write_text

LIKELY = re.compile(r"Likely mistake: (.+?)(?:\n|$)", re.DOTALL)
TOP = 8  # mistakes listed
# the statuses of a submission that was not judged, or broke the grader's protocol (tampering)
ERRORS = ("notebook error", "protocol error", "over the limit", "unreadable file",
          "name collision")


def _mistake(message: str) -> str | None:
    found = LIKELY.search(message)
    if not found:
        return None
    text = " ".join(found.group(1).split())
    first = re.split(r"(?<=\.)\s", text, maxsplit=1)[0]
    return first[:160]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def report(rows: list[dict], meta: dict) -> str:
    """The report's Markdown."""
    exercises: dict[str, Counter] = {}
    mistakes: Counter = Counter()
    who: dict[str, set] = {}
    errors: dict[str, list[str]] = {}  # error -> learners
    for r in rows:
        if r["exercise"]:
            exercises.setdefault(r["exercise"], Counter())[r["status"]] += 1
            if r["status"] == "failed" and (m := _mistake(r["message"])):
                mistakes[(r["exercise"], m)] += 1
                who.setdefault((r["exercise"], m), set()).add(r["learner"])
        if r["status"] in ERRORS:  # the same error of many learners is one line
            where = r["notebook"].rsplit("/", 1)[-1] or "the submission"
            errors.setdefault(f"{where}: {r['message'][:160]}", []).append(r["learner"])
    lines = [f"# Grades: {meta.get('csv', '')}", "",
             f"{meta.get('learners', 0)} learners, graded in {meta.get('seconds', 0):.0f} s "
             f"with {meta.get('jobs', 1)} jobs. Sandbox: {meta.get('sandbox', '')}.", "",
             "## Pass rate per exercise", "",
             "| exercise | passed | failed | not attempted | delegated | missing | "
             "notebook error | pass rate |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for ex, c in exercises.items():
        total = sum(c.values())
        lines.append(f"| {ex} | {c['passed']} | {c['failed']} | {c['not attempted']} | "
                     f"{c['delegated']} | {c['missing']} | {c['notebook error']} | "
                     f"{100 * c['passed'] / total:.0f}% |")
    lines += ["", "## Most common diagnosed mistakes", ""]
    if mistakes:
        for (ex, m), n in mistakes.most_common(TOP):
            lines.append(f"- **{ex}**, {n} learner{'s' if n > 1 else ''}: {_cell(m)}")
    else:
        lines.append("None: no failed check named a likely mistake.")
    lines += ["", "## Learners with errors", ""]
    if errors:
        for error, learners in sorted(errors.items(), key=lambda e: -len(set(e[1])))[:TOP]:
            names = list(dict.fromkeys(learners))
            who_ = ", ".join(f"**{n}**" for n in names[:6]) + \
                (f" and {len(names) - 6} more" if len(names) > 6 else "")
            lines.append(f"- {who_}: {_cell(error)}")
        if len(errors) > TOP:
            lines.append(f"- and {len(errors) - TOP} other errors: see the CSV.")
    else:
        lines.append("None.")
    return "\n".join(lines) + "\n"


def write_report(path: Path, rows: list[dict], meta: dict) -> None:
    atomic_write_text(path, report(rows, meta))
