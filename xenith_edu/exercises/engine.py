"""The exercise engine: cases, running a learner's function, judging its outcomes, verdicts.

A check is `check(spec, fn)`: `run` calls `fn` on every input of the spec, then `judge`, a pure
function of the inputs and the outcomes, compares them with the reference and diagnoses.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from .fit import explain, keepdims_slip
from .hints import keep, steps
from .kit import fmt, fmt_pair
from .mutate import explain as from_mutants
from .outcomes import NotCallable, run
from .progress import record
from .types import Case, CheckResult, Spec, Status
from .validate import Stop, records, unpack, validate

# Shape legend: B batch, S positions, N = B*S positions (flattened), d width, H heads,
# hd head width, f SwiGLU hidden width, V vocab.

GRADE_LOG_ENV = "XENITH_EDU_GRADE_LOG"  # if set, every check appends one JSON line to this file

# Largest accepted max|got - expected| / max|expected| for outputs of each dtype. float64 agrees
# with any correct formula to ~1e-13; float32 carries ~1e-7 per operation.
TOLERANCE = {np.dtype(np.float64): 1e-8, np.dtype(np.float32): 1e-4}

CANNOT = ("No mistake the check knows of fits this answer, so it cannot name it: compare each "
          "line with the derivation, one output at a time.")
ASK = ("\n  For a hint (a question, then the rule, then the line), run "
       "`from xenith_edu.exercises import hint; hint(\"{id}\")`; run it again for the next.")
NAN_HINT = ("NaN comes from 0/0, inf - inf, 0 * inf, or sqrt/log of a negative number: print "
            "the intermediate arrays of this case to find the first one that goes wrong.")


def _as64(a: object) -> object:
    if isinstance(a, np.ndarray) and a.dtype.kind == "f":
        return a.astype(np.float64)
    return a


def _scalar(x: object) -> object:
    if isinstance(x, np.ndarray) and x.shape == ():
        return x[()]
    return x


# ----------------------------------------------------------------------------------------------
# Judging one case: validation of the outcome, then the comparison of values.


def _rel(got: object, exp: object, floor: float = 0.0) -> tuple[float, tuple]:
    """max|got - exp| relative to max(max|exp|, floor) (absolute when both are 0), and where."""
    diff = np.abs(np.asarray(got, dtype=np.float64) - np.asarray(exp, dtype=np.float64))
    scale = max(float(np.max(np.abs(exp))) if np.size(exp) else 0.0, floor)
    idx = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.ndim else ()
    return float(diff.max()) / (scale if scale > 0 else 1.0), tuple(int(i) for i in idx)


def close(got: object, cand: object, tol: float) -> bool:
    """Whether `got` equals the candidate answer `cand` as closely as a right answer must."""
    try:
        g = np.asarray(got, dtype=np.float64)
        c = np.asarray(cand, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    if g.shape != c.shape or not np.all(np.isfinite(g)) or not np.all(np.isfinite(c)):
        return False
    return _rel(g, c)[0] <= 10 * tol


def _tolerance(spec: Spec, expected: tuple) -> float:
    if spec.tol is not None:
        return spec.tol
    dtypes = [e.dtype for e in expected if isinstance(e, np.ndarray) and e.dtype.kind == "f"]
    return max(TOLERANCE.get(d, 1e-8) for d in dtypes or [np.dtype(np.float64)])


def _not_finite(name: str, g: object, case: Case) -> str:
    g64 = np.asarray(g, dtype=np.float64)
    bad = tuple(int(i) for i in np.argwhere(~np.isfinite(g64))[0]) if g64.ndim else ()
    value = float(g64[bad])
    what = "NaN" if math.isnan(value) else "inf" if value > 0 else "-inf"
    where = f" (first at index {bad})" if bad else ""
    hint = case.overflow_hint or (NAN_HINT if what == "NaN" else "")
    return f"{name} {'contains' if bad else 'is'} {what}{where}." + (" " + hint if hint else "")


def _compare(spec: Spec, case: Case, outs: tuple, values: tuple, tol: float,
             floors: dict[str, float]) -> tuple[list[str], list[str]]:
    """The names of the wrong outputs, and one line about each."""
    wrong, lines = [], []
    for name, kind, g, e in zip(spec.out_names, spec.kinds, outs, values, strict=True):
        if kind == "int":
            if int(g) != int(e):
                wrong.append(name)
                lines.append(f"{name} is wrong: expected {int(e)}, got {int(g)}.")
            continue
        if not np.all(np.isfinite(np.asarray(g, dtype=np.float64))):
            wrong.append(name)
            lines.append(_not_finite(name, g, case))
            continue
        floor = math.sqrt(tol) * floors.get(name, 0.0)
        err, idx = _rel(g, e, floor)
        if err <= tol:
            continue
        wrong.append(name)
        floored = floor > (float(np.max(np.abs(e))) if np.size(e) else 0.0)
        versus = (f"relative to the size {fmt(floor)} of its terms" if floored
                  else f"relative to max|{name}|")
        if kind == "float":
            a, b = fmt_pair(e, g)
            lines.append(f"{name} is wrong: expected {a}, got {b} (relative error {err:.1e}"
                         + (f", {versus})." if floored else ")."))
        else:
            a, b = fmt_pair(e[idx], g[idx])
            lines.append(f"{name} is wrong: worst at index {idx}: expected {a}, got {b} "
                         f"(relative error {err:.1e}, {versus})." + (
                             _layers(g, e, tol, floor) if name in spec.per_layer else ""))
    return wrong, lines


def _layers(g: np.ndarray, e: np.ndarray, tol: float, floor: float) -> str:
    """' Wrong in layer 0, right in layers 1, 2.' for an output stacked by layer."""
    scale = max(float(np.max(np.abs(e))), floor)
    bad = [i for i in range(e.shape[0]) if _rel(g[i], e[i], scale)[0] > tol]
    good = [i for i in range(e.shape[0]) if i not in bad]

    def name(ls: list[int]) -> str:
        return ("layer " if len(ls) == 1 else "layers ") + ", ".join(map(str, ls))

    return f" Wrong in {name(bad)}" + (f", right in {name(good)}." if good else ".")


@dataclass
class _Judged:
    """One case whose outcome was well-formed: its values, in float64, and what went wrong."""

    case: Case
    args64: tuple
    exp: dict
    got: dict
    tol: float
    wrong: list[str]
    lines: list[str]


def _judge_case(spec: Spec, case: Case, outcome: object, fn_name: str) -> _Judged:
    """Compares one outcome with the reference; raises Stop if it is not even well-formed."""
    records(spec, outcome, fn_name)
    outs = unpack(spec, outcome, fn_name)
    expected = spec.reference(*case.args)  # shapes and dtypes the answer must have
    args64 = tuple(_as64(a) for a in case.args)
    values = spec.reference(*args64)  # the values, computed in float64
    keepdims_slip(spec, outs, expected)
    validate(spec, outs, expected)
    outs = tuple(_scalar(o) for o in outs)
    tol = _tolerance(spec, expected)
    floors = spec.floor(args64) if spec.floor is not None else {}
    wrong, lines = _compare(spec, case, outs, values, tol, floors)
    return _Judged(case, args64, dict(zip(spec.out_names, values, strict=True)),
                   dict(zip(spec.out_names, outs, strict=True)), tol, wrong, lines)


# ----------------------------------------------------------------------------------------------
# Diagnosis: which known mistake explains the wrong answer, on every case at once.


def _fits(j: _Judged, cand: dict, need_wrong: bool) -> bool:
    if need_wrong and not any(n in j.wrong for n in cand):
        return False
    return all(close(j.got[n], c, j.tol) for n, c in cand.items())


def _from_table(spec: Spec, first: _Judged, others: list[_Judged]) -> list[str]:
    """The known mistakes that give the learner's answer on the failed case and on every other.

    A mistake must fit every case where it predicts something, so a coincidence of one case
    (two sizes that happen to be equal) explains nothing.
    """
    if spec.mistakes is None:
        return []
    table = spec.mistakes(first.args64, first.exp)
    tables = [spec.mistakes(j.args64, j.exp) for j in others]
    found = []
    for i, (description, make) in enumerate(table):
        try:
            cand = make()
        except Exception:  # a candidate that cannot be formed for this case fits nothing
            continue
        if not cand or not _fits(first, cand, need_wrong=True):
            continue
        if all(_consistent(j, t[i][1]) for j, t in zip(others, tables, strict=True)):
            found.append(description)
    return found


def _consistent(j: _Judged, make: Callable[[], dict]) -> bool:
    try:
        cand = make()
    except Exception:
        return True  # no prediction on this case
    return not cand or _fits(j, cand, need_wrong=False)


def _generic(name: str, got: object, exp: object, tol: float, factors: dict[str, float]) -> str:
    """Patterns any output can show: zero, sign flipped, a named factor, a constant factor
    (arrays only: any two numbers differ by a constant factor), transposed."""
    g = np.asarray(got, dtype=np.float64)
    e = np.asarray(exp, dtype=np.float64)
    if g.size > 1 and np.all(g == 0) and np.any(e != 0):
        return f"{name} is all zeros: nothing was written or accumulated into it."
    if close(g, -e, tol):
        return f"{name} has its sign flipped."
    ee = float(np.sum(e * e))
    if ee > 0:
        c = float(np.sum(g * e)) / ee
        if c != 0 and abs(c - 1) > 1e-3 and close(g, c * e, tol):
            for label, value in factors.items():
                if math.isclose(c, value, rel_tol=1e-3):
                    return f"{name} is {fmt(c)} times too large: off by a factor of {label}."
                if math.isclose(c, 1 / value, rel_tol=1e-3):
                    return f"{name} is {fmt(1 / c)} times too small: off by a factor of {label}."
            if g.size > 1:
                return f"{name} is off by a constant factor of {fmt(c)}."
    if g.ndim >= 2 and g.shape[-1] == g.shape[-2] and close(g, np.swapaxes(e, -1, -2), tol):
        return f"{name} is transposed."
    return ""


def first_wrong(steps: tuple[tuple[str, str, str], ...], exp: dict, got: dict, wrong: set,
                tol: float) -> list[str]:
    """A step-by-step backward's diagnosis when no known mistake fits: the first wrong gradient
    going backward, its step and its row of the duality table. `steps` are (gradient, step,
    row) in backward order; the gradients after a wrong one are computed from it."""
    names = [name for name, _, _ in steps]
    for k, (name, step, rule) in enumerate(steps):
        if name in wrong:
            later = [n for n in names[k + 1:] if n in wrong]
            tail = (f" The {len(later)} wrong gradients after it are computed from it: fix "
                    f"{name} first.") if later else ""
            pattern = _generic(name, got[name], exp[name], tol, {})  # sign, zeros...
            return [f"the first wrong gradient, going backward, is {name} ({step}). Its row "
                    f"of the duality table: {rule}.{tail}" + (f" ({pattern})" if pattern else "")]
    return []


def _likely(spec: Spec, first: _Judged, others: list[_Judged], probes: list) -> list[str]:
    """The likely mistakes behind the wrong outputs: the check's own, then generic patterns."""
    likely: list[str] = []
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            likely += _from_table(spec, first, others)
            if spec.diagnose is not None and not likely:
                likely += spec.diagnose(first.args64, first.exp, first.got, set(first.wrong),
                                        first.tol)
        except Exception:  # a diagnosis must never hide the verdict itself
            pass
        if spec.probe_hint is not None and not likely:
            for case, outcome in probes:
                try:
                    found = spec.probe_hint(case.args, outcome)
                except Exception:
                    found = None
                if found:
                    likely.append(found)
        if spec.terms is not None and not likely:
            try:  # the wrong outputs fitted in the reference's own terms
                likely += explain(spec, [first] + others, close)
            except Exception:
                pass
        if not likely:
            try:  # the one change of the reference that gives the learner's outputs
                likely += from_mutants(spec, [first] + others, close)
            except Exception:
                pass
        if not likely:
            try:
                factors = spec.factors(first.args64) if spec.factors else {}
                for name in first.wrong:
                    text = _generic(name, first.got[name], first.exp[name], first.tol, factors)
                    if text:
                        likely.append(text)
            except Exception:
                pass
    return list(dict.fromkeys(likely))


