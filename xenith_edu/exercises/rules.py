"""Exercises of the chapter "The rules of backprop": the broadcast row, and one block taken apart
into atomic steps.

The learner derives the gradients of a broadcast vector and column; then backpropagates RMSNorm
and a linear layer step by step, and the check names the first wrong intermediate gradient in
the backward order and the row of the duality table it needs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from . import engine
from .engine import check
from .kit import amax, int_sampler, magnitudes, randn
from .types import Case, CheckResult, Mistake, Spec

# Shape legend: N positions (rows), n or d width (columns), m output width of the linear layer.

# The gradients the learner returns, in the backward order, each with the forward step it goes
# back through and the row of the chapter's duality table that step needs.
STEPS: tuple[tuple[str, str, str], ...] = (
    ("de", "step 10, loss = e.sum() / (2 * N)",
     "sum: its backward copies the gradient 1 / (2N) to every entry of e"),
    ("ddiff", "step 9, e = diff**2", "elementwise: multiply de by the derivative 2 * diff"),
    ("dout", "step 8, diff = out - target", "elementwise: the derivative of out - target is 1"),
    ("dW", "step 7, out = u @ W", "matmul: dW = u.T @ dout, of shape (d, m)"),
    ("du", "step 7, out = u @ W", "matmul: du = dout @ W.T, of shape (N, d)"),
    ("dw", "step 6, u = xhat * w",
     "broadcast: w is copied over the N rows, so dw sums du * xhat over them (axis=0)"),
    ("dxhat", "step 6, u = xhat * w", "elementwise: dxhat = du * w"),
    ("dr", "step 5, xhat = x * r",
     "broadcast: r (N, 1) is copied over the d columns, so dr sums dxhat * x along each row "
     "(axis=1, keepdims=True)"),
    ("dvar", "step 4, r = var**-0.5",
     "elementwise: the derivative of var**-0.5 is -0.5 * var**-1.5"),
    ("dms", "step 3, var = ms + eps", "elementwise: adding eps has derivative 1"),
    ("dsq", "step 2, ms = sq.mean(axis=1, keepdims=True)",
     "sum: a mean over d columns copies dms / d back to every column"),
    ("dx", "steps 5 and 1, xhat = x * r and sq = x**2",
     "used twice: x feeds both steps, so dx = dxhat * r + dsq * 2 * x"),
)
OUT_NAMES = tuple(name for name, _, _ in STEPS)


def block_forward(x: np.ndarray, w: np.ndarray, W: np.ndarray, target: np.ndarray,
                  eps: float) -> tuple[float, dict[str, np.ndarray]]:
    """RMSNorm then a linear layer, scored by a squared error, as ten atomic steps.

    Returns the loss and every intermediate by name. See the "The rules of backprop" chapter.
    """
    sq = x**2  # (N, d)
    ms = sq.mean(axis=1, keepdims=True)  # (N, 1)
    var = ms + eps  # (N, 1)
    r = var**-0.5  # (N, 1)
    xhat = x * r  # (N, d)
    u = xhat * w  # (N, d)
    out = u @ W  # (N, m)
    diff = out - target  # (N, m)
    e = diff**2  # (N, m)
    loss = e.sum() / (2 * len(x))  # scalar
    return loss, dict(sq=sq, ms=ms, var=var, r=r, xhat=xhat, u=u, out=out, diff=diff, e=e)


def block_backward(x: np.ndarray, w: np.ndarray, W: np.ndarray, target: np.ndarray,
                   eps: float) -> tuple[np.ndarray, ...]:
    """The twelve gradients of `block_forward`, in the backward order of `OUT_NAMES`."""
    _, c = block_forward(x, w, W, target, eps)
    N, d = x.shape
    de = np.full_like(c["e"], 1 / (2 * N))  # (N, m)
    ddiff = de * 2 * c["diff"]  # (N, m)
    dout = ddiff  # (N, m)
    dW = c["u"].T @ dout  # (d, m)
    du = dout @ W.T  # (N, d)
    dw = (du * c["xhat"]).sum(axis=0)  # (d,)
    dxhat = du * w  # (N, d)
    dr = (dxhat * x).sum(axis=1, keepdims=True)  # (N, 1)
    dvar = dr * -0.5 * c["var"] ** -1.5  # (N, 1)
    dms = dvar  # (N, 1)
    dsq = np.broadcast_to(dms / d, x.shape).copy()  # (N, d)
    dx = dxhat * c["r"] + dsq * 2 * x  # (N, d): x is used twice
    return de, ddiff, dout, dW, du, dw, dxhat, dr, dvar, dms, dsq, dx


def _cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)

    sq = ints(4, 6)
    shapes = [  # what, N, d, m, dtype, x scale
        ("", ints(4, 7), ints(5, 8), ints(2, 4), np.float64, 1.0),
        ("", ints(3, 6), ints(9, 12), ints(3, 5), np.float32, 1.0),
        ("N=1 (one position), ", 1, ints(5, 8), ints(2, 4), np.float64, 1.0),
        ("square W, ", ints(3, 6), sq, sq, np.float64, 1.0),
        ("N = d, ", sq + 1, sq + 1, ints(2, 3), np.float64, 1.0),
        ("small inputs where eps matters, ", ints(3, 5), ints(4, 7), ints(2, 4), np.float64,
         0.02),
    ]
    cases = []
    for what, N, d, m, dtype, xscale in shapes:
        eps = float(np.exp(rng.uniform(np.log(1e-5), np.log(1e-3))))
        x = randn(rng, (N, d), dtype, xscale)  # (N, d)
        w = (1.0 + 0.3 * rng.standard_normal(d)).astype(dtype)  # (d,)
        W = randn(rng, (d, m), dtype, 1 / np.sqrt(d))  # (d, m)
        target = randn(rng, (N, m), dtype)  # (N, m)
        label = f"{np.dtype(dtype).name}, {what}N={N}, d={d}, m={m}, eps={eps:.1e}"
        cases.append(Case(label, (x, w, W, target, eps)))
    return cases + magnitudes(rng, cases[0], 3, "target")


def _maker(g: dict) -> Callable[[str, str, Callable[[], np.ndarray]], Mistake]:
    """`at(name, text, value)`: a mistake at one step, which leaves every step above it right."""
    def at(name: str, text: str, value: Callable[[], np.ndarray]) -> Mistake:
        step = next(s for n, s, _ in STEPS if n == name)
        above = OUT_NAMES[:OUT_NAMES.index(name)]  # a mistake here leaves these right
        return f"{name} ({step}): {text}", lambda: {**{n: g[n] for n in above}, name: value()}

    return at


def _mistakes(args: tuple, exp: dict) -> list[Mistake]:
    """Each known mistake at one step, computed from the right gradients above that step."""
    return _head_mistakes(args, exp) + _norm_mistakes(args, exp)


def _head_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    """Mistakes in the loss and the linear layer: steps 10 down to 7."""
    x, w, W, target, eps = args
    _, c = block_forward(x, w, W, target, eps)
    N, d = x.shape
    m = W.shape[1]
    g, at = exp, _maker(exp)  # the right gradients, by name
    return [
        at("de", "the 1 / (2N) of the loss is missing: every entry of de is 1 / (2N) (sum).",
           lambda: np.ones_like(c["e"])),
        at("de", "the 1/2 of the loss is missing: every entry of de is 1 / (2N), not 1 / N.",
           lambda: np.full_like(c["e"], 1 / N)),
        at("de", f"de divides by all N * m = {N * m} entries; the loss divides by 2N only.",
           lambda: np.full_like(c["e"], 1 / (2 * N * m))),
        at("ddiff", "the factor 2 of the derivative of diff**2 is missing (elementwise).",
           lambda: g["de"] * c["diff"]),
        at("ddiff", "ddiff is not multiplied by de: each step multiplies the gradient that "
           "arrives from above by its own derivative.", lambda: 2 * c["diff"]),
        at("dout", "diff = out - target has derivative +1 with respect to out, not -1.",
           lambda: -g["ddiff"]),
        at("dW", "dW is transposed: the matmul rule gives dW = u.T @ dout, shape (d, m).",
           lambda: (g["dout"].T @ c["u"]) if d == m else None),
        at("dW", "dW uses xhat where u, the input of the product, is needed: dW = u.T @ dout.",
           lambda: c["xhat"].T @ g["dout"]),
        at("dW", "dW uses x where u, the input of the product, is needed: dW = u.T @ dout.",
           lambda: x.T @ g["dout"]),
        at("du", "du uses W where the matmul rule needs its transpose: du = dout @ W.T.",
           lambda: (g["dout"] @ W) if d == m else None),
    ]


def _norm_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    """Mistakes in RMSNorm and its gain: steps 6 down to 1."""
    x, w, W, target, eps = args
    _, c = block_forward(x, w, W, target, eps)
    N, d = x.shape
    g, at = exp, _maker(exp)  # the right gradients, by name

    def dx_with(dsq: np.ndarray) -> np.ndarray:
        return g["dxhat"] * c["r"] + dsq * 2 * x

    return [
        at("dw", "dw uses x where xhat is needed: u = xhat * w, so dw sums du * xhat.",
           lambda: (g["du"] * x).sum(axis=0)),
        at("dw", "dw misses the factor xhat: u = xhat * w, so dw sums du * xhat over the rows.",
           lambda: g["du"].sum(axis=0)),
        at("dw", "dw sums over the columns (axis=1); w is copied over the rows, so sum over "
           "axis=0.", lambda: (g["du"] * c["xhat"]).sum(axis=1) if N == d else None),
        at("dxhat", "dxhat ignores the gain: u = xhat * w, so dxhat = du * w.",
           lambda: g["du"]),
        at("dr", "dr uses xhat where x is needed: xhat = x * r, so dr sums dxhat * x.",
           lambda: (g["dxhat"] * c["xhat"]).sum(axis=1, keepdims=True)),
        at("dr", "dr takes a mean over the columns where the broadcast rule needs a sum.",
           lambda: (g["dxhat"] * x).mean(axis=1, keepdims=True)),
        at("dvar", "the derivative of var**-0.5 is -0.5 * var**-1.5, not -0.5 * var**-0.5.",
           lambda: g["dr"] * -0.5 * c["var"] ** -0.5),
        at("dvar", "the derivative of var**-0.5 is -0.5 * var**-1.5: the -0.5 is missing.",
           lambda: g["dr"] * c["var"] ** -1.5),
        at("dvar", "dvar is not multiplied by dr: each step multiplies the gradient that "
           "arrives from above by its own derivative.", lambda: -0.5 * c["var"] ** -1.5),
        at("dvar", "eps is fixed at 1e-05 instead of read from the argument eps.",
           lambda: (g["dr"] * -0.5 * (c["ms"] + 1e-5) ** -1.5) if eps != 1e-5 else None),
        at("dsq", f"the 1 / d of the mean is missing: ms averages d = {d} columns, so dsq is "
           "dms / d in every column.", lambda: np.broadcast_to(g["dms"], x.shape)),
        at("dsq", f"dsq divides by N = {N}; ms is a mean over the d = {d} columns of a row.",
           lambda: np.broadcast_to(g["dms"] / N, x.shape) if N != d else None),
        at("dx", "x is used twice, in step 1 and in step 5, and the gradients add: the path "
           "through sq = x**2 (dsq * 2 * x) is missing.", lambda: g["dxhat"] * c["r"]),
        at("dx", "x is used twice, in step 1 and in step 5, and the gradients add: the path "
           "through xhat = x * r (dxhat * r) is missing.", lambda: g["dsq"] * 2 * x),
        at("dx", "the derivative of x**2 is 2 * x: the path through step 1 misses the 2.",
           lambda: g["dxhat"] * c["r"] + g["dsq"] * x),
        at("dx", "the path through step 5 multiplies by xhat where r is needed: xhat = x * r, "
           "so that path is dxhat * r.", lambda: g["dxhat"] * c["xhat"] + g["dsq"] * 2 * x),
        at("dx", "the two paths are subtracted; x is used twice, and the gradients add: "
           "dx = dxhat * r + dsq * 2 * x.", lambda: dx_with(-g["dsq"])),
    ]


def _drop_none(mistakes: Callable[[tuple, dict], list[Mistake]]) -> Callable:
    """A mistake that cannot happen on a case (a transpose when d != m) predicts nothing."""
    def table(args: tuple, exp: dict) -> list[Mistake]:
        out = []
        for text, make in mistakes(args, exp):
            def only(make=make) -> dict:
                cand = make()
                return {} if any(v is None for v in cand.values()) else cand
            out.append((text, only))
        return out
    return table


def _first_wrong(args: tuple, exp: dict, got: dict, wrong: set, tol: float) -> list[str]:
    """When no known mistake fits: the first wrong gradient going backward, and its row."""
    return engine.first_wrong(STEPS, exp, got, wrong, tol)


def _floor(args: tuple) -> dict[str, float]:
    """The size of the terms each gradient is made of, so that a cancellation is not an error."""
    x, w, W, target, eps = args
    N, d = x.shape
    g = dict(zip(OUT_NAMES, block_backward(*args), strict=True))
    _, c = block_forward(*args)
    return {"de": 1 / (2 * N), "ddiff": 2 * amax(g["de"], c["diff"]),
            "dout": 2 * amax(g["de"], c["diff"]), "dxhat": amax(g["du"], w),
            "dW": N * amax(c["u"], g["dout"]), "du": W.shape[1] * amax(g["dout"], W),
            "dw": N * amax(g["du"], c["xhat"]), "dr": d * amax(g["dxhat"], x),
            "dvar": 0.5 * amax(g["dr"], c["var"] ** -1.5),
            "dms": 0.5 * amax(g["dr"], c["var"] ** -1.5),
            "dsq": 0.5 * amax(g["dr"], c["var"] ** -1.5) / d,
            "dx": amax(g["dxhat"], c["r"]) + 2 * amax(g["dsq"], x)}


BLOCK = Spec(
    id="rules_block",
    reference_name="xenith_edu.exercises.rules.block_backward",
    arg_names=("x", "w", "W", "target", "eps"),
    out_names=OUT_NAMES,
    kinds=("array",) * len(OUT_NAMES),
    reference=block_backward,
    cases=_cases,
    seed=1001,
    summary="float64 and float32, N = 1 to 7, a square W, N = d, small inputs where eps "
            "matters, target from 1e-3 to 1e2",
    mistakes=_drop_none(_mistakes),
    diagnose=_first_wrong,
    factors=lambda a: {f"N = {a[0].shape[0]}": float(a[0].shape[0]),
                       f"d = {a[0].shape[1]}": float(a[0].shape[1]),
                       f"2N = {2 * a[0].shape[0]}": float(2 * a[0].shape[0])},
    floor=_floor,
    shape_hints={
        "dw": "w is copied over the N rows (broadcast): sum du * xhat over them, axis=0.",
        "dr": "r is a column (N, 1) copied over the d columns (broadcast): sum dxhat * x "
              "along each row with keepdims=True.",
        "dvar": "var is a column (N, 1): its gradient is one too.",
        "dms": "ms is a column (N, 1): its gradient is one too.",
        "dsq": "sq is (N, d): the backward of the mean copies dms / d to every column "
               "(np.broadcast_to, or multiply by np.ones_like(x)).",
    },
)


def check_rules_block(fn: Callable) -> CheckResult:
    """`fn(x (N,d), w (d,), W (d,m), target (N,m), eps) -> (de, ddiff, ..., dx)`, the twelve
    gradients in the backward order. See the "The rules of backprop" chapter."""
    return check(BLOCK, fn)


def broadcast_backward(dY: np.ndarray, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`(da, dc)` of Y = X * a, a (n,) broadcast over the rows, and of Y = X * c, c (N, 1)
    broadcast over the columns, for the gradient dY (N, n) of Y."""
    return (dY * X).sum(axis=0), (dY * X).sum(axis=1, keepdims=True)  # (n,), (N, 1)


