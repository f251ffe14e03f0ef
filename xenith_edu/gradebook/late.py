"""Lateness per learner: the deadline (an extension moves it, and the cut-off with it) and the
two rules of the late deduction, side by side in book/teaching.md's walkthrough.

`earned` (the default): the percentage of the points earned, per day begun late. `possible`
(Canvas's rule): the percentage of the points possible, capped at the points earned. After the
cut-off both take everything. A total is always the points earned minus the deduction.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

from .inputs import LatePolicy, _table, csv_rows, parse_time

RULES = ("earned", "possible")  # what a day late costs: a percentage of which points
RULE_WORDS = {"earned": "of the points earned", "possible": "of the points possible, capped at "
              "the points earned"}
EXTENSION = "extension"  # the column of an extensions file, or of the roster


def check_rule(rule: object, late: LatePolicy) -> str:
    """The late rule the teacher gave (None: `earned`); a rule needs a deadline."""
    if rule is None:
        return "earned"
    if rule not in RULES:
        raise ValueError(f"late_rule: {rule!r} is not one of {', '.join(RULES)}")
    if late.deadline is None:
        raise ValueError("late_rule needs a deadline: give --deadline")
    return str(rule)


def lost(late: LatePolicy, when: datetime | None) -> tuple[float, str]:
    """(the fraction of the rule's points lost, the mark) of work handed in `when`."""
    days, factor, mark = late.judge(when)
    return (1.0 - factor if days else 0.0), mark


def deduction(rule: str, fraction: float, earned: float, possible: float) -> float:
    """The points a late learner loses from `earned` of `possible`: never more than earned."""
    if rule == "possible":
        return min(earned, fraction * possible)
    return earned * fraction


def for_learner(late: LatePolicy, extended: datetime | None) -> LatePolicy:
    """The late policy of a learner with the deadline `extended` (None: the class's): the
    cut-off moves by as much as the deadline."""
    if extended is None or late.deadline is None:
        return late
    shift = extended - late.deadline
    return replace(late, deadline=extended,
                   cutoff=None if late.cutoff is None else late.cutoff + shift)


def _extension(text: str, deadline: datetime, where: str) -> datetime:
    """An extension: the learner's own deadline (ISO 8601), or days added ("3", "2.5 days")."""
    days = re.fullmatch(r"\s*\+?(\d+(?:[.,]\d+)?)\s*(?:d|days?)?\s*", text)
    if days:
        n = float(days.group(1).replace(",", "."))
        if not math.isfinite(n) or n > 3650:
            raise ValueError(f"{where}: {text!r}: give at most 3650 days")
        return deadline + timedelta(days=n)
    when = parse_time(text, where)
    if when < deadline:
        raise ValueError(f"{where}: {text!r} is before the deadline: an extension moves the "
                         "deadline later")
    return when


def read_extensions(path: Path, learners: set[str], deadline: datetime | None,
                    roster: bool = False) -> dict[str, datetime]:
    """Each learner's extended deadline, from an extensions file (columns id, extension) or
    the roster's optional `extension` column (`roster`): a time, or a number of days."""
    if roster:
        header, _ = csv_rows(path, "roster", "save the roster as CSV (UTF-8)")
        if EXTENSION not in header:
            return {}
    what = "roster" if roster else "extensions file"
    found: dict[str, datetime] = {}
    for n, row in _table(path, what, ("id", EXTENSION)):
        text, where = row[EXTENSION], f"{path.name}, row {n}"
        if not text:
            continue
        if deadline is None:
            raise ValueError(f"{where}: an extension needs a deadline: give --deadline")
        if row["id"] not in learners:
            raise ValueError(f"{where}: {row['id']!r} is neither a submission nor on the "
                             "roster: correct the id or remove the row")
        if row["id"] in found:
            raise ValueError(f"{where}: {row['id']!r} has a second extension: keep one")
        found[row["id"]] = _extension(text, deadline, where)
    return found


def merge_extensions(first: dict[str, datetime], second: dict[str, datetime]
                     ) -> dict[str, datetime]:
    """The roster's extensions and the file's: a learner given one in both is refused."""
    both = sorted(set(first) & set(second))
    if both:
        raise ValueError(f"extensions: {both[0]!r} has an extension in the roster and in the "
                         "extensions file: keep one")
    return {**first, **second}
