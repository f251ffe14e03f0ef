"""Causal attention without the (S, S) matrix: the blockwise online softmax, forward and backward.
The fast form, with grouped-query attention; the readable form is the memory chapter's, one head.

The chapter "Memory: attention without the S×S matrix" writes the same algorithm for one head
with plain loops (`flash_forward_head`, `flash_backward_head` in notebooks/memory.ipynb); this
module runs it on every head at once, the query heads of a key/value group side by side, and is
what the model calls with `Config(attention="flash")`. The plain version is in `attention`.
It trusts its inputs: the block size comes from `Config.flash_block`, checked there. With a
sliding `window` (Mistral's) the blocks wholly outside every query's window are never visited.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

# Shape legend: B batch, H query heads, Hkv key/value heads (dividing H), G = H // Hkv query
# heads per key/value head, S positions, hd head width, bq/bk the rows of one query/key block
# (at most block_size). Only (B, Hkv, G, bq, bk) blocks of scores ever exist.

DEFAULT_BLOCK = 64


class FlashCache(NamedTuple):
    """What the backward needs: the inputs, the output and the row log-sum-exp, nothing (S, S).

    q, k, v recompute each block's scores; lse = log sum_j exp(score_ij) turns a score back into
    its probability, exp(score - lse); out gives D = rowsum(dout * out). block_size is a number.
    """

    q: np.ndarray  # (B, H, S, hd)
    k: np.ndarray  # (B, Hkv, S, hd)
    v: np.ndarray  # (B, Hkv, S, hd)
    out: np.ndarray  # (B, H, S, hd)
    lse: np.ndarray  # (B, H, S) row log-sum-exp of the scaled, masked scores
    block_size: int
    window: int | None = None  # the sliding window: which blocks exist, and their masks


@lru_cache(maxsize=256)
def _block_mask(off: int, bq: int, bk: int, window: int | None, dtype: np.dtype
                ) -> np.ndarray | None:
    """The additive mask (bq, bk) of a block whose first query sits `off` positions after its
    first key: query t sees key j when 0 <= t - j < window (0 <= t - j without a window);
    None when every query of the block sees every key. Kept, read-only."""
    d = off + np.arange(bq)[:, None] - np.arange(bk)[None, :]  # (bq, bk) t - j
    seen = (d >= 0) if window is None else (d >= 0) & (d < window)
    if seen.all():
        return None
    mask = np.where(seen, 0.0, -np.inf).astype(dtype)  # (bq, bk)
    mask.flags.writeable = False
    return mask


def _scores(qs: np.ndarray, k: np.ndarray, i0: int, j0: int, window: int | None) -> np.ndarray:
    """One block of scaled scores (B, Hkv, G, bq, bk), masked where a key is after its query
    (the diagonal block) or, with a window, too far before it."""
    s = qs @ np.swapaxes(k, -1, -2)  # (B, Hkv, G, bq, bk), k (B, Hkv, 1, bk, hd) broadcast
    mask = _block_mask(i0 - j0, s.shape[-2], s.shape[-1], window, s.dtype)
    if mask is not None:
        s += mask
    return s


def _key_blocks(i0: int, i1: int, bs: int, window: int | None) -> range:
    """The key blocks that queries [i0, i1) see, in the order the forward visits them: from the
    first up to the diagonal; with a window, from the diagonal back to the first that the
    window reaches (every row sees its own key on the diagonal: its running max is finite from
    the first block on, where the window's first block may hold no key of some row)."""
    if window is None:
        return range(0, i1, bs)
    lo = max(0, i0 - window + 1) // bs * bs  # the block of query i0's earliest key
    return range((i1 - 1) // bs * bs, lo - 1, -bs)


def _query_blocks(j0: int, j1: int, S: int, bs: int, window: int | None) -> range:
    """The query blocks that see some key of [j0, j1): from the diagonal on, up to the last
    query whose window reaches key j1 - 1."""
    return range(j0, S if window is None else min(S, j1 - 1 + window), bs)


def flash_attention_forward(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, block_size: int = DEFAULT_BLOCK,
    window: int | None = None,
) -> tuple[np.ndarray, FlashCache]:
    """softmax(q k^T / sqrt(hd) + causal mask) @ v, one block at a time; q (B, H, S, hd), k and
    v (B, Hkv, S, hd): query head j reads key/value head j // G (grouped-query attention).

    For each block of queries, the key blocks up to the diagonal are visited in order while a
    running max m, a running sum sigma and an unnormalised output acc are kept per row; when the
    max grows, sigma and acc are rescaled by exp(m_old - m_new), which makes the result exact.
    With a sliding `window`, query t sees keys t - window < j <= t only, as the plain
    version's `window_mask`: the key blocks wholly before every query's window are skipped.
    Returns `(out, cache)`, out (B, H, S, hd); the cache holds no (S, S) array.
    """
    bs = block_size  # an int >= 1: Config.flash_block is checked where the model is configured
    B, H, S, hd = q.shape
    Hkv = k.shape[1]
    dt = q.dtype.type
    qs = q * dt(1.0 / np.sqrt(hd))  # (B, H, S, hd) scaled once, as the plain version does
    qs = qs.reshape(B, Hkv, H // Hkv, S, hd)  # (B, Hkv, G, S, hd) a view: the heads by group
    kg, vg = k[:, :, None], v[:, :, None]  # (B, Hkv, 1, S, hd) views, shared by the group
    out = np.empty(qs.shape, q.dtype)  # (B, Hkv, G, S, hd)
    lse = np.empty(qs.shape[:-1], dtype=q.dtype)  # (B, Hkv, G, S)
    for i0 in range(0, S, bs):
        i1 = min(i0 + bs, S)
        qi = qs[..., i0:i1, :]  # (B, Hkv, G, bq, hd)
        m = np.full(qi.shape[:-1] + (1,), -np.inf, dtype=q.dtype)  # (B, Hkv, G, bq, 1) running
        # max
        sigma = np.zeros_like(m)  # (B, Hkv, G, bq, 1) running sum of exp(score - m)
        acc = np.zeros_like(qi)  # (B, Hkv, G, bq, hd) running sum of exp(score - m) v
        for j0 in _key_blocks(i0, i1, bs, window):  # later ones are all masked, and with a
            j1 = min(j0 + bs, S)  # window the earlier ones too
            s = _scores(qi, kg[..., j0:j1, :], i0, j0, window)  # (B, Hkv, G, bq, bk)
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))  # finite: a row's first block
            # holds its own key (key 0 first without a window, the diagonal first with one)
            alpha = np.exp(m - m_new)  # (B, Hkv, G, bq, 1) rescales what was summed against m
            s -= m_new
            p = np.exp(s, out=s)  # (B, Hkv, G, bq, bk) unnormalised probabilities, masked: 0
            sigma = alpha * sigma + p.sum(axis=-1, keepdims=True)
            acc *= alpha
            acc += p @ vg[..., j0:j1, :]
            m = m_new
        out[..., i0:i1, :] = acc / sigma
        lse[..., i0:i1] = (m + np.log(sigma))[..., 0]
    out, lse = out.reshape(B, H, S, hd), lse.reshape(B, H, S)  # views, the heads in order
    # backward needs q, k, v (to recompute the scores), out (for D), lse (for the probabilities)
    return out, FlashCache(q, k, v, out, lse, bs, window)


def flash_attention_backward(
    dout: np.ndarray, cache: FlashCache
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients `(dq, dk, dv)` given `dout` (B, H, S, hd), recomputing P block by block.

    P_ij = exp(score_ij - lse_i) is rebuilt from q, k and lse; the softmax's row sums
    rowsum(P * dP) are replaced by D = rowsum(dout * out), which is the same number per row.
    """
    q, k, v, out, lse, bs, window = cache
    B, H, S, hd = q.shape
    Hkv = k.shape[1]
    G = H // Hkv
    scale = q.dtype.type(1.0 / np.sqrt(hd))
    qs = (q * scale).reshape(B, Hkv, G, S, hd)  # (B, Hkv, G, S, hd) as in the forward
    dout = dout.reshape(B, Hkv, G, S, hd)  # (B, Hkv, G, S, hd)
    D = np.einsum("...ij,...ij->...i", dout, out.reshape(dout.shape))[..., None]  # (B, Hkv,
    # G, S, 1) rowsum(dO * O)
    lse_c = lse.reshape(B, Hkv, G, S, 1)  # (B, Hkv, G, S, 1)
    dq = np.zeros_like(qs)  # (B, Hkv, G, S, hd): every key block adds to it
    dk = np.empty_like(k)  # (B, Hkv, S, hd)
    dv = np.empty_like(v)  # (B, Hkv, S, hd)
    for j0 in range(0, S, bs):
        j1 = min(j0 + bs, S)
        kj, vj = k[:, :, None, j0:j1], v[:, :, None, j0:j1]  # (B, Hkv, 1, bk, hd)
        dkj = np.zeros_like(kj)  # (B, Hkv, 1, bk, hd) summed over the query blocks and the
        dvj = np.zeros_like(vj)  # group's heads that see key j (fan-in)
        for i0 in _query_blocks(j0, j1, S, bs, window):  # the others see none of these keys
            i1 = min(i0 + bs, S)
            # p = exp(score - lse): the forward's probabilities, recomputed
            s = _scores(qs[..., i0:i1, :], kj, i0, j0, window)  # (B, Hkv, G, bq, bk)
            s -= lse_c[..., i0:i1, :]
            p = np.exp(s, out=s)  # (B, Hkv, G, bq, bk)
            doi = dout[..., i0:i1, :]  # (B, Hkv, G, bq, hd)
            # out = p @ v: v's block is read by the G heads of its group, their parts add
            dvj += (np.swapaxes(p, -1, -2) @ doi).sum(axis=2, keepdims=True)
            dp = doi @ np.swapaxes(vj, -1, -2)  # (B, Hkv, G, bq, bk)
            # p = softmax(score): ds = p * (dp - rowsum(p * dp)), and rowsum(p * dp) = D
            dp -= D[..., i0:i1, :]
            dp *= p  # now ds (B, Hkv, G, bq, bk)
            # score = (q * scale) @ k^T
            dq[..., i0:i1, :] += (dp @ kj) * scale
            dkj += (np.swapaxes(dp, -1, -2) @ qs[..., i0:i1, :]).sum(axis=2, keepdims=True)
        dk[..., j0:j1, :] = dkj[:, :, 0]
        dv[..., j0:j1, :] = dvj[:, :, 0]
    return dq.reshape(B, H, S, hd), dk, dv
