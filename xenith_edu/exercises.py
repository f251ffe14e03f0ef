"""Exercise checks: one `check_*` function per exercise of the book, called from the notebooks.

Each check runs the learner's function on several cases against the package's reference and
prints a verdict precise enough to fix the bug from: which output, where, by how much, and why.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

# Shape legend: B batch, S positions, N = B*S positions (flattened), d width, H heads,
# hd head width, f SwiGLU hidden width, V vocab.

GRADE_LOG_ENV = "XENITH_EDU_GRADE_LOG"  # if set, every check appends one JSON line to this file

# Largest accepted max|got - expected| / max|expected| for outputs of each dtype. float64 agrees
# with any correct formula to ~1e-13; float32 carries ~1e-7 per operation.
TOLERANCE = {np.dtype(np.float64): 1e-8, np.dtype(np.float32): 1e-4}

PASSED, FAILED, NOT_ATTEMPTED = "passed", "failed", "not attempted"


@dataclass(frozen=True)
class CheckResult:
    """The verdict of one check: `status` is "passed", "failed" or "not attempted"."""

    exercise: str
    status: str
    passed: bool
    message: str

    def __str__(self) -> str:
        return self.message


# ----------------------------------------------------------------------------------------------
# The machinery shared by every check.


@dataclass
class _Case:
    label: str  # what the learner reads: "float32, N=5, d=16"
    args: tuple  # the arguments of the learner's function, in order
    overflow_hint: str = ""  # said when the learner's output is NaN or inf on this case


@dataclass
class _Spec:
    exercise: str  # id, the check's name without "check_"
    reference_name: str  # what the notebook falls back on, named in "not attempted yet"
    arg_names: tuple[str, ...]
    out_names: tuple[str, ...]
    kinds: tuple[str, ...]  # per output: "array", "float" or "int"
    reference: Callable[..., tuple]  # same arguments as the learner's function, returns a tuple
    make_cases: Callable[[], list[_Case]]
    summary: str  # what the passing cases covered, for the "passed" verdict
    single: bool = False  # the learner's function returns one value, not a tuple
    # (args in float64, expected, got, wrong output names, tol) -> likely mistakes
    diagnose: Callable[..., list[str]] | None = None
    factors: Callable[[tuple], dict[str, float]] | None = None  # named sizes: {"N": 8.0}
    probe: Callable[[Callable], str | None] | None = None  # an extra run that finds a mistake
    shape_hints: dict[str, str] = field(default_factory=dict)
    dtype_hint: str = ""
    tol: float | None = None  # overrides TOLERANCE (scalar checks)


class _Stop(Exception):
    """A case ended the check: carries the status and the explanation."""

    def __init__(self, status: str, text: str) -> None:
        super().__init__(text)
        self.status, self.text = status, text


def _fmt(x: float) -> str:
    return f"{float(x):.6g}"


def _copy(a: object) -> object:
    return a.copy() if isinstance(a, np.ndarray) else a


def _as64(a: object) -> object:
    if isinstance(a, np.ndarray) and a.dtype.kind == "f":
        return a.astype(np.float64)
    return a


def _type_name(x: object) -> str:
    if isinstance(x, np.ndarray):
        return f"a {x.dtype} array of shape {x.shape}"
    return f"a {type(x).__name__}"


def _where(exc: BaseException) -> str:
    """' (line 3: `x / rms`)' for the last frame of the learner's own code, or ''."""
    frames = traceback.extract_tb(exc.__traceback__)
    numpy_dir = os.path.dirname(np.__file__)
    mine = [
        f for f in frames
        if not f.filename.startswith(numpy_dir) and os.path.basename(f.filename) != "exercises.py"
    ]
    if not mine or mine[-1].lineno is None:
        return ""
    f = mine[-1]
    return f" (line {f.lineno}: `{f.line.strip()}`)" if f.line else f" (line {f.lineno})"


def _raise_hint(exc: Exception) -> str:
    text = str(exc)
    if "could not be broadcast" in text:
        return ("Hint: the shapes don't line up. A per-row statistic that lost its axis "
                "(keepdims=True missing) or a missing transpose?")
    if "matmul" in text or "not aligned" in text:
        return "Hint: the matrix shapes don't match: a missing (or extra) transpose .T?"
    if isinstance(exc, IndexError):
        return "Hint: an index is out of range or an array has fewer axes than you think."
    return ""


def _rel(got: np.ndarray, exp: np.ndarray) -> tuple[float, tuple]:
    """max|got - exp| relative to max|exp| (absolute when exp is all zeros), and where."""
    diff = np.abs(np.asarray(got, dtype=np.float64) - np.asarray(exp, dtype=np.float64))
    scale = float(np.max(np.abs(exp))) if np.size(exp) else 0.0
    idx = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.ndim else ()
    return float(diff.max()) / (scale if scale > 0 else 1.0), tuple(int(i) for i in idx)


