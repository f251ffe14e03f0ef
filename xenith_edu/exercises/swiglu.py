"""Exercises of the SwiGLU chapter: the block's backward, silu's derivative, and relatives.

See the "SwiGLU" chapter; each check diagnoses the usual mistakes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from math import erf

import numpy as np

from ..swiglu import sigmoid, swiglu_backward, swiglu_forward
from .engine import check
from .fit import Term
from .kit import amax, int_sampler, magnitudes, randn, sigmoid64
from .types import Case, CheckResult, Mistake, Spec

# Shape legend: N positions, d width, f hidden width.


def _swiglu_reference(dout, x, w1, w3, w2) -> tuple:
    _, cache = swiglu_forward(x, w1, w3, w2)
    return swiglu_backward(dout, cache)


def block_inputs(rng: np.random.Generator, N: int, d: int, f: int, dtype: type) -> tuple:
    """(dout, x, w1, w3, w2) of a block of width d and hidden width f, weights ~ 1/sqrt(fan-in)."""
    x = randn(rng, (N, d), dtype)  # (N, d)
    w1 = randn(rng, (d, f), dtype, 1 / math.sqrt(d))  # (d, f)
    w3 = randn(rng, (d, f), dtype, 1 / math.sqrt(d))  # (d, f)
    w2 = randn(rng, (f, d), dtype, 1 / math.sqrt(f))  # (f, d)
    dout = randn(rng, (N, d), dtype)  # (N, d)
    return dout, x, w1, w3, w2


def _swiglu_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)

    sq = ints(3, 6)
    shapes = [  # label, N, d, f, dtype
        ("", ints(4, 6), ints(3, 6), ints(8, 12), np.float64),
        ("", ints(3, 6), ints(4, 7), ints(6, 10), np.float32),
        ("N=1 (one position), ", 1, ints(2, 5), ints(4, 8), np.float64),
        (f"N=d=f={sq} (square)", sq, sq, sq, np.float64),
        ("random shape ", ints(2, 8), ints(2, 6), ints(7, 12), np.float64),
    ]
    cases = []
    for what, N, d, f, dtype in shapes:
        label = what if what.endswith(")") else f"{what}N={N}, d={d}, f={f}"
        label = label.replace("(one position), N=1, ", "(one position), ")
        cases.append(Case(f"{np.dtype(dtype).name}, {label}",
                          block_inputs(rng, N, d, f, dtype)))
    return cases + magnitudes(rng, cases[0], 0, "dout")


def _swiglu_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    dout, x, w1, w3, w2 = args
    h1, h3 = x @ w1, x @ w3  # (N, f)
    s = sigmoid64(h1)
    dha = dout @ w2.T  # (N, f)
    dh3 = dha * h1 * s

    def through_gate(dsilu: np.ndarray) -> dict:
        dh1 = dha * h3 * dsilu
        return {"dx": dh1 @ w1.T + dh3 @ w3.T, "dw1": x.T @ dh1}

    dh1 = dha * h3 * s * (1 + h1 * (1 - s))
    return [
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
    ]


def _swiglu_terms(args: tuple) -> dict[str, list[Term]]:
    """dx = dh1 @ w1.T + dh3 @ w3.T; dw1 = x.T @ dh1, dw3 = x.T @ dh3, dw2 = a.T @ dout."""
    dout, x, w1, w3, w2 = args
    h1, h3 = x @ w1, x @ w3  # (N, f)
    s = sigmoid64(h1)
    dha = dout @ w2.T  # (N, f)
    dh1 = dha * h3 * s * (1 + h1 * (1 - s))  # (N, f) through silu
    dh3 = dha * h1 * s  # (N, f)
    return {"dx": [Term("dh1 @ w1.T", dh1 @ w1.T), Term("dh3 @ w3.T", dh3 @ w3.T)],
            "dw1": [Term("x.T @ dh1", x.T @ dh1)], "dw3": [Term("x.T @ dh3", x.T @ dh3)],
            "dw2": [Term("(silu(h1) * h3).T @ dout", (h1 * s * h3).T @ dout)]}


def block_floor(args: tuple) -> dict[str, float]:
    """The size of the terms of each gradient of a gated block (dout, x, w1, w3, w2)."""
    dout, x, w1, w3, w2 = args
    return {"dx": amax(dout, w2, x, w1, w3), "dw1": amax(dout, w2, x, x, w3),
            "dw3": amax(dout, w2, x, x, w1), "dw2": amax(x, w1, x, w3, dout)}


SWIGLU = Spec(
    id="swiglu_backward",
    reference_name="xenith_edu.swiglu.swiglu_backward",
    arg_names=("dout", "x", "w1", "w3", "w2"),
    out_names=("dx", "dw1", "dw3", "dw2"),
    kinds=("array",) * 4,
    reference=_swiglu_reference,
    cases=_swiglu_cases,
    seed=202,
    summary="float64 and float32, N = 1 to 6, a square and a random shape, dout from 1e-3 to 1e2",
    mistakes=_swiglu_mistakes,
    terms=_swiglu_terms,
    hints=("out = (silu(x @ w1) * (x @ w3)) @ w2: every matmul's backward is two matmuls with a "
           "transpose, the product's backward multiplies by the other factor, and x feeds two "
           "matmuls, so its gradient is the sum of both.",
           "Backward in reverse: dw2 = a.T @ dout and da = dout @ w2.T; then dh3 = da * silu(h1) "
           "and dh1 = da * h3 * silu'(h1); then dw1 = x.T @ dh1, dw3 = x.T @ dh3 and dx = "
           "dh1 @ w1.T + dh3 @ w3.T.",
           "silu'(z) = sigmoid(z) * (1 + z * (1 - sigmoid(z))); dx = dh1 @ w1.T + dh3 @ w3.T; "
           "dw1 = x.T @ dh1; dw3 = x.T @ dh3; dw2 = (silu(h1) * h3).T @ dout"),
    factors=lambda a: {f"N = {a[1].shape[0]}": float(a[1].shape[0])},
    floor=block_floor,
)


def check_swiglu_backward(fn: Callable) -> CheckResult:
    """`fn(dout (N,d), x (N,d), w1 (d,f), w3 (d,f), w2 (f,d)) -> (dx, dw1, dw3, dw2)`.

    See the "SwiGLU" chapter.
    """
    return check(SWIGLU, fn)


def _silu_grad_reference(z: np.ndarray) -> tuple:
    s = sigmoid(z)
    return (s * (1 + z * (1 - s)),)


def _silu_grad_cases(rng: np.random.Generator) -> list[Case]:
    big = np.array([-800.0, -100.0, -30.0, -1.0, 0.0, 1.0, 30.0, 100.0, 800.0])
    big = big * rng.uniform(0.9, 1.0, size=big.shape)
    hint = ("Overflow in exp for large |z|: compute sigmoid as 1 / (1 + exp(-z)), which is "
            "safe in both directions (exp(800) = inf gives 0 or 1, not NaN).")
    n = int(rng.integers(5, 10))
    a, b = int(rng.integers(2, 5)), int(rng.integers(3, 6))
    return [
        Case(f"float64, shape ({n},)", (randn(rng, (n,), np.float64, 2.0),)),
        Case(f"float32, shape ({a}, {b})", (randn(rng, (a, b), np.float32, 2.0),)),
        Case(f"float64, shape (2, {a}, {b})", (randn(rng, (2, a, b), np.float64, 3.0),)),
        Case("float64, large |z| up to 800", (big,), hint),
        Case("float32, large |z| up to 100", (big[1:-1].astype(np.float32),), hint),
        Case(f"float64, small |z|, shape ({a}, {a})", (randn(rng, (a, a), np.float64, 0.01),)),
    ]


def _silu_terms(args: tuple) -> dict[str, list[Term]]:
    """silu'(z) = sigmoid(z) + z * sigmoid(z) * (1 - sigmoid(z))."""
    z = args[0]
    s = sigmoid64(z)
    return {"dz": [Term("sigmoid(z)", s),
                   Term("z * sigmoid(z) * (1 - sigmoid(z))", z * s * (1 - s),
                        (("z", z), ("sigmoid(z)", s), ("1 - sigmoid(z)", 1 - s)))]}


