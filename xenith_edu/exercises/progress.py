"""Progress the learner owns: every check records, in a small JSON file in the learner's folder,
whether the exercise passed, how many attempts and how many hints it took.

The file is `xenith-edu-progress.json` in the working directory (where the notebook runs), or
the path in the environment variable XENITH_EDU_PROGRESS ("off" records nothing). It is written
atomically; a folder that cannot be written, or a damaged file, never fails a check.
`xenith-edu progress` prints the table.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import NamedTuple

from ..tools.util import atomic_write_text

# Shape legend: none; the records are counts.

PROGRESS_ENV = "XENITH_EDU_PROGRESS"
FILE_NAME = "xenith-edu-progress.json"
VERSION = 1


class Entry(NamedTuple):
    """One exercise's record."""

    exercise: str
    passed: bool  # passed at least once
    status: str  # the last verdict: "passed", "failed" or "not attempted"
    attempts: int  # checks run on an answer (not "not attempted")
    hints: int  # hints asked for


def path() -> Path | None:
    """Where progress is recorded, or None when XENITH_EDU_PROGRESS is "off"."""
    where = os.environ.get(PROGRESS_ENV, "")
    if where.strip().lower() == "off":
        return None
    return Path(where) if where else Path.cwd() / FILE_NAME


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0
    return max(0, int(value))


def read(file: Path) -> dict[str, Entry]:
    """The records in `file`; ValueError naming the file if it is not a progress file."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{file}: not a progress file ({type(e).__name__}); delete it to "
                         "start again") from None
    if not isinstance(data, dict) or not isinstance(data.get("exercises"), dict):
        raise ValueError(f"{file}: not a progress file (no \"exercises\" table); delete it to "
                         "start again")
    out = {}
    for name, rec in data["exercises"].items():
        if isinstance(name, str) and isinstance(rec, dict):
            status = rec.get("status") if isinstance(rec.get("status"), str) else ""
            out[name] = Entry(name, rec.get("passed") is True, status,
                              _count(rec.get("attempts")), _count(rec.get("hints")))
    return out


def _update(exercise: str, status: str | None = None, hint: bool = False) -> None:
    file = path()
    if file is None:
        return
    try:
        entries = read(file) if file.exists() else {}
    except (OSError, ValueError):
        entries = {}  # a damaged file is replaced by a good one
    old = entries.get(exercise, Entry(exercise, False, "", 0, 0))
    new = old._replace(hints=old.hints + int(hint))
    if status is not None:
        attempted = status != "not attempted"
        new = new._replace(status=status, passed=old.passed or status == "passed",
                           attempts=old.attempts + int(attempted))
    entries[exercise] = new
    table = {e.exercise: {"passed": e.passed, "status": e.status, "attempts": e.attempts,
                          "hints": e.hints} for e in entries.values()}
    atomic_write_text(file, json.dumps({"version": VERSION, "exercises": table}, indent=1,
                                       sort_keys=True) + "\n")


def record(exercise: str, status: str | None = None, hint: bool = False) -> None:
    """Adds a verdict (`status`) or a hint to the exercise's record; never raises."""
    try:
        _update(exercise, status, hint)
    except Exception:  # progress is a convenience: a check never fails because of it
        pass


def table(entries: dict[str, Entry], order: list[tuple[str, str]]) -> str:
    """The records as a text table, in the book's order: `order` is (chapter, exercise)."""
    rows = [("chapter", "exercise", "passed", "attempts", "hints")]
    known = {e for _, e in order}
    for chapter, name in order + [("?", n) for n in sorted(entries) if n not in known]:
        e = entries.get(name)
        if e is not None:
            rows.append((chapter, name, "yes" if e.passed else "no", str(e.attempts),
                         str(e.hints)))
    if len(rows) == 1:
        return "No exercise checked yet."
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]
    done = sum(1 for r in rows[1:] if r[2] == "yes")
    return "\n".join(lines + [f"{done} of {len(rows) - 1} checked exercises passed."])
