"""RMSNorm, forward and backward: y = x / sqrt(mean(x**2) + eps) * w over the last axis.

Chapter 3 of the book derives the backward: dx = rstd * (g - xhat * mean(g * xhat)), g = dy * w.
"""

from __future__ import annotations

import numpy as np

# Shape legend: (..., d) any leading axes (B, S or N = B*S), d width.


def rmsnorm_forward(x: np.ndarray, w: np.ndarray, eps: float) -> tuple[np.ndarray, tuple]:
    """Normalize the last axis of `x` (..., d) by its root mean square and scale by `w` (d,).

    Returns `(y, cache)`. See chapter 3 (RMSNorm).
    """
    ms = np.mean(x * x, axis=-1, keepdims=True)  # (..., 1) mean square
    rstd = 1.0 / np.sqrt(ms + np.asarray(eps, dtype=x.dtype))  # (..., 1)
    xhat = x * rstd  # (..., d) unit-RMS input
    y = xhat * w  # (..., d)
    # backward needs xhat (for dw and the projection) and rstd (the scale of dx), and w.
    cache = (xhat, rstd, w)
    return y, cache


def rmsnorm_backward(dy: np.ndarray, cache: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Gradients `(dx, dw)` of RMSNorm given `dy` (..., d). See chapter 3 (RMSNorm)."""
    xhat, rstd, w = cache
    # y = xhat * w: w is broadcast over every position, so its gradient sums over them.
    d = dy.shape[-1]
    dw = (dy * xhat).reshape(-1, d).sum(axis=0)  # (d,)
    g = dy * w  # (..., d) gradient w.r.t. xhat
    # xhat = x * rstd: the Jacobian is rstd * (I - xhat xhat^T / d), a projection that removes
    # the component of g along xhat.
    dx = g - xhat * np.mean(g * xhat, axis=-1, keepdims=True)  # (..., d)
    dx *= rstd
    return dx, dw
