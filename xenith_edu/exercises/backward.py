"""Exercises of the whole-backward chapter: the linear layer, and the gradient of a full layer.

See the "The whole backward pass" chapter; each check diagnoses the usual mistakes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .engine import check
from .kit import amax, int_sampler, log_uniform, magnitudes, randn, rms_parts
from .types import Case, CheckResult, Mistake, Spec

# Shape legend: N positions, n inputs, m outputs of a linear layer Y = X @ W.


def _linear_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)

    sq = ints(3, 5)
    shapes = [  # label, N, n, m, dtype
        ("", ints(4, 6), ints(2, 3), ints(4, 5), np.float64),
        ("", ints(4, 6), ints(3, 5), ints(2, 3), np.float32),
        ("N=1 (one position), ", 1, ints(2, 4), ints(2, 3), np.float64),
        (f"N=n=m={sq} (square)", sq, sq, sq, np.float64),
        ("", ints(9, 12), ints(3, 5), ints(10, 14), np.float64),
    ]
    cases = []
    for what, N, n, m, dtype in shapes:
        dY = randn(rng, (N, m), dtype)  # (N, m)
        X = randn(rng, (N, n), dtype)  # (N, n)
        W = randn(rng, (n, m), dtype)  # (n, m)
        label = what if what.endswith(")") else f"{what}N={N}, n={n}, m={m}"
        label = label.replace("(one position), N=1, ", "(one position), ")
        cases.append(Case(f"{np.dtype(dtype).name}, {label}", (dY, X, W)))
    return cases + magnitudes(rng, cases[0], 0, "dY")


LINEAR = Spec(
    id="linear_backward",
    reference_name="dX = dY @ W.T, dW = X.T @ dY",
    arg_names=("dY", "X", "W"),
    out_names=("dX", "dW"),
    kinds=("array", "array"),
    reference=lambda dY, X, W: (dY @ W.T, X.T @ dY),
    cases=_linear_cases,
    seed=707,
    summary="float64 and float32, N = 1 to 12, a square case, dY from 1e-3 to 1e2",
    mistakes=lambda args, exp: [
        ("dX = dY @ W.T: W needs the transpose.", lambda: {"dX": args[0] @ args[2]}),
        ("dW = X.T @ dY (shape (n, m), like W); dY.T @ X is its transpose.",
         lambda: {"dW": args[0].T @ args[1]}),
    ],
    factors=lambda a: {f"N = {a[1].shape[0]}": float(a[1].shape[0])},
    floor=lambda a: {"dX": amax(a[0], a[2]), "dW": amax(a[0], a[1])},
)


def check_linear_backward(fn: Callable) -> CheckResult:
    """`fn(dY (N, m), X (N, n), W (n, m)) -> (dX, dW)` of Y = X @ W.

    See the "The whole backward pass" chapter.
    """
    return check(LINEAR, fn)


def rms_backward64(dxn: np.ndarray, x: np.ndarray, w: np.ndarray, eps: float) -> tuple:
    """(dx, dw) of xn = rmsnorm(x, w, eps), in float64: see the RMSNorm chapter."""
    xhat, rstd = rms_parts(x, eps)
    g = dxn * w
    return rstd * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True)), np.sum(dxn * xhat, 0)


def residual_backward64(dout, h, w, W, alpha, eps, skip: float = 1.0, branch: float = 1.0,
                        dW_alpha: bool = True) -> dict:
    """out = h + alpha * rmsnorm(h, w) @ W: each gradient, in float64.

    The switches leave one factor out, for the diagnosis: `skip` scales the residual path,
    `branch` the alpha seen by the branch's gradient, `dW_alpha` whether dW gets alpha.
    """
    xhat, rstd = rms_parts(h, eps)
    xn = xhat * w  # (N, d)
    dbranch = alpha * branch * dout  # out = h + alpha * branch(h)
    dW = xn.T @ (dbranch if dW_alpha else dout)  # branch = xn @ W
    dxn = dbranch @ W.T
    dx, dw = rms_backward64(dxn, h, w, eps)  # xn = rmsnorm(h, w)
    return {"dh": skip * dout + dx, "dw": dw, "dW": dW}  # h is used twice: the gradients add


def _residual_reference(dout, h, w, W, alpha, eps) -> tuple:
    out = residual_backward64(*(np.asarray(a, dtype=np.float64) for a in (dout, h, w, W)),
                              alpha, eps)
    return tuple(out[n].astype(h.dtype) for n in ("dh", "dw", "dW"))


def _residual_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)

    cases = []
    for what, N, d, dtype in [("", ints(3, 6), ints(3, 6), np.float64),
                              ("", ints(3, 6), ints(4, 8), np.float32),
                              ("N=1 (one position), ", 1, ints(3, 5), np.float64),
                              ("", ints(9, 12), ints(3, 5), np.float64)]:
        alpha, eps = float(rng.uniform(0.1, 2.0)), log_uniform(rng, 1e-6, 1e-4)
        h = randn(rng, (N, d), dtype)  # (N, d)
        w = (1.0 + 0.3 * rng.standard_normal(d)).astype(dtype)  # (d,)
        W = randn(rng, (d, d), dtype, 1 / np.sqrt(d))  # (d, d)
        dout = randn(rng, (N, d), dtype)  # (N, d)
        label = f"{what}N={N}, d={d}".replace("(one position), N=1, ", "(one position), ")
        cases.append(Case(f"{np.dtype(dtype).name}, {label}, alpha={alpha:.3f}, eps={eps:.1e}",
                          (dout, h, w, W, alpha, eps)))
    return cases + magnitudes(rng, cases[0], 0, "dout")


def _residual_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    dout, h, w, W, alpha, eps = args

    def r(**kw) -> dict:
        return residual_backward64(dout, h, w, W, alpha, eps, **kw)

    return [
        ("the residual path is missing: h is used twice (skip and branch), so dh = dout + the "
         "branch's gradient.", lambda: {"dh": r(skip=0.0)["dh"]}),
        ("alpha scales the skip path too: only the branch is scaled, dh = dout + alpha * ...",
         lambda: {"dh": r(skip=alpha)["dh"]}),
        ("alpha is missing from the branch's gradient: the branch receives alpha * dout.",
         lambda: r(branch=1.0 / alpha)),
        ("alpha is applied twice in the branch's gradient.", lambda: r(branch=alpha)),
        ("dW misses alpha: the branch's output is scaled, so dW = xn.T @ (alpha * dout).",
         lambda: {"dW": r(dW_alpha=False)["dW"]}),
        ("dW uses h where the normalised xn = rmsnorm(h, w) is needed: dW = xn.T @ (alpha * "
         "dout).", lambda: {"dW": h.T @ (alpha * dout)}),
    ]


RESIDUAL = Spec(
    id="residual_scale_backward",
    reference_name="the backward of h + alpha * rmsnorm(h, w) @ W",
    arg_names=("dout", "h", "w", "W", "alpha", "eps"),
    out_names=("dh", "dw", "dW"),
    kinds=("array",) * 3,
    reference=_residual_reference,
    cases=_residual_cases,
    seed=708,
    summary="float64 and float32, one position, N up to 12, alpha 0.1 to 2, dout from 1e-3 to "
            "1e2",
    mistakes=_residual_mistakes,
    floor=lambda a: {"dh": amax(a[0]) * (1 + a[4] * amax(a[2], a[3]) * a[1].shape[1]),
                     "dw": a[4] * a[1].shape[0] * amax(a[0], a[3]),
                     "dW": a[4] * a[1].shape[0] * amax(a[0], a[2])},
)


def check_residual_scale_backward(fn: Callable) -> CheckResult:
    """`fn(dout, h, w, W, alpha, eps) -> (dh, dw, dW)` of out = h + alpha * rmsnorm(h, w) @ W.

    See the "The whole backward pass" chapter.
    """
    return check(RESIDUAL, fn)


def stack_forward(h: np.ndarray, w: np.ndarray, W: np.ndarray, eps: float) -> list:
    """Each layer's input of h <- h + rmsnorm(h, w[l]) @ W[l], l = 0 .. L-1, and the output."""
    hs = [h]
    for l in range(w.shape[0]):
        xhat, _ = rms_parts(hs[-1], eps)
        hs.append(hs[-1] + (xhat * w[l]) @ W[l])
    return hs


