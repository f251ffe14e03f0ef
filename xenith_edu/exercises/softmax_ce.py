"""Exercises of the softmax cross-entropy chapter: the loss and its gradient, and relatives.

See the "Softmax cross-entropy" chapter; each check diagnoses the usual mistakes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..softmax_ce import softmax_cross_entropy
from .engine import check
from .fit import Term, term
from .kit import OVERFLOW, int_sampler, randn, softmax64
from .types import Case, CheckResult, Mistake, Spec

# Shape legend: N positions, V vocab.


def _ce_reference(logits: np.ndarray, targets: np.ndarray) -> tuple:
    return softmax_cross_entropy(logits, targets)


def _logit_case(rng: np.random.Generator, label: str, N: int, V: int, dtype: type,
                scale: float = 1.0, shift: float = 0.0, same: bool = False) -> Case:
    logits = randn(rng, (N, V), dtype, scale) + dtype(shift)  # (N, V)
    targets = rng.integers(0, V, size=N)  # (N,)
    if same:
        targets = np.full(N, targets[0])
    label = f"{np.dtype(dtype).name}, " + label.format(N=N, V=V)
    return Case(label, (logits, targets), OVERFLOW if shift else "")


def _confidently_wrong(rng: np.random.Generator, N: int, V: int) -> Case:
    """Every target's logit 35 to 50 below its row's max (its probability 1e-15 to 1e-22): a
    log nudged or clipped by a small constant shows here; the reference's 1e-30 clamp does not."""
    logits = randn(rng, (N, V), np.float64, 2.0)  # (N, V)
    targets = rng.integers(0, V, size=N)  # (N,)
    rows = np.arange(N)
    logits[rows, targets] = logits.max(axis=-1) - rng.uniform(35.0, 50.0, size=N)
    label = f"float64, confidently wrong (every target below 1e-15), N={N}, V={V}"
    return Case(label, (logits, targets), "")


def _rows_apart(rng: np.random.Generator, N: int, V: int) -> Case:
    """Rows whose logits lie far apart (around 0 and around 800): each row needs its own max;
    one max for the whole array underflows every exp of the low rows."""
    logits = randn(rng, (N, V), np.float64, 2.0)  # (N, V)
    logits[::2] += rng.uniform(780.0, 820.0)  # every other row far above the rest
    targets = rng.integers(0, V, size=N)  # (N,)
    label = f"float64, rows far apart (around 0 and around 800), N={N}, V={V}"
    return Case(label, (logits, targets), OVERFLOW)


def _ce_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)

    big64, big32 = float(rng.uniform(750, 850)), float(rng.uniform(90, 105))
    plain = "N={N}, V={V}"
    n_eq = ints(5, 8)  # N = V: a row sum broadcast along the wrong axis fits the shapes
    return [
        _logit_case(rng, plain, ints(6, 10), ints(8, 16), np.float64, 2.0),
        _logit_case(rng, plain, ints(4, 8), ints(10, 20), np.float32, 2.0),
        _logit_case(rng, "N={N}, V={V}, every target the same token", ints(6, 10), ints(5, 9),
                    np.float64, same=True),
        _logit_case(rng, "N=1 (one position), V={V}", 1, ints(3, 8), np.float64),
        _logit_case(rng, plain, ints(2, 5), 2, np.float64),
        # exp overflows past ~709 (float64) and ~88 (float32); the spread stays small enough
        # that no probability underflows (the reference clamps log at 1e-30)
        _logit_case(rng, f"large logits (around {big64:.0f}), " + plain, ints(3, 6),
                    ints(5, 10), np.float64, 5.0, big64),
        _logit_case(rng, f"large logits (around {big32:.0f}), " + plain, ints(3, 6),
                    ints(4, 8), np.float32, 5.0, big32),
        _logit_case(rng, "small logits (softmax near uniform), N=V={N}", n_eq, n_eq, np.float64,
                    0.02),
        _logit_case(rng, plain, ints(9, 12), ints(20, 40), np.float32, 3.0),
        _confidently_wrong(rng, ints(3, 6), ints(6, 12)),
        _rows_apart(rng, ints(4, 7), ints(5, 10)),
    ]


def _ce_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    logits, targets = args
    N, V = logits.shape
    onehot = np.eye(V)[targets]  # (N, V)
    p = softmax64(logits)
    loss, dl = exp["loss"], exp["dlogits"]
    return [
        (f"dlogits is N = {N} times too large: the 1/N of the mean is missing "
         "(dlogits = (softmax - onehot) / N).", lambda: {"dlogits": dl * N}),
        (f"dlogits is divided by N = {N} twice.", lambda: {"dlogits": dl / N}),
        ("sign flipped: dlogits = (softmax - onehot) / N, not (onehot - softmax) / N.",
         lambda: {"dlogits": -dl}),
        ("the one-hot term is missing: subtract 1 at each target "
         "(dlogits = (softmax - onehot) / N).", lambda: {"dlogits": p / N}),
        ("the one-hot term is missing and the 1/N too.", lambda: {"dlogits": p}),
        ("the softmax is normalised over the wrong axis: each row (axis=-1) must sum to 1.",
         lambda: {"dlogits": (softmax64(logits, axis=0) - onehot) / N}),
        (f"the loss is summed over the positions, not averaged (divide by N = {N}).",
         lambda: {"loss": loss * N}),
        ("the loss has its sign flipped: it is -log softmax(logits)[target].",
         lambda: {"loss": -loss}),
        ("the loss uses log base 2: use the natural log, np.log.",
         lambda: {"loss": loss / math.log(2)}),
        ("the loss uses log base 10: use the natural log, np.log.",
         lambda: {"loss": loss / math.log(10)}),
        ("a row sum is broadcast along the wrong axis: keepdims=True is missing in the "
         "softmax's sum over axis=-1.", lambda: _no_keepdims(logits, targets) if N == V else {}),
    ]


