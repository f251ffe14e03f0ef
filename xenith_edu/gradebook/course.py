"""A course, not only a grader: the graded rows become points, totals per learner and chapter,
late marks, the roster's absentees, the written answers, feedback and the LMS's import files.

Grading (grading.py) learns the facts: the teacher's parts, each submission's rows, time and
written answers. `finish` turns the facts and the teacher's policy into every file; a single
run and the merge of shards (shards.py) both end here, so their files are the same.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from ..grader.names import escape_controls, fold
from ..grader.roster import COLLISION
from ..grader.statuses import Row
from . import late as lateness
from . import overrides as override
from .exports import check_exports, csv_text, exported, num, write_exports
from .feedback import write_feedback
from .inputs import LatePolicy, Person, late_policy, read_roster, read_timestamps
from .outfiles import write_text
from .points import Part
from .report import write_report
from .written import key_path, read_key, read_sheet, write_sheet
from .written import note as untouched

CSV_FIELDS = ("learner", "notebook", "exercise", "status", "points", "max_points", "late",
              "message", "mistake")  # mistake: the check's first diagnosis, as data
TOTAL_FIELDS = ("learner", "name", "email", "submitted", "late", "total", "maximum", "percent")
EXPORTS = ("canvas", "moodle")
OPTIONS = ("roster", "timestamps", "written", "feedback", "export", "deadline", "late_penalty",
           "late_cutoff", "late_from_mtime", "late_rule", "extensions", "overrides"
           )  # the course's options of grade() and grade_merge()
# the totals' columns that only a course using them has: the late deduction (a deadline), each
# learner's extended deadline (extensions), the teacher's overrides
DEDUCTION, EXTENDED, OVERRIDES = "deduction", "extended deadline", "overrides"
# where a submission's time comes from: the one source the teacher stated
FROM_TIMESTAMPS, FROM_MTIME = "by the LMS's timestamps", "by the file's modification time"


@dataclass
class Entry:
    """One submission as the course records it (what a shard hands to the merge)."""

    learner: str
    key: str  # its name in the submissions folder: alice.ipynb, bob
    index: int  # its place in the whole class, the folder's order
    folder: bool = False
    time: float | None = None  # its modification time (seconds since the epoch)
    problem: str = ""  # why it was not graded (not a notebook, a link)
    status: str = Row.NOTEBOOK_ERROR  # the row's status when it was not graded
    answers: dict = field(default_factory=dict)  # teacher's notebook -> {question: answer}


@dataclass
class Learner:
    """One line of the totals: a roster's learner, a submission, or both."""

    id: str
    entry: Entry | None
    person: Person | None
    note: str = ""  # "not on the roster", "name shared with another submission"


@dataclass
class Policy:
    """What the teacher decided: the roster, the late policy, the times, the filled sheet."""

    roster: list[Person] | None = None
    late: LatePolicy = field(default_factory=LatePolicy)
    times: dict[str, datetime] = field(default_factory=dict)  # from a timestamps file
    filled: dict = field(default_factory=dict)  # (learner, question) -> (points, comment)
    feedback: Path | None = None
    export: tuple[str, ...] = ()
    source: str = ""  # FROM_TIMESTAMPS, FROM_MTIME, or "" (no deadline: nobody is late)
    key: dict = field(default_factory=dict)  # the written sheet's key: sheet id -> learner
    rule: str = "earned"  # late.RULES: a day late costs a percentage of which points
    extensions: dict[str, datetime] = field(default_factory=dict)  # learner -> own deadline
    overrides: dict = field(default_factory=dict)  # (learner, item) -> overrides.Override

    def lateness(self, learner: Learner) -> LatePolicy:
        """The late policy of `learner`: the class's, with their extension if any."""
        return lateness.for_learner(self.late, self.extensions.get(learner.id))


