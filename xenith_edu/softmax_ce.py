"""Softmax cross-entropy: the loss at the top of the model and its gradient.

Chapter 1 of the book derives it: dlogits = (softmax(logits) - onehot(targets)) / N.
"""

from __future__ import annotations

import numpy as np

# Shape legend: N positions (N = B*S when flattened), V vocab. Leading axes may be any
# shape (...); the loss is averaged over all of them.

LOG_CLAMP = 1e-30  # -log(max(p, 1e-30)): a probability that underflows to 0 costs 69, not inf


def _check(logits: np.ndarray, targets: np.ndarray) -> None:
    if not isinstance(logits, np.ndarray) or logits.dtype.kind != "f":
        raise TypeError("logits must be a floating-point NumPy array")
    if not isinstance(targets, np.ndarray) or targets.dtype.kind not in "iu":
        raise TypeError("targets must be an integer NumPy array")
    if logits.ndim < 1 or targets.shape != logits.shape[:-1]:
        raise ValueError(
            f"targets has shape {targets.shape}, expected logits.shape[:-1] = {logits.shape[:-1]}"
        )
    V = logits.shape[-1]
    if targets.size and (targets.min() < 0 or targets.max() >= V):
        raise ValueError(f"targets must lie in [0, {V}), got values in "
                         f"[{targets.min()}, {targets.max()}]")


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)  # (..., V), max 0: exp cannot overflow
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z  # (..., V) probabilities, rows sum to 1


def per_token_loss(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log softmax(logits)[target] at every position, shape logits.shape[:-1].

    See chapter 1 (softmax cross-entropy).
    """
    _check(logits, targets)
    p = _softmax(logits)  # (..., V)
    py = np.take_along_axis(p, targets[..., None], axis=-1)[..., 0]  # (...)
    return -np.log(np.maximum(py, LOG_CLAMP))


def softmax_cross_entropy(logits: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy over all positions and its gradient `dlogits` (same shape/dtype).

    loss = mean_n -log softmax(logits_n)[y_n];  dlogits = (softmax(logits) - onehot(y)) / N.
    See chapter 1 (softmax cross-entropy).
    """
    _check(logits, targets)
    N = targets.size
    p = _softmax(logits)  # (..., V), becomes dlogits in place (p is our own array)
    py = np.take_along_axis(p, targets[..., None], axis=-1)  # (..., 1)
    loss = float(-np.log(np.maximum(py, LOG_CLAMP)).mean())
    # d loss / d logits = p - onehot(y): subtract 1 at each target, then divide by N.
    np.put_along_axis(p, targets[..., None], py - 1, axis=-1)
    p /= N
    return loss, p
