"""Grading a class: the teacher's exercises, the learners' functions called in a sandbox, and
the verdicts judged here, in the grader's own process, on cases drawn at grading time.

The teacher's notebooks say which exercises there are: each check cell `check_<id>(<fn>)`
names an exercise and the learner's function. For each learner, one sandbox runs the learner's
notebooks of the same names and calls each function on hidden random cases (varied sizes
and settings, the same for every learner: drawn from the assignment's seed); only plain arrays
and numbers come back. `judge` compares them with the package's reference here. The learner's code
can change nothing the grader uses. Before the
sandbox starts, the grader reads the written answers from its private copy of the notebooks and
empties the cells tagged skip-grading; the course (course.py) turns the rows into points.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import queue
import re
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..exercises import SPECS, InPlace, NotCallable, Opaque, Raised, judge
from . import cells, course, nbread, roster, sandbox, shards, statuses, wire
from . import regrade as regrading
from .delegation import targets
from .journal import Journal, fingerprint
from .material import material
from .names import canonical
from .points import read_parts
from .roster import Exercise, learner_notebooks, match, submissions, teacher_exercises
from .statuses import Found, GradeRow, Row

STATUSES = statuses.STATUSES
CSV_FIELDS = course.CSV_FIELDS
DEFAULT_TIMEOUT = 120.0  # seconds for one notebook's cells
CALL_TIME = 10.0  # seconds for one exercise's calls (every case and probe)


@dataclass
class Options:
    """How the class is graded (see `grade`)."""

    timeout: float = DEFAULT_TIMEOUT
    call_time: float = CALL_TIME
    limits: sandbox.Limits = field(default_factory=sandbox.Limits)
    seed: int = 0  # the assignment's case seed: every learner gets the same hidden cases
    parts: list = field(default_factory=list)  # the course's parts (points.Part): questions
    material: dict = field(default_factory=dict)  # what the teacher's cells import (material.py)
    checks: dict = field(default_factory=dict)  # "notebook/exercise" -> its check's digest


def _specs() -> dict:
    return SPECS


# ----------------------------------------------------------------------------------------------
# The request: every exercise's function and the inputs it gets, drawn now.


def case_seed(assignment: int, nb: str, ex: str) -> int:
    """The seed of an exercise's hidden cases: a function of the assignment's seed, the
    teacher's notebook and the exercise, never of the learner (same notebook, same grade)."""
    text = f"{assignment}/{nb}/{ex}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") >> 1


def build_request(learner: str, plan: list[tuple[str, str, list[Exercise]]],
                  options: Options, home: str) -> tuple[dict, list[bytes], dict]:
    """The sandbox's request, the inputs frame of each notebook (sent once its cells have
    run), and the cases kept here: {(notebook, exercise): (seed, inputs)}."""
    specs = _specs()
    notebooks, frames, kept = [], [], {}
    for i, (teacher_nb, rel, exercises) in enumerate(plan):
        entries, trees, blobs = [], [], []
        for ex in exercises:
            spec = specs[ex.id]
            seed = case_seed(options.seed, teacher_nb, ex.id)
            inputs = spec.inputs(np.random.default_rng(seed))
            kept[(teacher_nb, ex.id)] = (seed, inputs)
            entries.append({"id": ex.id, "fn": ex.fn, "targets": targets(spec)})
            trees.append([wire.encode_value(tuple(c.args), blobs) for c in inputs])
        notebooks.append({"path": f"{home}/{rel}", "exercises": entries})
        frames.append(wire.pack({"op": "inputs", "nb": i, "exercises": trees}, blobs))
    limits = options.limits.as_dict()
    limits["nproc"] = sandbox.nproc_limit(limits["nproc"])
    n = sum(len(nb["exercises"]) for nb in notebooks)
    limits["cpu"] = min(limits["cpu"], int(options.timeout + options.call_time * (n + 1) + 30))
    msg = {"notebooks": notebooks, "exec_time": options.timeout, "call_time": options.call_time,
           "limits": limits, "material": options.material}
    return msg, frames, kept