def outputs(out_csv: Path) -> dict[str, Path]:
    """The course's files next to the CSV."""
    return {k: out_csv.with_name(f"{out_csv.stem}.{k}.{ext}") for k, ext in
            (("totals", "csv"), ("written", "csv"), ("canvas", "csv"), ("moodle", "csv"),
             ("course", "json"))}


def _ids(entries: list[Entry]) -> dict[str, str]:
    """Each entry's learner id; learners of the same name are told apart, not merged."""
    count: dict[str, int] = {}
    for e in entries:
        count[e.learner] = count.get(e.learner, 0) + 1
    return {e.key: (e.key + ("/" if e.folder else "")) if count[e.learner] > 1 else e.learner
            for e in entries}


def learners(entries: list[Entry], roster: list[Person] | None,
             collided: set[str] = frozenset()) -> list[Learner]:
    """The class: the roster's learners in its order, then the submissions it does not name.

    `collided`: the names that several submissions would share (the walk grades them apart,
    under their file names, `dup.ipynb` and `dup/`), whose entries say so in a note."""
    ids = _ids(entries)
    shared = {e.learner for e in entries if ids[e.key] != e.learner
              or e.learner.removesuffix("/").removesuffix(".ipynb") in collided}
    by_id = {fold(ids[e.key]): (ids[e.key], e) for e in entries}  # as a disk ignores case
    out = []
    for p in roster or []:
        out.append(Learner(p.id, by_id.pop(fold(p.id), (None, None))[1], p))
    for lid, e in by_id.values():
        note = "name shared with another submission" if e.learner in shared else \
            ("not on the roster" if roster is not None else "")
        out.append(Learner(lid, e, None, note))
    return out


def policy(roster: Path | None, late: LatePolicy, timestamps: Path | None,
           sheets: list[Path], entries: list[Entry], parts: list[Part],
           feedback: Path | None = None, export: tuple[str, ...] = (),
           key: dict | None = None) -> Policy:
    """The policy, every file of it read and checked now: before anything is graded."""
    people = read_roster(roster) if roster is not None else None
    klass = learners([e for e in entries if e.status != COLLISION], people)
    ids = {p.id for p in klass}  # the one id of each learner, which the files' ids find
    times = read_timestamps(timestamps, ids) if timestamps is not None else {}
    questions = {q.id: q.points for part in parts for q in part.questions}
    filled: dict = {}
    for sheet in sheets:  # the sheet written last time, then the one the teacher gives
        filled.update(read_sheet(sheet, questions, ids, key or {}))
    export = check_exports(export, exported(klass))  # each file's one identifier, now
    if feedback is not None and feedback.exists() and not feedback.is_dir():
        raise ValueError(f"feedback: {feedback} is a file: give a folder for the feedback")
    return Policy(people, late, times, filled, feedback, tuple(dict.fromkeys(export)),
                  key=key or {})


def adjustments(pol: Policy, given: dict, paths: dict, entries: list[Entry],
                parts: list[Part]) -> None:
    """The late rule, the extensions (a file, the roster's column) and the overrides, read
    and checked now, into `pol`: before anything is graded."""
    ids = set(_ids(entries).values()) | {p.id for p in pol.roster or []}
    pol.rule = lateness.check_rule(given.get("late_rule"), pol.late)
    due = pol.late.deadline
    from_roster = lateness.read_extensions(paths["roster"], ids, due, roster=True) \
        if paths["roster"] is not None else {}
    from_file = lateness.read_extensions(paths["extensions"], ids, due) \
        if paths["extensions"] is not None else {}
    pol.extensions = lateness.merge_extensions(from_roster, from_file)
    items = {ex: p for part in parts for ex, p in part.points.items()}
    items.update({q.id: q.points for part in parts for q in part.questions})
    if paths["overrides"] is not None:
        pol.overrides = override.read_overrides(paths["overrides"], items, ids)


# ----------------------------------------------------------------------------------------------
# Rows and totals.


