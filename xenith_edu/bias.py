"""A bias added to every row, y = x + b, forward and backward: Qwen2.5's q, k and v projections.
The gradient of b sums the rows' gradients (b fans out to every position); x's passes through.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# Shape legend: N positions (any leading axes), m width.


class BiasCache(NamedTuple):
    """What `bias_backward` needs: nothing but the width, since y = x + b is linear in both."""

    width: int  # m: dy's rows are summed into a (m,) gradient


def bias_forward(x: np.ndarray, b: np.ndarray, out: np.ndarray | None = None
                 ) -> tuple[np.ndarray, BiasCache]:
    """y = x + b for x (..., m) and b (m,), written into `out` if given (it may be x)."""
    return np.add(x, b, out=out), BiasCache(b.shape[0])


def bias_backward(dy: np.ndarray, cache: BiasCache) -> tuple[np.ndarray, np.ndarray]:
    """Gradients `(dx, db)` given dy (..., m): dx is dy itself, db (m,) sums its rows."""
    return dy, dy.reshape(-1, cache.width).sum(axis=0)


__all__ = ["BiasCache", "bias_backward", "bias_forward"]