# ----------------------------------------------------------------------------------------------
# The verdict.


def judge(spec: Spec, calls: list[tuple[Case, object]],
          fn_name: str = "your function") -> CheckResult:
    """The verdict on the learner's outcomes: a pure function, it never calls the learner.

    `calls` pairs each input of `spec.inputs(rng)` (cases and probes, as that list gives them)
    with its outcome: the returned value (plain data) or a `Raised`, `InPlace` or `NotCallable`.
    """
    cases = [(c, o) for c, o in calls if not c.probe]
    probes = [(c, o) for c, o in calls if c.probe]
    not_callable = next((o for _, o in calls if isinstance(o, NotCallable)), None)
    if not_callable is not None:
        text = (f"[failed] {spec.id}: expected a function, got {not_callable.text} "
                f"({not_callable.type_name}). Pass the function itself, without calling it.")
        return CheckResult(spec.id, Status.FAILED, False, text)
    if not cases:  # nothing to judge is never a pass
        return CheckResult(spec.id, Status.FAILED, False, f"[failed] {spec.id}: no case was run.")
    judged: list[_Judged] = []
    first: tuple[int, Case, str] | None = None
    for i, (case, outcome) in enumerate(cases, start=1):
        try:
            try:
                j = _judge_case(spec, case, outcome, fn_name)
            except Stop:
                raise
            except Exception as exc:  # a check must never crash the learner's notebook
                raise Stop(Status.FAILED, f"the check could not compare the answer "
                                    f"({type(exc).__name__}: {exc}).") from None
        except Stop as stop:
            if stop.status == Status.NOT_ATTEMPTED:
                return _not_attempted(spec, fn_name)
            first = first or (i, case, stop.text)
            continue
        judged.append(j)
        if j.wrong and first is None:
            first = (i, case, "")
    return _result(spec, cases, judged, probes, first)