def _silu_grad_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    z = args[0]
    s = sigmoid64(z)
    return [
        ("that is sigmoid(z), half of the product rule: silu(z) = z * sigmoid(z).",
         lambda: {"dz": s}),
        ("that is silu(z) itself, not its derivative.", lambda: {"dz": z * s}),
        ("that is the derivative of sigmoid, not of silu.", lambda: {"dz": s * (1 - s)}),
        ("sigmoid's derivative is sigmoid * (1 - sigmoid), not sigmoid.",
         lambda: {"dz": s + z * s}),
        ("the product rule misses the sigmoid(z) term.", lambda: {"dz": z * s * (1 - s)}),
    ]


SILU = Spec(
    id="silu_grad",
    reference_name="xenith_edu.swiglu (sigmoid(z) * (1 + z * (1 - sigmoid(z))))",
    arg_names=("z",),
    out_names=("dz",),
    kinds=("array",),
    reference=_silu_grad_reference,
    cases=_silu_grad_cases,
    seed=203,
    summary="float64 and float32, 1-D to 3-D, |z| from 1e-2 to 800",
    single=True,
    mistakes=_silu_grad_mistakes,
    terms=_silu_terms,
    floor=lambda args: {"dz": 1.0},
    may_call=("xenith_edu.swiglu.sigmoid",),
)


