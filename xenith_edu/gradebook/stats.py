"""The class's statistics and what to re-teach, read from the CSV files that `grade` writes:
totals (mean, median, quartiles, a histogram), points and pass rates per item, diagnosed mistakes.

Only the files' columns are read (the grades CSV and its totals), never the grader's internals.
The class is the learners who handed in and are on the roster (or every submission, without a
roster); the absent and those on no roster are counted apart and never enter the class's figures.
"""

from __future__ import annotations

import html
import io
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..grader.statuses import STATUSES, Row
from ..tools.util import atomic_write, atomic_write_text
from .course import outputs
from .exports import csv_text, num
from .inputs import csv_rows, unsafe_cell

MAX_BYTES = 256 << 20  # a grades CSV larger than this is not one
GRADE_COLUMNS = ("learner", "exercise", "status", "points", "max_points", "mistake")
TOTAL_COLUMNS = ("learner", "submitted", "total", "maximum")
WRITTEN = (Row.GRADED.value, Row.TO_GRADE.value)  # the statuses only a written answer has
COLLISION, FAILED = Row.COLLISION.value, Row.FAILED.value  # as the CSV holds them
KNOWN = frozenset(s.value for s in STATUSES)
NO_DIAGNOSIS = "(failed, no mistake named: see each row's message)"
OFF_ROSTER = "yes, not on the roster"
ITEM_FIELDS = ("kind", "item", "learners", "passed", "pass_rate", "mean_points", "max_points",
               "to_grade")
MISTAKE_FIELDS = ("exercise", "mistake", "learners")
FIGURE_FIELDS = ("figure", "value")
FILES = ("stats.md", "stats.csv", "mistakes.csv", "figures.csv", "totals.png")


@dataclass
class Item:
    """One exercise or written question, over the class's learners."""

    id: str
    kind: str  # "exercise" or "written"
    points: dict[str, float] = field(default_factory=dict)  # learner -> points
    most: float = 0.0  # the item's points
    statuses: dict[str, Counter] = field(default_factory=dict)  # learner -> their statuses
    mistakes: dict[str, set] = field(default_factory=dict)  # mistake -> learners

    @property
    def learners(self) -> int:
        return len(self.points)

    @property
    def passed(self) -> int:
        """Learners whose every row of the item passed (a written answer: graded)."""
        good = Row.GRADED.value if self.kind == "written" else Row.PASSED.value
        return sum(1 for c in self.statuses.values() if set(c) == {good})

    def mean(self) -> float:
        return sum(self.points.values()) / self.learners if self.learners else 0.0


@dataclass
class Stats:
    """The class's figures, and the learners counted apart."""

    totals: dict[str, float]  # class learner -> total
    maximum: float
    absent: list[str]
    off_roster: dict[str, float]  # learner not on the roster -> total
    items: list[Item]

    def figures(self) -> dict[str, float]:
        """n, mean, median, quartiles (linear interpolation, numpy's default), min and max."""
        t = np.array(list(self.totals.values()), dtype=np.float64)  # (n,)
        if not len(t):
            return {"learners": 0}
        q1, median, q3 = np.percentile(t, [25, 50, 75])
        return {"learners": len(t), "mean": float(t.mean()), "median": float(median),
                "q1": float(q1), "q3": float(q3), "min": float(t.min()), "max": float(t.max())}


# ----------------------------------------------------------------------------------------------
# Reading the files: one gate per file, each bad cell one line that names the file and row.


def read_csv(path: Path, what: str, required: tuple[str, ...]) -> list[tuple[int, dict]]:
    """(row number, {column: text}) of the CSV `path` that `grade` wrote as its `what`."""
    if not path.is_file():
        why = "is not a file" if path.exists() else "does not exist"
        raise ValueError(f"{path} {why}: give the {what} that grade wrote")
    header, rows = csv_rows(path, what, f"give the {what} that grade wrote", MAX_BYTES)
    missing = [c for c in required if c not in header]
    if missing:
        raise ValueError(f"{path.name}, row 1: no column {missing[0]!r}: is this the {what} "
                         f"that grade wrote? It has the columns {', '.join(required)}")
    out = []
    for n, row in rows:
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise ValueError(f"{path.name}, row {n}: {len(row)} cells under a header of "
                             f"{len(header)}: give the {what} that grade wrote, unedited")
        out.append((n, {h: unsafe_cell(c) for h, c in zip(header, row, strict=True)}))
    return out


