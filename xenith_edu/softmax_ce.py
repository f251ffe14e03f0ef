"""Softmax cross-entropy: the loss at the top of the model and its gradient.

The softmax cross-entropy chapter derives it: dlogits = (softmax(logits) - onehot(targets)) / N.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .tools.workspace import empty_like

# Shape legend: N positions (N = B*S when flattened), V vocab. Leading axes may be any
# shape (...); the loss is averaged over all of them. The targets are integer ids in [0, V)
# with shape logits.shape[:-1]: `forward`, `backward` and `loss_and_grads` check them.

LOG_CLAMP = 1e-30  # -log(max(p, 1e-30)): a probability that underflows to 0 costs 69, not inf


class SoftmaxCECache(NamedTuple):
    """What `softmax_ce_backward` needs: p - onehot(y) is the whole gradient, up to 1/N."""

    p: np.ndarray  # (..., V) the probabilities with 1 taken off at each target, 0 where ignored
    positions: int  # N, the positions the mean is over (those not ignored)


BLOCK = 2 ** 19  # numbers per block of rows (2 MiB of float32): a block's passes stay in cache


def _softmax(logits: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """softmax over the last axis, into `out` (which may be `logits` itself) or a new array.

    A block of rows at a time: each row's numbers are the same as in one pass over the whole
    array (every step is a row's own), but the block's five passes (max, shift, exp, sum,
    divide) read it from the cache, not from memory: a real vocabulary's (N, V) logits are
    hundreds of MB (Llama-3.2-1B's at S = 256: 131 MB)."""
    z = empty_like(logits) if out is None else out  # (..., V)
    V = logits.shape[-1]
    rows, zs = logits.reshape(-1, V), z.reshape(-1, V)  # (N, V) views
    step = max(1, BLOCK // max(V, 1))
    for i in range(0, rows.shape[0], step):
        r, b = rows[i:i + step], zs[i:i + step]  # (rows, V)
        np.subtract(r, r.max(axis=-1, keepdims=True), out=b)  # a row max of 0: no overflow
        np.exp(b, out=b)
        b /= b.sum(axis=-1, keepdims=True)
    return z  # (..., V) probabilities, rows sum to 1


def per_token_loss(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log softmax(logits)[target] at every position, shape logits.shape[:-1].

    See the softmax cross-entropy chapter.
    """
    p = _softmax(logits)  # (..., V)
    py = np.take_along_axis(p, targets[..., None], axis=-1)[..., 0]  # (...)
    return -np.log(np.maximum(py, LOG_CLAMP))


def softmax_ce_forward(
    logits: np.ndarray, targets: np.ndarray, ignore_index: int | None = None,
    out: np.ndarray | None = None,
) -> tuple[float, SoftmaxCECache]:
    """Mean cross-entropy over the positions whose target is not `ignore_index`, and the cache.

    loss = mean_n -log softmax(logits_n)[y_n] over the counted positions (all of them when
    `ignore_index` is None: a padding token's positions are left out, as transformers' -100
    labels are). With no position counted the loss is 0 and so is its gradient.
    See the softmax cross-entropy chapter. `out` (C-contiguous, shaped as logits; it may be
    `logits` itself, which the caller then gives up) receives the cache's array.
    """
    p = _softmax(logits, out)  # (..., V), becomes p - onehot(y) in place (p is our own)
    safe = targets
    keep = None
    if ignore_index is not None:
        keep = targets != ignore_index  # (...) the positions that count
        safe = np.where(keep, targets, 0)  # an ignored target may lie outside [0, V)
    py = np.take_along_axis(p, safe[..., None], axis=-1)  # (..., 1)
    nll = -np.log(np.maximum(py[..., 0], LOG_CLAMP))  # (...)
    count = int(targets.size if keep is None else keep.sum())
    if keep is None:
        loss = float(nll.mean())
    else:
        loss = float(nll[keep].sum() / count) if count else 0.0
    # d loss / d logits_n = p_n - onehot(y_n) at a counted position, 0 at an ignored one
    np.put_along_axis(p, safe[..., None], py - 1, axis=-1)
    if keep is not None:
        p *= keep[..., None]
    return loss, SoftmaxCECache(p, count)


def softmax_ce_backward(dloss: float, cache: SoftmaxCECache) -> np.ndarray:
    """dlogits (..., V) given the loss's gradient `dloss` (1.0 when it is the objective).

    dlogits = dloss * (softmax(logits) - onehot(y)) / N, in a new array: the cache is left as
    it was, so a second call gives the same gradient.
    """
    return _scaled(dloss, cache, empty_like(cache.p))


def _scaled(dloss: float, cache: SoftmaxCECache, out: np.ndarray) -> np.ndarray:
    """dloss * cache.p / N written into `out` (..., V), which may be cache.p itself."""
    if dloss != 1.0:
        np.multiply(cache.p, dloss, out=out)
        out /= max(cache.positions, 1)  # a division, as the chapter writes it: the same bits
        return out
    return np.divide(cache.p, max(cache.positions, 1), out=out)


def softmax_cross_entropy(
    logits: np.ndarray, targets: np.ndarray, ignore_index: int | None = None,
    out: np.ndarray | None = None,
) -> tuple[float, np.ndarray]:
    """Mean cross-entropy over all positions and its gradient `dlogits` (same shape/dtype).

    loss = mean_n -log softmax(logits_n)[y_n];  dlogits = (softmax(logits) - onehot(y)) / N.
    `ignore_index`: positions with that target count for neither (see `softmax_ce_forward`).
    `out`: where dlogits is written (C-contiguous; `logits` itself when the caller gives them
    up, as the model's backward does: no second (N, V) array). See the softmax cross-entropy
    chapter.
    """
    loss, cache = softmax_ce_forward(logits, targets, ignore_index, out)
    return loss, _scaled(1.0, cache, out=cache.p)  # the cache is ours alone: reuse its array