def _absent_rows(lid: str, parts: list[Part]) -> list[tuple]:
    return [(lid, "", ex, Row.NOT_SUBMITTED, "nothing was handed in", "") for part in parts
            for ex in part.points]


def _written_rows(learner: Learner, parts: list[Part], filled: dict) -> list[tuple]:
    rows = []
    for part in parts:
        for q in part.questions:
            if learner.entry is None:
                rows.append((learner.id, "", q.id, Row.NOT_SUBMITTED, "nothing was handed in",
                             ""))
                continue
            points, comment = filled.get((learner.id, q.id), (None, ""))
            answer = learner.entry.answers.get(part.notebook, {}).get(q.id)
            status = Row.GRADED if points is not None else Row.TO_GRADE
            note = comment or ("" if points is not None else untouched(answer, q.stub))
            rows.append((learner.id, part.notebook, q.id, status, note, ""))
    return rows


def class_rows(people: list[Learner], base: dict[str, list[tuple]], parts: list[Part],
               pol: Policy) -> list[dict]:
    """Every row of the CSV: the graded rows with points and late marks, the absentees'
    rows, and the written answers'."""
    worth = {ex: p for part in parts for ex, p in part.points.items()}
    asked = {q.id: q.points for part in parts for q in part.questions}
    out = []
    for learner in people:
        e = learner.entry
        if e is None:
            found = _absent_rows(learner.id, parts)
        elif e.problem:
            found = [(learner.id, "", "", e.status, e.problem, "")]
        else:
            found = [(learner.id, *r[1:]) for r in base[e.key]]
        found += _written_rows(learner, parts, pol.filled)
        found += _unmatched_overrides(learner.id, found, pol)
        mark = _mark(lateness.lost(pol.lateness(learner), _when(learner, pol))[1], pol)
        for lid, nb, ex, status, message, mistake in found:
            most = asked[ex] if ex in asked else worth.get(ex)
            got = _got(status, most, pol.filled.get((lid, ex)))
            status = str(getattr(status, "value", status))  # a Status, or a text
            if (lid, ex) in pol.overrides and most is not None:  # the teacher's word wins
                got = pol.overrides[(lid, ex)].points
                message = override.message(pol.overrides[(lid, ex)], status, message)
            out.append(dict(zip(CSV_FIELDS, (lid, nb, ex, status, "" if most is None else
                                            num(got), "" if most is None else num(most),
                                            mark, message, mistake), strict=True)))
    return out


def _unmatched_overrides(lid: str, found: list[tuple], pol: Policy) -> list[tuple]:
    """A row for each override of an item the learner has no row of (a submission that was
    not graded): the override still counts."""
    have = {r[2] for r in found}
    return [(lid, "", item, Row.GRADED, "", "") for (who, item) in pol.overrides
            if who == lid and item not in have]


def _got(status: str, most: float | None, filled: tuple | None) -> float:
    if most is None:
        return 0.0
    if status == Row.PASSED:
        return most
    if status == Row.GRADED and filled is not None:
        return float(filled[0])
    return 0.0


def _when(learner: Learner, pol: Policy) -> datetime | None:
    """The submission's time from the one source the teacher stated, never another."""
    if pol.source == FROM_TIMESTAMPS:
        return pol.times.get(learner.id)
    if pol.source == FROM_MTIME and learner.entry is not None and \
            learner.entry.time is not None:
        return datetime.fromtimestamp(learner.entry.time).astimezone()
    return None


def _mark(mark: str, pol: Policy) -> str:
    """A late mark says which source judged it."""
    return f"{mark}, {pol.source}" if mark else ""


def untimed(people: list[Learner], pol: Policy) -> list[str]:
    """The learners who handed work in but whom the timestamps file leaves without a time:
    reported, with a warning, and not judged late."""
    if pol.source != FROM_TIMESTAMPS:
        return []
    return [p.id for p in people if p.entry is not None and p.id not in pol.times]