def _number(text: str, where: str, column: str, blank: float | None = None) -> float:
    """A cell of points: a finite number, 0 or more (`blank` stands for an empty cell)."""
    if not text.strip() and blank is not None:
        return blank
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"{where}: {column} is {text[:40]!r}: a number of points, 0 or more, "
                         "is expected (give the file that grade wrote, unedited)")
    return x


class Line(NamedTuple):
    """One learner's line of the totals file, as the statistics need it."""

    submitted: str  # "yes", "no" (absent), "yes, not on the roster", "yes, name shared ..."
    total: float  # after the late policy


def read_totals(path: Path) -> tuple[dict[str, Line], float]:
    """{learner: their line} of a totals file, and its maximum."""
    out: dict[str, Line] = {}
    maximum = None
    for n, r in read_csv(path, "totals file", TOTAL_COLUMNS):
        where = f"{path.name}, row {n}"
        if r["learner"] in out:
            raise ValueError(f"{where}: the learner {r['learner'][:60]!r} appears twice: give "
                             "the totals file that grade wrote")
        most = _number(r["maximum"], where, "maximum")
        total = _number(r["total"], where, "total")
        if maximum is not None and most != maximum:
            raise ValueError(f"{where}: maximum {r['maximum']!r} differs from the rows above "
                             f"({num(maximum)}): give the totals file of one class")
        if total > most:
            raise ValueError(f"{where}: total {r['total']!r} is above the maximum "
                             f"{r['maximum']!r}: give the totals file that grade wrote")
        if not (r["submitted"] in ("yes", "no") or r["submitted"].startswith("yes, ")):
            raise ValueError(f"{where}: submitted is {r['submitted'][:40]!r}, not yes or no: "
                             "give the totals file that grade wrote")
        maximum = most
        out[r["learner"]] = Line(r["submitted"], total)
    return out, maximum or 0.0


def first_sentence(text: str) -> str:
    """A diagnosis's first sentence, on one line: what groups the learners who made it. The
    grader's own rule (up to the first full stop before a space, 160 characters at most), so
    that the CSV's `mistake` column, which it already holds, is its own key."""
    flat = " ".join(text.split())
    return re.split(r"(?<=\.)\s", flat, maxsplit=1)[0][:160]


def _items(path: Path, rows: list[tuple[int, dict]], members: set[str], known: set[str]
           ) -> list[Item]:
    """The class's items, in the CSV's order; rows of learners outside the class are skipped."""
    written = {r["exercise"] for _, r in rows if r["status"] in WRITTEN}
    items: dict[str, Item] = {}
    worth: dict[tuple[str, str], float] = {}  # (item, learner) -> the points of its rows
    for n, r in rows:
        where, lid, ex = f"{path.name}, row {n}", r["learner"], r["exercise"]
        if r["status"] not in KNOWN:
            raise ValueError(f"{where}: status {r['status'][:40]!r} is none of the grader's: "
                             "give the CSV that grade wrote, unedited")
        if r["status"] == COLLISION or not ex:
            continue  # a submission that is no learner, or a notebook's error row
        if lid not in known:
            raise ValueError(f"{where}: the learner {lid[:60]!r} is not in the totals file: "
                             "give the totals file that grade wrote with this CSV (--totals)")
        got = _number(r["points"], where, "points", blank=0.0)
        most = _number(r["max_points"], where, "max_points", blank=0.0)
        if got > most:
            raise ValueError(f"{where}: points {r['points']!r} above max_points "
                             f"{r['max_points']!r}: give the CSV that grade wrote, unedited")
        item = items.setdefault(ex, Item(ex, "written" if ex in written else "exercise"))
        worth[(ex, lid)] = worth.get((ex, lid), 0.0) + most  # two notebooks may check it
        item.most = max(item.most, worth[(ex, lid)])
        if lid not in members:
            continue
        item.points[lid] = item.points.get(lid, 0.0) + got
        item.statuses.setdefault(lid, Counter())[r["status"]] += 1
        if r["status"] == FAILED and item.kind == "exercise":
            mistake = first_sentence(r["mistake"]) or NO_DIAGNOSIS
            item.mistakes.setdefault(mistake, set()).add(lid)
    for item in items.values():  # a learner of the class without a row of it: not graded
        for lid in members - set(item.points):
            item.points[lid] = 0.0
            item.statuses[lid] = Counter({"no row": 1})
    return list(items.values())


