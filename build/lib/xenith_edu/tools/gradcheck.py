"""Gradient checking: analytic gradients against central finite differences in float64.

Every chapter and test uses these functions; the Softmax cross-entropy chapter explains the method.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

FLOOR = 1e-8  # relative error is |a - n| / max(|a|, |n|, FLOOR): tiny values compare absolutely
H = 1e-3  # the default step of the fourth-order central difference below


def rel_error(a: np.ndarray | float, b: np.ndarray | float, floor: float = FLOOR) -> np.ndarray:
    """Elementwise |a - b| / max(|a|, |b|, floor)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.abs(a - b) / np.maximum(np.maximum(np.abs(a), np.abs(b)), floor)


@dataclass
class GradCheck:
    """The outcome of one gradient check: the worst coordinate and both values there."""

    name: str
    max_rel_error: float
    worst_index: tuple
    analytic: float
    numeric: float
    n_checked: int
    tol: float

    @property
    def passed(self) -> bool:
        return bool(self.max_rel_error <= self.tol)

    def __str__(self) -> str:
        verdict = "ok" if self.passed else "FAILED"
        return (f"{self.name}: max rel error {self.max_rel_error:.1e} over {self.n_checked} "
                f"coordinates (tol {self.tol:.0e}) {verdict}; worst at {self.worst_index}: "
                f"analytic {self.analytic:.6e}, numeric {self.numeric:.6e}")


def numerical_gradient(
    f: Callable[[np.ndarray], float],
    x: np.ndarray,
    indices: list[tuple] | None = None,
    h: float = H,
    order: int = 4,
) -> np.ndarray:
    """Central finite differences of scalar `f` at `x`, at `indices` (all if None).

    order 2: D(h) = (f(x + h e_i) - f(x - h e_i)) / 2h, error O(h**2).
    order 4: (4 D(h) - D(2h)) / 3, which cancels the h**2 term (Richardson), error O(h**4).
    In float64 the fourth-order rule with h = 1e-3 is about a hundred times more accurate
    than the second-order one at its best step (about 1e-5): rounding costs 1e-16 |f| / h,
    so a larger step is cheaper, and the h**4 truncation stays tiny. The Softmax cross-entropy
    chapter shows both.
    `x` must be float64; it is perturbed in a private copy and never changed.
    Returns an array shaped like x (zeros where not evaluated).
    """
    if not isinstance(x, np.ndarray) or x.dtype != np.float64:
        raise TypeError("numerical_gradient needs a float64 array x: float32 is too coarse")
    if order not in (2, 4):
        raise ValueError(f"order must be 2 or 4, got {order}")
    xp = x.copy()
    grad = np.zeros_like(x)
    if indices is None:
        indices = list(np.ndindex(x.shape))

    def f_at(i: tuple, step: float) -> float:
        old = xp[i]
        xp[i] = old + step
        value = f(xp)
        xp[i] = old
        return value

    for i in indices:
        d1 = (f_at(i, h) - f_at(i, -h)) / (2 * h)
        if order == 2:
            grad[i] = d1
        else:
            d2 = (f_at(i, 2 * h) - f_at(i, -2 * h)) / (4 * h)
            grad[i] = (4 * d1 - d2) / 3
    return grad


def sample_indices(shape: tuple, n: int | None, rng: np.random.Generator | None) -> list[tuple]:
    """All indices of `shape` if n is None or covers them, else n distinct random ones."""
    size = int(np.prod(shape))
    if n is None or n >= size:
        return list(np.ndindex(shape))
    if rng is None:
        raise ValueError("sample_indices needs rng to sample n < size indices")
    flat = rng.choice(size, size=n, replace=False)
    return [tuple(int(j) for j in np.unravel_index(k, shape)) for k in np.sort(flat)]


def check_gradient(
    f: Callable[[np.ndarray], float],
    x: np.ndarray,
    analytic: np.ndarray,
    *,
    name: str = "x",
    h: float = H,
    order: int = 4,
    tol: float = 1e-7,
    n_coords: int | None = None,
    rng: np.random.Generator | None = None,
    floor: float = FLOOR,
) -> GradCheck:
    """Compare `analytic` (the gradient of scalar f at x) with central differences.

    Checks every coordinate, or `n_coords` sampled with `rng`. Returns a GradCheck whose
    `passed` says whether the worst relative error is within `tol`.
    """
    if analytic.shape != x.shape:
        raise ValueError(f"analytic gradient of {name} has shape {analytic.shape}, "
                         f"x has {x.shape}")
    idx = sample_indices(x.shape, n_coords, rng)
    numeric = numerical_gradient(f, x, idx, h, order)
    a = np.array([analytic[i] for i in idx])  # (n,) analytic and numeric values side by side
    n = np.array([numeric[i] for i in idx])  # (n,) float64, as numerical_gradient computes
    err = rel_error(a, n, floor)  # (n,) in float64, whatever analytic's dtype
    w = int(np.argmax(err))
    return GradCheck(name, float(err[w]), idx[w], float(a[w]), float(n[w]), len(idx), tol)
