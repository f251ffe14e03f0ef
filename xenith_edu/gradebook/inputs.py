"""The teacher's course files, read as foreign input: the roster, the submission times an LMS
exports, the filled sheet of written answers, and the deadline settings.

Every reader checks the whole file before anything is graded or written. A bad file raises
ValueError with one line: the file, the row, what is wrong and what to do.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ..grader.names import canonical, finder, fold

MAX_BYTES = 128 << 20  # a roster or sheet larger than this is not one
TRIGGERS = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet takes for a formula (OWASP)


def _risky(piece: str) -> bool:
    """A piece a spreadsheet may run: a formula character first, or past any white space."""
    marks = (*TRIGGERS, "'")
    return piece.startswith(marks) or piece.lstrip().startswith(marks)


def _guard(piece: str) -> str:
    return "'" + piece if _risky(piece) else piece


def _unguard(piece: str) -> str:
    return piece[1:] if piece.startswith("'") and _risky(piece[1:]) else piece


def safe_cell(value: object) -> str:
    """A CSV cell a spreadsheet shows as text, whichever list separator it splits on: each
    piece after a `;` (the separator where `,` is the decimal mark) that starts, past spaces,
    with a formula character gets a quote (and so does one that starts with a quote, so that
    `unsafe_cell` gives back exactly what was written)."""
    text = "" if value is None else str(value)
    return ";".join(_guard(piece) for piece in text.split(";"))


def unsafe_cell(text: str) -> str:
    """The value `safe_cell` neutralised, as read back from a sheet the grader wrote."""
    return ";".join(_unguard(piece) for piece in text.split(";"))


@dataclass(frozen=True)
class Person:
    """One learner of the roster: the id that names their submission, and what an LMS needs."""

    id: str
    name: str = ""
    email: str = ""
    section: str = ""
    sis_login: str = ""
    canvas_id: str = ""


def csv_rows(path: Path, what: str, advice: str, max_bytes: int = MAX_BYTES
             ) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """The one reader of the CSV files a class's grading reads (the teacher's, the grader's
    own): the header, lower-cased, and each row with its number, after the checks of size,
    encoding, NUL bytes and CSV syntax. Each failure is one ValueError that names the file (and
    the row) and ends with `advice`, what to do."""
    try:
        if path.stat().st_size > max_bytes:
            raise ValueError(f"{path.name}: larger than {max_bytes >> 20} MiB: is this the "
                             f"{what}?")
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ValueError(f"{path.name}: not UTF-8 text: {advice}") from None
    except OSError as exc:
        raise ValueError(f"{path.name}: cannot be read ({exc.strerror}): {advice}") from None
    if "\0" in text:
        n = text[:text.index("\0")].count("\n") + 1
        raise ValueError(f"{path.name}, row {n}: a NUL byte: {advice}")
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = [h.strip().lower() for h in next(reader, [])]
        rows = [(reader.line_num, r) for r in reader]
    except csv.Error as exc:
        raise ValueError(f"{path.name}, row {reader.line_num}: not CSV ({exc}): {advice}") \
            from None
    return header, rows


def _table(path: Path, what: str, required: tuple[str, ...]) -> list[tuple[int, dict]]:
    """(row number, {column: text}) of a teacher's CSV file, its header lower-cased."""
    header, rows = csv_rows(path, what, f"save the {what} as CSV (UTF-8)")
    missing = [c for c in required if c not in header]
    if missing:
        raise ValueError(f"{path.name}, row 1: no column {missing[0]!r} in the header: the "
                         f"{what} needs the columns {', '.join(required)}")
    if len(set(header)) != len(header):
        raise ValueError(f"{path.name}, row 1: a column is named twice: name each once")
    out = []
    for n, row in rows:
        if not any(cell.strip() for cell in row):
            continue
        if len(row) > len(header):
            raise ValueError(f"{path.name}, row {n}: {len(row)} cells under a header of "
                             f"{len(header)}: quote the cells that hold a comma")
        row = row + [""] * (len(header) - len(row))  # a short row: its missing cells are blank
        cells = {h: unsafe_cell(c.strip()) for h, c in zip(header, row, strict=True)}
        for key in ("id", "learner"):  # a learner's id: its one canonical form
            if key in cells:
                cells[key] = canonical(cells[key])
        out.append((n, cells))
    return out


def _unique(path: Path, n: int, key: object, seen: set, what: str) -> None:
    if key in seen:
        raise ValueError(f"{path.name}, row {n}: {what} appears twice: keep one row of it")
    seen.add(key)


