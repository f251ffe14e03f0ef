"""Exercises of the RMSNorm chapter: the backward, and relatives that bring eps and the mean back.

See the "RMSNorm" chapter; each check diagnoses the usual mistakes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..rmsnorm import rmsnorm_backward, rmsnorm_forward
from .engine import check
from .fit import Term, term
from .kit import amax, int_sampler, log_uniform, magnitudes, randn, rms_parts
from .types import Case, CheckResult, Mistake, Spec

# Shape legend: N positions, d width.


def _rmsnorm_reference(dy, x, w, eps) -> tuple:
    _, cache = rmsnorm_forward(x, w, eps)
    return rmsnorm_backward(dy, cache)


def _rmsnorm_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)

    sq = ints(4, 7)
    shapes = [  # label, N, d, dtype, x scale
        ("", ints(4, 6), ints(6, 10), np.float64, 1.0),
        ("", ints(3, 6), ints(12, 18), np.float32, 1.0),
        ("N=1 (one position), ", 1, ints(6, 10), np.float64, 1.0),
        (f"N=d={sq} (square)", sq, sq, np.float64, 1.0),
        ("small inputs where eps matters, ", ints(3, 5), ints(4, 6), np.float64, 0.01),
        ("random shape ", ints(2, 9), ints(2, 11), np.float64, 1.0),
    ]
    cases = []
    for what, N, d, dtype, xscale in shapes:
        eps = log_uniform(rng, 1e-6, 1e-4)
        x = randn(rng, (N, d), dtype, xscale)  # (N, d)
        w = (1.0 + 0.5 * rng.standard_normal(d)).astype(dtype)  # (d,)
        dy = randn(rng, (N, d), dtype)  # (N, d)
        label = what if what.endswith(")") else f"{what}N={N}, d={d}"
        label = label.replace("(one position), N=1, ", "(one position), ")
        cases.append(Case(f"{np.dtype(dtype).name}, {label}, eps={eps:.1e}", (dy, x, w, eps)))
    return cases + magnitudes(rng, cases[0], 0, "dy")


def _rmsnorm_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    dy, x, w, eps = args
    d = x.shape[-1]
    xhat, rstd = rms_parts(x, eps)
    g = dy * w

    def dx_from(g: np.ndarray, xhat: np.ndarray, rstd: np.ndarray) -> np.ndarray:
        return rstd * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True))

    def no_keepdims(both: bool = True) -> dict:
        # a per-row statistic (N,) broadcast along the last axis: only possible when N == d
        rstd1 = 1.0 / np.sqrt(np.mean(x * x, axis=-1) + eps)  # (N,)
        xh = x * rstd1
        proj = np.mean(g * xh, axis=-1, keepdims=not both)
        return {"dx": rstd1 * (g - xh * proj), "dw": np.sum(dy * xh, axis=0)}

    def with_eps(e: float) -> dict:
        return dict(zip(("dx", "dw"), _rmsnorm_reference(dy, x, w, e), strict=True))

    xh0, rstd0 = rms_parts(x, eps, axis=0)
    table = [
        ("the mean term of RMSNorm's Jacobian is missing: dx = rstd * (g - xhat * "
         "mean(g * xhat)), with g = dy * w, not just rstd * g.", lambda: {"dx": rstd * g}),
        ("the mean term of RMSNorm's Jacobian has the wrong sign: dx = rstd * (g - xhat * "
         "mean(g * xhat)).",
         lambda: {"dx": rstd * (g + xhat * np.mean(g * xhat, axis=-1, keepdims=True))}),
        (f"the mean term uses a sum over the d = {d} features where the mean is needed.",
         lambda: {"dx": rstd * (g - xhat * np.sum(g * xhat, axis=-1, keepdims=True))}),
        ("eps is missing: rstd = 1 / sqrt(mean(x**2) + eps).", lambda: with_eps(0.0)),
        ("dx ignores the gain w: the gradient reaching xhat is g = dy * w.",
         lambda: {"dx": dx_from(dy, xhat, rstd)}),
        ("dw uses x where the normalised xhat = x * rstd is needed: dw = sum(dy * xhat, "
         "axis=0).", lambda: {"dw": np.sum(dy * x, axis=0)}),
        ("a per-row statistic is broadcast along the wrong axis: keepdims=True is missing "
         "in a mean over axis=-1.", no_keepdims),
        ("rstd is broadcast along the wrong axis: keepdims=True is missing in the mean of "
         "x**2 over axis=-1.", lambda: no_keepdims(both=False)),
        ("the mean of x**2 is taken over the wrong axis: RMSNorm normalises each row "
         "(axis=-1), not each feature.",
         lambda: {"dx": dx_from(g, xh0, rstd0), "dw": np.sum(dy * xh0, axis=0)}),
        ("dw sums over the features (axis=1): w is shared by the positions, so sum dy * xhat "
         "over them (axis=0).", lambda: {"dw": np.sum(dy * xhat, axis=1)}),
    ]
    for fixed in (1e-5, 1e-6):  # the usual defaults, typed in instead of read
        table.append((f"eps is fixed at {fixed:g} instead of read from the argument eps.",
                      lambda fixed=fixed: with_eps(fixed) if fixed != eps else {}))
    return table


def _rmsnorm_terms(args: tuple) -> dict[str, list[Term]]:
    """dx = rstd * dy * w - rstd * xhat * mean(g * xhat), dw = sum(dy * xhat, axis=0)."""
    dy, x, w, eps = args
    N, d = x.shape
    xhat, rstd = rms_parts(x, eps)  # (N, d), (N, 1)
    g = dy * w  # (N, d)
    proj = np.mean(g * xhat, axis=-1, keepdims=True)  # (N, 1)
    flat = np.mean(g * xhat, axis=-1)  # (N,) without keepdims: it broadcasts only if N == d
    axis0 = ("its mean runs over the positions (axis=0), not over each row's features "
             "(axis=-1)", -rstd * xhat * np.mean(g * xhat, axis=0, keepdims=True))
    flat_slip = ("keepdims=True is missing in its mean over axis=-1, so the row means spread "
                 "along the features", -rstd * xhat * flat if N == d else None)
    dw_slips = (("it sums over the features (axis=1), not over the positions (axis=0)",
                 np.sum(dy * xhat, axis=1) if N == d else None),)
    return {
        "dx": [term("rstd * dy * w", ("rstd", rstd), ("dy", dy), ("w", w)),
               term("-rstd * xhat * mean(g * xhat)", ("rstd", rstd), ("xhat", xhat),
                    ("mean(g * xhat)", proj), sign=-1.0, slips=(axis0, flat_slip))],
        "dw": [Term("sum(dy * xhat, axis=0)", np.sum(dy * xhat, axis=0), slips=dw_slips)],
    }


RMSNORM = Spec(
    id="rmsnorm_backward",
    reference_name="xenith_edu.rmsnorm.rmsnorm_backward",
    arg_names=("dy", "x", "w", "eps"),
    out_names=("dx", "dw"),
    kinds=("array", "array"),
    reference=_rmsnorm_reference,
    cases=_rmsnorm_cases,
    seed=303,
    summary="float64 and float32, N = 1 to 6, a square and a random shape, small inputs "
            "where eps matters, dy from 1e-3 to 1e2",
    mistakes=_rmsnorm_mistakes,
    terms=_rmsnorm_terms,
    hints=("y = xhat * w with xhat = x * rstd, and rstd depends on the whole row: dx gets the "
           "direct path through xhat and a second through rstd (the chain rule through a mean).",
           "Write g = dy * w first; then dx = rstd * (g - xhat * mean(g * xhat, axis=-1, "
           "keepdims=True)); dw sums dy * xhat over the positions, the axis w is shared along.",
           "dx = rstd * (dy * w) - rstd * xhat * mean(dy * w * xhat, axis=-1, keepdims=True); "
           "dw = sum(dy * xhat, axis=0), with rstd = 1 / sqrt(mean(x**2, axis=-1, keepdims=True) "
           "+ eps)"),
    factors=lambda a: {f"N = {a[1].shape[0]}": float(a[1].shape[0]),
                       f"d = {a[1].shape[1]}": float(a[1].shape[1])},
    floor=lambda a: {"dx": amax(a[0], a[2]) / np.sqrt(np.mean(a[1] ** 2) + a[3]),
                     "dw": a[1].shape[0] * amax(a[0])},
    shape_hints={"dw": "w is shared by every position: sum dy * xhat over the positions "
                       "(axis=0), one entry per feature."},
)


def check_rmsnorm_backward(fn: Callable) -> CheckResult:
    """`fn(dy (N,d), x (N,d), w (d,), eps) -> (dx (N,d), dw (d,))`. See the "RMSNorm" chapter."""
    return check(RMSNORM, fn)




def layernorm_backward64(dy, x, w, b, eps, ddof: int = 0, center: bool = True) -> dict:
    """LayerNorm y = (x - mean) / sqrt(var + eps) * w + b, its backward in float64."""
    mu = x.mean(axis=-1, keepdims=True) if center else 0.0  # (N, 1)
    xc = x - mu
    var = np.sum(xc * xc, axis=-1, keepdims=True) / (x.shape[-1] - ddof)  # (N, 1)
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = xc * rstd  # (N, d)
    g = dy * w
    proj = np.mean(g * xhat, axis=-1, keepdims=True) * x.shape[-1] / (x.shape[-1] - ddof)
    dx = rstd * (g - (np.mean(g, axis=-1, keepdims=True) if center else 0.0) - xhat * proj)
    return {"dx": dx, "dw": np.sum(dy * xhat, axis=0), "db": np.sum(dy, axis=0)}


def _ln_reference(dy, x, w, b, eps) -> tuple:
    out = layernorm_backward64(*(np.asarray(a, dtype=np.float64) for a in (dy, x, w, b)), eps)
    return tuple(out[n].astype(x.dtype) for n in ("dx", "dw", "db"))


def _ln_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)
    sq = ints(4, 7)

    plans = [("", ints(3, 6), ints(5, 9), np.float64, 1.0, 2.0),
             ("", ints(3, 6), ints(10, 16), np.float32, 1.0, 1.0),
             ("N=1 (one position), ", 1, ints(4, 8), np.float64, 1.0, 3.0),
             ("small inputs where eps matters, ", ints(2, 4), ints(4, 6), np.float64, 0.01, 0.0),
             ("N=d (square), ", sq, sq, np.float64, 1.0, 1.0)]
    cases = []
    for what, N, d, dtype, scale, offset in plans:
        eps = log_uniform(rng, 1e-6, 1e-4)
        x = (randn(rng, (N, d), np.float64, scale) + offset * rng.standard_normal((N, 1)) * scale
             ).astype(dtype)  # (N, d) rows with a mean of their own
        w = (1.0 + 0.5 * rng.standard_normal(d)).astype(dtype)  # (d,)
        b = randn(rng, (d,), dtype, 0.5)  # (d,)
        dy = randn(rng, (N, d), dtype)  # (N, d)
        label = f"{what}N={N}, d={d}".replace("(one position), N=1, ", "(one position), ")
        cases.append(Case(f"{np.dtype(dtype).name}, {label}, eps={eps:.1e}",
                          (dy, x, w, b, eps)))
    return cases + magnitudes(rng, cases[0], 0, "dy")


def _ln_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    dy, x, w, b, eps = args

    def ln(**kw) -> dict:
        return layernorm_backward64(dy, x, w, b, eps, **kw)

    xhat, rstd = (x - x.mean(-1, keepdims=True)), None
    rstd = 1.0 / np.sqrt(np.mean(xhat * xhat, axis=-1, keepdims=True) + eps)
    xhat = xhat * rstd
    g = dy * w
    return [
        ("that is RMSNorm's backward: LayerNorm subtracts each row's mean first, so xhat = "
         "(x - mean) * rstd and dx gains the term -mean(g).", lambda: ln(center=False)),
        ("the mean term -mean(g) of dx is missing: subtracting the mean in the forward gives "
         "dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).",
         lambda: {"dx": rstd * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True))}),
        ("the xhat * mean(g * xhat) term of dx is missing (the variance depends on x too).",
         lambda: {"dx": rstd * (g - np.mean(g, axis=-1, keepdims=True))}),
        ("the variance divides by d - 1 (unbiased, np.var(ddof=1)); LayerNorm divides by d.",
         lambda: ln(ddof=1)),
        ("eps is missing: rstd = 1 / sqrt(var + eps).",
         lambda: layernorm_backward64(dy, x, w, b, 0.0)),
        ("dx ignores the gain w: the gradient reaching xhat is g = dy * w.",
         lambda: {"dx": layernorm_backward64(dy, x, np.ones_like(w), b, eps)["dx"]}),
        ("dw uses x where the normalised xhat is needed: dw = sum(dy * xhat, axis=0).",
         lambda: {"dw": np.sum(dy * x, axis=0)}),
        ("db is the bias's gradient: sum(dy, axis=0), not multiplied by anything.",
         lambda: {"db": np.sum(dy * w, axis=0)}),
    ]


def _ln_terms(args: tuple) -> dict[str, list[Term]]:
    """dx = rstd * g - rstd * mean(g) - rstd * xhat * mean(g * xhat), with g = dy * w."""
    dy, x, w, b, eps = args
    xc = x - x.mean(axis=-1, keepdims=True)  # (N, d)
    rstd = 1.0 / np.sqrt(np.mean(xc * xc, axis=-1, keepdims=True) + eps)  # (N, 1)
    xhat = xc * rstd
    g = dy * w  # (N, d)
    return {
        "dx": [term("rstd * dy * w", ("rstd", rstd), ("dy", dy), ("w", w)),
               term("-rstd * mean(g)", ("rstd", rstd),
                    ("mean(g)", np.mean(g, axis=-1, keepdims=True)), sign=-1.0),
               term("-rstd * xhat * mean(g * xhat)", ("rstd", rstd), ("xhat", xhat),
                    ("mean(g * xhat)", np.mean(g * xhat, axis=-1, keepdims=True)), sign=-1.0)],
        "dw": [Term("sum(dy * xhat, axis=0)", np.sum(dy * xhat, axis=0))],
        "db": [Term("sum(dy, axis=0)", np.sum(dy, axis=0))],
    }


LAYERNORM = Spec(
    id="layernorm_backward",
    reference_name="the LayerNorm backward with bias",
    arg_names=("dy", "x", "w", "b", "eps"),
    out_names=("dx", "dw", "db"),
    kinds=("array",) * 3,
    reference=_ln_reference,
    cases=_ln_cases,
    seed=305,
    summary="float64 and float32, rows with a mean of their own, one position, small inputs "
            "where eps matters, a square x, dy from 1e-3 to 1e2",
    mistakes=_ln_mistakes,
    terms=_ln_terms,
    factors=lambda a: {f"N = {a[1].shape[0]}": float(a[1].shape[0]),
                       f"d = {a[1].shape[1]}": float(a[1].shape[1])},
    floor=lambda a: {"dx": amax(a[0], a[2]) / np.sqrt(np.var(a[1]) + a[4]),
                     "dw": a[1].shape[0] * amax(a[0]), "db": a[1].shape[0] * amax(a[0])},
    shape_hints={n: "w and b are shared by every position: sum over the positions (axis=0)."
                 for n in ("dw", "db")},
)


def check_layernorm_backward(fn: Callable) -> CheckResult:
    """`fn(dy (N,d), x (N,d), w (d,), b (d,), eps) -> (dx, dw, db)` of LayerNorm with a bias.

    y = (x - mean(x)) / sqrt(var(x) + eps) * w + b along each row. See the "RMSNorm" chapter.
    """
    return check(LAYERNORM, fn)


def _scale_reference(dy, x, w, eps) -> tuple:
    dx, _ = _rmsnorm_reference(dy, x, w, eps)
    return (np.sum(x * dx, axis=-1),)


def _scale_cases(rng: np.random.Generator) -> list[Case]:
    # inputs of the size of sqrt(eps), where eps changes the answer most
    ints = int_sampler(rng)

    cases = []
    for what, N, d, dtype in [("", ints(3, 6), ints(4, 10), np.float64),
                              ("", ints(3, 6), ints(8, 16), np.float32),
                              ("N=1 (one position), ", 1, ints(4, 8), np.float64),
                              ("N=d (square), ", 5, 5, np.float64)]:
        eps = log_uniform(rng, 1e-6, 1e-3)
        x = randn(rng, (N, d), dtype, np.sqrt(eps) * float(rng.uniform(0.3, 3)))  # (N, d)
        w = (1.0 + 0.5 * rng.standard_normal(d)).astype(dtype)  # (d,)
        dy = randn(rng, (N, d), dtype)  # (N, d)
        label = f"{what}N={N}, d={d}".replace("(one position), N=1, ", "(one position), ")
        cases.append(Case(f"{np.dtype(dtype).name}, {label}, eps={eps:.1e}", (dy, x, w, eps)))
    return cases + magnitudes(rng, cases[0], 0, "dy")


def _scale_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    dy, x, w, eps = args
    _, rstd = rms_parts(x, eps)
    r = rstd[:, 0]
    gx = np.sum(dy * w * x, axis=-1)  # (N,)
    return [
        ("that is the answer for eps = 0 (RMSNorm is then scale-invariant); with eps > 0, "
         "d/da of y(a x) at a = 1 is eps * rstd**3 * x * w.", lambda: {"s": np.zeros_like(r)}),
        ("the sign: sum(x * dx) = +eps * rstd**3 * sum(dy * w * x).",
         lambda: {"s": -eps * r**3 * gx}),
        ("one factor of rstd is missing: sum(x * dx) = eps * rstd**3 * sum(dy * w * x).",
         lambda: {"s": eps * r**2 * gx}),
        ("the gain w is missing: sum(x * dx) = eps * rstd**3 * sum(dy * w * x).",
         lambda: {"s": eps * r**3 * np.sum(dy * x, axis=-1)}),
        ("that is x . (rstd * dy * w): the mean term of the backward is missing.",
         lambda: {"s": r * gx}),
        ("the sum runs over the positions (axis=0): s has one number per position, a sum over "
         "the features (axis=-1).",
         lambda: {"s": np.sum(x * _rmsnorm_reference(dy, x, w, eps)[0], axis=0)}),
    ]


RMSNORM_SCALE = Spec(
    id="rmsnorm_scale_grad",
    reference_name="sum(x * dx, axis=-1) of the RMSNorm backward",
    arg_names=("dy", "x", "w", "eps"),
    out_names=("s",),
    kinds=("array",),
    reference=_scale_reference,
    cases=_scale_cases,
    seed=306,
    summary="float64 and float32, one position, a square x, inputs of the size of sqrt(eps), dy "
            "from 1e-3 to 1e2",
    single=True,
    mistakes=_scale_mistakes,
    # the terms of sum(x * dx): d products of x and dx ~ rstd * dy * w
    floor=lambda a: {"s": a[1].shape[1] * amax(a[1], a[0], a[2]) / np.sqrt(
        np.min(np.mean(a[1] ** 2, axis=-1)) + a[3])},
    shape_hints={"s": "One number per position: sum over the features (axis=-1)."},
)


def check_rmsnorm_scale_grad(fn: Callable) -> CheckResult:
    """`fn(dy (N,d), x (N,d), w (d,), eps) -> s (N,)`, s[n] = sum(x[n] * dx[n]) in closed form.

    With eps = 0 it is 0 (RMSNorm ignores the scale of x); derive it for eps > 0.
    See the "RMSNorm" chapter.
    """
    return check(RMSNORM_SCALE, fn)


SPECS = [RMSNORM, LAYERNORM, RMSNORM_SCALE]

__all__ = ["check_rmsnorm_backward", "check_layernorm_backward",
           "check_rmsnorm_scale_grad"]
