"""The linear layer y = x @ W, forward and backward: the rule every chapter leans on.
The fast form the model runs; the readable form is the two lines of "The rules of backprop",
dX = dY @ W.T and dW = X.T @ dY (weights stored (in, out)), as the book's notation page writes.

Fast how: the products write into workspace buffers; the same values as the readable form. No
input checks: the model checks at its boundary. Measured figures are in benchmarks/README.md.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .tools.workspace import empty

# Shape legend: N positions (any leading axes ... are flattened for dW), n in, m out.


class LinearCache(NamedTuple):
    """What `linear_backward` needs: each factor of the product multiplies the other's gradient."""

    x: np.ndarray | None  # (..., n) the input, for dW = x.T @ dy; None for a frozen weight
    # (LoRA fine-tuning): its gradient is never made, so its input need not be kept
    w: np.ndarray  # (n, m) the weight, for dx = dy @ w.T


def linear_forward(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, LinearCache]:
    """y = x @ w for x (..., n) and w (n, m). Returns `(y, cache)`; see the notation page."""
    y = np.matmul(x, w, out=empty((*x.shape[:-1], w.shape[1]), x.dtype))  # (..., m)
    return y, LinearCache(x, w)


def linear_backward(dy: np.ndarray, cache: LinearCache
                    ) -> tuple[np.ndarray, np.ndarray | None]:
    """Gradients `(dx, dw)` of y = x @ w given dy (..., m); see the notation page. dw is None
    when the cache holds no input (a frozen weight)."""
    x, w = cache
    dx = np.matmul(dy, w.T, out=empty((*dy.shape[:-1], w.shape[0]), dy.dtype))  # (..., n)
    if x is None:
        return dx, None
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])  # (N, n), (N, m)
    dw = np.matmul(x2.T, dy2, out=empty(w.shape, dy.dtype))  # (n, m), summed over the rows
    return dx, dw
