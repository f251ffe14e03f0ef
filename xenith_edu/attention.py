"""Causal scaled dot-product attention over all heads at once, forward and backward.
The fast form, with grouped-query attention; the "Causal attention" chapter has the readable one.

This module is what the model runs: every head in one batched product, a kept causal mask, the
workspace's reused arrays, the query heads of a key/value group stacked into one product, and
the softmax's row-max shift only where exp needs it (`_exp_is_safe`). The
chapter derives the same backward, with the softmax's vector-Jacobian product, first one head at
a time in loops and then on all heads in a few lines (its `attention_backward`); its exercises
check a learner's version against this module.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .tools.workspace import empty, empty_like

# Shape legend: B batch, H query heads, Hkv key/value heads (Hkv divides H; Hkv = H without
# grouped-query attention), G = H // Hkv, Sq query and Sk key positions (Sq = Sk = S in
# training), hd head width.


class AttentionCache(NamedTuple):
    """What `causal_attention_backward` needs: each product's other factors, and the softmax."""

    q: np.ndarray  # (B, H, Sq, hd) queries, for dk = dscores^T @ q
    k: np.ndarray  # (B, Hkv, Sk, hd) keys, for dq = dscores @ k
    v: np.ndarray  # (B, Hkv, Sk, hd) values, for datt = dout @ v^T
    att: np.ndarray  # (B, H, Sq, Sk) the attention weights (softmax output), for dv and dscores
    scale: float | None = None  # the scores' factor when it is not 1 / sqrt(hd) (Gemma 3's
    # query_pre_attn_scalar ** -0.5): for dq and dk, which it multiplies as it did the scores


def causal_mask(S: int, dtype: type = np.float32) -> np.ndarray:
    """(S, S) additive mask: 0 where key position <= query position, -inf above the diagonal."""
    return np.triu(np.full((S, S), -np.inf, dtype=dtype), k=1)


@lru_cache(maxsize=16)
def _square_mask(n: int, dtype: np.dtype) -> np.ndarray:
    """The values of `causal_mask(n, dtype)` as a read-only (n, n) view of a kept row of 2n - 1.

    Entry (i, j) depends only on j - i: it is row[n - 1 + j - i] of row = [0]*n + [-inf]*(n - 1),
    a view that starts at row[n - 1] and steps one element back per row. Why: adding a freshly
    made (S, S) mask to the (B, H, S, S) scores was measured at six to ten times the cost of
    adding the same values from an array kept from earlier (300 to 455 against 47 to 65 us at
    the book's sizes, 1.4 ms of a step), and this kept view holds 2n - 1 numbers, not n * n.
    """
    row = np.concatenate((np.zeros(n, dtype), np.full(n - 1, -np.inf, dtype)))  # (2n - 1,)
    step = row.itemsize
    return as_strided(row[n - 1 :], shape=(n, n), strides=(-step, step), writeable=False)


@lru_cache(maxsize=64)
def window_mask(Sq: int, Sk: int, window: int, dtype: np.dtype) -> np.ndarray:
    """The sliding-window causal mask of Sq queries, the last of Sk positions: (Sq, Sk), 0 where
    query position t = Sk - Sq + i sees key j, t - window < j <= t (itself and the window - 1
    before it, as Mistral), -inf elsewhere. Kept, read-only."""
    t = np.arange(Sk - Sq, Sk)[:, None]  # (Sq, 1) the queries' positions
    j = np.arange(Sk)[None, :]  # (1, Sk)
    mask = np.where((j <= t) & (j > t - window), 0.0, -np.inf).astype(dtype)  # (Sq, Sk)
    mask.flags.writeable = False
    return mask


@lru_cache(maxsize=64)
def _kept_mask(Sq: int, Sk: int, dtype: np.dtype) -> np.ndarray:
    """The causal mask of Sq queries, the last of Sk positions, as a read-only (Sq, Sk) view.

    Query i sits at position Sk - Sq + i and sees the keys j <= Sk - Sq + i: rows Sk - Sq to
    Sk - 1 and the first Sk columns of a kept square mask. Its size is Sk rounded up to a power
    of two, so that decoding, one more key at every token, keeps reusing one. With Sq = Sk = S
    these are the values of `causal_mask(S)`.
    """
    n = 1 << (Sk - 1).bit_length()  # the power of two >= Sk
    return _square_mask(n, dtype)[Sk - Sq : Sk, :Sk]


def _exp_is_safe(scores: np.ndarray, Sq: int, Sk: int) -> bool:
    """Whether exp of the masked `scores` (B, H, Sq, Sk) needs no shift by each row's max.

    The shift only keeps exp in range; it costs a reduction over rows of Sk numbers, the
    slowest pass of the softmax (three times the exp's time at the book's sizes). Unshifted,
    exp neither overflows (no score, hence no row sum of Sk terms, above the largest exp) nor
    loses a row: each row's own position (the query's diagonal entry, a lower bound of its
    max) is large enough that every term within float rounding of the row's largest is a
    normal number. Scores of a model in training sit far inside both bounds; a NaN fails the
    test, and takes the shifted path, as before.
    """
    top = float(scores.max())
    low = float(np.diagonal(scores, Sk - Sq, 2, 3).min())
    hi, lo = _exp_bounds(scores.dtype, Sk)
    return top <= hi and low >= lo