# ----------------------------------------------------------------------------------------------
# What came back: outcomes, then verdicts judged here.


def _records():
    return InPlace, NotCallable, Opaque, Raised


def outcome_of(result: dict, blobs: list[bytes], args: tuple) -> tuple[object, list[str]]:
    """One call's outcome as `judge` takes it (decided in the sandbox by the exercise floor's
    one runner, `outcomes.run`), and the package functions it delegated to."""
    return wire.decode_outcome(result.get("outcome"), blobs, len(args)), _names(result)


def _names(result: dict) -> list[str]:
    names = result.get("delegated", [])
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def _stopped_outcomes(fn: str, stop: dict, n: int, options: Options) -> dict[int, object]:
    _, _, _, Raised = _records()
    j = stop.get("call") if isinstance(stop.get("call"), int) else 0
    if stop.get("why") == "time":
        first = Raised("TimeoutError", f"{fn} did not return within {options.call_time:g} s "
                       "(an infinite loop, or far too slow?), and was stopped")
    else:
        first = Raised("SystemExit", f"the process ended while {fn} ran (os._exit, a crash, "
                       "or the memory limit)")
    later = Raised("RuntimeError", "not run: an earlier case did not return")
    return {k: first if k == j else later for k in range(j, n)}


@dataclass
class NotebookReply:
    """The frames of one notebook, sorted out."""

    ran: dict | None = None
    results: dict = field(default_factory=dict)  # (ex, call) -> (result, blobs)
    stops: dict = field(default_factory=dict)  # ex -> stop record (call phase)
    run_stop: dict | None = None


def sort_frames(frames: list, n_notebooks: int) -> list[NotebookReply]:
    replies = [NotebookReply() for _ in range(n_notebooks)]
    for msg, blobs in frames:
        i = msg.get("nb")
        if type(i) is not int or not 0 <= i < n_notebooks:
            continue
        op, r = msg.get("op"), replies[i]
        if op == "ran" and r.ran is None:
            r.ran = msg
        elif op == "result" and type(msg.get("ex")) is int and type(msg.get("call")) is int:
            r.results.setdefault((msg["ex"], msg["call"]), (msg, blobs))
        elif op == "stopped" and msg.get("phase") == "run":
            r.run_stop = msg
        elif op == "stopped" and type(msg.get("ex")) is int:
            r.stops[msg["ex"]] = msg
    return replies


def judge_exercise(ex: Exercise, inputs: list, reply: NotebookReply, k: int,
                   options: Options) -> tuple[str, str, str]:
    """(status, message, mistake) of one exercise, judged here from the outcomes that came
    back; `mistake` is the diagnosis the check names first, as data ("" when none)."""

    _, NotCallable, _, _ = _records()
    state = (reply.ran.get("functions") or {}).get(ex.fn, "missing")
    if state == "missing":
        return Row.MISSING, (f"{ex.fn} is not defined in this notebook: the teacher's notebook "
                           f"checks it with check_{ex.id}({ex.fn}) (deleted or renamed?)"), ""
    spec = _specs()[ex.id]
    if state != "ok":
        outcome = NotCallable(str(state)[:40], str(state)[:100])
        return _verdict(judge(spec, [(inputs[0], outcome)], ex.fn))
    stopped = _stopped_outcomes(ex.fn, reply.stops[k], len(inputs), options) \
        if k in reply.stops else {}
    calls, delegated = [], set()
    for j, case in enumerate(inputs):
        if j in stopped:
            calls.append((case, stopped[j]))
            continue
        got = reply.results.get((k, j))
        if got is None:
            return (Row.NOTEBOOK_ERROR,
                    f"the sandbox did not return {ex.fn}'s answer to case {j + 1}", "")
        outcome, names = outcome_of(got[0], got[1], tuple(case.args))
        delegated.update(names)
        calls.append((case, outcome))
    if delegated:
        return Row.DELEGATED, (f"[delegated] {ex.id}: {ex.fn} hands the work to "
                             f"{', '.join(sorted(delegated))}, the package's own function for "
                             "this exercise; recorded as delegated, not passed"), ""
    return _verdict(judge(spec, calls, ex.fn))