def _broadcast_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)

    sq = ints(4, 6)
    plans = [  # what, N, n, dtype: N != n except in the square case, so that a sum over the
        ("", ints(3, 5), ints(7, 10), np.float64),  # wrong axis has the wrong shape
        ("", ints(8, 11), ints(3, 5), np.float32),
        ("N=1 (one position), ", 1, ints(4, 8), np.float64),
        (f"N = n = {sq} (square), ", sq, sq, np.float64),
    ]
    cases = []
    for what, N, n, dtype in plans:
        X = randn(rng, (N, n), dtype)  # (N, n)
        dY = randn(rng, (N, n), dtype)  # (N, n)
        label = f"{what}N={N}, n={n}" if not what.endswith("), ") else what.rstrip(", ")
        cases.append(Case(f"{np.dtype(dtype).name}, {label}", (dY, X)))
    return cases + magnitudes(rng, cases[0], 0, "dY")


def _broadcast_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    dY, X = args
    N, n = X.shape
    return [
        ("da misses the local derivative X: Y = X * a, so each use of a_j carries X_ij, and "
         "da = (dY * X).sum(axis=0).", lambda: {"da": dY.sum(axis=0)}),
        ("dc misses the local derivative X: Y = X * c, so each use of c_i carries X_ij, and "
         "dc = (dY * X).sum(axis=1, keepdims=True).",
         lambda: {"dc": dY.sum(axis=1, keepdims=True)}),
        (f"da takes a mean over the N = {N} rows where the broadcast row needs a sum: a_j is "
         "used once in every row, and each use adds its gradient.",
         lambda: {"da": (dY * X).mean(axis=0) if N > 1 else None}),
        (f"dc takes a mean over the n = {n} columns where the broadcast row needs a sum: c_i "
         "is used once in every column, and each use adds its gradient.",
         lambda: {"dc": (dY * X).mean(axis=1, keepdims=True)}),
        ("da sums over the columns (axis=1): a is copied over the rows, so sum over axis=0.",
         lambda: {"da": (dY * X).sum(axis=1) if N == n else None}),
        ("da and dc are swapped: a (n,) is copied over the rows (sum over axis=0), c (N, 1) "
         "over the columns (sum over axis=1).",
         lambda: {"da": (dY * X).sum(axis=1) if N == n else None,
                  "dc": (dY * X).sum(axis=0)[:, None]}),
    ]