def _no_keepdims(logits: np.ndarray, targets: np.ndarray) -> dict:
    """softmax with e / e.sum(axis=-1): the (N,) sums divide the columns, possible if N == V."""
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1)  # (N, V): wrong, row sums spread along the last axis
    N = len(targets)
    d = p.copy()
    d[np.arange(N), targets] -= 1
    return {"loss": float(-np.mean(np.log(p[np.arange(N), targets]))), "dlogits": d / N}


def _ce_terms(args: tuple) -> dict[str, list[Term]]:
    """loss = -mean(log softmax(logits)[target]), dlogits = softmax / N - onehot / N."""
    logits, targets = args
    N, V = logits.shape
    p = softmax64(logits)  # (N, V)
    onehot = np.eye(V)[targets]  # (N, V)
    loss = -float(np.mean(np.log(np.maximum(p[np.arange(N), targets], 1e-300))))
    axis0 = (("its softmax is normalised over the positions (axis=0): each row (axis=-1) must "
              "sum to 1", softmax64(logits, axis=0) / N),)
    return {"loss": [Term("-mean(log softmax(logits)[target])", np.asarray(loss))],
            "dlogits": [term("softmax / N", ("softmax", p), ("1 / N", 1.0 / N), slips=axis0),
                        term("-onehot / N", ("onehot", onehot), ("1 / N", 1.0 / N), sign=-1.0)]}


def _ce_floor(args: tuple) -> dict[str, float]:
    logits = args[0]
    return {"loss": 1.0 + float(np.max(np.abs(logits))), "dlogits": 1.0 / logits.shape[0]}


CE = Spec(
    id="softmax_cross_entropy",
    reference_name="xenith_edu.softmax_ce.softmax_cross_entropy",
    arg_names=("logits", "targets"),
    out_names=("loss", "dlogits"),
    kinds=("float", "array"),
    reference=_ce_reference,
    cases=_ce_cases,
    seed=101,
    summary="float64 and float32, N = 1 to 12, V = 2 to 40, N = V, repeated targets, logits "
            "from near 0 to around 800, targets of probability below 1e-15, rows far apart",
    mistakes=_ce_mistakes,
    terms=_ce_terms,
    hints=("The loss is the mean over N positions of -log softmax(logits)[target]: the gradient of "
           "-log softmax at a row is softmax minus the one-hot of its target, and the mean "
           "divides by N.",
           "Subtract each row's max, exponentiate, normalise each row (axis=-1); loss = mean of "
           "-log p[n, target[n]]; dlogits = p, then subtract 1 at each target, then divide by N.",
           "loss = -mean(log softmax(logits)[arange(N), targets]); dlogits = (softmax(logits) - "
           "onehot(targets)) / N"),
    factors=lambda a: {f"N = {a[0].shape[0]}": float(a[0].shape[0]),
                       f"V = {a[0].shape[1]}": float(a[0].shape[1])},
    floor=_ce_floor,
)


def check_softmax_cross_entropy(fn: Callable) -> CheckResult:
    """`fn(logits (N, V), targets (N,) int) -> (loss, dlogits (N, V))`.

    See the "Softmax cross-entropy" chapter.
    """
    return check(CE, fn)


def log_softmax64(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))


def smoothed(logits: np.ndarray, targets: np.ndarray, smoothing: float,
             off: float | None = None, on: float | None = None) -> tuple[float, np.ndarray]:
    """Loss and dlogits against the target distribution q: `on` at the target, `off` elsewhere.

    By default q = (1 - smoothing) * onehot + smoothing / V: the mean of -sum(q * log p), and
    its gradient (p - q) / N.
    """
    N, V = logits.shape
    lp = log_softmax64(logits.astype(np.float64))  # (N, V)
    off = smoothing / V if off is None else off
    on = 1 - smoothing + smoothing / V if on is None else on
    q = np.full((N, V), off)  # (N, V)
    q[np.arange(N), targets] = on
    return float(-np.sum(q * lp) / N), (np.exp(lp) - q) / N


def _ls_reference(logits: np.ndarray, targets: np.ndarray, smoothing: float) -> tuple:
    loss, dlogits = smoothed(logits, targets, smoothing)
    return float(loss), dlogits.astype(logits.dtype)