def _verdict(result) -> tuple[str, str, str]:
    """A CheckResult as (status, message, mistake): the first diagnosed mistake's first
    sentence, read from the result's `mistakes` field, never from its message."""
    first = " ".join(result.mistakes[0].split()) if result.mistakes else ""
    return result.status, result.message, re.split(r"(?<=\.)\s", first, maxsplit=1)[0][:160]


def notebook_rows(nb: str, rel: str | None, exercises: list[Exercise], kept: dict,
                  reply: NotebookReply | None, problem: str | None, options: Options
                  ) -> list[Found]:
    """(notebook, exercise, status, message) rows of one teacher's notebook for one learner."""
    if rel is None:
        return [Found("", e.id, Row.MISSING, f"no {nb} was submitted", "") for e in exercises]
    if reply is None or reply.ran is None:
        why = _why_not_run(reply, problem, options)
        return [Found(rel, e.id, Row.NOTEBOOK_ERROR, why, "") for e in exercises] or \
            [Found(rel, "", Row.NOTEBOOK_ERROR, why, "")]
    stopped = str(reply.ran.get("stopped") or "")
    if stopped.startswith("unreadable: "):
        why = f"{rel} is not a valid notebook ({stopped[12:][:200]})"
        return [Found(rel, e.id, Row.NOTEBOOK_ERROR, why, "") for e in exercises]
    rows = []
    for k, ex in enumerate(exercises):
        try:
            status, message, mistake = judge_exercise(ex, kept[(nb, ex.id)][1], reply, k,
                                                      options)
        except wire.ChannelError as exc:
            status, message, mistake = (Row.NOTEBOOK_ERROR,
                                        f"the sandbox's reply could not be read: {exc}", "")
        rows.append(Found(rel, ex.id, status, message, mistake))
    errors = [f"cell {n}: {text}" if text.startswith(cells.UNAVAILABLE) else
              f"cell {n} raised {text}" for n, text in reply.ran.get("errors", [])[:3]
              if isinstance(text, str)]
    if reply.ran.get("stopped"):
        errors.append(str(reply.ran["stopped"]))
    if errors:
        rows.append(Found(rel, "", Row.NOTEBOOK_ERROR, "; ".join(errors), ""))
    return rows


def _why_not_run(reply: NotebookReply | None, problem: str | None, options: Options) -> str:
    if reply is not None and reply.run_stop is not None:
        if reply.run_stop.get("why") == "time":
            return (f"the notebook did not stop at its time limit of {options.timeout:g} s "
                    "and was stopped")
        return ("the notebook ended its own process (os._exit, a crash, or the memory limit) "
                "before its cells finished")
    return f"the notebook did not run: {problem or 'no reply from the sandbox'}"


# ----------------------------------------------------------------------------------------------
# One learner: a private copy, one sandbox, the rows.


def sandbox_seconds(plan: list, options: Options) -> float:
    """The wall-clock budget of a learner's whole sandbox: each notebook's cells twice (once
    more after a function that had to be stopped), its calls, and some."""
    per_nb = 2 * (options.timeout + 10) + options.call_time
    return sum(per_nb + options.call_time * len(ex) for _, _, ex in plan) + 30