BROADCAST = Spec(
    id="broadcast_backward",
    reference_name="xenith_edu.exercises.rules.broadcast_backward",
    arg_names=("dY", "X"),
    out_names=("da", "dc"),
    kinds=("array", "array"),
    reference=broadcast_backward,
    cases=_broadcast_cases,
    seed=1002,
    summary="float64 and float32, more rows than columns and fewer, one position, a square X, "
            "dY from 1e-3 to 1e2",
    mistakes=_drop_none(_broadcast_mistakes),
    factors=lambda a: {f"N = {a[1].shape[0]}": float(a[1].shape[0]),
                       f"n = {a[1].shape[1]}": float(a[1].shape[1])},
    floor=lambda a: {"da": a[1].shape[0] * amax(a[0], a[1]),
                     "dc": a[1].shape[1] * amax(a[0], a[1])},
    shape_hints={
        "da": "a (n,) is copied over the N rows: sum dY * X over them (axis=0), one entry "
              "per column.",
        "dc": "c (N, 1) is copied over the n columns: sum dY * X along each row (axis=1) "
              "with keepdims=True, so that dc keeps the shape (N, 1).",
    },
    hints=("The broadcast row: an array copied along an axis is used once per copy, so its "
           "gradient sums, along that axis, the gradient of each use times its local "
           "derivative (here the other factor, X).",
           "a (n,) is copied over the rows: sum dY * X over axis=0. c (N, 1) is copied over the "
           "columns: sum dY * X over axis=1, with keepdims=True.",
           "da = (dY * X).sum(axis=0); dc = (dY * X).sum(axis=1, keepdims=True)"),
)


def check_broadcast_backward(fn: Callable) -> CheckResult:
    """`fn(dY (N,n), X (N,n)) -> (da (n,), dc (N,1))` for Y = X * a and Y = X * c, a and c
    broadcast. See the "The rules of backprop" chapter."""
    return check(BROADCAST, fn)


SPECS = [BROADCAST, BLOCK]

__all__ = ["check_broadcast_backward", "check_rules_block"]
