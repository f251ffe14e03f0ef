"""Causal scaled dot-product attention over all heads at once, forward and backward.

The causal attention chapter derives the backward, with the softmax's vector-Jacobian product.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .tools.workspace import empty, empty_like

# Shape legend: B batch, H heads, S positions, hd head width.


class AttentionCache(NamedTuple):
    """What `causal_attention_backward` needs: each product's other factors, and the softmax."""

    q: np.ndarray  # (B, H, S, hd) queries, for dk = dscores^T @ q
    k: np.ndarray  # (B, H, S, hd) keys, for dq = dscores @ k
    v: np.ndarray  # (B, H, S, hd) values, for datt = dout @ v^T
    att: np.ndarray  # (B, H, S, S) the attention weights (softmax output), for dv and dscores


def causal_mask(S: int, dtype: type = np.float32) -> np.ndarray:
    """(S, S) additive mask: 0 where key position <= query position, -inf above the diagonal."""
    return np.triu(np.full((S, S), -np.inf, dtype=dtype), k=1)


@lru_cache(maxsize=16)
def _kept_mask(S: int, dtype: np.dtype) -> np.ndarray:
    """The values of `causal_mask(S, dtype)` as a read-only (S, S) view of a kept row of 2S - 1.

    Entry (i, j) depends only on j - i: it is row[S - 1 + j - i] of row = [0]*S + [-inf]*(S - 1),
    a view that starts at row[S - 1] and steps one element back per row. Why: adding a freshly
    made (S, S) mask to the (B, H, S, S) scores was measured at six to ten times the cost of
    adding the same values from an array kept from earlier (300 to 455 against 47 to 65 us at
    the book's sizes, 1.4 ms of a step), and this kept view holds 2S - 1 numbers, not S * S.
    """
    row = np.concatenate((np.zeros(S, dtype), np.full(S - 1, -np.inf, dtype)))  # (2S - 1,)
    step = row.itemsize
    return as_strided(row[S - 1 :], shape=(S, S), strides=(-step, step), writeable=False)


def causal_attention_forward(
    q: np.ndarray, k: np.ndarray, v: np.ndarray
) -> tuple[np.ndarray, AttentionCache]:
    """softmax(q k^T / sqrt(hd) + causal mask) @ v on (B, H, S, hd) arrays.

    Returns `(out, cache)`, out (B, H, S, hd). See the causal attention chapter.
    """
    S, hd = q.shape[-2], q.shape[-1]
    scale = 1.0 / np.sqrt(hd)
    # scale q (S*hd numbers) rather than the scores (S*S numbers): same product, fewer ops.
    qs = np.multiply(q, q.dtype.type(scale), out=empty_like(q))  # (B, H, S, hd)
    att = np.matmul(qs, np.swapaxes(k, -1, -2), out=empty((*q.shape[:-1], S), q.dtype))
    # att (B, H, S, S): query rows, key columns
    att += _kept_mask(S, q.dtype)  # causal_mask(S): a key after the query gets -inf
    att -= att.max(axis=-1, keepdims=True)  # the diagonal is never masked: the max is finite
    np.exp(att, out=att)  # masked scores become exactly 0
    # the row sums as a product with a column of ones: one matrix product is five times faster
    # than att.sum(axis=-1) over rows this short
    att /= att @ np.ones((S, 1), dtype=att.dtype)  # (B, H, S, S) attention weights, rows sum to 1
    out = np.matmul(att, v, out=empty_like(q))  # (B, H, S, hd)
    return out, AttentionCache(q, k, v, att)


def causal_attention_backward(
    dout: np.ndarray, cache: AttentionCache
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients `(dq, dk, dv)` given `dout` (B, H, S, hd). See the causal attention chapter."""
    q, k, v, att = cache
    scale = q.dtype.type(1.0 / np.sqrt(q.shape[-1]))
    # out = att @ v
    datt = np.matmul(dout, np.swapaxes(v, -1, -2), out=empty_like(att))  # (B, H, S, S)
    dv = np.matmul(np.swapaxes(att, -1, -2), dout, out=empty_like(dout))  # (B, H, S, hd)
    # att = softmax(scores), row by row: dscores = att * (datt - sum(att * datt)).
    # Masked entries have att = 0, so no gradient reaches them.
    datt -= np.einsum("...ij,...ij->...i", att, datt)[..., None]
    datt *= att  # now dscores (B, H, S, S)
    # scores = (q * scale) @ k^T
    dq = np.matmul(datt, k, out=empty_like(dout))  # (B, H, S, hd)
    dq *= scale
    dk = np.matmul(np.swapaxes(datt, -1, -2), q, out=empty_like(dout))  # (B, H, S, hd)
    dk *= scale
    return dq, dk, dv