def check_silu_grad(fn: Callable) -> CheckResult:
    """`fn(z) -> silu'(z)` elementwise, same shape and dtype as z. See the "SwiGLU" chapter."""
    return check(SILU, fn)


GELU_C = math.sqrt(2.0 / math.pi)  # the tanh form: 0.5 z (1 + tanh(c (z + 0.044715 z**3)))


def gelu_tanh_grad(z: np.ndarray, cubic: float = 0.044715, c: float = GELU_C) -> np.ndarray:
    """The derivative of 0.5 z (1 + tanh(c (z + cubic z**3))), in float64."""
    t = np.tanh(c * (z + cubic * z**3))
    return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * c * (1 + 3 * cubic * z * z)


def _gelu_backward(dout, x, w1, w2, dgelu: Callable = gelu_tanh_grad) -> dict:
    h = x @ w1  # (N, f)
    t = np.tanh(GELU_C * (h + 0.044715 * h**3))
    a = 0.5 * h * (1 + t)  # (N, f) gelu(h)
    da = dout @ w2.T  # (N, f)
    dh = da * dgelu(h)
    return {"dx": dh @ w1.T, "dw1": x.T @ dh, "dw2": a.T @ dout}


def _gelu_reference(dout, x, w1, w2) -> tuple:
    out = _gelu_backward(*(np.asarray(a, dtype=np.float64) for a in (dout, x, w1, w2)))
    return tuple(out[n].astype(x.dtype) for n in ("dx", "dw1", "dw2"))


def _gelu_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)

    plans = [("", ints(3, 6), ints(2, 5), ints(6, 10), np.float64, 1.0),
             ("", ints(3, 6), ints(3, 6), ints(7, 12), np.float32, 1.0),
             ("N=1 (one position), ", 1, ints(2, 4), ints(4, 8), np.float64, 1.0),
             ("large pre-activations (tanh saturates), ", ints(2, 4), ints(2, 4), ints(4, 8),
              np.float64, 6.0),
             ("N=d=f (square), ", 4, 4, 4, np.float64, 1.0)]
    cases = []
    for what, N, d, f, dtype, scale in plans:
        dout, x, w1, _, w2 = block_inputs(rng, N, d, f, dtype)
        x = (x * dtype(scale)).astype(dtype)
        label = f"{what}N={N}, d={d}, f={f}".replace("(one position), N=1, ", "(one position), ")
        cases.append(Case(f"{np.dtype(dtype).name}, {label}", (dout, x, w1, w2)))
    return cases + magnitudes(rng, cases[0], 0, "dout")