def _close(got: object, cand: object, tol: float) -> bool:
    """Whether `got` equals the candidate answer `cand` as closely as a right answer must."""
    try:
        g = np.asarray(got, dtype=np.float64)
        c = np.asarray(cand, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    if g.shape != c.shape or not np.all(np.isfinite(g)) or not np.all(np.isfinite(c)):
        return False
    return _rel(g, c)[0] <= 10 * tol


def _candidates(got: dict, wrong: set, tol: float, table: list) -> list[str]:
    """The descriptions of `table` [(description, () -> {name: wrong answer})] that `got` fits.

    A candidate fits when every output it predicts matches the learner's, and one of them is
    an output the learner got wrong.
    """
    found = []
    for description, make in table:
        try:
            cand = make()
        except Exception:  # a candidate that cannot be formed for this case fits nothing
            continue
        if any(n in wrong for n in cand) and all(_close(got[n], c, tol) for n, c in cand.items()):
            found.append(description)
    return found


def _generic(name: str, got: object, exp: object, tol: float, factors: dict[str, float]) -> str:
    """Patterns any output can show: zero, sign flipped, a constant factor, transposed."""
    g = np.asarray(got, dtype=np.float64)
    e = np.asarray(exp, dtype=np.float64)
    if g.size > 1 and np.all(g == 0) and np.any(e != 0):
        return f"{name} is all zeros: nothing was written or accumulated into it."
    if _close(g, -e, tol):
        return f"{name} has its sign flipped."
    ee = float(np.sum(e * e))
    if ee > 0:
        c = float(np.sum(g * e)) / ee
        if c != 0 and abs(c - 1) > 1e-3 and _close(g, c * e, tol):
            for label, value in factors.items():
                if math.isclose(c, value, rel_tol=1e-3):
                    return f"{name} is {_fmt(c)} times too large: off by a factor of {label}."
                if math.isclose(c, 1 / value, rel_tol=1e-3):
                    return f"{name} is {_fmt(1 / c)} times too small: off by a factor of {label}."
            return f"{name} is off by a constant factor of {_fmt(c)}."
    if g.ndim >= 2 and g.shape[-1] == g.shape[-2] and _close(g, np.swapaxes(e, -1, -2), tol):
        return f"{name} is transposed."
    return ""


def _shape_message(name: str, got: np.ndarray, exp: np.ndarray, hints: dict[str, str]) -> str:
    text = f"{name} has shape {got.shape}, expected {exp.shape}"
    hint = " " + hints[name] if name in hints else ""
    if got.ndim >= 2 and got.shape == exp.shape[::-1]:
        return text + ": transposed?"
    if got.ndim < exp.ndim:
        return text + ": an axis was reduced away (keepdims=True missing, or a sum over too " \
                      "many axes?)." + hint
    if got.ndim > exp.ndim:
        return text + ": an extra axis (a sum over the positions missing?)." + hint
    if sorted(got.shape) == sorted(exp.shape):
        return text + ": the axes are in the wrong order?" + hint
    return text + "." + hint if hint else text + ": a sum or mean over the wrong axis?"


def _dtype_message(name: str, got: np.dtype, exp: np.dtype, extra: str) -> str:
    text = f"{name} has dtype {got}, expected {exp} (keep the dtype of the inputs)"
    if exp == np.float32 and got == np.float64:
        text += (": a float64 array slipped in. np.zeros(shape) and np.ones default to float64;"
                 " use np.zeros_like(...) or dtype=x.dtype")
    elif exp == np.float64 and got == np.float32:
        text += ": float64 was asked for; don't cast to float32 or create float32 arrays"
    elif got.kind in "iub":
        text += ": integer arithmetic? Start from a float array of the inputs' dtype"
    return text + "." + (" " + extra if extra else "")


def _validate(spec: _Spec, outs: tuple, expected: tuple, case: _Case) -> None:
    """Type, shape, dtype and finiteness of every output, strictly; raises _Stop."""
    for name, kind, g, e in zip(spec.out_names, spec.kinds, outs, expected, strict=True):
        if g is None:
            raise _Stop(FAILED, f"{name} is None: a `return` missing?")
        if kind == "array":
            if not isinstance(g, np.ndarray) or isinstance(g, np.matrix):
                raise _Stop(FAILED, f"{name} should be a NumPy array of shape {e.shape}, "
                                    f"got {_type_name(g)}.")
            if g.shape != e.shape:
                text = _shape_message(name, g, e, spec.shape_hints)
                others = [n for n, o in zip(spec.out_names, expected, strict=True)
                          if n != name and isinstance(o, np.ndarray) and o.shape == g.shape]
                if others and g.shape != e.shape[::-1]:
                    text = (f"{name} has shape {g.shape}, expected {e.shape}; that is the shape "
                            f"of {others[0]}: are the outputs in the order "
                            f"({', '.join(spec.out_names)})?")
                raise _Stop(FAILED, text)
            if g.dtype != e.dtype:
                raise _Stop(FAILED, _dtype_message(name, g.dtype, e.dtype, spec.dtype_hint))
        elif kind == "float":
            if isinstance(g, np.ndarray) and g.shape == () and g.dtype.kind in "iuf":
                g = g[()]
            if isinstance(g, bool | np.bool_) or not isinstance(g, numbers.Real):
                raise _Stop(FAILED, f"{name} should be a number (a float), got {_type_name(g)}.")
        elif kind == "int":
            if isinstance(g, np.ndarray) and g.shape == () and g.dtype.kind in "iu":
                g = g[()]
            if isinstance(g, bool | np.bool_) or not isinstance(g, int | np.integer):
                extra = ""
                if isinstance(g, float | np.floating):
                    extra = " Use integer arithmetic (// rather than /) or int(...)."
                raise _Stop(FAILED, f"{name} should be an int, got {_type_name(g)} "
                                    f"({g!r}).{extra}")


def _scalar(x: object) -> object:
    if isinstance(x, np.ndarray) and x.shape == ():
        return x[()]
    return x


def _run_case(spec: _Spec, fn: Callable, case: _Case, fn_name: str) -> None:
    """Runs one case; returns quietly if the learner's answer is right, raises _Stop if not."""
    args = tuple(_copy(a) for a in case.args)  # the learner works on copies of the case
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            got = fn(*args)
    except NotImplementedError:
        raise _Stop(NOT_ATTEMPTED, "") from None
    except (Exception, SystemExit) as exc:  # the learner's error is a verdict, not a crash
        hint = _raise_hint(exc)
        text = str(exc).strip().rstrip(".")
        raise _Stop(FAILED, f"{fn_name} raised {type(exc).__name__}: {text}{_where(exc)}."
                            + (" " + hint if hint else "")) from None

    for name, before, after in zip(spec.arg_names, case.args, args, strict=True):
        if isinstance(before, np.ndarray) and not (
            isinstance(after, np.ndarray) and after.shape == before.shape
            and np.array_equal(after, before, equal_nan=True)
        ):
            raise _Stop(FAILED, f"{fn_name} changed its input `{name}` in place (look for "
                                f"`{name} *= ...`, `{name}[...] = ...`, `{name}.shape = ...` or "
                                f"`out={name}`). Compute new arrays: the caller still needs its "
                                "inputs.")

    n = len(spec.out_names)
    if spec.single:
        if got is None:
            raise _Stop(FAILED, f"{fn_name} returned None: a `return` missing?")
        if isinstance(got, tuple):
            raise _Stop(FAILED, f"{fn_name} returned a tuple of {len(got)} value(s), expected "
                                f"a single {spec.out_names[0]}.")
        outs = (got,)
    else:
        if got is None:
            raise _Stop(FAILED, f"{fn_name} returned None: a `return` missing? Expected a tuple "
                                f"({', '.join(spec.out_names)}).")
        if not isinstance(got, tuple | list):
            raise _Stop(FAILED, f"{fn_name} returned {_type_name(got)}, expected a tuple of "
                                f"{n} values ({', '.join(spec.out_names)}).")
        if len(got) != n:
            raise _Stop(FAILED, f"{fn_name} returned {len(got)} values, expected {n} "
                                f"({', '.join(spec.out_names)}).")
        outs = tuple(got)

    expected = spec.reference(*case.args)  # shapes and dtypes the answer must have
    args64 = tuple(_as64(a) for a in case.args)
    values = spec.reference(*args64)  # the values, computed in float64
    _validate(spec, outs, expected, case)
    outs = tuple(_scalar(o) for o in outs)

    dtypes = [e.dtype for e in expected if isinstance(e, np.ndarray) and e.dtype.kind == "f"]
    tol = spec.tol if spec.tol is not None else max(TOLERANCE.get(d, 1e-8) for d in dtypes or
                                                       [np.dtype(np.float64)])
    wrong, lines = [], []
    for name, kind, g, e in zip(spec.out_names, spec.kinds, outs, values, strict=True):
        if kind == "int":
            if int(g) != int(e):
                wrong.append(name)
                lines.append(f"{name} is wrong: expected {int(e)}, got {int(g)}.")
            continue
        finite = np.isfinite(np.asarray(g, dtype=np.float64))
        if not np.all(finite):
            wrong.append(name)
            bad = tuple(int(i) for i in np.argwhere(~finite)[0]) if np.ndim(g) else ()
            value = float(np.asarray(g, dtype=np.float64)[bad])
            what = "NaN" if math.isnan(value) else "inf" if value > 0 else "-inf"
            where = f" (first at index {bad})" if bad else ""
            lines.append(f"{name} {'contains' if bad else 'is'} {what}{where}."
                         + (" " + case.overflow_hint if case.overflow_hint else ""))
            continue
        err, idx = _rel(g, e)
        if err > tol:
            wrong.append(name)
            if kind == "float":
                lines.append(f"{name} is wrong: expected {_fmt(e)}, got {_fmt(g)} "
                             f"(relative error {err:.1e}).")
            else:
                lines.append(f"{name} is wrong: worst at index {idx}: expected {_fmt(e[idx])}, "
                             f"got {_fmt(g[idx])} (relative error {err:.1e}, "
                             f"relative to max|{name}|).")
    if not wrong:
        return
    right = [name for name in spec.out_names if name not in wrong]
    if right:
        lines.append(f"({', '.join(right)} {'is' if len(right) == 1 else 'are'} right.)")

    got_d = dict(zip(spec.out_names, outs, strict=True))
    exp_d = dict(zip(spec.out_names, values, strict=True))
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        likely = _likely(spec, fn, args64, exp_d, got_d, wrong, tol)
    if likely:
        lines.append("Likely mistake: " + " ".join(likely))
    raise _Stop(FAILED, "\n  ".join(lines))


def _likely(spec: _Spec, fn: Callable, args64: tuple, exp_d: dict, got_d: dict, wrong: list,
            tol: float) -> list[str]:
    """The likely mistakes behind the wrong outputs: the check's own, then generic patterns."""
    likely: list[str] = []
    if spec.diagnose is not None:
        try:
            likely += spec.diagnose(args64, exp_d, got_d, set(wrong), tol)
        except Exception:  # a diagnosis must never hide the verdict itself
            pass
    if spec.probe is not None and not likely:
        try:
            found = spec.probe(fn)
        except Exception:
            found = None
        if found:
            likely.append(found)
    if not likely:
        try:
            factors = spec.factors(args64) if spec.factors else {}
            for name in wrong:
                text = _generic(name, got_d[name], exp_d[name], tol, factors)
                if text:
                    likely.append(text)
        except Exception:
            pass
    return list(dict.fromkeys(likely))


def _log(result: CheckResult) -> None:
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


def _check(spec: _Spec, fn: object) -> CheckResult:
    """Runs every case of `spec` on the learner's `fn`, prints the verdict and returns it."""
    fn_name = getattr(fn, "__name__", "")
    if not isinstance(fn_name, str) or not fn_name.isidentifier():
        fn_name = "your function"
    if not callable(fn):
        status, text = FAILED, (f"[failed] {spec.exercise}: expected a function, got "
                                f"{repr(fn)[:60]} ({type(fn).__name__}). Pass the function "
                                "itself, without calling it.")
    else:
        cases = spec.make_cases()
        status, text = PASSED, (f"[passed] {spec.exercise}: all {len(cases)} cases agree with the "
                                f"reference ({spec.summary}).")
        for i, case in enumerate(cases, start=1):
            try:
                try:
                    _run_case(spec, fn, case, fn_name)
                except _Stop:
                    raise
                except Exception as exc:  # a check must never crash the learner's notebook
                    raise _Stop(FAILED, f"the check could not compare the answer "
                                        f"({type(exc).__name__}: {exc}).") from None
            except _Stop as stop:
                status = stop.status
                if status == NOT_ATTEMPTED:
                    text = (f"[not attempted yet] {spec.exercise}: {fn_name} raises "
                            "NotImplementedError. Fill it in and run this cell again; meanwhile "
                            f"the notebook goes on with {spec.reference_name}.")
                else:
                    text = (f"[failed] {spec.exercise}, case {i} of {len(cases)} ({case.label}):"
                            f"\n  {stop.text}")
                break
    result = CheckResult(spec.exercise, status, status == PASSED, text)
    print(result.message)
    _log(result)
    return result


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _randn(rng: np.random.Generator, shape: tuple, dtype: type = np.float64,
           scale: float = 1.0) -> np.ndarray:
    return (scale * rng.standard_normal(shape)).astype(dtype)


_OVERFLOW = ("Overflow in exp: exp of a large number is inf. Subtract each row's max before "
             "exponentiating (the softmax does not change).")

# ----------------------------------------------------------------------------------------------
# Chapter 1: softmax cross-entropy.


def _softmax64(z: np.ndarray, axis: int = -1) -> np.ndarray:
    z = z - z.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def _ce_reference(logits: np.ndarray, targets: np.ndarray) -> tuple:
    from .softmax_ce import softmax_cross_entropy

    return softmax_cross_entropy(logits, targets)


def _ce_cases() -> list[_Case]:
    rng = _rng(101)
    cases = []
    for label, N, V, dtype, scale, shift in [
        ("float64, N=8, V=11", 8, 11, np.float64, 2.0, 0.0),
        ("float32, N=6, V=17", 6, 17, np.float32, 2.0, 0.0),
        ("float64, N=1 (one position), V=5", 1, 5, np.float64, 1.0, 0.0),
        ("float64, N=3, V=2", 3, 2, np.float64, 1.0, 0.0),
        # exp overflows past ~709 (float64) and ~88 (float32); the spread stays small enough
        # that no probability underflows (the reference clamps log at 1e-30)
        ("float64, large logits (around 800), N=5, V=9", 5, 9, np.float64, 5.0, 800.0),
        ("float32, large logits (around 100), N=4, V=6", 4, 6, np.float32, 5.0, 100.0),
    ]:
        logits = _randn(rng, (N, V), dtype, scale) + dtype(shift)  # (N, V)
        targets = rng.integers(0, V, size=N)  # (N,)
        cases.append(_Case(label, (logits, targets), _OVERFLOW if shift else ""))
    logits = _randn(rng, (10, 7))  # (N, V)
    cases.insert(2, _Case("float64, N=10, V=7, every target the same token",
                          (logits, np.full(10, 3))))
    return cases


def _ce_diagnose(args: tuple, exp: dict, got: dict, wrong: set, tol: float) -> list[str]:
    logits, targets = args
    N, V = logits.shape
    onehot = np.eye(V)[targets]  # (N, V)
    p = _softmax64(logits)
    loss, dl = exp["loss"], exp["dlogits"]
    return _candidates(got, wrong, tol, [
        (f"dlogits is N = {N} times too large: the 1/N of the mean is missing "
         "(dlogits = (softmax - onehot) / N).", lambda: {"dlogits": dl * N}),
        (f"dlogits is divided by N = {N} twice.", lambda: {"dlogits": dl / N}),
        ("sign flipped: dlogits = (softmax - onehot) / N, not (onehot - softmax) / N.",
         lambda: {"dlogits": -dl}),
        ("the one-hot term is missing: subtract 1 at each target "
         "(dlogits = (softmax - onehot) / N).", lambda: {"dlogits": p / N}),
        ("the one-hot term is missing and the 1/N too.", lambda: {"dlogits": p}),
        ("the softmax is normalised over the wrong axis: each row (axis=-1) must sum to 1.",
         lambda: {"dlogits": (_softmax64(logits, axis=0) - onehot) / N}),
        (f"the loss is summed over the positions, not averaged (divide by N = {N}).",
         lambda: {"loss": loss * N}),
        ("the loss has its sign flipped: it is -log softmax(logits)[target].",
         lambda: {"loss": -loss}),
        ("the loss uses log base 2: use the natural log, np.log.",
         lambda: {"loss": loss / math.log(2)}),
        ("the loss uses log base 10: use the natural log, np.log.",
         lambda: {"loss": loss / math.log(10)}),
    ])


_CE = _Spec(
    exercise="softmax_cross_entropy",
    reference_name="xenith_edu.softmax_ce.softmax_cross_entropy",
    arg_names=("logits", "targets"),
    out_names=("loss", "dlogits"),
    kinds=("float", "array"),
    reference=_ce_reference,
    make_cases=_ce_cases,
    summary="float64 and float32, N = 1 to 10, repeated targets, logits around 800",
    diagnose=_ce_diagnose,
    factors=lambda a: {f"N = {a[0].shape[0]}": float(a[0].shape[0])},
)


def check_softmax_cross_entropy(fn: Callable) -> CheckResult:
    """Chapter 1: `fn(logits (N, V), targets (N,) int) -> (loss, dlogits (N, V))`."""
    return _check(_CE, fn)


_UNIFORM = _Spec(
    exercise="uniform_loss",
    reference_name="the loss log(V)",
    arg_names=("V",),
    out_names=("loss",),
    kinds=("float",),
    reference=lambda V: (math.log(V),),
    make_cases=lambda: [_Case(f"V={V}", (V,)) for V in (2, 10, 65, 50257)],
    summary="V = 2, 10, 65 and 50257",
    single=True,
    diagnose=lambda args, exp, got, wrong, tol: _candidates(got, wrong, tol, [
        ("sign flipped: the loss is -log(1/V).", lambda: {"loss": -exp["loss"]}),
        ("that is the probability 1/V of each token; the loss is -log of it.",
         lambda: {"loss": 1.0 / args[0]}),
        ("log base 2: use the natural log.", lambda: {"loss": math.log2(args[0])}),
        ("log base 10: use the natural log.", lambda: {"loss": math.log10(args[0])}),
        ("that is V itself; the loss is -log(1/V).", lambda: {"loss": float(args[0])}),
    ]),
)


def check_uniform_loss(fn: Callable) -> CheckResult:
    """Chapter 1: `fn(V) -> float`, the loss of a model whose logits are all equal."""
    return _check(_UNIFORM, fn)


# ----------------------------------------------------------------------------------------------
# Chapter 2: SwiGLU.


def _swiglu_reference(dout, x, w1, w3, w2) -> tuple:
    from .swiglu import swiglu_backward, swiglu_forward

    _, cache = swiglu_forward(x, w1, w3, w2)
    return swiglu_backward(dout, cache)


def _swiglu_cases() -> list[_Case]:
    rng = _rng(202)
    r = _rng(2020)
    Nr, dr, fr = int(r.integers(2, 9)), int(r.integers(2, 7)), int(r.integers(7, 13))
    cases = []
    for label, N, d, f, dtype in [
        ("float64, N=6, d=4, f=10", 6, 4, 10, np.float64),
        ("float32, N=5, d=6, f=8", 5, 6, 8, np.float32),
        ("float64, N=1 (one position), d=3, f=5", 1, 3, 5, np.float64),
        ("float64, N=d=f=4 (square)", 4, 4, 4, np.float64),
        (f"float64, random shape N={Nr}, d={dr}, f={fr}", Nr, dr, fr, np.float64),
    ]:
        x = _randn(rng, (N, d), dtype)  # (N, d)
        w1 = _randn(rng, (d, f), dtype, 1 / math.sqrt(d))  # (d, f)
        w3 = _randn(rng, (d, f), dtype, 1 / math.sqrt(d))  # (d, f)
        w2 = _randn(rng, (f, d), dtype, 1 / math.sqrt(f))  # (f, d)
        dout = _randn(rng, (N, d), dtype)  # (N, d)
        cases.append(_Case(label, (dout, x, w1, w3, w2)))
    return cases


def _sigmoid64(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _swiglu_diagnose(args: tuple, exp: dict, got: dict, wrong: set, tol: float) -> list[str]:
    dout, x, w1, w3, w2 = args
    h1, h3 = x @ w1, x @ w3  # (N, f)
    s = _sigmoid64(h1)
    dha = dout @ w2.T  # (N, f)
    dh3 = dha * h1 * s

    def through_gate(dsilu: np.ndarray) -> dict:
        dh1 = dha * h3 * dsilu
        return {"dx": dh1 @ w1.T + dh3 @ w3.T, "dw1": x.T @ dh1}

    dh1 = dha * h3 * s * (1 + h1 * (1 - s))
    return _candidates(got, wrong, tol, [
        ("silu'(h1) taken as sigmoid(h1): silu(z) = z * sigmoid(z) needs the product rule, "
         "silu'(z) = sigmoid(z) * (1 + z * (1 - sigmoid(z))).", lambda: through_gate(s)),
        ("silu'(h1) taken as sigmoid's derivative sigmoid * (1 - sigmoid): silu'(z) = "
         "sigmoid(z) * (1 + z * (1 - sigmoid(z))).", lambda: through_gate(s * (1 - s))),
        ("silu'(h1) misses sigmoid's own derivative: silu'(z) = sigmoid(z) * (1 + z * "
         "(1 - sigmoid(z))).", lambda: through_gate(s + h1 * s)),
        ("dw1 and dw3 are swapped: w1 is the gate (through silu), w3 the up projection.",
         lambda: {"dw1": exp["dw3"], "dw3": exp["dw1"]}),
        ("dx misses the path through w3: x feeds both projections, so dx = dh1 @ w1.T + "
         "dh3 @ w3.T.", lambda: {"dx": dh1 @ w1.T}),
        ("dx misses the path through w1 (the gate): x feeds both projections, so dx = "
         "dh1 @ w1.T + dh3 @ w3.T.", lambda: {"dx": dh3 @ w3.T}),
        ("the up branch is multiplied by h1 where silu(h1) is needed: dh3 = dha * silu(h1).",
         lambda: {"dx": dh1 @ w1.T + (dha * h1) @ w3.T, "dw3": x.T @ (dha * h1)}),
    ])


_SWIGLU = _Spec(
    exercise="swiglu_backward",
    reference_name="xenith_edu.swiglu.swiglu_backward",
    arg_names=("dout", "x", "w1", "w3", "w2"),
    out_names=("dx", "dw1", "dw3", "dw2"),
    kinds=("array",) * 4,
    reference=_swiglu_reference,
    make_cases=_swiglu_cases,
    summary="float64 and float32, N = 1 to 6, a square and a random shape",
    diagnose=_swiglu_diagnose,
    factors=lambda a: {f"N = {a[1].shape[0]}": float(a[1].shape[0])},
)


def check_swiglu_backward(fn: Callable) -> CheckResult:
    """Chapter 2: `fn(dout (N,d), x (N,d), w1 (d,f), w3 (d,f), w2 (f,d)) -> (dx, dw1, dw3, dw2)`."""
    return _check(_SWIGLU, fn)


def _silu_grad_reference(z: np.ndarray) -> tuple:
    from .swiglu import sigmoid

    s = sigmoid(z)
    return (s * (1 + z * (1 - s)),)


def _silu_grad_cases() -> list[_Case]:
    rng = _rng(203)
    big = np.array([-800.0, -100.0, -30.0, -1.0, 0.0, 1.0, 30.0, 100.0, 800.0])
    hint = ("Overflow in exp for large |z|: compute sigmoid as 1 / (1 + exp(-z)), which is "
            "safe in both directions (exp(800) = inf gives 0 or 1, not NaN).")
    return [
        _Case("float64, shape (7,)", (_randn(rng, (7,), np.float64, 2.0),)),
        _Case("float32, shape (3, 4)", (_randn(rng, (3, 4), np.float32, 2.0),)),
        _Case("float64, shape (2, 3, 4)", (_randn(rng, (2, 3, 4), np.float64, 3.0),)),
        _Case("float64, large |z| up to 800", (big,), hint),
        _Case("float32, large |z| up to 100", (big[1:-1].astype(np.float32),), hint),
    ]


def _silu_grad_diagnose(args: tuple, exp: dict, got: dict, wrong: set, tol: float) -> list[str]:
    z = args[0]
    s = _sigmoid64(z)
    return _candidates(got, wrong, tol, [
        ("that is sigmoid(z), half of the product rule: silu(z) = z * sigmoid(z).",
         lambda: {"dz": s}),
        ("that is silu(z) itself, not its derivative.", lambda: {"dz": z * s}),
        ("that is the derivative of sigmoid, not of silu.", lambda: {"dz": s * (1 - s)}),
        ("sigmoid's derivative is sigmoid * (1 - sigmoid), not sigmoid.",
         lambda: {"dz": s + z * s}),
        ("the product rule misses the sigmoid(z) term.", lambda: {"dz": z * s * (1 - s)}),
    ])


_SILU = _Spec(
    exercise="silu_grad",
    reference_name="xenith_edu.swiglu (sigmoid(z) * (1 + z * (1 - sigmoid(z))))",
    arg_names=("z",),
    out_names=("dz",),
    kinds=("array",),
    reference=_silu_grad_reference,
    make_cases=_silu_grad_cases,
    summary="float64 and float32, 1-D to 3-D, |z| up to 800",
    single=True,
    diagnose=_silu_grad_diagnose,
)


def check_silu_grad(fn: Callable) -> CheckResult:
    """Chapter 2: `fn(z) -> silu'(z)` elementwise, same shape and dtype as z."""
    return _check(_SILU, fn)


# ----------------------------------------------------------------------------------------------
# Chapter 3: RMSNorm.


def _rmsnorm_reference(dy, x, w, eps) -> tuple:
    from .rmsnorm import rmsnorm_backward, rmsnorm_forward

    _, cache = rmsnorm_forward(x, w, eps)
    return rmsnorm_backward(dy, cache)


def _rmsnorm_cases() -> list[_Case]:
    rng = _rng(303)
    r = _rng(3030)
    Nr, dr = int(r.integers(2, 10)), int(r.integers(2, 12))
    cases = []
    for label, N, d, dtype, xscale, eps in [
        ("float64, N=6, d=8", 6, 8, np.float64, 1.0, 1e-5),
        ("float32, N=5, d=16", 5, 16, np.float32, 1.0, 1e-5),
        ("float64, N=1 (one position), d=8", 1, 8, np.float64, 1.0, 1e-5),
        ("float64, N=d=6 (square)", 6, 6, np.float64, 1.0, 1e-5),
        ("float64, small inputs where eps matters, N=4, d=5", 4, 5, np.float64, 0.01, 1e-5),
        (f"float64, random shape N={Nr}, d={dr}, eps=1e-6", Nr, dr, np.float64, 1.0, 1e-6),
    ]:
        x = _randn(rng, (N, d), dtype, xscale)  # (N, d)
        w = (1.0 + 0.5 * rng.standard_normal(d)).astype(dtype)  # (d,)
        dy = _randn(rng, (N, d), dtype)  # (N, d)
        cases.append(_Case(label, (dy, x, w, eps)))
    return cases


def _rms_parts(x: np.ndarray, eps: float, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=axis, keepdims=True) + eps)
    return x * rstd, rstd


def _rmsnorm_diagnose(args: tuple, exp: dict, got: dict, wrong: set, tol: float) -> list[str]:
    dy, x, w, eps = args
    d = x.shape[-1]
    xhat, rstd = _rms_parts(x, eps)
    g = dy * w

    def dx_from(g: np.ndarray, xhat: np.ndarray, rstd: np.ndarray) -> np.ndarray:
        return rstd * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True))

    def no_keepdims() -> dict:
        # every per-row statistic (N,) broadcast along the last axis: only possible when N == d
        rstd1 = 1.0 / np.sqrt(np.mean(x * x, axis=-1) + eps)  # (N,)
        xh = x * rstd1
        return {"dx": rstd1 * (g - xh * np.mean(g * xh, axis=-1)),
                "dw": np.sum(dy * xh, axis=0)}

    xh0, rstd0 = _rms_parts(x, eps, axis=0)
    return _candidates(got, wrong, tol, [
        ("the mean term of RMSNorm's Jacobian is missing: dx = rstd * (g - xhat * "
         "mean(g * xhat)), with g = dy * w, not just rstd * g.", lambda: {"dx": rstd * g}),
        ("the mean term of RMSNorm's Jacobian has the wrong sign: dx = rstd * (g - xhat * "
         "mean(g * xhat)).",
         lambda: {"dx": rstd * (g + xhat * np.mean(g * xhat, axis=-1, keepdims=True))}),
        (f"the mean term uses a sum over the d = {d} features where the mean is needed.",
         lambda: {"dx": rstd * (g - xhat * np.sum(g * xhat, axis=-1, keepdims=True))}),
        ("eps is missing: rstd = 1 / sqrt(mean(x**2) + eps).",
         lambda: dict(zip(("dx", "dw"), _rmsnorm_reference(dy, x, w, 0.0),
                                  strict=True))),
        ("dx ignores the gain w: the gradient reaching xhat is g = dy * w.",
         lambda: {"dx": dx_from(dy, xhat, rstd)}),
        ("dw uses x where the normalised xhat = x * rstd is needed: dw = sum(dy * xhat, "
         "axis=0).", lambda: {"dw": np.sum(dy * x, axis=0)}),
        ("a per-row statistic is broadcast along the wrong axis: keepdims=True is missing "
         "in a mean over axis=-1.", no_keepdims),
        ("the mean of x**2 is taken over the wrong axis: RMSNorm normalises each row "
         "(axis=-1), not each feature.",
         lambda: {"dx": dx_from(g, xh0, rstd0), "dw": np.sum(dy * xh0, axis=0)}),
    ])


