"""Grading again what changed: the digest of each exercise's check, kept in every journal
record, so that after a fix `--resume` re-grades exactly the rows of the checks that changed;
and `--regrade NAMES`, the named learners graded again and the rest kept.

A check's digest is a hash of its catalogue entry (the source of the reference, the cases and
the diagnosis, and of every function and class of the package they call, traced through their
code, so that a fix in a shared function or the component itself counts; the settings), the
package's version and the exercise's case seed. A record without digests (an older grader's)
is graded again whole, and the run says so.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import sys
import threading
from pathlib import Path

from ..grader.names import canonical, escape_controls
from ..grader.statuses import GradeRow

# the Spec's functions whose source is the check (what a fix changes), and its settings
CODE = ("reference", "cases", "probes", "mistakes", "diagnose", "factors", "probe_hint",
        "floor", "terms")
PACKAGE = "xenith_edu"
SETTINGS = ("id", "arg_names", "out_names", "kinds", "single", "tol", "per_layer", "may_call",
            "seed")


def _source(fn: object) -> str:
    """The source of a function (of a partial's function), else its name and bytecode."""
    if fn is None:
        return "-"
    fn = getattr(fn, "func", fn)
    try:
        return inspect.getsource(fn)  # type: ignore[arg-type]
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        return f"{getattr(fn, '__qualname__', repr(fn))}:{code.co_code.hex() if code else ''}"


def _ours(obj: object) -> bool:
    """A function or class of the package (what a fix of a check can change)."""
    return (inspect.isfunction(obj) or inspect.isclass(obj)) and \
        str(getattr(obj, "__module__", "")).split(".")[0] == PACKAGE


def _names(code) -> set[str]:
    """The global and attribute names a code object uses, its nested functions' included."""
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _names(const)
    return names


def _called(fn: object) -> list[object]:
    """The package's functions and classes `fn` uses: its globals, the attributes of the
    package's modules it names, and the functions its closure holds."""
    code, found = getattr(fn, "__code__", None), []
    if code is None:
        return found
    names, known = sorted(_names(code)), getattr(fn, "__globals__", {})
    for name in names:
        obj = known.get(name)
        if inspect.ismodule(obj) and obj.__name__.split(".")[0] == PACKAGE:
            found += [getattr(obj, m) for m in names if _ours(getattr(obj, m, None))]
        elif _ours(obj):
            found.append(obj)
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            found += [cell.cell_contents] if _ours(cell.cell_contents) else []
        except ValueError:  # an empty cell
            continue
    return found


def _traced(fn: object, seen: dict[str, str]) -> None:
    """The sources of `fn` and of everything of the package it uses, into `seen`."""
    fn = getattr(fn, "func", fn)
    if fn is None:
        return
    key = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
    if key in seen:
        return
    seen[key] = _source(fn)
    if inspect.isfunction(fn):
        for obj in _called(fn):
            _traced(obj, seen)


def check_digest(spec: object, case_seed: int) -> str:
    """The digest of one exercise's check as a class is graded with it."""
    from .. import __version__  # the package's, imported when a check is digested

    h = hashlib.sha256(json.dumps([__version__, case_seed, [repr(getattr(spec, k, None))
                                                             for k in SETTINGS]]).encode())
    for name in CODE:
        seen: dict[str, str] = {}
        _traced(getattr(spec, name, None), seen)
        h.update(b"\0" + name.encode() + b"\0" + json.dumps(sorted(seen.items())).encode())
    return h.hexdigest()[:24]


def checks(teacher: list, specs: dict, seed_of) -> dict[str, str]:
    """{"notebook/exercise": digest} of the teacher's exercises; `seed_of(nb, ex)` is the case
    seed of an exercise."""
    return {f"{nb}/{ex.id}": check_digest(specs[ex.id], seed_of(nb, ex.id))
            for nb, exercises in teacher for ex in exercises}


def stale(record: dict, now: dict[str, str]) -> set[str] | None:
    """The checks of `now` whose digest differs from the journal record's; None when the record
    has no digests (an older grader's): all of it is graded again."""
    kept = record.get("checks")
    if not isinstance(kept, dict):
        return None
    return {key for key, digest in now.items() if kept.get(key) != digest}


def only(teacher: list, changed: set[str]) -> list:
    """The teacher's notebooks cut to the exercises whose check changed."""
    cut = [(nb, [ex for ex in exercises if f"{nb}/{ex.id}" in changed])
           for nb, exercises in teacher]
    return [(nb, exercises) for nb, exercises in cut if exercises]


def merge(old: list, new: list, teacher: list, changed: set[str]) -> list[GradeRow] | None:
    """A learner's rows with those of the changed checks taken from `new` (the partial run)
    and the others kept from `old`, in the order a whole run writes them; None when either
    is not one row per exercise (a submission over a limit, say): then grade it whole."""
    flat = [(f"{nb}/{ex.id}", ex.id) for nb, exercises in teacher for ex in exercises]
    redone = [(key, ex) for key, ex in flat if key in changed]
    old, new = [GradeRow(*r) for r in old], [GradeRow(*r) for r in new]
    if [r.exercise for r in old[:len(flat)]] != [ex for _, ex in flat] or \
            [r.exercise for r in new[:len(redone)]] != [ex for _, ex in redone]:
        return None
    fresh = iter(new)
    rows = [next(fresh) if key in changed else old[i] for i, (key, _) in enumerate(flat)]
    return rows + new[len(redone):]  # the submission's own rows (unreadable files) are new


def names(given: object, entries: list) -> set[str]:
    """The journal keys (alice.ipynb, bob) of the learners named by `--regrade` ("alice,bob",
    or a list): each a learner's name or file name in the submissions folder, made canonical."""
    items = given.split(",") if isinstance(given, str) else given
    if not isinstance(items, list | tuple | set | frozenset) or \
            not all(isinstance(x, str) for x in items):
        raise TypeError(f"regrade: give the learners' names, \"alice,bob\", got {given!r}")
    wanted = [canonical(x.strip()) for x in items if x.strip()]
    if not wanted:
        raise ValueError("regrade: no learner named: give their names, --regrade alice,bob")
    keys = {}
    for learner, source, _ in entries:
        if source is not None:
            keys.setdefault(canonical(learner), set()).add(source.name)
            keys.setdefault(canonical(source.name), set()).add(source.name)
    unknown = [w for w in wanted if w not in keys]
    if unknown:
        raise ValueError(f"regrade: no submission of {escape_controls(unknown[0])!r} in the "
                         "submissions folder: give the names as the grades CSV shows them")
    return set().union(*(keys[w] for w in wanted))


def named(given: object, entries: list, journal: Path) -> set[str]:
    """The journal keys of the learners `--regrade` names, checked before anything runs: the
    journal that keeps the others must exist."""
    found = names(given, entries)
    if not journal.is_file():
        raise ValueError(f"regrade: no journal {journal.name} next to the CSV: grade the class "
                         "once first (--regrade keeps everyone else from it)")
    return found


def what_changed(record: dict | None, key: str, journal, now: dict[str, str]
                 ) -> set[str] | None:
    """The checks of a learner kept in `journal` that changed since (empty: keep it); None
    when the learner is graded whole (new, changed, named by --regrade, an older record)."""
    if record is None:
        if key in journal.regrade or journal.resumed:
            journal.tally.add("named" if key in journal.regrade else "new")
        return None
    changed = stale(record, now)
    journal.tally.add("kept" if changed == set() else
                      "undigested" if changed is None else "changed", changed or set())
    return changed


def partly(run, teacher: list, record: dict | None, changed: set[str] | None) -> tuple:
    """`run` (of a part of `teacher`: rows, answers, seeds, seconds) on the exercises whose
    check changed, merged with the record's other rows; on the whole of `teacher` when
    `changed` is None or the rows do not merge."""
    if changed is None or record is None:
        return run(teacher)
    rows, found, seeds, seconds = run(only(teacher, changed))
    merged = None if seeds.get("retry") else merge(record["rows"], rows, teacher, changed)
    if merged is None:
        return run(teacher)
    kept_seeds = record.get("seeds") if isinstance(record.get("seeds"), dict) else {}
    kept = record.get("answers") if isinstance(record.get("answers"), dict) else {}
    return merged, {**kept, **found}, {**kept_seeds, **seeds}, seconds


class Tally:
    """How many learners a run graded again, and why: said in one line at the end."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts = {"named": 0, "changed": 0, "undigested": 0, "new": 0, "kept": 0}
        self.exercises: set[str] = set()

    def add(self, why: str, changed: set[str] = frozenset()) -> None:
        with self.lock:
            self.counts[why] += 1
            self.exercises |= changed

    def say(self) -> str:
        c, parts = self.counts, []
        if c["named"]:
            parts.append(f"{c['named']} named learner(s) graded again")
        if c["changed"]:
            parts.append(f"{c['changed']} learner(s) re-graded for the check(s) that changed "
                         f"since the journal ({', '.join(sorted(self.exercises))})")
        if c["new"]:
            parts.append(f"{c['new']} new or changed submission(s) graded")
        if c["undigested"]:
            parts.append(f"{c['undigested']} learner(s) graded again whole: their journal "
                         "records have no check digests (an older grader)")
        return "xenith-edu grade: " + "; ".join(parts or ["no check changed"]) + \
            f"; {c['kept']} kept as they were"

    def print(self) -> None:
        print(self.say(), file=sys.stderr, flush=True)
