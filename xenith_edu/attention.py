"""Causal scaled dot-product attention over all heads at once, forward and backward.

Chapter 4 of the book derives the backward, with the softmax Jacobian-vector product.
"""

from __future__ import annotations

import numpy as np

# Shape legend: B batch, H heads, S positions, hd head width.


def causal_mask(S: int, dtype: type = np.float32) -> np.ndarray:
    """(S, S) additive mask: 0 where key position <= query position, -inf above the diagonal."""
    return np.triu(np.full((S, S), -np.inf, dtype=dtype), k=1)


def causal_attention_forward(
    q: np.ndarray, k: np.ndarray, v: np.ndarray
) -> tuple[np.ndarray, tuple]:
    """softmax(q k^T / sqrt(hd) + causal mask) @ v on (B, H, S, hd) arrays.

    Returns `(out, cache)`, out (B, H, S, hd). See chapter 4 (causal attention).
    """
    S, hd = q.shape[-2], q.shape[-1]
    scale = 1.0 / np.sqrt(hd)
    # scale q (S*hd numbers) rather than the scores (S*S numbers): same product, fewer ops.
    att = (q * q.dtype.type(scale)) @ np.swapaxes(k, -1, -2)  # (B, H, S, S) query rows, key cols
    att += causal_mask(S, q.dtype)  # a key after the query gets -inf
    att -= att.max(axis=-1, keepdims=True)  # the diagonal is never masked: the max is finite
    np.exp(att, out=att)  # masked scores become exactly 0
    att /= att.sum(axis=-1, keepdims=True)  # (B, H, S, S) attention weights, rows sum to 1
    out = att @ v  # (B, H, S, hd)
    # backward needs q, k, v (the products' other factors) and att (the softmax output).
    cache = (q, k, v, att)
    return out, cache


def causal_attention_backward(
    dout: np.ndarray, cache: tuple
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients `(dq, dk, dv)` given `dout` (B, H, S, hd). See chapter 4."""
    q, k, v, att = cache
    scale = q.dtype.type(1.0 / np.sqrt(q.shape[-1]))
    # out = att @ v
    datt = dout @ np.swapaxes(v, -1, -2)  # (B, H, S, S)
    dv = np.swapaxes(att, -1, -2) @ dout  # (B, H, S, hd)
    # att = softmax(scores), row by row: dscores = att * (datt - sum(att * datt)).
    # Masked entries have att = 0, so no gradient reaches them.
    datt -= np.einsum("...ij,...ij->...i", att, datt)[..., None]
    datt *= att  # now dscores (B, H, S, S)
    # scores = (q * scale) @ k^T
    dq = datt @ k  # (B, H, S, hd)
    dq *= scale
    dk = np.swapaxes(datt, -1, -2) @ q  # (B, H, S, hd)
    dk *= scale
    return dq, dk, dv