_RMSNORM = _Spec(
    exercise="rmsnorm_backward",
    reference_name="xenith_edu.rmsnorm.rmsnorm_backward",
    arg_names=("dy", "x", "w", "eps"),
    out_names=("dx", "dw"),
    kinds=("array", "array"),
    reference=_rmsnorm_reference,
    make_cases=_rmsnorm_cases,
    summary="float64 and float32, N = 1 to 6, a square and a random shape, small inputs "
            "where eps matters",
    diagnose=_rmsnorm_diagnose,
    factors=lambda a: {f"N = {a[1].shape[0]}": float(a[1].shape[0]),
                       f"d = {a[1].shape[1]}": float(a[1].shape[1])},
    shape_hints={"dw": "w is shared by every position: sum dy * xhat over the positions "
                       "(axis=0), one entry per feature."},
)


def check_rmsnorm_backward(fn: Callable) -> CheckResult:
    """Chapter 3: `fn(dy (N,d), x (N,d), w (d,), eps) -> (dx (N,d), dw (d,))`."""
    return _check(_RMSNORM, fn)


_RMSNORM_DOT = _Spec(
    exercise="rmsnorm_dot",
    reference_name="the value 0",
    arg_names=("d",),
    out_names=("value",),
    kinds=("float",),
    reference=lambda d: (0.0,),
    make_cases=lambda: [_Case(f"d={d}", (d,)) for d in (2, 16, 512)],
    summary="d = 2, 16 and 512",
    single=True,
    diagnose=lambda args, exp, got, wrong, tol: _candidates(got, wrong, tol, [
        ("that is sum(xhat**2) = d, the squared length of xhat, not the dot product of x "
         "with dx.", lambda: {"value": float(args[0])}),
    ]),
)