def _ls_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)
    n_eq = ints(5, 8)  # N = V

    plans = [("N={N}, V={V}", ints(4, 9), ints(5, 12), np.float64, 2.0, 0.0),
             ("N={N}, V={V}", ints(3, 7), ints(6, 14), np.float32, 2.0, 0.0),
             ("N=1 (one position), V={V}", 1, ints(3, 8), np.float64, 1.0, 0.0),
             ("large logits (around 800), N={N}, V={V}", ints(3, 6), ints(4, 8), np.float64,
              5.0, float(rng.uniform(750, 850))),
             ("small logits, N=V={N}", n_eq, n_eq, np.float64, 0.02, 0.0),
             ("N={N}, V={V}", ints(9, 12), ints(10, 20), np.float64, 2.0, 0.0)]
    cases = []
    for label, N, V, dtype, scale, shift in plans:
        c = _logit_case(rng, label, N, V, dtype, scale, shift)
        eps = float(rng.uniform(0.05, 0.3))
        cases.append(Case(f"{c.label}, smoothing={eps:.3f}", c.args + (eps,), c.overflow_hint))
    return cases


def _ls_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    logits, targets, eps = args
    N, V = logits.shape

    def q(**kw) -> dict:
        return dict(zip(("loss", "dlogits"), smoothed(logits, targets, eps, **kw), strict=True))

    plain = dict(zip(("loss", "dlogits"), smoothed(logits, targets, 0.0), strict=True))
    return [
        ("the smoothing is ignored: that is the plain cross-entropy.", lambda: plain),
        ("the gradient ignores the smoothing: dlogits = (softmax - q) / N, with q = "
         "(1 - smoothing) * onehot + smoothing / V.",
         lambda: {"loss": exp["loss"], "dlogits": plain["dlogits"]}),
        ("the one-hot part is not scaled by (1 - smoothing): q = (1 - smoothing) * onehot + "
         "smoothing / V sums to 1.", lambda: q(on=1 + eps / V)),
        ("the smoothing is spread over the V - 1 other tokens; this exercise spreads it over "
         "all V: q = (1 - smoothing) * onehot + smoothing / V.",
         lambda: q(off=eps / (V - 1), on=1 - eps)),
        (f"the uniform part is smoothing, not smoothing / V (V = {V}): q must sum to 1.",
         lambda: q(off=eps, on=1 - eps + eps)),
        (f"dlogits is N = {N} times too large: the 1/N of the mean is missing.",
         lambda: {"dlogits": exp["dlogits"] * N}),
        (f"the loss is summed over the positions, not averaged (divide by N = {N}).",
         lambda: {"loss": exp["loss"] * N}),
        ("sign flipped: dlogits = (softmax - q) / N.", lambda: {"dlogits": -exp["dlogits"]}),
    ]


def _ls_terms(args: tuple) -> dict[str, list[Term]]:
    """dlogits = softmax / N - (1 - smoothing) * onehot / N - smoothing / (V * N)."""
    logits, targets, eps = args
    N, V = logits.shape
    onehot = np.eye(V)[targets]  # (N, V)
    loss, _ = smoothed(logits, targets, eps)
    return {"loss": [Term("-mean(sum(q * log softmax(logits)))", np.asarray(loss))],
            "dlogits": [term("softmax / N", ("softmax", softmax64(logits)), ("1 / N", 1.0 / N)),
                        term("-(1 - smoothing) * onehot / N", ("1 - smoothing", 1.0 - eps),
                             ("onehot", onehot), ("1 / N", 1.0 / N), sign=-1.0),
                        term("-smoothing / (V * N)", ("smoothing", eps), ("1 / V", 1.0 / V),
                             ("1 / N", np.full((N, V), 1.0 / N)), sign=-1.0)]}


LABEL_SMOOTHING = Spec(
    id="label_smoothing",
    reference_name="the cross-entropy against q = (1 - smoothing) * onehot + smoothing / V",
    arg_names=("logits", "targets", "smoothing"),
    out_names=("loss", "dlogits"),
    kinds=("float", "array"),
    reference=_ls_reference,
    cases=_ls_cases,
    seed=103,
    summary="float64 and float32, one position, N = V, up to 12 positions, logits from near 0 "
            "to around 800, smoothing 0.05 to 0.3",
    mistakes=_ls_mistakes,
    terms=_ls_terms,
    factors=lambda a: {f"N = {a[0].shape[0]}": float(a[0].shape[0]),
                       f"V = {a[0].shape[1]}": float(a[0].shape[1])},
    floor=_ce_floor,
)


def check_label_smoothing(fn: Callable) -> CheckResult:
    """`fn(logits (N, V), targets (N,), smoothing) -> (loss, dlogits (N, V))` with label smoothing.

    The target distribution is q = (1 - smoothing) * onehot + smoothing / V; the loss is the
    mean over positions of -sum(q * log softmax(logits)). See the "Softmax cross-entropy" chapter.
    """
    return check(LABEL_SMOOTHING, fn)


SPECS = [CE, LABEL_SMOOTHING]

__all__ = ["check_softmax_cross_entropy", "check_label_smoothing"]