def _result(spec: Spec, cases: list, judged: list[_Judged], probes: list,
            first: tuple[int, Case, str] | None) -> CheckResult:
    n = len(cases)
    if first is None:
        return CheckResult(spec.id, Status.PASSED, True, f"[passed] {spec.id}: all {n} cases agree "
                                                  f"with the reference ({spec.summary}).")
    i, case, text = first
    if text:
        message = f"[failed] {spec.id}, case {i} of {n} ({case.label}):\n  {text}"
    else:
        failed = next(j for j in judged if j.case is case)
        message, likely = _failed_values(spec, i, n, failed, judged, probes)
        return CheckResult(spec.id, Status.FAILED, False, message, tuple(likely))
    return CheckResult(spec.id, Status.FAILED, False, message)


def _failed_values(spec: Spec, i: int, n: int, first: _Judged, judged: list[_Judged],
                   probes: list) -> tuple[str, list[str]]:
    """The verdict's text, and the likely mistakes it names (the report reads these)."""
    lines = list(first.lines)
    if len(first.wrong) > 3:  # the first wrong output, in the spec's order; the rest by name
        rest = first.wrong[1:]
        lines = lines[:1] + [f"({len(rest)} more outputs are wrong: {', '.join(rest[:5])}"
                             + (", ..." if len(rest) > 5 else "") + ".)"]
    right = [name for name in spec.out_names if name not in first.wrong]
    if len(right) > 6:
        lines.append(f"(The other {len(right)} outputs are right.)")
    elif right:
        lines.append(f"({', '.join(right)} {'is' if len(right) == 1 else 'are'} right.)")
    # a NaN or inf line carries its own hint; the outputs it spoils are not a new mistake
    not_finite = any(not np.all(np.isfinite(np.asarray(first.got[w], dtype=np.float64)))
                     for w in first.wrong if spec.kinds[spec.out_names.index(w)] != "int")
    likely = _likely(spec, first, [j for j in judged if j is not first], probes)
    if likely:
        lines.append("Likely mistake: " + " ".join(likely))
    elif not not_finite:
        lines.append(CANNOT)
    text = f"[failed] {spec.id}, case {i} of {n} ({first.case.label}):\n  " + "\n  ".join(lines)
    return text, likely