def totals(people: list[Learner], rows: list[dict], parts: list[Part], pol: Policy
           ) -> list[dict]:
    """One line per learner: the total after the late policy, the maximum, the percent, and
    a subtotal per chapter (each of the teacher's notebooks)."""
    part_of = {ex: part.chapter for part in parts for ex in [*part.points,
                                                              *(q.id for q in part.questions)]}
    raw: dict[str, dict[str, float]] = {p.id: {part.chapter: 0.0 for part in parts}
                                        for p in people}
    for r in rows:
        if r["points"]:
            raw[r["learner"]][part_of[r["exercise"]]] += float(r["points"])
    possible = {part.chapter: sum(part.points.values()) + sum(q.points for q in part.questions)
                for part in parts}
    maximum = sum(possible.values())
    out = []
    for p in people:
        fraction, mark = lateness.lost(pol.lateness(p), _when(p, pol))
        cut = {ch: lateness.deduction(pol.rule, fraction, v, possible[ch])
               for ch, v in raw[p.id].items()}  # per chapter: each is the LMS's assignment
        subs = {ch: v - cut[ch] for ch, v in raw[p.id].items()}
        total = sum(subs.values())
        line = {"learner": p.id, "name": p.person.name if p.person else "",
                "email": p.person.email if p.person else "",
                "submitted": "no" if p.entry is None else ("yes" if not p.note else
                                                           f"yes, {p.note}"),
                "late": _mark(mark, pol), "total": num(total), "maximum": num(maximum),
                "percent": f"{100 * total / maximum:.1f}" if maximum else "0.0"}
        line.update({ch: num(v) for ch, v in subs.items()})
        line.update(_adjusted(p, pol, sum(raw[p.id].values()), (fraction, sum(cut.values()))))
        out.append(line)
    return out


def columns(pol: Policy) -> list[str]:
    """The totals' optional columns this course has (see DEDUCTION)."""
    return [c for c, used in ((DEDUCTION, pol.late.deadline is not None),
                              (EXTENDED, bool(pol.extensions)),
                              (OVERRIDES, bool(pol.overrides))) if used]


def _adjusted(p: Learner, pol: Policy, earned: float, late: tuple[float, float]
              ) -> dict[str, str]:
    """A totals line's optional columns, and the points earned and the rule (which the
    feedback page itemizes; not columns). `late`: (the fraction lost, the deduction)."""
    due = pol.extensions.get(p.id)
    mine = {item: o for (who, item), o in pol.overrides.items() if who == p.id}
    fraction, cut = late
    line = {"earned": num(earned),
            "rule": f"{num(100 * fraction)}% {lateness.RULE_WORDS[pol.rule]}"}
    if pol.late.deadline is not None:
        line[DEDUCTION] = num(cut)
    if pol.extensions:
        line[EXTENDED] = "" if due is None else due.isoformat(timespec="minutes")
    if pol.overrides:
        line[OVERRIDES] = override.summary(mine)
    return line


# ----------------------------------------------------------------------------------------------
# The files.