def _gelu_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    dout, x, w1, w2 = args
    def erf_grad(z: np.ndarray) -> np.ndarray:  # the exact GELU z * Phi(z)
        phi = 0.5 * (1 + np.vectorize(erf)(z / math.sqrt(2)))
        return phi + z * np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)

    def gate(dgelu: Callable) -> dict:
        out = _gelu_backward(dout, x, w1, w2, dgelu)
        return {"dx": out["dx"], "dw1": out["dw1"]}

    return [
        ("that is the derivative of the exact (erf) GELU; this exercise uses the tanh form.",
         lambda: gate(erf_grad)),
        ("the chain rule through the cubic is missing: d/dz of c (z + 0.044715 z**3) is "
         "c (1 + 3 * 0.044715 z**2).", lambda: gate(lambda z: _variant(z, chain=False))),
        ("gelu'(z) misses the product rule's z * tanh' term: only 0.5 (1 + tanh(...)) is left.",
         lambda: gate(lambda z: _variant(z, product=False))),
        ("tanh's derivative is 1 - tanh**2, not 1 - tanh.",
         lambda: gate(lambda z: _variant(z, dtanh_sq=False))),
        ("the constant c = sqrt(2 / pi) is missing from the derivative of the tanh's argument.",
         lambda: gate(lambda z: _variant(z, c_out=False))),
        ("dw2 uses the pre-activation h = x @ w1 where gelu(h) is needed: dw2 = gelu(h).T @ dout.",
         lambda: {"dw2": (x @ w1).T @ dout}),
    ]


def _variant(z: np.ndarray, chain: bool = True, product: bool = True, dtanh_sq: bool = True,
             c_out: bool = True) -> np.ndarray:
    """gelu'(z) of the tanh form with one piece of the derivation left out."""
    t = np.tanh(GELU_C * (z + 0.044715 * z**3))
    inner = (GELU_C if c_out else 1.0) * ((1 + 3 * 0.044715 * z * z) if chain else 1.0)
    return 0.5 * (1 + t) + (0.5 * z * (1 - (t * t if dtanh_sq else t)) * inner if product
                            else 0.0)


GELU_MLP = Spec(
    id="gelu_mlp_backward",
    reference_name="the tanh-form GELU MLP backward",
    arg_names=("dout", "x", "w1", "w2"),
    out_names=("dx", "dw1", "dw2"),
    kinds=("array",) * 3,
    reference=_gelu_reference,
    cases=_gelu_cases,
    seed=204,
    summary="float64 and float32, one position, a square block, pre-activations where tanh "
            "saturates, dout from 1e-3 to 1e2",
    mistakes=_gelu_mistakes,
    factors=lambda a: {f"N = {a[1].shape[0]}": float(a[1].shape[0])},
    floor=lambda a: {"dx": amax(a[0], a[3], a[2]), "dw1": amax(a[0], a[3], a[1]),
                     "dw2": amax(a[1], a[2], a[0])},
)


def check_gelu_mlp_backward(fn: Callable) -> CheckResult:
    """`fn(dout (N,d), x (N,d), w1 (d,f), w2 (f,d)) -> (dx, dw1, dw2)` of gelu(x @ w1) @ w2.

    gelu(z) = 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z**3))), the tanh form of GPT-2.
    See the "SwiGLU" chapter.
    """
    return check(GELU_MLP, fn)


SPECS = [SWIGLU, SILU, GELU_MLP]

__all__ = ["check_swiglu_backward", "check_silu_grad", "check_gelu_mlp_backward"]
