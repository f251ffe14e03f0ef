"""Causal attention without the (S, S) matrix: the blockwise online softmax, forward and backward.

See the chapter "Memory: attention without the S×S matrix"; the plain version is in `attention`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# Shape legend: B batch, H heads, S positions, hd head width, bq/bk the rows of one query/key
# block (at most block_size). Only (B, H, bq, bk) blocks of scores ever exist.

DEFAULT_BLOCK = 64


class FlashCache(NamedTuple):
    """What the backward needs: the inputs, the output and the row log-sum-exp, nothing (S, S).

    q, k, v recompute each block's scores; L = log sum_j exp(score_ij) turns a score back into
    its probability, exp(score - L); out gives D = rowsum(dout * out). block_size is a number.
    """

    q: np.ndarray  # (B, H, S, hd)
    k: np.ndarray  # (B, H, S, hd)
    v: np.ndarray  # (B, H, S, hd)
    out: np.ndarray  # (B, H, S, hd)
    L: np.ndarray  # (B, H, S) row log-sum-exp of the scaled, masked scores
    block_size: int


def _check_block(block_size: object) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)):
        raise TypeError(f"block_size must be an int, got {type(block_size).__name__}")
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    return int(block_size)


def _scores(qs: np.ndarray, k: np.ndarray, i0: int, j0: int, tri: np.ndarray) -> np.ndarray:
    """One block of scaled scores (B, H, bq, bk), the causal mask added on a diagonal block."""
    s = qs @ np.swapaxes(k, -1, -2)  # (B, H, bq, bk)
    if i0 == j0:  # the diagonal block: a key after its query gets -inf
        s += tri[: s.shape[-2], : s.shape[-1]]
    return s


def flash_attention_forward(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, block_size: int = DEFAULT_BLOCK
) -> tuple[np.ndarray, FlashCache]:
    """softmax(q k^T / sqrt(hd) + causal mask) @ v on (B, H, S, hd), one block at a time.

    For each block of queries, the key blocks up to the diagonal are visited in order while a
    running max m, a running sum l and an unnormalised output acc are kept per row; when the max
    grows, l and acc are rescaled by exp(m_old - m_new), which makes the result exact.
    Returns `(out, cache)`, out (B, H, S, hd); the cache holds no (S, S) array.
    """
    bs = _check_block(block_size)
    S, hd = q.shape[-2], q.shape[-1]
    dt = q.dtype.type
    qs = q * dt(1.0 / np.sqrt(hd))  # (B, H, S, hd) scaled once, as the plain version does
    tri = np.triu(np.full((bs, bs), -np.inf, dtype=q.dtype), k=1)  # (bs, bs) diagonal mask
    out = np.empty_like(q)  # (B, H, S, hd)
    L = np.empty(q.shape[:-1], dtype=q.dtype)  # (B, H, S)
    for i0 in range(0, S, bs):
        i1 = min(i0 + bs, S)
        qi = qs[..., i0:i1, :]  # (B, H, bq, hd)
        m = np.full(qi.shape[:-1] + (1,), -np.inf, dtype=q.dtype)  # (B, H, bq, 1) running max
        l = np.zeros_like(m)  # (B, H, bq, 1) running sum of exp(score - m)
        acc = np.zeros_like(qi)  # (B, H, bq, hd) running sum of exp(score - m) v
        for j0 in range(0, i1, bs):  # key blocks up to the diagonal; later ones are all masked
            j1 = min(j0 + bs, S)
            s = _scores(qi, k[..., j0:j1, :], i0, j0, tri)  # (B, H, bq, bk)
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))  # finite: j0 = 0 comes first
            alpha = np.exp(m - m_new)  # (B, H, bq, 1) rescales what was summed against m
            s -= m_new
            p = np.exp(s, out=s)  # (B, H, bq, bk) unnormalised probabilities, masked ones 0
            l = alpha * l + p.sum(axis=-1, keepdims=True)
            acc *= alpha
            acc += p @ v[..., j0:j1, :]
            m = m_new
        out[..., i0:i1, :] = acc / l
        L[..., i0:i1] = (m + np.log(l))[..., 0]
    # backward needs q, k, v (to recompute the scores), out (for D) and L (for the probabilities).
    return out, FlashCache(q, k, v, out, L, bs)


def flash_attention_backward(
    dout: np.ndarray, cache: FlashCache
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients `(dq, dk, dv)` given `dout` (B, H, S, hd), recomputing P block by block.

    P_ij = exp(score_ij - L_i) is rebuilt from q, k and L; the softmax's row sums
    rowsum(P * dP) are replaced by D = rowsum(dout * out), which is the same number per row.
    """
    q, k, v, out, L, bs = cache
    S, hd = q.shape[-2], q.shape[-1]
    scale = q.dtype.type(1.0 / np.sqrt(hd))
    qs = q * scale  # (B, H, S, hd) as in the forward
    tri = np.triu(np.full((bs, bs), -np.inf, dtype=q.dtype), k=1)  # (bs, bs)
    D = np.einsum("...ij,...ij->...i", dout, out)[..., None]  # (B, H, S, 1) rowsum(dO * O)
    Lc = L[..., None]  # (B, H, S, 1)
    dq = np.zeros_like(q)  # (B, H, S, hd): every key block adds to it
    dk = np.empty_like(k)  # (B, H, S, hd)
    dv = np.empty_like(v)  # (B, H, S, hd)
    for j0 in range(0, S, bs):
        j1 = min(j0 + bs, S)
        kj, vj = k[..., j0:j1, :], v[..., j0:j1, :]  # (B, H, bk, hd)
        dkj = np.zeros_like(kj)  # (B, H, bk, hd) summed over the query blocks that see key j
        dvj = np.zeros_like(vj)  # (B, H, bk, hd)
        for i0 in range(j0, S, bs):  # query blocks from the diagonal on; earlier ones see 0
            i1 = min(i0 + bs, S)
            # p = exp(score - L): the forward's probabilities, recomputed
            s = _scores(qs[..., i0:i1, :], kj, i0, j0, tri)  # (B, H, bq, bk)
            s -= Lc[..., i0:i1, :]
            p = np.exp(s, out=s)  # (B, H, bq, bk)
            doi = dout[..., i0:i1, :]  # (B, H, bq, hd)
            # out = p @ v
            dvj += np.swapaxes(p, -1, -2) @ doi
            dp = doi @ np.swapaxes(vj, -1, -2)  # (B, H, bq, bk)
            # p = softmax(score): ds = p * (dp - rowsum(p * dp)), and rowsum(p * dp) = D
            dp -= D[..., i0:i1, :]
            dp *= p  # now ds (B, H, bq, bk)
            # score = (q * scale) @ k^T
            dq[..., i0:i1, :] += (dp @ kj) * scale
            dkj += np.swapaxes(dp, -1, -2) @ qs[..., i0:i1, :]
        dk[..., j0:j1, :] = dkj
        dv[..., j0:j1, :] = dvj
    return dq, dk, dv