def read_roster(path: Path) -> list[Person]:
    """The roster: a CSV with an `id` column (the submission's name) and optional `name`,
    `email`, `section`, `sis_login` and `canvas_id`."""
    people, seen = [], set()
    for n, row in _table(path, "roster", ("id",)):
        if not row["id"]:
            raise ValueError(f"{path.name}, row {n}: the id is empty: give every learner the "
                             "name of their submission (alice for alice.ipynb)")
        _unique(path, n, fold(row["id"]), seen, f"the id {row['id']!r}")  # as a disk
        people.append(Person(row["id"], *(row.get(k, "") for k in
                                          ("name", "email", "section", "sis_login",
                                           "canvas_id"))))
    return people


def parse_time(text: str, where: str) -> datetime:
    """An ISO 8601 time; without an offset it is the machine's local time."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{where}: {text!r} is not an ISO 8601 time: write it as "
                         "2026-12-01T23:59 or 2026-12-01T23:59+01:00") from None
    return when.astimezone() if when.tzinfo is None else when


def read_timestamps(path: Path, learners: set[str]) -> dict[str, datetime]:
    """The submission times an LMS exports: columns `id` and `submitted` (ISO 8601)."""
    out: dict[str, datetime] = {}
    seen: set = set()
    known = finder(learners)  # an id finds its learner with or without case
    for n, row in _table(path, "timestamps file", ("id", "submitted")):
        _unique(path, n, fold(row["id"]), seen, f"the id {row['id']!r}")
        if fold(row["id"]) not in known:
            raise ValueError(f"{path.name}, row {n}: {row['id']!r} is neither a submission nor "
                             "on the roster: correct the id or remove the row")
        if row["submitted"]:
            out[known[fold(row["id"])]] = parse_time(row["submitted"], f"{path.name}, row {n}")
    return out


def read_filled(path: Path, questions: dict[str, float], learners: set[str]
                ) -> dict[tuple[str, str], tuple[float | None, str]]:
    """The teacher's filled sheet of written answers: (learner, question) -> (points or None
    when not yet graded, comment). `questions` maps each question to its points."""
    out: dict[tuple[str, str], tuple[float | None, str]] = {}
    known = finder(learners)  # an id finds its learner with or without case
    for n, row in _table(path, "sheet of written answers",
                         ("learner", "question", "points", "comment")):
        learner, question = row["learner"], row["question"]
        learner = known.get(fold(learner), learner)
        where = f"{path.name}, row {n}"
        if question not in questions:
            raise ValueError(f"{where}: no written question {question!r} in the teacher's "
                             "notebooks: keep the question column as the grader wrote it")
        if learner not in learners:
            raise ValueError(f"{where}: no learner {learner!r} in this class: keep the learner "
                             "column as the grader wrote it")
        if (learner, question) in out:
            raise ValueError(f"{where}: {learner}'s {question} appears twice: keep one row of it")
        out[(learner, question)] = (_points(row["points"], questions[question], where),
                                    row["comment"])
    return out


def _points(text: str, most: float, where: str) -> float | None:
    if not text:
        return None
    try:
        points = float(text.replace(",", "."))
    except ValueError:
        points = math.nan
    if not (math.isfinite(points) and 0 <= points <= most):
        raise ValueError(f"{where}: points {text!r}: write a number from 0 to {most:g}, or "
                         "leave the cell empty")
    return points


@dataclass(frozen=True)
class LatePolicy:
    """When work is due, and what lateness costs: `penalty` of the points per day begun late;
    nothing after `cutoff`."""

    deadline: datetime | None = None
    penalty: float = 0.0
    cutoff: datetime | None = None

    def judge(self, when: datetime | None) -> tuple[int, float, str]:
        """(days late, the factor of the points kept, the mark) of work handed in `when`."""
        if self.deadline is None or when is None or when <= self.deadline:
            return 0, 1.0, ""
        days = math.ceil((when - self.deadline).total_seconds() / 86400)
        if self.cutoff is not None and when > self.cutoff:
            return days, 0.0, f"late by {days} day{'s' if days > 1 else ''}, after the cut-off"
        return days, max(0.0, 1.0 - self.penalty * days), \
            f"late by {days} day{'s' if days > 1 else ''}"


def late_policy(deadline: str | None, penalty: float | None, cutoff: str | None
                ) -> LatePolicy:
    """The policy of the options --deadline, --late-penalty (a fraction per day), --late-cutoff."""
    if deadline is None:
        if penalty is not None or cutoff is not None:
            raise ValueError("late_penalty and late_cutoff need a deadline: give --deadline")
        return LatePolicy()
    due = parse_time(deadline, "deadline")
    if penalty is not None and (isinstance(penalty, bool) or not isinstance(penalty, int | float)
                                or not 0 <= penalty <= 1):
        raise ValueError(f"late_penalty: {penalty!r}: give the fraction of the points lost per "
                         "day late, from 0 to 1 (0.1 for 10%)")
    end = parse_time(cutoff, "late_cutoff") if cutoff is not None else None
    if end is not None and end < due:
        raise ValueError("late_cutoff: before the deadline: give a cut-off after it")
    return LatePolicy(due, float(penalty or 0.0), end)