def _not_attempted(spec: Spec, fn_name: str) -> CheckResult:
    text = (f"[not attempted yet] {spec.id}: {fn_name} raises NotImplementedError. Fill it in "
            f"and run this cell again; meanwhile the notebook goes on with "
            f"{spec.reference_name}.")
    return CheckResult(spec.id, Status.NOT_ATTEMPTED, False, text)


def log(result: CheckResult) -> None:
    """Appends the verdict to the grade log named by GRADE_LOG_ENV, if it is set."""
    path = os.environ.get(GRADE_LOG_ENV)
    if not path:
        return
    line = json.dumps({"exercise": result.exercise, "status": result.status,
                       "message": result.message})
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError as exc:
        print(f"(could not append to the grade log {path}: {exc})")


def _fn_name(fn: object) -> str:
    name = getattr(fn, "__name__", "")
    return name if isinstance(name, str) and name.isidentifier() else "your function"


def check(spec: Spec, fn: object, rng: np.random.Generator | None = None) -> CheckResult:
    """The notebook's check: runs `fn` on every input, judges, prints the verdict, returns it."""
    inputs = spec.inputs(rng)
    if not callable(fn):
        calls = [(inputs[0], run(fn, ()))]
    else:
        calls = [(case, run(fn, case.args)) for case in inputs]
    result = judge(spec, calls, _fn_name(fn))
    result = replace(result, hints=steps(spec, result.mistakes))
    keep(spec.id, result.hints)
    if result.status == Status.FAILED:
        result = replace(result, message=result.message + ASK.format(id=spec.id))
    print(result.message)
    log(result)
    record(spec.id, str(result.status))
    return result