def class_stats(grades: Path, totals: Path | None = None) -> Stats:
    """The statistics of the class graded into `grades` (its totals file: `totals`, default
    the one next to it). Raises ValueError in one line on a file grade did not write."""
    totals = outputs(grades)["totals"] if totals is None else totals
    rows = read_csv(grades, "grades CSV", GRADE_COLUMNS)
    people, maximum = read_totals(totals)
    members = {lid for lid, line in people.items() if line.submitted not in ("no", OFF_ROSTER)}
    items = _items(grades, rows, members, set(people))
    return Stats({lid: line.total for lid, line in people.items() if lid in members}, maximum,
                 [lid for lid, line in people.items() if line.submitted == "no"],
                 {lid: line.total for lid, line in people.items()
                  if line.submitted == OFF_ROSTER}, items)


# ----------------------------------------------------------------------------------------------
# Writing them.


MARKDOWN = re.compile(r"([\\`*_\[\]|~#<>])")  # what makes emphasis, code, links, cells, HTML


def _md(text: object) -> str:
    """`text` as literal Markdown on one line."""
    flat = html.escape(" ".join(str(text).split()), quote=False)
    return MARKDOWN.sub(r"\\\1", flat)


def _rate(item: Item) -> str:
    if item.kind == "written" or not item.learners:
        return ""
    return f"{item.passed / item.learners:.3f}"


def item_rows(stats: Stats) -> list[dict]:
    """stats.csv: one row per exercise and written question, over the class."""
    return [dict(zip(ITEM_FIELDS, (
        item.kind, item.id, item.learners, item.passed, _rate(item), num(item.mean()),
        num(item.most), sum(c[Row.TO_GRADE.value] > 0 for c in item.statuses.values())),
        strict=True)) for item in stats.items]


def mistake_rows(stats: Stats) -> list[dict]:
    """mistakes.csv: per exercise, each diagnosed mistake and how many learners made it."""
    return [{"exercise": item.id, "mistake": m, "learners": len(who)}
            for item in stats.items for m, who in _ranked(item)]


def _ranked(item: Item) -> list[tuple[str, set]]:
    return sorted(item.mistakes.items(), key=lambda mw: (-len(mw[1]), mw[0]))


def figure_rows(stats: Stats) -> list[dict]:
    """figures.csv: the class's figures, then the counts of the learners counted apart."""
    figs: dict[str, object] = {k: num(v) if isinstance(v, float) else v
                               for k, v in stats.figures().items()}
    figs.update({"maximum": num(stats.maximum), "absent": len(stats.absent),
                 "not_on_roster": len(stats.off_roster)})
    return [{"figure": k, "value": v} for k, v in figs.items()]


def _reteach(stats: Stats) -> list[str]:
    """The exercises, the least passed first, each with its mistakes and how many made them."""
    exercises = [i for i in stats.items if i.kind == "exercise" and i.learners]
    exercises.sort(key=lambda i: (i.passed / i.learners, i.id))
    lines = []
    for item in exercises:
        others = Counter(next(s for s in c if s != Row.PASSED.value)
                         for c in item.statuses.values() if set(c) != {Row.PASSED.value})
        lines.append(f"- **{_md(item.id)}**: {item.passed} of {item.learners} passed" + "".join(
            f", {n} {_md(s)}" for s, n in sorted(others.items(), key=lambda sn: -sn[1])))
        for m, who in _ranked(item):
            n = len(who)
            lines.append(f"  - {n} learner{'s' if n != 1 else ''}: {_md(m)}")
    return lines or ["No exercise was graded for the class."]


