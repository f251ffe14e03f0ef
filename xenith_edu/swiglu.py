"""SwiGLU feed-forward block, forward and backward: out = (silu(x @ w1) * (x @ w3)) @ w2.

Chapter 2 of the book derives the backward through the gate, the up and the down projections.
"""

from __future__ import annotations

import numpy as np

# Shape legend: N positions (any leading axes ... are flattened), d width, f hidden.


def sigmoid(z: np.ndarray) -> np.ndarray:
    """Logistic sigmoid, written with tanh so that it never overflows."""
    s = np.tanh(0.5 * z)
    s += 1.0
    s *= 0.5
    return s


def silu(z: np.ndarray) -> np.ndarray:
    """silu(z) = z * sigmoid(z)."""
    return z * sigmoid(z)


def silu_grad(z: np.ndarray) -> np.ndarray:
    """silu'(z) = sigmoid(z) * (1 + z * (1 - sigmoid(z)))."""
    s = sigmoid(z)
    return s * (1.0 + z * (1.0 - s))


def swiglu_forward(
    x: np.ndarray, w1: np.ndarray, w3: np.ndarray, w2: np.ndarray
) -> tuple[np.ndarray, tuple]:
    """SwiGLU on `x` (..., d) with gate `w1` (d, f), up `w3` (d, f), down `w2` (f, d).

    Returns `(out, cache)`, out shaped like x. See chapter 2 (SwiGLU).
    """
    f = w1.shape[1]
    x2 = x.reshape(-1, x.shape[-1])  # (N, d)
    # h1 = x @ w1 and h3 = x @ w3 as one product with [w1 | w3]: one large matrix product
    # is faster than two small ones, and the backward can do the same.
    w13 = np.concatenate((w1, w3), axis=1)  # (d, 2f)
    h13 = x2 @ w13  # (N, 2f)
    h1, h3 = h13[:, :f], h13[:, f:]  # (N, f) gate pre-activation, (N, f) up projection
    sig = sigmoid(h1)  # (N, f)
    gate = h1 * sig  # (N, f) silu(h1)
    ha = gate * h3  # (N, f) gated hidden
    out = (ha @ w2).reshape(x.shape)  # (..., d)
    # backward needs the inputs of each product (x2, ha) and its weights (w13, w2), and the
    # gate's pieces (h3, sig, gate) to differentiate silu(h1) * h3 without another exp.
    cache = (x2, x.shape, w13, w2, h3, sig, gate, ha)
    return out, cache


def swiglu_backward(
    dout: np.ndarray, cache: tuple
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Gradients `(dx, dw1, dw3, dw2)` of SwiGLU given `dout` (..., d). See chapter 2."""
    x2, x_shape, w13, w2, h3, sig, gate, ha = cache
    f = h3.shape[1]
    dout2 = dout.reshape(-1, dout.shape[-1])  # (N, d)
    # out = ha @ w2
    dw2 = ha.T @ dout2  # (f, d)
    dha = dout2 @ w2.T  # (N, f)
    dh13 = np.empty((dha.shape[0], 2 * f), dtype=dha.dtype)  # (N, 2f) = [dh1 | dh3]
    # ha = silu(h1) * h3, so dh3 = dha * silu(h1) ...
    np.multiply(dha, gate, out=dh13[:, f:])
    # ... and dh1 = dha * h3 * silu'(h1), with silu'(h1) = sig * (1 + h1 (1 - sig))
    # = sig + gate * (1 - sig), computed in place in dh1's slot.
    dh1 = dh13[:, :f]
    np.subtract(1.0, sig, out=dh1)
    dh1 *= gate
    dh1 += sig
    dh1 *= h3
    dh1 *= dha
    # h13 = x @ [w1 | w3]: x fans out to both projections, so dx sums both paths.
    dx = dh13 @ w13.T  # (N, d) = dh1 @ w1.T + dh3 @ w3.T
    dw13 = x2.T @ dh13  # (d, 2f) = [dw1 | dw3]
    dw1, dw3 = np.ascontiguousarray(dw13[:, :f]), np.ascontiguousarray(dw13[:, f:])
    return dx.reshape(x_shape), dw1, dw3, dw2
