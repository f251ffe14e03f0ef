"""RMSNorm, forward and backward: y = x / sqrt(mean(x**2) + eps) * w over the last axis.
The fast form the model runs; the readable form is the RMSNorm chapter's ("A readable
implementation"), which derives the backward: dx = rstd * (g - xhat * mean(g * xhat)), g = dy * w.

Gemma's gain is offset + w with offset 1 (w stored, zeros meaning the gain one): the gain is w
moved by a constant, whose Jacobian is the identity, so dw is the gain's gradient as it was, and
dx is the same rule with the gain offset + w in g. Only the forward sees the offset.

Fast how: row sums as dot products (no (..., d) temporaries), buffers from the workspace; the
same values as the readable form to float32 rounding. No input checks: the model checks at its
boundary. Measured figures are in benchmarks/README.md.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .tools.workspace import empty_like

# Shape legend: (..., d) any leading axes (B, S or N = B*S), d width.


class RMSNormCache(NamedTuple):
    """What `rmsnorm_backward` needs; x itself is not kept, xhat and rstd carry it."""

    xhat: np.ndarray  # (..., d) the unit-RMS input: for dw and for the projection in dx
    rstd: np.ndarray  # (..., 1) 1 / RMS: the scale of dx
    w: np.ndarray  # (d,) the gain (offset + w with an offset): dxhat = dy * gain


def rmsnorm_forward(x: np.ndarray, w: np.ndarray, eps: float, offset: float = 0.0
                    ) -> tuple[np.ndarray, RMSNormCache]:
    """Normalize the last axis of `x` (..., d) by its root mean square and scale by `w` (d,),
    or by `offset + w` (Gemma's 1 + w) with an offset.

    Returns `(y, cache)`. See the RMSNorm chapter.
    """
    d = x.shape[-1]
    ms = np.einsum("...i,...i->...", x, x)[..., None]  # (..., 1) sum of squares, no (..., d) copy
    ms /= d  # mean square
    rstd = 1.0 / np.sqrt(ms + np.asarray(eps, dtype=x.dtype))  # (..., 1)
    xhat = np.multiply(x, rstd, out=empty_like(x))  # (..., d) unit-RMS input
    gain = w if not offset else w + np.asarray(offset, dtype=w.dtype)  # (d,)
    y = np.multiply(xhat, gain, out=empty_like(x))  # (..., d)
    return y, RMSNormCache(xhat, rstd, gain)


def rmsnorm_backward(dy: np.ndarray, cache: RMSNormCache) -> tuple[np.ndarray, np.ndarray]:
    """Gradients `(dx, dw)` of RMSNorm given `dy` (..., d). See the RMSNorm chapter."""
    xhat, rstd, w = cache
    # y = xhat * w: w is broadcast over every position, so its gradient sums over them.
    d = dy.shape[-1]
    dw = np.einsum("nd,nd->d", dy.reshape(-1, d), xhat.reshape(-1, d))  # (d,)
    g = np.multiply(dy, w, out=empty_like(dy))  # (..., d) gradient w.r.t. xhat
    # xhat = x * rstd: the Jacobian is rstd * (I - xhat xhat^T / d), a projection that removes
    # the component of g along xhat.
    proj = np.einsum("...i,...i->...", g, xhat)[..., None]  # (..., 1) d * mean(g * xhat)
    proj /= d
    dx = np.multiply(xhat, proj, out=empty_like(dy))  # (..., d)
    np.subtract(g, dx, out=dx)  # g - xhat * mean(g * xhat)
    dx *= rstd
    return dx, dw
