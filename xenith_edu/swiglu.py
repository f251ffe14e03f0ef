"""SwiGLU feed-forward block, forward and backward: out = (silu(x @ w1) * (x @ w3)) @ w2.
The fast form the model runs; the readable form is the SwiGLU chapter's ("A readable
implementation"), which derives the backward through the gate, the up and the down projections.

Fast how: the gate and up projections written into one stacked (2, N, f) array, the gate's
halved (so that the gate is (h1 / 2)(1 + tanh(h1 / 2)) in three passes), buffers from the
workspace, element-wise passes in place, no copy of a weight; the same values as the readable
form to float32 rounding. No input checks: the model
checks at its boundary. Measured figures are in benchmarks/README.md.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .tools.workspace import empty

# Shape legend: N positions (any leading axes ... are flattened), d width, f hidden.


class GateUpWeights(NamedTuple):
    """The gate and up projections as the caller holds them: what dx reads when no stack is."""

    w1: np.ndarray  # (d, f) the gate projection: for dx = du @ w1.T / 2
    w3: np.ndarray  # (d, f) the up projection: for dx += dh3 @ w3.T


class SwiGLUCache(NamedTuple):
    """What `swiglu_backward` needs: each product's input and weight, and the gate's pieces
    (h3, sig2, gate), to differentiate silu(h1) * h3 without computing another tanh."""

    x: np.ndarray | None  # (N, d) the input, flattened: for [2 dw1, dw3] = x.T @ [du, dh3]
    # (None, and ha None, when the weights are frozen: LoRA; no weight gradient is made)
    x_shape: tuple[int, ...]  # the input's shape (..., d), to give dx the same
    w13: np.ndarray | None  # (2, d, f) [w1 / 2, w3] stacked, when the caller gave it
    # (`swiglu_forward`'s w13, decoding's): for dx; None otherwise, and w1w3 holds the weights
    w2: np.ndarray  # (f, d) the down projection: for dha = dout @ w2.T
    h3: np.ndarray  # (N, f) the up projection x @ w3: for dh1
    sig2: np.ndarray  # (N, f) 2 sigmoid(h1) = 1 + tanh(h1 / 2): for silu'(h1)
    gate: np.ndarray  # (N, f) silu(h1): for dh3 and silu'(h1)
    ha: np.ndarray | None  # (N, f) the gated hidden silu(h1) * h3, input of w2: for dw2
    w1w3: GateUpWeights | None = None  # w1 (d, f) and w3 (d, f) as they are,
    # when no stack was given: dx reads them, so no stacked (2, d, f) copy is made or kept


def sigmoid(z: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Logistic sigmoid 1 / (1 + exp(-z)), written into `out` if given.

    For z below about -88 (float32) exp(-z) overflows to inf, and 1 / (1 + inf) is exactly 0,
    the right limit: the overflow is expected, so its warning is silenced.
    """
    s = np.negative(z, out=out)
    if not isinstance(s, np.ndarray):  # a scalar or 0-d input: no array to work in place
        with np.errstate(over="ignore"):
            return 1.0 / (1.0 + np.exp(s))
    with np.errstate(over="ignore"):
        np.exp(s, out=s)
    s += 1.0
    return np.reciprocal(s, out=s)


def silu(z: np.ndarray) -> np.ndarray:
    """silu(z) = z * sigmoid(z)."""
    return z * sigmoid(z)


def silu_grad(z: np.ndarray) -> np.ndarray:
    """silu'(z) = sigmoid(z) * (1 + z * (1 - sigmoid(z)))."""
    s = sigmoid(z)
    return s * (1.0 + z * (1.0 - s))


def stacked_gate_up(w1: np.ndarray, w3: np.ndarray, out: np.ndarray | None = None
                    ) -> np.ndarray:
    """[w1 / 2, w3] (2, d, f): the two weights of one stacked product (see `swiglu_forward`)."""
    out = np.empty((2, *w1.shape), w1.dtype) if out is None else out
    np.multiply(w1, 0.5, out=out[0])
    out[1] = w3
    return out