def check_rmsnorm_dot(fn: Callable) -> CheckResult:
    """Chapter 3: `fn(d) -> float`, sum(x * dx) per row when w = ones and eps = 0."""
    return _check(_RMSNORM_DOT, fn)


# ----------------------------------------------------------------------------------------------
# Chapter 4: causal attention.


def _attention_reference(dout, q, k, v) -> tuple:
    from .attention import causal_attention_backward, causal_attention_forward

    _, cache = causal_attention_forward(q, k, v)
    return causal_attention_backward(dout, cache)


def _attention_cases() -> list[_Case]:
    rng = _rng(404)
    cases = []
    for label, B, H, S, hd, dtype, scale in [
        ("float64, B=2, H=3, S=5, hd=4", 2, 3, 5, 4, np.float64, 1.0),
        ("float32, B=1, H=2, S=7, hd=8", 1, 2, 7, 8, np.float32, 1.0),
        ("float64, S=1 (one position), B=2, H=2, hd=4", 2, 2, 1, 4, np.float64, 1.0),
        ("float64, S=hd=4 (square), B=1, H=2", 1, 2, 4, 4, np.float64, 1.0),
        ("float64, large scores (up to ~1.5e3), B=1, H=2, S=6, hd=4", 1, 2, 6, 4, np.float64,
         30.0),
    ]:
        q = _randn(rng, (B, H, S, hd), dtype, scale)  # (B, H, S, hd)
        k = _randn(rng, (B, H, S, hd), dtype, scale)  # (B, H, S, hd)
        v = _randn(rng, (B, H, S, hd), dtype)  # (B, H, S, hd)
        dout = _randn(rng, (B, H, S, hd), dtype)  # (B, H, S, hd)
        cases.append(_Case(label, (dout, q, k, v), _OVERFLOW if scale > 1 else ""))
    return cases


