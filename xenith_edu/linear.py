"""The linear layer y = x @ W, forward and backward: the rule every chapter leans on.

The book's notation page derives it: dX = dY @ W.T and dW = X.T @ dY (weights stored (in, out)).
"""

from __future__ import annotations

import numpy as np

# Shape legend: N positions (any leading axes ... are flattened for dW), n in, m out.


def linear_forward(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, tuple]:
    """y = x @ w for x (..., n) and w (n, m). Returns `(y, cache)`; see the notation page."""
    y = x @ w  # (..., m)
    cache = (x, w)  # backward multiplies dy by the other factor of the product
    return y, cache


def linear_backward(dy: np.ndarray, cache: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Gradients `(dx, dw)` of y = x @ w given dy (..., m); see the notation page."""
    x, w = cache
    dx = dy @ w.T  # (..., n)
    dw = x.reshape(-1, x.shape[-1]).T @ dy.reshape(-1, dy.shape[-1])  # (n, m), summed over rows
    return dx, dw