def swiglu_forward(
    x: np.ndarray, w1: np.ndarray, w3: np.ndarray, w2: np.ndarray,
    w13: np.ndarray | None = None,
) -> tuple[np.ndarray, SwiGLUCache]:
    """SwiGLU on `x` (..., d) with gate `w1` (d, f), up `w3` (d, f), down `w2` (f, d).

    Returns `(out, cache)`, out shaped like x. See the SwiGLU chapter. `w13`, if given, is
    `stacked_gate_up(w1, w3)` made once by a caller that runs the block often (decoding): the
    same values, without stacking the two (d, f) weights again at every call.
    """
    (d, f), dtype = w1.shape, x.dtype
    x2 = x.reshape(-1, d)  # (N, d)
    N = x2.shape[0]
    # h1 = x @ w1 and h3 = x @ w3 as one stacked product with [w1, w3] (2, d, f). Stacked, not
    # side by side as (d, 2f): each of h1 and h3 is then a contiguous (N, f) block, and the
    # element-wise passes below run about twice as fast on it as on a column half of (N, 2f).
    # silu(h1) = h1 sigmoid(h1) = (h1 / 2) (1 + tanh(h1 / 2)): the product computes u = h1 / 2
    # directly, with w1 / 2 (halving is exact in floating point), and the gate takes three
    # passes over (N, f) where 1 / (1 + exp(-h1)) took four, then one more for h1 * sigmoid
    h13 = empty((2, N, f), dtype)  # (2, N, f)
    u, h3 = h13  # (N, f) half the gate pre-activation h1 / 2, (N, f) up projection
    if w13 is None:  # x @ (w1 / 2) is (x @ w1) / 2 to the bit (halving is exact): two products
        np.matmul(x2, w1, out=u)  # into the stack, and no (2, d, f) copy of the weights
        u *= 0.5  # (at Llama-3.2-1B's shape the copy took 50 ms a layer, a fifth of the block)
        np.matmul(x2, w3, out=h3)
    else:
        np.matmul(x2, w13, out=h13)
    sig2 = np.tanh(u, out=empty((N, f), dtype))  # (N, f)
    sig2 += 1.0  # 1 + tanh(h1 / 2) = 2 sigmoid(h1)
    gate = np.multiply(u, sig2, out=empty((N, f), dtype))  # (N, f) silu(h1)
    ha = np.multiply(gate, h3, out=empty((N, f), dtype))  # (N, f) gated hidden
    out = np.matmul(ha, w2, out=empty((N, d), dtype)).reshape(x.shape)  # (..., d)
    return out, SwiGLUCache(x2, x.shape, w13, w2, h3, sig2, gate, ha,
                            None if w13 is not None else GateUpWeights(w1, w3))


def swiglu_backward(
    dout: np.ndarray, cache: SwiGLUCache
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """Gradients `(dx, dw1, dw3, dw2)` of SwiGLU given `dout` (..., d). See the SwiGLU chapter.
    The weights' are None when the cache holds no input (frozen weights)."""
    x2, x_shape, w13, w2, h3, sig2, gate, ha, w1w3 = cache
    (N, f), d, dtype = h3.shape, w2.shape[1], dout.dtype
    dout2 = dout.reshape(-1, d)  # (N, d)
    # out = ha @ w2
    dw2 = None if ha is None else np.matmul(ha.T, dout2, out=empty((f, d), dtype))  # (f, d)
    dh13 = empty((2, N, f), dtype)  # (2, N, f) = [du, dh3], stacked as h13 is
    du, dh3 = dh13  # (N, f) each, contiguous
    dha = np.matmul(dout2, w2.T, out=dh3)  # (N, f), in dh3's block: dh3 is made from it in place
    # ha = silu(h1) * h3 with h1 = 2u, so du = dha * h3 * 2 silu'(h1), and silu'(h1) =
    # sig (1 + h1 (1 - sig)) = sig + gate (1 - sig): 2 silu'(h1) = sig2 + gate (2 - sig2) ...
    np.subtract(2.0, sig2, out=du)
    du *= gate
    du += sig2
    du *= h3
    du *= dha
    dh3 *= gate  # ... and dh3 = dha * silu(h1), in place over dha
    # h13 = x @ [w1 / 2, w3]: x fans out to both projections, so dx sums both paths.
    if w1w3 is not None:  # the weights as they are: dx = du @ w1.T / 2 + dh3 @ w3.T
        dx = np.matmul(du, w1w3[0].T, out=empty((N, d), dtype))  # (N, d)
        dx *= 0.5  # u = x @ (w1 / 2): halving is exact, the same bits as with the stack
        dx += np.matmul(dh3, w1w3[1].T, out=empty((N, d), dtype))
    else:  # the stack [w1 / 2, w3] that the caller gave (decoding's)
        assert w13 is not None
        dx13 = np.matmul(dh13, w13.transpose(0, 2, 1), out=empty((2, N, d), dtype))  # (2,
        # N, d)
        dx = np.add(dx13[0], dx13[1], out=empty((N, d), dtype))  # (N, d)
    if x2 is None:  # frozen weights: no dw1, dw3
        return dx.reshape(x_shape), None, None, dw2
    dw13 = np.matmul(x2.T, dh13, out=empty((2, d, f), dtype))  # (2, d, f) = [dw1 * 2, dw3]
    dw13[0] *= 0.5  # u = x @ (w1 / 2): dw1 = (x.T @ du) / 2
    return dx.reshape(x_shape), dw13[0], dw13[1], dw2