def _attention_parts(q: np.ndarray, k: np.ndarray, masked: bool = True) -> np.ndarray:
    S, hd = q.shape[-2], q.shape[-1]
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(hd)  # (B, H, S, S)
    if masked:
        scores = np.where(np.triu(np.ones((S, S), dtype=bool), k=1), -np.inf, scores)
    return _softmax64(scores)  # (B, H, S, S)


_LEAK = ("gradient leaks through the causal mask: keys and values receive gradient from "
         "queries before them (with a gradient at query 0 only, a later key or value got some). "
         "The backward must use the masked attention weights, zero above the diagonal.")


def _attention_with(P: np.ndarray, dout, q, k, v, rowsum: bool = True) -> dict:
    scale = 1.0 / math.sqrt(q.shape[-1])
    dP = dout @ np.swapaxes(v, -1, -2)  # (B, H, S, S)
    if rowsum:
        dP = dP - np.sum(P * dP, axis=-1, keepdims=True)
    dS = P * dP * scale
    return {"dq": dS @ k, "dk": np.swapaxes(dS, -1, -2) @ q, "dv": np.swapaxes(P, -1, -2) @ dout}


def _attention_diagnose(args: tuple, exp: dict, got: dict, wrong: set, tol: float) -> list[str]:
    dout, q, k, v = args
    hd = q.shape[-1]
    P = _attention_parts(q, k)
    scale = 1.0 / math.sqrt(hd)
    dP = dout @ np.swapaxes(v, -1, -2)
    dS = P * (dP - np.sum(P * dP, axis=-1, keepdims=True)) * scale  # (B, H, S, S)
    return _candidates(got, wrong, tol, [
        (_LEAK, lambda: _attention_with(_attention_parts(q, k, masked=False), dout, q, k, v)),
        (f"the 1/sqrt(hd) scale of the scores is missing from dq and dk (hd = {hd}).",
         lambda: {"dq": exp["dq"] * math.sqrt(hd), "dk": exp["dk"] * math.sqrt(hd)}),
        ("the 1/sqrt(hd) scale is applied twice in dq and dk.",
         lambda: {"dq": exp["dq"] / math.sqrt(hd), "dk": exp["dk"] / math.sqrt(hd)}),
        ("the softmax Jacobian's row-sum term is missing: dscores = P * (dP - sum(P * dP, "
         "axis=-1, keepdims=True)).",
         lambda: {k_: a for k_, a in _attention_with(P, dout, q, k, v, rowsum=False).items()
                  if k_ != "dv"}),
        ("dq and dk are swapped: dq = dscores @ k and dk = dscores^T @ q.",
         lambda: {"dq": exp["dk"], "dk": exp["dq"]}),
        ("dv needs the transposed weights: dv = P^T @ dout (each key collects from the queries "
         "that attend to it), not P @ dout.", lambda: {"dv": P @ dout}),
        ("dk needs the transposed score gradient: dk = dscores^T @ q, not dscores @ q.",
         lambda: {"dk": dS @ q}),
    ])


def _attention_probe(fn: Callable) -> str | None:
    """A gradient at query 0 only: every key and value after position 0 must get exactly 0."""
    rng = _rng(405)
    q, k, v = (_randn(rng, (1, 2, 5, 4)) for _ in range(3))  # (B, H, S, hd)
    dout = np.zeros_like(q)
    dout[..., 0, :] = rng.standard_normal((1, 2, 4))
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        dq, dk, dv = fn(dout, q.copy(), k.copy(), v.copy())
    dk, dv = np.asarray(dk, dtype=np.float64), np.asarray(dv, dtype=np.float64)
    if dk.shape != q.shape or dv.shape != q.shape:
        return None
    scale = float(np.max(np.abs(dout)))
    later = max(float(np.max(np.abs(dk[..., 1:, :]))), float(np.max(np.abs(dv[..., 1:, :]))))
    if later > 1e-6 * scale:
        return _LEAK
    return None


