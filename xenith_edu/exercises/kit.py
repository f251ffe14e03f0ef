"""The exercise kit: the small helpers every chapter's exercise module shares (drawing sizes and
inputs, float64 references, formatting numbers). One home for each; the chapters import them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .types import Case


def int_sampler(rng: np.random.Generator) -> Callable[[int, int], int]:
    """`ints(lo, hi)`: a uniform integer in [lo, hi], both ends included, drawn from `rng`."""

    def ints(lo: int, hi: int) -> int:
        return int(rng.integers(lo, hi + 1))

    return ints


def log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


def fmt(x: float) -> str:
    return f"{float(x):.6g}"


def fmt_pair(expected: float, got: float) -> tuple[str, str]:
    """Both numbers with as many digits as it takes to show that they differ (6 at least)."""
    e, g = float(expected), float(got)
    for digits in range(6, 18):
        a, b = f"{e:.{digits}g}", f"{g:.{digits}g}"
        if a != b:
            return a, b
    return repr(e), repr(g)


def randn(rng: np.random.Generator, shape: tuple, dtype: type = np.float64,
          scale: float = 1.0) -> np.ndarray:
    return (scale * rng.standard_normal(shape)).astype(dtype)


def softmax64(z: np.ndarray, axis: int = -1) -> np.ndarray:
    z = z - z.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def sigmoid64(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def amax(*arrays: object) -> float:
    """The product of the largest magnitudes of the arrays: the size of their products' terms."""
    out = 1.0
    for a in arrays:
        out *= float(np.max(np.abs(a))) if np.size(a) else 0.0
    return out


OVERFLOW = ("Overflow in exp: exp of a large number is inf. Subtract each row's max before "
            "exponentiating (the softmax does not change).")


def rms_parts(x: np.ndarray, eps: float, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """(xhat, rstd) of RMSNorm along `axis`, the float64 reference of the RMSNorm chapter."""
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=axis, keepdims=True) + eps)
    return x * rstd, rstd


def rescaled(case: Case, index: int, factor: float, what: str) -> Case:
    """The case with its float argument number `index` multiplied by `factor` (same dtype): the
    same sizes at another magnitude, so that no check holds only for inputs near 1."""
    args = list(case.args)
    a = args[index]
    args[index] = (a.astype(np.float64) * factor).astype(a.dtype)
    return Case(f"{case.label}, {what}", tuple(args), case.overflow_hint)


def magnitudes(rng: np.random.Generator, case: Case, index: int, name: str) -> list[Case]:
    """Two rescaled copies of `case`: argument `index` (called `name`) around 1e2, and 1e-2
    to 1e-3 of its size; a gradient's argument is linear, so both are as valid as the case."""
    big, small = log_uniform(rng, 30.0, 100.0), log_uniform(rng, 1e-3, 1e-2)
    return [rescaled(case, index, big, f"{name} scaled by {big:.0f}"),
            rescaled(case, index, small, f"{name} scaled by {small:.0e}")]
