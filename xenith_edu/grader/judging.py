"""One learner judged: their functions called in a sandbox on the assignment's hidden cases,
the verdicts judged here, in the grader's own process, as typed rows.

The teacher's notebooks say which exercises there are (roster.py): each check cell
`check_<id>(<fn>)` names an exercise and the learner's function. One sandbox runs the learner's
notebooks of the same names and calls each function on hidden random cases (varied sizes and
settings, the same for every learner: drawn from the assignment's seed); only plain arrays and
numbers come back. `judge` compares them with the package's reference here. The learner's code
can change nothing the grader uses. Before the sandbox starts, the grader reads the written
answers from its private copy of the notebooks and empties the cells tagged skip-grading. The
class, its journal and its grades are the gradebook's (`xenith_edu.gradebook`).
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..exercises import SPECS, InPlace, NotCallable, Opaque, Raised, judge
from . import cells, nbread, roster, sandbox, statuses, wire
from .delegation import targets
from .roster import Exercise, learner_notebooks, match
from .statuses import Found, Row

STATUSES = statuses.STATUSES
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