_ATTENTION = _Spec(
    exercise="attention_backward",
    reference_name="xenith_edu.attention.causal_attention_backward",
    arg_names=("dout", "q", "k", "v"),
    out_names=("dq", "dk", "dv"),
    kinds=("array",) * 3,
    reference=_attention_reference,
    make_cases=_attention_cases,
    summary="float64 and float32, S = 1 to 7, square S = hd, scores up to ~1.5e3",
    diagnose=_attention_diagnose,
    probe=_attention_probe,
    factors=lambda a: {f"sqrt(hd) = {_fmt(math.sqrt(a[1].shape[-1]))}":
                       math.sqrt(a[1].shape[-1]), f"S = {a[1].shape[-2]}": float(a[1].shape[-2])},
)


def check_attention_backward(fn: Callable) -> CheckResult:
    """Chapter 4: `fn(dout, q, k, v)` all (B, H, S, hd) `-> (dq, dk, dv)`, causal attention."""
    return _check(_ATTENTION, fn)


def _memory_diagnose(args: tuple, exp: dict, got: dict, wrong: set, tol: float) -> list[str]:
    B, H, S, itemsize = args
    n = B * H * S * S
    table = [
        ("that counts elements, not bytes: multiply by itemsize.", n),
        ("that counts bits, not bytes.", n * itemsize * 8),
        ("one factor of S is missing: each head holds an S x S matrix.", B * H * S * itemsize),
        ("the heads are missing: there is one S x S matrix per head (H).", B * S * S * itemsize),
        ("the batch is missing: there is one S x S matrix per sequence and head (B).",
         H * S * S * itemsize),
        ("counted twice: one layer keeps one (B, H, S, S) probability matrix.",
         2 * n * itemsize),
    ]
    g = int(got["bytes"])
    return [text for text, value in table if value == g and value != n * itemsize]


_MEMORY = _Spec(
    exercise="attention_memory",
    reference_name="B * H * S * S * itemsize",
    arg_names=("B", "H", "S", "itemsize"),
    out_names=("bytes",),
    kinds=("int",),
    reference=lambda B, H, S, itemsize: (B * H * S * S * itemsize,),
    make_cases=lambda: [_Case(f"B={B}, H={H}, S={S}, itemsize={i}", (B, H, S, i))
                        for B, H, S, i in [(2, 3, 5, 8), (4, 6, 256, 4), (8, 12, 1024, 2),
                                           (1, 1, 1, 4)]],
    summary="four sizes up to B=8, H=12, S=1024",
    single=True,
    diagnose=_memory_diagnose,
)


def check_attention_memory(fn: Callable) -> CheckResult:
    """Chapter 4: `fn(B, H, S, itemsize) -> int`, bytes of one layer's attention probabilities."""
    return _check(_MEMORY, fn)


# ----------------------------------------------------------------------------------------------
# Chapter 5: RoPE.


def _rope_reference(du, cos, sin) -> tuple:
    from .rope import rope_backward

    return (rope_backward(du, cos, sin),)


def _tables(S: int, hd: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    from .rope import rope_tables

    return rope_tables(S, hd, theta)


def _rope_cases() -> list[_Case]:
    rng = _rng(505)
    cases = []
    for label, shape, dtype, theta in [
        ("float64, du (S=6, hd=8)", (6, 8), np.float64, 10000.0),
        ("float32, du (B=2, H=3, S=5, hd=4)", (2, 3, 5, 4), np.float32, 10000.0),
        ("float64, S=1 (one position), du (1, 2, 1, 6)", (1, 2, 1, 6), np.float64, 10000.0),
        ("float64, du (3, S=7, hd=2)", (3, 7, 2), np.float64, 10000.0),
        ("float64, long sequence S=64, hd=16, theta=100", (2, 64, 16), np.float64, 100.0),
    ]:
        cos, sin = _tables(shape[-2], shape[-1], theta)  # (S, hd/2) each
        cases.append(_Case(label, (_randn(rng, shape, dtype), cos, sin)))
    return cases


def _rope_diagnose(args: tuple, exp: dict, got: dict, wrong: set, tol: float) -> list[str]:
    du, cos, sin = args

    def pairs(u: np.ndarray, c: np.ndarray, s: np.ndarray) -> np.ndarray:
        out = np.empty_like(u)
        out[..., 0::2] = u[..., 0::2] * c - u[..., 1::2] * s
        out[..., 1::2] = u[..., 0::2] * s + u[..., 1::2] * c
        return out

    def halves(u: np.ndarray, c: np.ndarray, s: np.ndarray) -> np.ndarray:
        h = u.shape[-1] // 2
        a, b = u[..., :h], u[..., h:]
        return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)

    return _candidates(got, wrong, tol, [
        ("RoPE rotated the wrong way: the backward is the rotation by -angle (the transpose), "
         "(du[2i]*cos + du[2i+1]*sin, -du[2i]*sin + du[2i+1]*cos).",
         lambda: {"du_in": pairs(du, cos, sin)}),
        ("du came back unrotated: the backward rotates each pair by -angle.",
         lambda: {"du_in": du}),
        ("cos and sin are swapped.", lambda: {"du_in": pairs(du, sin, -cos)}),
        ("the pairs are (u[i], u[i + hd/2]) (the rotate-half convention); this book pairs "
         "neighbours (u[2i], u[2i+1]).", lambda: {"du_in": halves(du, cos, -sin)}),
        ("the pairs are (u[i], u[i + hd/2]) and rotated the wrong way; this book pairs "
         "neighbours (u[2i], u[2i+1]) and the backward rotates by -angle.",
         lambda: {"du_in": halves(du, cos, sin)}),
    ])


_ROPE = _Spec(
    exercise="rope_backward",
    reference_name="xenith_edu.rope.rope_backward",
    arg_names=("du", "cos", "sin"),
    out_names=("du_in",),
    kinds=("array",),
    reference=_rope_reference,
    make_cases=_rope_cases,
    summary="float64 and float32, 2-D to 4-D, S = 1 to 64",
    single=True,
    diagnose=_rope_diagnose,
    dtype_hint="The tables are float64: cast them to du's dtype (cos.astype(du.dtype)).",
)


def check_rope_backward(fn: Callable) -> CheckResult:
    """Chapter 5: `fn(du (..., S, hd), cos (S, hd/2), sin (S, hd/2)) -> du_in`, same shape."""
    return _check(_ROPE, fn)