def report(stats: Stats) -> str:
    """stats.md: the class's figures, the table per item, what to re-teach, who is apart."""
    figs = stats.figures()
    lines = ["# The class's statistics", ""]
    if figs["learners"]:
        lines += [f"{figs['learners']} learners handed in (the class). Totals, of "
                  f"{num(stats.maximum)} points: mean {num(figs['mean'])}, median "
                  f"{num(figs['median'])}, quartiles {num(figs['q1'])} and {num(figs['q3'])}, "
                  f"lowest {num(figs['min'])}, highest {num(figs['max'])}.", "",
                  "![The class's totals](totals.png)"]
    else:
        lines.append("No learner of the class handed anything in: no figures.")
    lines += ["", "## Points and pass rate per exercise and written question", "",
              "| item | kind | learners | passed | pass rate | mean points | of |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in item_rows(stats):
        rate = f"{100 * float(r['pass_rate']):.0f}%" if r["pass_rate"] else \
            f"{r['passed']} graded, {r['to_grade']} to grade"
        lines.append(f"| {_md(r['item'])} | {r['kind']} | {r['learners']} | {r['passed']} | "
                     f"{rate} | {r['mean_points']} | {r['max_points']} |")
    lines += ["", "## What to re-teach", "",
              "The exercises, the least passed first, with each diagnosed mistake and how many "
              "learners made it.", "", *_reteach(stats), "", "## Counted apart", ""]
    lines.append(f"- Absent (not submitted): {len(stats.absent)}" +
                 (": " + ", ".join(_md(a) for a in stats.absent) if stats.absent else ""))
    lines.append(f"- Not on the roster (graded, not in the class's figures): "
                 f"{len(stats.off_roster)}" + (": " + ", ".join(
                     f"{_md(k)} ({num(v)})" for k, v in stats.off_roster.items())
                     if stats.off_roster else ""))
    return "\n".join(lines) + "\n"


def histogram(stats: Stats) -> bytes:
    """totals.png: the histogram of the class's totals, from 0 to the maximum (Agg, no pyplot)."""
    from matplotlib.figure import Figure  # only when the figure is drawn
    from matplotlib.ticker import MaxNLocator  # with the figure (above)

    fig = Figure(figsize=(6.4, 3.6), dpi=100)
    ax = fig.add_subplot()
    top = stats.maximum if stats.maximum > 0 else 1.0
    ax.hist(list(stats.totals.values()), bins=np.linspace(0.0, top, 11).tolist(), range=(0.0, top),
            color="#4c72b0", edgecolor="white")
    figs = stats.figures()
    if figs["learners"]:
        ax.axvline(figs["mean"], color="#c44e52", label=f"mean {num(figs['mean'])}")
        ax.axvline(figs["median"], color="#55a868", ls="--",
                   label=f"median {num(figs['median'])}")
        ax.legend(loc="upper left")
    ax.set_xlim(0.0, top)
    ax.set_xlabel(f"total points (of {num(stats.maximum)})")
    ax.set_ylabel("learners")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"{figs['learners']} learners; apart: {len(stats.absent)} absent, "
                 f"{len(stats.off_roster)} not on the roster", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def write_stats(grades: Path, out: Path, totals: Path | None = None) -> Stats:
    """Read the class graded into `grades` and write FILES into the folder `out`."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"out: {out} is a file: give a folder for the statistics")
    stats = class_stats(grades, totals)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "stats.csv", csv_text(ITEM_FIELDS, item_rows(stats)))
    atomic_write_text(out / "mistakes.csv", csv_text(MISTAKE_FIELDS, mistake_rows(stats)))
    atomic_write_text(out / "figures.csv", csv_text(FIGURE_FIELDS, figure_rows(stats)))
    png = histogram(stats)

    def write_png(f) -> None:
        f.write(png)

    atomic_write(out / "totals.png", write_png)
    atomic_write_text(out / "stats.md", report(stats))
    return stats
