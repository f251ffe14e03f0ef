"""Grading a class: every learner judged in a sandbox (`xenith_edu.grader`), each learner's
rows journaled as soon as they are known, and the class ended as a course (course.py).

`grade` reads the class (the submissions, the teacher's exercises, the written questions), runs
`jobs` sandboxes at a time, keeps the journal that --resume reads and the shards' facts, and
hands the rows to the course: points, totals, the report, feedback and LMS files.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import queue
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..exercises import SPECS
from ..grader import roster, sandbox, statuses
from ..grader.judging import CALL_TIME, DEFAULT_TIMEOUT, Options, case_seed, grade_learner
from ..grader.material import material
from ..grader.names import canonical
from ..grader.roster import Exercise, submissions, teacher_exercises
from ..grader.statuses import Found, GradeRow, Row
from . import course, shards
from . import regrade as regrading
from .journal import Journal, fingerprint
from .points import read_parts

STATUSES = statuses.STATUSES
CSV_FIELDS = course.CSV_FIELDS


# ----------------------------------------------------------------------------------------------
# The class.


def _check_arguments(root: Path, out_csv: Path, timeout: object, jobs: object) -> None:
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or \
            not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive integer, got {jobs!r}")
    if not root.is_dir():
        raise ValueError(f"submissions_dir: {root} is not a folder")
    if out_csv.is_dir():
        raise ValueError(f"out_csv: {out_csv} is a folder; give a file name such as grades.csv")
    if not out_csv.parent.is_dir():
        raise ValueError(f"out_csv: the folder {out_csv.parent} does not exist")


def outputs(out_csv: Path) -> tuple[Path, Path]:
    """The journal and the report that go next to the CSV."""
    return (out_csv.with_name(out_csv.stem + ".journal.jsonl"),
            out_csv.with_name(out_csv.stem + ".md"))


def _key(teacher: list[tuple[str, list[Exercise]]], parts: list) -> str:
    """What a journal was written for: the exercises, and the written questions whose answers
    it keeps (not the points, which the course applies afresh at every run)."""
    written = [[q.id for q in p.questions] for p in parts]
    text = json.dumps([[n, [[e.id, e.fn] for e in ex]] for n, ex in teacher] +
                      ([written] if any(written) else []))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _check_seed(seed: object, shard: str | None) -> None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or
                             not 0 <= seed < 2**63):
        raise ValueError(f"seed: must be an integer from 0 to 2**63 - 1, got {seed!r}")
    if shard is not None and seed is None:
        raise ValueError("shard: give the assignment's seed (--seed S), the same for every "
                         "shard, so that every learner of the class gets the same cases")


def _check_shard(shard: str | None, seed: object, course_options: dict) -> tuple[int, int]:
    k, n = shards.parse_shard(shard)
    unknown = set(course_options) - set(course.OPTIONS)
    if unknown:
        raise TypeError(f"grade() got an unexpected keyword argument {sorted(unknown)[0]!r}")
    given = {o for o, v in course_options.items() if v not in (None, (), [])}
    if shard is not None and given:
        raise ValueError(f"{sorted(given)[0]}: a shard grades only; give the course's options "
                         "to grade-merge, which joins the shards")
    _check_seed(seed, shard)
    return k, n


def _the_class(root: Path, out_csv: Path, instructor: Path | None, feedback: object
               ) -> tuple[list, list, list]:
    """The submissions (the grader's own files skipped), the teacher's exercises, the parts."""
    mine = [out_csv, *outputs(out_csv), *course.outputs(out_csv).values()]
    skip = {Path(p).resolve() for p in mine + ([feedback] if feedback is not None else [])}
    entries = submissions(root, skip)
    teacher = teacher_exercises(instructor, entries)
    return entries, teacher, read_parts(instructor, teacher)


def grade(submissions_dir: Path, out_csv: Path, timeout: float | None = DEFAULT_TIMEOUT, *,
          instructor: Path | None = None, jobs: int | None = None, resume: bool = False,
          memory: int | None = None, seed: int | None = None, progress: bool | None = None,
          call_time: float = CALL_TIME, shard: str | None = None, regrade: object = None,
          **course_options) -> list[dict]:
    """Grade every submission in `submissions_dir`; write the CSV, its journal, a report, the
    totals and the other files of the course (see `course.finish`).

    The exercises come from the teacher's notebooks (`instructor`: a notebook or a folder;
    default the book's chapter notebooks that the class handed in). A learner is a notebook
    `alice.ipynb` in `submissions_dir`, or a folder `bob/` whose notebooks are matched to the
    teacher's by file name. Each learner's notebooks run in one sandbox (see `sandbox.py`),
    `timeout` seconds per notebook (None: DEFAULT_TIMEOUT), `jobs` learners at a time (default
    the number of cores), `memory` bytes of address space (default 2 GiB). Each learner's rows
    go to the journal as soon as they are known; with `resume`, the learners already in the
    journal (and unchanged) are kept, not run again. The CSV is written atomically once every
    sandbox has ended. `seed` is the assignment's case seed: every learner gets the same hidden
    cases, drawn from it, the teacher's notebook and the exercise (default: a fresh random seed,
    kept in the journal for --resume; shards must all give the same one). `call_time` bounds, in
    seconds, one exercise's calls of the learner's function. `progress` prints a line per
    learner on stderr (None: when stderr is a terminal). `shard` "K/N" grades the K-th of N
    slices of the class and writes only its journal and facts, for `grade_merge`. The course's
    options (each checked before anything runs): `roster` (CSV: id, name, email, ...),
    `timestamps` (CSV: id, submitted), `written` (the filled sheet of written answers),
    `feedback` (a folder), `export` (("canvas", "moodle")), `deadline`, `late_cutoff` (ISO 8601)
    `late_penalty` (a fraction per day late), `late_rule` ("earned", "possible"), `extensions`,
    `overrides` (CSVs). `regrade` ("alice,bob"): grade them again, keep the others.
    """
    from ..booktools.student import _as_path  # the one check of a path argument

    root, out_csv = _as_path(submissions_dir, "submissions_dir"), _as_path(out_csv, "out_csv")
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    jobs = jobs if jobs is not None else (os.cpu_count() or 1)
    _check_arguments(root, out_csv, timeout, jobs)
    k, n = _check_shard(shard, seed, course_options)
    instructor = None if instructor is None else _as_path(instructor, "instructor")
    journal_path, files, started = outputs(out_csv)[0], course.outputs(out_csv), time.monotonic()
    entries, teacher, parts = _the_class(root, out_csv, instructor,
                                         course_options.get("feedback"))
    named = set() if regrade is None else regrading.named(regrade, entries, journal_path)
    facts = [course.entry_of(i, e) for i, e in enumerate(entries)]
    pol = course.from_options(course_options, facts, parts, files["written"])
    journal, options = _setup(journal_path, (teacher, parts, instructor), resume or bool(named),
                              seed, Options(float(timeout), float(call_time), _limits(memory)),
                              named)
    progress = sys.stderr.isatty() if progress is None else progress
    mine = shards.select(len(entries), k, n)
    graded = _run_class([entries[i] for i in mine], teacher, options, journal, jobs, progress)
    base = {facts[i].key: rows for i, (rows, _) in zip(mine, graded, strict=True)}
    for i, (_, found) in zip(mine, graded, strict=True):
        facts[i].answers = found
    meta = {"learners": len(entries), "jobs": jobs, "seconds": time.monotonic() - started,
            "sandbox": sandbox.isolation(), "journal": shards.digest(journal_path),
            "class": _identity(entries, instructor, teacher, options)}
    shards.write_facts(files["course"], _key(teacher, parts), (k, n), len(entries), parts,
                       [facts[i] for i in mine], meta)
    if shard is not None:
        fields = ("learner", "notebook", "exercise", "status", "message", "mistake")
        return [dict(zip(fields, r, strict=True)) for rows, _ in graded for r in rows]
    return course.finish(out_csv, facts, base, parts, pol, meta)


def _identity(entries: list, instructor: Path | None, teacher: list, options: Options) -> str:
    names = {name for name, _ in teacher}
    files = [p for p in roster.teacher_files(instructor) if p.name in names]
    given = {"timeout": options.timeout, "call_time": options.call_time, "seed": options.seed,
             "limits": options.limits.as_dict(), "checks": options.checks}
    return shards.class_identity(entries, files, given)


def _limits(memory: object) -> sandbox.Limits:
    return sandbox.Limits() if memory is None else sandbox.Limits(memory=int(memory))


def _setup(path: Path, course_of: tuple, resume: bool, seed: int | None, options: Options,
           named: set[str]) -> tuple[Journal, Options]:
    """The journal (which keeps the assignment's seed; `named`: the learners graded again)
    and the grading options."""
    teacher, parts, instructor = course_of
    sandbox.check_works()
    if not sandbox.bwrap():
        print(f"xenith-edu grade: {sandbox.WARNING}", file=sys.stderr, flush=True)
    journal = Journal(path, _key(teacher, parts), resume, seed, named)
    options.seed, options.parts = int(journal.seed), parts
    options.checks = regrading.checks(teacher, SPECS,
                                    lambda nb, ex: case_seed(options.seed, nb, ex))
    options.material = material(roster.teacher_sources(instructor, teacher))
    return journal, options


def _kept(record: dict) -> tuple[list[tuple], dict]:
    """The rows and written answers of a learner kept from the journal."""
    kept = record.get("answers")
    return [GradeRow(*r) for r in record["rows"]], kept if isinstance(kept, dict) else {}


def _graded(learner: str, source: Path, teacher: list, options: Options, slot: int,
            fonts: list) -> tuple[list[tuple], dict]:
    """`grade_learner`, or one row if this submission could not be graded: one learner never
    stops the class (the row is not journaled, so --resume tries again)."""
    try:
        return grade_learner(learner, source, teacher, options, slot, fonts)
    except (MemoryError, RecursionError) as exc:  # this learner's, never the class's failure
        why = f"[over the limit] not graded: the grader ran out of {type(exc).__name__[:-5]}"
        return [Found("", "", Row.OVER_LIMIT, why.replace("Recursion", "recursion depth")
                 .replace("Memory", "memory"), "")], {}
    except (OSError, ValueError, RuntimeError) as exc:
        why = roster.display(f"{type(exc).__name__}: {exc}")[:300]
        return [Found("", "", Row.NOTEBOOK_ERROR, f"the grader could not grade this submission "
                 f"({why}); --resume tries again", "")], {"retry": True}


def _sandboxed(learner: str, source: Path, part: list, options: Options, pool: tuple
               ) -> tuple[list[GradeRow], dict, dict, float]:
    """One learner graded on the exercises of `part` in a sandbox of `pool` (slots, fonts):
    (rows, written answers, seeds, seconds)."""
    slots, fonts = pool
    slot, t0 = slots.get(), time.monotonic()
    try:
        found, seeds = _graded(learner, source, part, options, slot, fonts)
    finally:
        slots.put(slot)
    prefix = f"{canonical(roster.display(source.name))}/" if source.is_dir() else ""
    if sandbox.ABORT.is_set():
        raise KeyboardInterrupt  # its sandbox was ended: not a grade
    return [GradeRow(learner, prefix + nb if nb else "", ex, st, msg, mistake)
            for nb, ex, st, msg, mistake in found], seeds.pop("answers", {}), \
        seeds, round(time.monotonic() - t0, 2)


def _run_class(entries: list, teacher: list, options: Options, journal: Journal, jobs: int,
               progress: bool) -> list[tuple[list[tuple], dict]]:
    """Every learner's rows and written answers, in the folder's order; `jobs` sandboxes at a
    time."""
    slots: queue.Queue[int] = queue.Queue()
    for k in range(jobs):
        slots.put(k)
    fonts, count, lock = sandbox.font_cache(), {"done": 0}, threading.Lock()

    def one(entry: tuple[str, Path | None, str]) -> tuple[list[tuple], dict]:
        learner, source, problem = entry
        key = source.name if source is not None else learner
        if source is None:
            rows = [Found("", "", problem.status, problem.text, "")]
        else:
            stamp = fingerprint(source)
            record = journal.done(key, stamp)
            changed = regrading.what_changed(record, key, journal, options.checks)
            if changed == set():
                return _kept(record)

            def run(part: list) -> tuple[list[GradeRow], dict, dict, float]:
                return _sandboxed(learner, source, part, options, (slots, fonts))

            rows, found, seeds, seconds = regrading.partly(run, teacher, record, changed)
            if not seeds.pop("retry", False):  # else not journaled: --resume grades it again
                journal.append({"learner": key, "fingerprint": stamp, "rows": rows,
                                "seeds": seeds, "answers": found, "seconds": seconds,
                                "checks": options.checks})
            return rows, found
        return [GradeRow(learner, *r) for r in rows], {}

    def tracked(entry):
        rows, found = one(entry)
        if progress:
            with lock:
                count["done"] += 1
                passed = sum(1 for r in rows if r[3] == Row.PASSED)
                print(f"graded {entry[0]} ({count['done']} of {len(entries)}): {passed} of "
                      f"{sum(1 for r in rows if r[2])} passed", file=sys.stderr, flush=True)
        return rows, found

    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        done = list(pool.map(tracked, entries))
        journal.tally.print() if journal.resumed else None  # who was graded again, and why
        return done
    except KeyboardInterrupt:
        sandbox.stop_all()
        print(f"xenith-edu grade: interrupted; {journal.path.name} keeps the learners graded "
              "so far: run the same command with --resume to grade the others",
              file=sys.stderr, flush=True)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        sandbox.ABORT.clear()