def _rope_tables_diagnose(args: tuple, exp: dict, got: dict, wrong: set,
                          tol: float) -> list[str]:
    S, hd, theta = args

    def tables(t: np.ndarray, exponent: np.ndarray) -> dict:
        angle = t[:, None] * theta ** exponent[None, :]
        return {"cos": np.cos(angle), "sin": np.sin(angle)}

    t, i = np.arange(S, dtype=np.float64), np.arange(hd // 2, dtype=np.float64)
    return _candidates(got, wrong, tol, [
        ("cos and sin are swapped.", lambda: {"cos": exp["sin"], "sin": exp["cos"]}),
        ("the exponent's sign: the frequencies are theta ** (-2i/hd), slower for larger i.",
         lambda: tables(t, 2 * i / hd)),
        ("the exponent is -i/hd where -2i/hd is needed.", lambda: tables(t, -i / hd)),
        ("positions start at 1: they start at 0 (position 0 is not rotated).",
         lambda: tables(t + 1, -2 * i / hd)),
    ])


_ROPE_TABLES = _Spec(
    exercise="rope_tables",
    reference_name="xenith_edu.rope.rope_tables",
    arg_names=("seq_len", "head_dim", "theta"),
    out_names=("cos", "sin"),
    kinds=("array", "array"),
    reference=lambda S, hd, theta: _tables(S, hd, theta),
    make_cases=lambda: [_Case(f"seq_len={S}, head_dim={hd}, theta={theta:g}", (S, hd, theta))
                        for S, hd, theta in [(8, 4, 10000.0), (16, 8, 100.0), (1, 2, 10000.0),
                                             (5, 6, 500000.0)]],
    summary="seq_len 1 to 16, head_dim 2 to 8, theta 100 to 500000",
    diagnose=_rope_tables_diagnose,
    shape_hints={"cos": "One row per position, one column per pair: (seq_len, head_dim // 2).",
                 "sin": "One row per position, one column per pair: (seq_len, head_dim // 2)."},
)


def check_rope_tables(fn: Callable) -> CheckResult:
    """Chapter 5: `fn(seq_len, head_dim, theta) -> (cos, sin)`, each (seq_len, head_dim // 2)."""
    return _check(_ROPE_TABLES, fn)


# ----------------------------------------------------------------------------------------------
# Chapter 6: embedding scatter-add and tied embeddings.


def _embedding_reference(x, dh, vocab_size) -> tuple:
    from .embedding import embedding_backward

    return (embedding_backward(x, dh, vocab_size),)


def _token_cases(seed: int) -> list[tuple[str, np.ndarray, int, int, type]]:
    rng = _rng(seed)
    return [  # label, x (B, S), V, d, dtype
        ("float64, B=2, S=5, V=7, d=3, repeated tokens", rng.integers(0, 4, size=(2, 5)), 7, 3,
         np.float64),
        ("float32, B=3, S=4, V=10, d=5, repeated tokens", rng.integers(0, 10, size=(3, 4)), 10,
         5, np.float32),
        ("float64, S=1 (one token), V=4, d=3", np.array([[2]]), 4, 3, np.float64),
        ("float64, every token the same, B=2, S=3, V=5, d=5", np.full((2, 3), 2), 5, 5,
         np.float64),
        ("float64, all tokens distinct, B=2, S=3, V=6, d=4",
         rng.permutation(6).reshape(2, 3), 6, 4, np.float64),
    ]


def _embedding_cases() -> list[_Case]:
    rng = _rng(606)
    cases = []
    for label, x, V, d, dtype in _token_cases(6060):
        dh = _randn(rng, x.shape + (d,), dtype)  # (B, S, d)
        cases.append(_Case(label, (x, dh, V)))
    return cases


def _repeats_diagnose(x: np.ndarray, dh: np.ndarray, V: int, got: np.ndarray, exp: np.ndarray,
                      tol: float, name: str) -> list[str]:
    """Wrong only on the rows of tokens that occur more than once: the scatter doesn't add."""
    counts = np.bincount(x.reshape(-1), minlength=V)  # (V,)
    d = exp.shape[-1]
    scale = max(float(np.max(np.abs(exp))), 1e-300)
    bad_rows = np.nonzero(np.max(np.abs(got - exp), axis=-1) > tol * scale)[0]
    if bad_rows.size == 0:
        return []
    if np.all(counts[bad_rows] == 0):
        return [f"{name} has non-zero rows for tokens that never occur: start from np.zeros, "
                "not np.empty."]
    if np.all(counts[bad_rows] > 1):
        v = int(bad_rows[np.argmax(counts[bad_rows])])
        flat = dh.reshape(-1, d)
        scatter = np.zeros_like(exp)
        np.add.at(scatter, x.reshape(-1), flat)
        rows = got[v] - (exp[v] - scatter[v])  # the learner's scatter part of row v
        if _close(rows, scatter[v] / counts[v], tol):
            return [f"repeated tokens are averaged instead of summed: token {v} occurs "
                    f"{counts[v]} times and its row is the sum of all {counts[v]} gradients."]
        return [f"repeated tokens overwrite instead of accumulate: token {v} occurs "
                f"{counts[v]} times and its row must sum all {counts[v]} gradients "
                "(np.add.at(dwte, x, dh); dwte[x] = dh and dwte[x] += dh keep only one)."]
    return []


def _embedding_diagnose(args: tuple, exp: dict, got: dict, wrong: set, tol: float) -> list[str]:
    x, dh, V = args
    return _repeats_diagnose(x, dh, V, np.asarray(got["dwte"], dtype=np.float64), exp["dwte"],
                             tol, "dwte")


_EMBEDDING = _Spec(
    exercise="embedding_backward",
    reference_name="xenith_edu.embedding.embedding_backward",
    arg_names=("x", "dh", "vocab_size"),
    out_names=("dwte",),
    kinds=("array",),
    reference=_embedding_reference,
    make_cases=_embedding_cases,
    summary="float64 and float32, repeated tokens, one token, one token repeated everywhere, "
            "unused vocabulary rows",
    single=True,
    diagnose=_embedding_diagnose,
    shape_hints={"dwte": "One row per vocabulary entry: dwte is (vocab_size, d)."},
    dtype_hint="Create dwte with dtype=dh.dtype.",
)


def check_embedding_backward(fn: Callable) -> CheckResult:
    """Chapter 6: `fn(x (B, S) int, dh (B, S, d), vocab_size) -> dwte (V, d)`."""
    return _check(_EMBEDDING, fn)


def _tied_reference(x, dh, dlogits, xf, vocab_size) -> tuple:
    from .embedding import embedding_backward

    return (embedding_backward(x, dh, vocab_size) + dlogits.T @ xf,)


def _tied_cases() -> list[_Case]:
    rng = _rng(607)
    cases = []
    for label, x, V, d, dtype in _token_cases(6070):
        N = x.size
        dh = _randn(rng, x.shape + (d,), dtype)  # (B, S, d)
        dlogits = _randn(rng, (N, V), dtype, 0.5)  # (N, V)
        xf = _randn(rng, (N, d), dtype)  # (N, d)
        cases.append(_Case(label, (x, dh, dlogits, xf, V)))
    return cases


def _tied_diagnose(args: tuple, exp: dict, got: dict, wrong: set, tol: float) -> list[str]:
    x, dh, dlogits, xf, V = args
    proj = dlogits.T @ xf  # (V, d)
    scatter = exp["dwte"] - proj
    found = _candidates(got, wrong, tol, [
        ("only the output-projection term dlogits.T @ xf: add the embedding scatter-add, "
         "wte is used twice.", lambda: {"dwte": proj}),
        ("only the embedding scatter-add: add the output-projection term dlogits.T @ xf, "
         "wte is used twice.", lambda: {"dwte": scatter}),
        ("the output-projection term has its sign flipped.", lambda: {"dwte": scatter - proj}),
    ])
    return found or _repeats_diagnose(x, dh, V, np.asarray(got["dwte"], dtype=np.float64),
                                      exp["dwte"], tol, "dwte")


_TIED = _Spec(
    exercise="tied_wte_grad",
    reference_name="xenith_edu.embedding.embedding_backward(x, dh, V) + dlogits.T @ xf",
    arg_names=("x", "dh", "dlogits", "xf", "vocab_size"),
    out_names=("dwte",),
    kinds=("array",),
    reference=_tied_reference,
    make_cases=_tied_cases,
    summary="float64 and float32, repeated tokens, one token, unused vocabulary rows",
    single=True,
    diagnose=_tied_diagnose,
    shape_hints={"dwte": "One row per vocabulary entry: dwte is (vocab_size, d)."},
    dtype_hint="Create dwte with dtype=dh.dtype.",
)


def check_tied_wte_grad(fn: Callable) -> CheckResult:
    """Chapter 6: `fn(x, dh, dlogits (N, V), xf (N, d), vocab_size) -> dwte (V, d)`, tied."""
    return _check(_TIED, fn)


# ----------------------------------------------------------------------------------------------
# Chapter 7: the linear layer, the building block of the whole backward pass.


def _linear_cases() -> list[_Case]:
    rng = _rng(707)
    cases = []
    for label, N, n, m, dtype in [
        ("float64, N=5, n=3, m=4", 5, 3, 4, np.float64),
        ("float32, N=6, n=4, m=2", 6, 4, 2, np.float32),
        ("float64, N=1 (one position), n=3, m=2", 1, 3, 2, np.float64),
        ("float64, N=n=m=4 (square)", 4, 4, 4, np.float64),
    ]:
        dY = _randn(rng, (N, m), dtype)  # (N, m)
        X = _randn(rng, (N, n), dtype)  # (N, n)
        W = _randn(rng, (n, m), dtype)  # (n, m)
        cases.append(_Case(label, (dY, X, W)))
    return cases


_LINEAR = _Spec(
    exercise="linear_backward",
    reference_name="dX = dY @ W.T, dW = X.T @ dY",
    arg_names=("dY", "X", "W"),
    out_names=("dX", "dW"),
    kinds=("array", "array"),
    reference=lambda dY, X, W: (dY @ W.T, X.T @ dY),
    make_cases=_linear_cases,
    summary="float64 and float32, N = 1 to 6, a square case",
    diagnose=lambda args, exp, got, wrong, tol: _candidates(got, wrong, tol, [
        ("dX = dY @ W.T: W needs the transpose.", lambda: {"dX": args[0] @ args[2]}),
        ("dW = X.T @ dY (shape (n, m), like W); dY.T @ X is its transpose.",
         lambda: {"dW": args[0].T @ args[1]}),
    ]),
    factors=lambda a: {f"N = {a[1].shape[0]}": float(a[1].shape[0])},
)


def check_linear_backward(fn: Callable) -> CheckResult:
    """Chapter 7: `fn(dY (N, m), X (N, n), W (n, m)) -> (dX, dW)` of Y = X @ W."""
    return _check(_LINEAR, fn)


# ----------------------------------------------------------------------------------------------
# Chapter 8: AdamW and the learning-rate schedule.


def _adamw_reference(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay) -> tuple:
    from .optim import adamw_update

    return adamw_update(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay)


def _adamw_cases() -> list[_Case]:
    rng = _rng(808)
    cases = []
    for label, shape, dtype, t, wd in [
        ("float64, p (5, 3), t=3, weight_decay=0.1", (5, 3), np.float64, 3, 0.1),
        ("float32, p (4,), t=7, weight_decay=0.1", (4,), np.float32, 7, 0.1),
        ("float64, p (2, 3, 4), t=1 (first update), weight_decay=0.05", (2, 3, 4),
         np.float64, 1, 0.05),
        ("float64, p (6,), t=1000, weight_decay=0", (6,), np.float64, 1000, 0.0),
    ]:
        p = _randn(rng, shape, dtype)
        g = _randn(rng, shape, dtype, 0.1)
        m = _randn(rng, shape, dtype, 0.05) if t > 1 else np.zeros(shape, dtype)
        v = (_randn(rng, shape, dtype, 0.03) ** 2).astype(dtype) if t > 1 else \
            np.zeros(shape, dtype)
        cases.append(_Case(label, (p, g, m, v, t, 1e-2, 0.9, 0.95, 1e-8, wd)))
    return cases


def _adamw_diagnose(args: tuple, exp: dict, got: dict, wrong: set, tol: float) -> list[str]:
    p, g, m, v, t, lr, b1, b2, eps, wd = args

    def step(g=g, decay=p * (1 - lr * wd), t_bias=t, sign=-1.0, eps_in=False,
             sq=True) -> dict:
        m2 = b1 * m + (1 - b1) * g
        v2 = b2 * v + (1 - b2) * (g * g if sq else g)
        mh = m2 / (1 - b1**t_bias) if t_bias else m2
        vh = v2 / (1 - b2**t_bias) if t_bias else v2
        den = np.sqrt(vh + eps) if eps_in else np.sqrt(vh) + eps
        return {"p": decay + sign * lr * mh / den, "m": m2, "v": v2}

    return _candidates(got, wrong, tol, [
        ("the bias correction is missing: m_hat = m / (1 - beta1**t), v_hat = v / "
         "(1 - beta2**t).", lambda: {"p": step(t_bias=0)["p"]}),
        ("the bias correction uses t + 1: t is already the 1-based update count.",
         lambda: {"p": step(t_bias=t + 1)["p"]}),
        ("the weight decay goes through the gradient (L2, as in Adam): AdamW decouples it, "
         "p * (1 - lr * weight_decay), and the moments see only g.",
         lambda: step(g=g + wd * p, decay=p)),
        ("the weight decay is missing: p * (1 - lr * weight_decay).",
         lambda: {"p": step(decay=p)["p"]}),
        ("the weight decay is not scaled by lr: p * (1 - lr * weight_decay).",
         lambda: {"p": step(decay=p * (1 - wd))["p"]}),
        ("the step goes uphill: p moves by -lr * m_hat / (sqrt(v_hat) + eps).",
         lambda: {"p": step(sign=1.0)["p"]}),
        ("eps is inside the square root: it goes outside, sqrt(v_hat) + eps.",
         lambda: {"p": step(eps_in=True)["p"]}),
        ("v must average g**2, not g.", lambda: {"v": step(sq=False)["v"]}),
    ])


_ADAMW = _Spec(
    exercise="adamw_update",
    reference_name="xenith_edu.optim.adamw_update",
    arg_names=("p", "g", "m", "v", "t", "lr", "beta1", "beta2", "eps", "weight_decay"),
    out_names=("p", "m", "v"),
    kinds=("array",) * 3,
    reference=_adamw_reference,
    make_cases=_adamw_cases,
    summary="float64 and float32, t = 1 to 1000, with and without weight decay",
    diagnose=_adamw_diagnose,
)


def check_adamw_update(fn: Callable) -> CheckResult:
    """Chapter 8: `fn(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay) -> (p, m, v)`."""
    return _check(_ADAMW, fn)


def _lr_reference(step, max_lr, min_lr, warmup_steps, decay_steps) -> tuple:
    from .optim import lr_at

    return (lr_at(step, max_lr, min_lr, warmup_steps, decay_steps),)


def _lr_cases() -> list[_Case]:
    cases = []
    for max_lr, min_lr, warmup, decay in [(6e-4, 6e-5, 10, 100), (1e-3, 0.0, 3, 20)]:
        for step in sorted({0, 1, warmup // 2, warmup - 1, warmup, warmup + 1,
                            (warmup + decay) // 2, decay - 1, decay, decay + 7}):
            phase = ("warmup" if step < warmup else "cosine decay" if step < decay
                     else "after the decay")
            cases.append(_Case(f"step={step} ({phase}), max_lr={max_lr:g}, min_lr={min_lr:g}, "
                               f"warmup_steps={warmup}, decay_steps={decay}",
                               (step, max_lr, min_lr, warmup, decay)))
    return cases


def _lr_diagnose(args: tuple, exp: dict, got: dict, wrong: set, tol: float) -> list[str]:
    step, max_lr, min_lr, warmup, decay = args
    progress = (step - warmup) / (decay - warmup)
    return _candidates(got, wrong, tol, [
        ("the warmup is off by one: update 0 already moves, lr = max_lr * (step + 1) / "
         "warmup_steps.", lambda: {"lr": max_lr * step / warmup} if step < warmup else {}),
        ("the decay is linear: it follows a half cosine, min_lr + 0.5 * (1 + cos(pi * "
         "progress)) * (max_lr - min_lr).",
         lambda: {"lr": max_lr - progress * (max_lr - min_lr)} if warmup <= step < decay
         else {}),
        ("the cosine decays to 0: it ends at min_lr.",
         lambda: {"lr": 0.5 * (1 + math.cos(math.pi * progress)) * max_lr}
         if warmup <= step < decay else {}),
        ("the decay's progress counts from step 0: it starts after the warmup, progress = "
         "(step - warmup_steps) / (decay_steps - warmup_steps).",
         lambda: {"lr": min_lr + 0.5 * (1 + math.cos(math.pi * step / decay)) *
                  (max_lr - min_lr)} if warmup <= step < decay else {}),
        ("after decay_steps the rate stays at min_lr.",
         lambda: {"lr": 0.0} if step >= decay and min_lr else {}),
    ])


_LR = _Spec(
    exercise="lr_schedule",
    reference_name="xenith_edu.optim.lr_at",
    arg_names=("step", "max_lr", "min_lr", "warmup_steps", "decay_steps"),
    out_names=("lr",),
    kinds=("float",),
    reference=_lr_reference,
    make_cases=_lr_cases,
    summary="two schedules, steps in the warmup, the cosine decay and after it",
    single=True,
    diagnose=_lr_diagnose,
    tol=1e-9,
)


def check_lr_schedule(fn: Callable) -> CheckResult:
    """Chapter 8: `fn(step, max_lr, min_lr, warmup_steps, decay_steps) -> float`."""
    return _check(_LR, fn)


# The exercise id (the check's name without "check_") -> (chapter, check function).
CHECKS: dict[str, tuple[int, Callable[[Callable], CheckResult]]] = {
    "softmax_cross_entropy": (1, check_softmax_cross_entropy),
    "uniform_loss": (1, check_uniform_loss),
    "swiglu_backward": (2, check_swiglu_backward),
    "silu_grad": (2, check_silu_grad),
    "rmsnorm_backward": (3, check_rmsnorm_backward),
    "rmsnorm_dot": (3, check_rmsnorm_dot),
    "attention_backward": (4, check_attention_backward),
    "attention_memory": (4, check_attention_memory),
    "rope_backward": (5, check_rope_backward),
    "rope_tables": (5, check_rope_tables),
    "embedding_backward": (6, check_embedding_backward),
    "tied_wte_grad": (6, check_tied_wte_grad),
    "linear_backward": (7, check_linear_backward),
    "adamw_update": (8, check_adamw_update),
    "lr_schedule": (8, check_lr_schedule),
}

__all__ = ["CHECKS", "CheckResult", "GRADE_LOG_ENV"] + [f"check_{name}" for name in CHECKS]