def grade_learner(learner: str, source: Path, teacher: list[tuple[str, list[Exercise]]],
                  options: Options, slot: int, fonts: list) -> tuple[list[tuple], dict]:
    """The rows (notebook, exercise, status, message) of one learner, and the seeds used (and,
    under "answers", the learner's written answers to the questions of `options.parts`)."""
    walked = roster.walk(source)
    if walked.over:  # nothing of it is read, nor run
        why = f"[over the limit] not graded: {walked.over}"
        return [Found("", e.id, roster.OVER_LIMIT, why, "") for _, ex in teacher for e in ex], {}
    mine = learner_notebooks(source)
    if not mine:
        return [Found("", "", Row.NOTEBOOK_ERROR, "no notebook (.ipynb) in this folder", "")], {}
    matched = match([name for name, _ in teacher], mine)
    plan = [(name, matched[name], ex) for name, ex in teacher if matched[name] is not None]
    problem, replies, kept, retry, found, tampered = None, [], {}, False, {}, None
    if plan:
        tmp = Path(tempfile.mkdtemp(prefix="xenith-grade-"))
        try:
            copy = sandbox.private_copy(source, tmp)
            found = _prepare(copy, plan, options)
            home = sandbox.HOME if sandbox.bwrap() else str(copy)
            msg, frames, kept = build_request(learner, plan, options, home)
            run = sandbox.run_sandbox(copy, msg, frames, sandbox_seconds(plan, options), slot,
                                      fonts)
            problem, tampered = run.problem or _setup_error(run), run.tampered
            # a sandbox that never got ready failed before any learner code ran: not a grade
            retry = bool(problem) and all(m.get("op") != "ready" for m, _ in run.frames)
            replies = sort_frames(run.frames, len(plan))
        except sandbox.FolderTooLarge as exc:
            problem = str(exc)
        except nbread.OverLimit as exc:
            why = f"[over the limit] not graded: {exc}"
            return [Found("", e.id, Row.OVER_LIMIT, why, "") for _, ex in teacher for e in ex], {}
        finally:
            sandbox.remove_tree(tmp)
    rows, at = [], {name: i for i, (name, _, _) in enumerate(plan)}
    for name, exercises in teacher:
        i = at.get(name)
        reply = replies[i] if i is not None and i < len(replies) else None
        rows += notebook_rows(name, matched[name], exercises, kept, reply, problem, options)
    if tampered:  # the learner's code wrote on the channel: nothing it sent counts
        rows = [Found(nb, ex, wire.PROTOCOL_ERROR, wire.tampering(tampered), "")
                for nb, ex, *_ in rows if ex] or \
            [Found("", "", wire.PROTOCOL_ERROR, wire.tampering(tampered), "")]
    seeds = {f"{nb}/{ex}": seed for (nb, ex), (seed, _) in kept.items()}
    seeds.update({f"{name}/seconds of its cells": r.ran.get("seconds") for (name, _, _), r
                  in zip(plan, replies, strict=False) if r.ran is not None})
    if walked.unreadable:
        rows.append(Found("", "", roster.UNREADABLE, "not opened, not copied to the sandbox: "
                     + "; ".join(walked.unreadable[:20])[:2000], ""))
    if retry:
        seeds["retry"] = True
    seeds["answers"] = found
    return rows, seeds


def _prepare(copy: Path, plan: list, options: Options) -> dict:
    """Before the sandbox starts: the written answers read from the private copy, and its
    cells tagged skip-grading emptied, in a child under the sandbox's memory limit (never in
    this process). Returns {teacher's notebook: {question: answer}}; raises nbread.OverLimit."""
    questions = {p.notebook: [q.id for q in p.questions] for p in options.parts}
    items = [{"name": name, "path": str(copy / rel), "questions": questions.get(name, [])}
             for name, rel, _ in plan]
    return nbread.read_limited(items, options.limits.memory, options.timeout + 30)


def _setup_error(run: sandbox.SandboxRun) -> str | None:
    for msg, _ in run.frames:
        if msg.get("op") == "error":
            return f"the sandbox could not start: {str(msg.get('text'))[:300]}"
    return None


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
    from .student import _as_path  # the one check of a path argument

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
    options.checks = regrading.checks(teacher, _specs(),
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