def buggy_stack_backward(dout: np.ndarray, h: np.ndarray, w: np.ndarray, W: np.ndarray,
                         eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A complete backward of L residual layers with one planted bug, for the learner to find.

    Forward: for l in 0 .. L-1: h = h + rmsnorm(h, w[l]) @ W[l]. Returns (dh, dw, dW).
    """
    hs = stack_forward(h, w, W, eps)
    dw, dW = np.zeros_like(w), np.zeros_like(W)  # (L, d), (L, d, d)
    dh = dout
    for l in reversed(range(w.shape[0])):
        x = hs[l]  # the layer's input
        rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)  # (N, 1)
        xhat = x * rstd
        dW[l] = (xhat * w[l]).T @ dh  # branch = xn @ W[l]
        dxn = dh @ W[l].T
        dw[l] = np.sum(dxn * xhat, axis=0)  # xn = xhat * w[l]
        g = dxn * w[l]
        dx = rstd * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
        dh = dx  # h = h + branch(h)
    return dh, dw, dW


def _stack_reference(dout, h, w, W, eps) -> tuple:
    args = [np.asarray(a, dtype=np.float64) for a in (dout, h, w, W)]
    out = _stack_backward64(*args, eps)
    return tuple(o.astype(h.dtype) for o in out)


def _stack_backward64(dout, h, w, W, eps) -> tuple:
    hs = stack_forward(h, w, W, eps)
    dw, dW = np.zeros_like(w), np.zeros_like(W)
    dh = dout
    for l in reversed(range(w.shape[0])):
        out = residual_backward64(dh, hs[l], w[l], W[l], 1.0, eps)
        dh, dw[l], dW[l] = out["dh"], out["dw"], out["dW"]
    return dh, dw, dW


def _stack_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)

    cases = []
    for N, d, L, dtype in [(ints(3, 5), ints(3, 6), ints(2, 3), np.float64),
                           (ints(2, 5), ints(3, 6), ints(2, 3), np.float32),
                           (1, ints(3, 5), 1, np.float64), (ints(9, 12), 3, 2, np.float64)]:
        eps = log_uniform(rng, 1e-6, 1e-4)
        h = randn(rng, (N, d), dtype)  # (N, d)
        w = (1.0 + 0.3 * rng.standard_normal((L, d))).astype(dtype)  # (L, d)
        W = randn(rng, (L, d, d), dtype, 1 / np.sqrt(d))  # (L, d, d)
        dout = randn(rng, (N, d), dtype)  # (N, d)
        cases.append(Case(f"{np.dtype(dtype).name}, N={N}, d={d}, L={L} layers, eps={eps:.1e}",
                          (dout, h, w, W, eps)))
    return cases + magnitudes(rng, cases[0], 0, "dout")


STACK_BUG = Spec(
    id="backward_find_the_bug",
    reference_name="the backward of the residual stack",
    arg_names=("dout", "h", "w", "W", "eps"),
    out_names=("dh", "dw", "dW"),
    kinds=("array",) * 3,
    reference=_stack_reference,
    cases=_stack_cases,
    seed=709,
    summary="float64 and float32, one to three layers, one position, N up to 12, dout from "
            "1e-3 to 1e2",
    per_layer=("dw", "dW"),
    mistakes=lambda args, exp: [
        ("this is still what the given code computes: its bug is not fixed yet (the last "
         "layer's gradients are right; follow dh down to the layer below).",
         lambda: dict(zip(("dh", "dw", "dW"), buggy_stack_backward(*args), strict=True)))],
    floor=lambda a: {n: a[2].shape[0] * amax(a[0]) * (1 + amax(a[2], a[3]) * a[1].shape[1])
                     for n in ("dh", "dw", "dW")},
)


def check_backward_find_the_bug(fn: Callable) -> CheckResult:
    """`fn(dout, h, w (L,d), W (L,d,d), eps) -> (dh, dw, dW)`: your fix of
    `buggy_stack_backward`. The verdict says which gradient is still wrong.
    See the "The whole backward pass" chapter."""
    return check(STACK_BUG, fn)


def crossover(a: float, c: float, b: float) -> float:
    """The positive root of b S**2 = c + a S: where P's bytes equal the rest of the cache."""
    return (a + math.sqrt(a * a + 4 * b * c)) / (2 * b)


def _crossover_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for _ in range(5):
        B, H = int(rng.integers(1, 33)), int(rng.choice([1, 2, 4, 8, 12, 16]))
        itemsize = int(rng.choice([2, 4, 8]))
        a = float(rng.integers(200, 4000)) * B * itemsize  # bytes per position
        c = float(rng.integers(0, 2**22)) * itemsize  # fixed bytes (weight copies)
        cases.append(Case(f"a={a:.0f}, c={c:.0f}, B={B}, H={H}, itemsize={itemsize}",
                          (a, c, B, H, itemsize)))
    return cases


def _crossover_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    a, c, B, H, i = args
    b = B * H * i
    return [
        ("the fixed part c is left out: that is a / b, where b S**2 = a S; solve "
         "b S**2 = c + a S.", lambda: {"S": a / b}),
        ("that is the other root of b S**2 - a S - c = 0 (negative): take "
         "(a + sqrt(a**2 + 4 b c)) / (2 b).", lambda: {"S": (a - math.sqrt(a * a + 4 * b * c))
                                                       / (2 * b)}),
        ("b misses the itemsize: P holds B * H * S**2 numbers of itemsize bytes each.",
         lambda: {"S": crossover(a, c, B * H)}),
        ("b misses the batch: there is one S x S matrix per sequence and head.",
         lambda: {"S": crossover(a, c, H * i)}),
        ("b misses the heads: there is one S x S matrix per sequence and head.",
         lambda: {"S": crossover(a, c, B * i)}),
        ("the quadratic formula divides by b, not 2 b.", lambda: {"S": 2 * crossover(a, c, b)}),
        ("the discriminant is a**2 + b c; it is a**2 + 4 b c.",
         lambda: {"S": (a + math.sqrt(a * a + b * c)) / (2 * b)}),
    ]


CROSSOVER = Spec(
    id="attention_crossover",
    reference_name="the positive root of B H itemsize S**2 = c + a S",
    arg_names=("a", "c", "B", "H", "itemsize"),
    out_names=("S",),
    kinds=("float",),
    reference=lambda a, c, B, H, i: (crossover(a, c, B * H * i),),
    cases=_crossover_cases,
    seed=710,
    summary="five configurations of batch, heads, itemsize and measured a, c",
    single=True,
    mistakes=_crossover_mistakes,
    floor=lambda args: {"S": 1.0},
    tol=1e-9,
)


def check_attention_crossover(fn: Callable) -> CheckResult:
    """`fn(a, c, B, H, itemsize) -> S`: the context length where the (B, H, S, S) attention
    probabilities take as many bytes as the rest of the layer's cache, c + a S.
    See the "The whole backward pass" chapter."""
    return check(CROSSOVER, fn)


SPECS = [LINEAR, RESIDUAL, STACK_BUG, CROSSOVER]

__all__ = ["check_linear_backward", "check_residual_scale_backward",
           "check_backward_find_the_bug", "check_attention_crossover"]