@lru_cache(maxsize=16)
def _exp_bounds(dtype: np.dtype, Sk: int) -> tuple[float, float]:
    """The range of scores whose exp needs no shift: a row sum of Sk terms below the largest
    finite number, and a row's largest term 2**mantissa above the smallest normal number."""
    info = np.finfo(dtype)
    hi = math.log(float(info.max)) - math.log(Sk) - 1.0
    lo = math.log(float(info.smallest_normal)) + (info.nmant + 1) * math.log(2.0) + 1.0
    return hi, lo


def causal_attention_forward(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, window: int | None = None,
    scale: float | None = None,
) -> tuple[np.ndarray, AttentionCache]:
    """softmax(q k^T / sqrt(hd) + causal mask) @ v, q (B, H, Sq, hd), k and v (B, Hkv, Sk, hd).

    Grouped-query attention when Hkv < H (Hkv divides H): query head j reads key/value head
    j // (H // Hkv), as transformers' repeat_kv. The queries are the last Sq of the Sk
    positions (Sq = Sk in training; fewer when decoding with a KV cache): query i sees the keys
    up to position Sk - Sq + i; with a sliding `window`, only the last `window` of them
    (`window_mask`). Returns `(out, cache)`, out (B, H, Sq, hd). See the causal attention
    chapter. The backward is the same with or without a window: a masked weight is exactly 0,
    so no gradient reaches its score (the mask is a constant, as the causal one is). `scale`, if
    given, replaces 1 / sqrt(hd): scores = scale q k^T, so dq and dk take the same factor.
    """
    B, H, Sq, hd = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    factor = 1.0 / np.sqrt(hd) if scale is None else scale
    # scale q (S*hd numbers) rather than the scores (S*S numbers): same product, fewer ops.
    qs = np.multiply(q, q.dtype.type(factor), out=empty(q.shape, q.dtype))  # (B, H, Sq, hd)
    # a key/value head's G = H/Hkv query heads, stacked as one block of G*Sq rows: one product
    # per key/value head, and no copy of the keys
    qs = qs.reshape(B, Hkv, -1, hd)  # (B, Hkv, G*Sq, hd) a view
    att = np.matmul(qs, np.swapaxes(k, -1, -2), out=empty((B, Hkv, qs.shape[2], Sk), q.dtype))
    # att (B, Hkv, G*Sq, Sk): query rows, key columns; per query head, a view (B, H, Sq, Sk)
    att4 = att.reshape(B, H, Sq, Sk)  # a view
    # causal_mask: a key after the query (or, with a window, too far before it) gets -inf
    att4 += _kept_mask(Sq, Sk, q.dtype) if window is None else window_mask(Sq, Sk, window,
                                                                          q.dtype)
    if not _exp_is_safe(att4, Sq, Sk):  # softmax(s) = softmax(s - max s) for any row shift
        att -= att.max(axis=-1, keepdims=True)  # the diagonal is never masked: finite
    np.exp(att, out=att)  # masked scores become exactly 0
    # the row sums as a product with a column of ones: one matrix product is five times faster
    # than att.sum(axis=-1) over rows this short
    att /= att @ np.ones((Sk, 1), dtype=att.dtype)  # attention weights, rows sum to 1
    out = np.matmul(att, v, out=empty(qs.shape, q.dtype))  # (B, Hkv, G*Sq, hd)
    return out.reshape(B, H, Sq, hd), AttentionCache(q, k, v, att4, scale)


def causal_attention_backward(
    dout: np.ndarray, cache: AttentionCache
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients `(dq, dk, dv)` given `dout` (B, H, Sq, hd); dk and dv are (B, Hkv, Sk, hd).

    A key/value head is read by its G = H/Hkv query heads, so its gradient sums theirs: the
    products below run over the group's G*Sq query rows at once, and the sum is in them.
    See the causal attention chapter.
    """
    q, k, v, att, given = cache
    B, H, Sq, hd = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    scale = q.dtype.type(1.0 / np.sqrt(hd) if given is None else given)
    att = att.reshape(B, Hkv, -1, Sk)  # (B, Hkv, G*Sq, Sk) a view
    dout = dout.reshape(B, Hkv, -1, hd)  # (B, Hkv, G*Sq, hd), a view when G = 1
    # out = att @ v
    datt = np.matmul(dout, np.swapaxes(v, -1, -2), out=empty_like(att))  # (B, Hkv, G*Sq, Sk)
    dv = np.matmul(np.swapaxes(att, -1, -2), dout, out=empty(v.shape, v.dtype))  # (B, Hkv, Sk,
    # hd): fan-in, the group's query rows summed by the product
    # att = softmax(scores), row by row: dscores = att * (datt - sum(att * datt)).
    # Masked entries have att = 0, so no gradient reaches them.
    datt -= np.einsum("...ij,...ij->...i", att, datt)[..., None]
    datt *= att  # now dscores (B, Hkv, G*Sq, Sk)
    # scores = (q * scale) @ k^T
    dq = np.matmul(datt, k, out=empty(dout.shape, dout.dtype))  # (B, Hkv, G*Sq, hd)
    dq *= scale
    qg = q.reshape(B, Hkv, -1, hd)  # (B, Hkv, G*Sq, hd)
    dk = np.matmul(np.swapaxes(datt, -1, -2), qg, out=empty(k.shape, k.dtype))  # (B, Hkv, Sk,
    # hd): fan-in again
    dk *= scale
    return dq.reshape(B, H, Sq, hd), dk, dv