def finish(out_csv: Path, entries: list[Entry], base: dict[str, list[tuple]],
           parts: list[Part], pol: Policy, meta: dict) -> list[dict]:
    """Write the CSV, the totals, the report, the written sheet, the feedback and the exports;
    return the CSV's rows."""
    # a name collision is a row of the CSV and a note, not a learner of the totals or the LMS
    collided = [e for e in entries if e.status == COLLISION]
    people = learners([e for e in entries if e.status != COLLISION], pol.roster,
                      {e.learner for e in collided})
    rows = class_rows(people, base, parts, pol)
    rows += [dict(zip(CSV_FIELDS, (e.learner, "", "", e.status, "", "", "", e.problem, ""),
                      strict=True)) for e in collided]
    lines = totals(people, rows, parts, pol)
    missing = untimed(people, pol)
    if missing:
        print(f"xenith-edu grade: warning: {len(missing)} learner(s) handed work in but have no "
              f"time in the timestamps file, and are not judged late: "
              f"{', '.join(map(escape_controls, missing[:10]))}", file=sys.stderr, flush=True)
    meta = {**meta, "untimed": missing, "source": pol.source}
    files = outputs(out_csv)
    write_text(out_csv, csv_text(CSV_FIELDS, rows))
    fields = [*TOTAL_FIELDS, *columns(pol), *(p.chapter for p in parts)]
    write_text(files["totals"], csv_text(fields, [{k: t[k] for k in fields} for t in lines]))
    if any(part.questions for part in parts):  # the anonymous sheet, and its key apart
        write_sheet(files["written"], people, parts, pol.filled, pol.key, meta.get("class"))
    questions = [q.id for part in parts for q in part.questions]
    write_report(out_csv.with_name(out_csv.stem + ".md"), rows,
                 {**meta, "csv": out_csv.name, "questions": questions}, people, lines)
    write_exports(files, pol.export, people, lines, parts)
    if pol.feedback is not None:
        write_feedback(pol.feedback, people, rows, lines, parts)
    return rows


def entry_time(source: Path) -> float | None:
    """A submission's time: its modification time, the latest of a folder's notebooks."""
    from ..grader.roster import learner_notebooks  # the one walk of a learner's folder

    try:
        if not source.is_dir():
            return os.lstat(source).st_mtime
        times = [os.lstat(source / rel).st_mtime for rel in learner_notebooks(source)]
        return max(times) if times else os.lstat(source).st_mtime
    except OSError:
        return None


def entry_of(i: int, entry: tuple[str, Path | None, str]) -> Entry:
    learner, source, problem = entry
    if source is None:  # a key no file name can have: "/" never stands in one
        status, text = problem if problem else (Row.NOTEBOOK_ERROR, "not graded")
        return Entry(learner, f"/{learner}", i, problem=text, status=status)
    return Entry(learner, source.name, i, source.is_dir(), entry_time(source))


def from_options(given: dict, entries: list, parts: list, sheet: Path) -> Policy:
    """The teacher's course options, every file read and checked now, before any grading."""
    from ..booktools.student import _as_path  # the one check of a path argument

    unknown = set(given) - set(OPTIONS)
    if unknown:
        raise TypeError(f"unexpected keyword argument {sorted(unknown)[0]!r}")
    path = {k: None if given.get(k) is None else _as_path(given[k], k)
            for k in ("roster", "timestamps", "written", "feedback", "extensions", "overrides")}
    sheets = [p for p in (sheet if sheet.is_file() else None, path["written"])
              if p is not None]
    late = late_policy(given.get("deadline"), given.get("late_penalty"), given.get("late_cutoff"))
    export = given.get("export") or ()
    export = (export,) if isinstance(export, str) else tuple(export)
    pol = policy(path["roster"], late, path["timestamps"], list(dict.fromkeys(sheets)),
                 entries, parts, path["feedback"], export, read_key(key_path(sheet)))
    pol.source = time_source(late, path["timestamps"], given.get("late_from_mtime"))
    adjustments(pol, given, path, entries, parts)
    return pol


def time_source(late: LatePolicy, timestamps: Path | None, from_mtime: object) -> str:
    """The one source of the submission times: the LMS's timestamps, or the files'
    modification times when the teacher asks for them (a learner or an archive sets those)."""
    if from_mtime not in (None, False, True):
        raise TypeError(f"late_from_mtime must be True or False, got {from_mtime!r}")
    if from_mtime and timestamps is not None:
        raise ValueError("late_from_mtime: give one source of the submission times, "
                         "--timestamps or --late-from-mtime, not both")
    if late.deadline is None:
        return ""
    if timestamps is None and not from_mtime:
        raise ValueError("deadline: say where the submission times come from: --timestamps "
                         "CSV (the LMS's export), or --late-from-mtime (the files' "
                         "modification times, which a learner or an archive can set)")
    return FROM_TIMESTAMPS if timestamps is not None else FROM_MTIME
