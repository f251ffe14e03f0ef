"""GeGLU feed-forward block (Gemma), forward and backward: out = (gelu(x @ w1) * (x @ w3)) @ w2.
SwiGLU with the tanh form of GELU in place of SiLU as the gate (`hidden_activation:
gelu_pytorch_tanh`); the SwiGLU chapter derives the block, and only the gate's derivative differs.

Derivation. gelu(z) = z/2 (1 + t), t = tanh(u), u = c (z + a z^3), c = sqrt(2/pi), a = 0.044715.
By the product rule, gelu'(z) = (1 + t)/2 + z/2 * dt/dz, and dt/dz = (1 - t^2) * du/dz with
du/dz = c (1 + 3 a z^2): gelu'(z) = (1 + t)/2 + z/2 (1 - t^2) c (1 + 3 a z^2), read from t
(kept) without another tanh. The rest is SwiGLU's: with h1 = x @ w1, h3 = x @ w3,
ha = gelu(h1) * h3 and out = ha @ w2, dw2 = ha^T dout, dha = dout w2^T, dh3 = dha * gelu(h1),
dh1 = dha * h3 * gelu'(h1), and x fans out to both products: dx = dh1 w1^T + dh3 w3^T,
dw1 = x^T dh1, dw3 = x^T dh3.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .tools.workspace import empty

# Shape legend: N positions (any leading axes ... are flattened), d width, f hidden.

GELU_C = math.sqrt(2.0 / math.pi)  # c of the tanh form
GELU_A = 0.044715  # a of the tanh form


class GeGLUCache(NamedTuple):
    """What `geglu_backward` needs: each product's input and weight, and the gate's pieces."""

    x: np.ndarray | None  # (N, d) the input, flattened: for dw1 = x.T @ dh1 and dw3 = x.T @ dh3
    # (None, and ha None, when the weights are frozen: LoRA; no weight gradient is made)
    x_shape: tuple[int, ...]  # the input's shape (..., d), to give dx the same
    w1: np.ndarray  # (d, f) the gate projection: for dx
    w3: np.ndarray  # (d, f) the up projection: for dx
    w2: np.ndarray  # (f, d) the down projection: for dha = dout @ w2.T
    h1: np.ndarray  # (N, f) the gate's pre-activation x @ w1: for gelu'(h1)
    h3: np.ndarray  # (N, f) the up projection x @ w3: for dh1
    t: np.ndarray  # (N, f) tanh(c (h1 + a h1^3)): for gelu'(h1) without another tanh
    gate: np.ndarray  # (N, f) gelu(h1): for dh3
    ha: np.ndarray | None  # (N, f) the gated hidden gelu(h1) * h3, input of w2: for dw2


def gelu_tanh(z: np.ndarray) -> np.ndarray:
    """GELU's tanh form, z/2 (1 + tanh(c (z + a z^3))), as transformers' gelu_pytorch_tanh."""
    return 0.5 * z * (1.0 + np.tanh(GELU_C * (z + GELU_A * z**3)))


def geglu_forward(
    x: np.ndarray, w1: np.ndarray, w3: np.ndarray, w2: np.ndarray
) -> tuple[np.ndarray, GeGLUCache]:
    """GeGLU on `x` (..., d) with gate `w1` (d, f), up `w3` (d, f), down `w2` (f, d).

    Returns `(out, cache)`, out shaped like x.
    """
    (d, f), dtype = w1.shape, x.dtype
    x2 = x.reshape(-1, d)  # (N, d)
    N = x2.shape[0]
    h1 = np.matmul(x2, w1, out=empty((N, f), dtype))  # (N, f) gate pre-activation
    h3 = np.matmul(x2, w3, out=empty((N, f), dtype))  # (N, f) up projection
    t = np.multiply(h1, h1, out=empty((N, f), dtype))  # (N, f) h1^2, then the tanh in place
    t *= GELU_A
    t += 1.0
    t *= h1  # h1 + a h1^3
    t *= GELU_C
    np.tanh(t, out=t)
    gate = np.add(t, 1.0, out=empty((N, f), dtype))  # (N, f) 1 + t, then gelu(h1)
    gate *= h1
    gate *= 0.5
    ha = np.multiply(gate, h3, out=empty((N, f), dtype))  # (N, f) gated hidden
    out = np.matmul(ha, w2, out=empty((N, d), dtype)).reshape(x.shape)  # (..., d)
    return out, GeGLUCache(x2, x.shape, w1, w3, w2, h1, h3, t, gate, ha)


def geglu_backward(
    dout: np.ndarray, cache: GeGLUCache
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """Gradients `(dx, dw1, dw3, dw2)` of GeGLU given `dout` (..., d). The weights' are None
    when the cache holds no input of their products (frozen weights: none is computed)."""
    x2, x_shape, w1, w3, w2, h1, h3, t, gate, ha = cache
    (N, f), d, dtype = h1.shape, w1.shape[0], dout.dtype
    dout2 = dout.reshape(-1, d)  # (N, d)
    # out = ha @ w2
    dw2 = None if ha is None else np.matmul(ha.T, dout2, out=empty((f, d), dtype))  # (f, d)
    dha = np.matmul(dout2, w2.T, out=empty((N, f), dtype))  # (N, f)
    # ha = gelu(h1) * h3
    dh3 = np.multiply(dha, gate, out=empty((N, f), dtype))  # (N, f)
    # gelu'(h1) = (1 + t)/2 + h1/2 (1 - t^2) c (1 + 3 a h1^2)
    dh1 = np.multiply(h1, h1, out=empty((N, f), dtype))  # (N, f) h1^2, then gelu'(h1)
    dh1 *= 3.0 * GELU_A
    dh1 += 1.0
    dh1 *= GELU_C * 0.5
    dh1 *= h1
    dh1 *= 1.0 - t * t
    dh1 += 0.5 * (1.0 + t)
    dh1 *= h3
    dh1 *= dha  # dh1 = dha * h3 * gelu'(h1)
    # h1 = x @ w1, h3 = x @ w3: x fans out to both, so dx sums both paths
    dx = np.matmul(dh1, w1.T, out=empty((N, d), dtype))  # (N, d)
    dx += dh3 @ w3.T
    if x2 is None:  # frozen: no dw1, dw3
        return dx.reshape(x_shape), None, None, dw2
    dw1 = np.matmul(x2.T, dh1, out=empty((d, f), dtype))  # (d, f)
    dw3 = np.matmul(x2.T, dh3, out=empty((d, f), dtype))  # (d, f)
    return dx.reshape(x_shape), dw1, dw3, dw2


__all__ = ["GeGLUCache", "gelu_tanh", "geglu_backward", "geglu_forward"]
