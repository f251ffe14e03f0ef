"""Softmax cross-entropy: the loss at the top of the model and its gradient.

The softmax cross-entropy chapter derives it: dlogits = (softmax(logits) - onehot(targets)) / N.
"""

from __future__ import annotations

import numpy as np

from .tools.workspace import empty_like

# Shape legend: N positions (N = B*S when flattened), V vocab. Leading axes may be any
# shape (...); the loss is averaged over all of them. The targets are integer ids in [0, V)
# with shape logits.shape[:-1]: `forward`, `backward` and `loss_and_grads` check them.

LOG_CLAMP = 1e-30  # -log(max(p, 1e-30)): a probability that underflows to 0 costs 69, not inf


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = np.subtract(logits, logits.max(axis=-1, keepdims=True), out=empty_like(logits))
    # z (..., V) has a row max of 0: exp cannot overflow
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z  # (..., V) probabilities, rows sum to 1


def per_token_loss(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log softmax(logits)[target] at every position, shape logits.shape[:-1].

    See the softmax cross-entropy chapter.
    """
    p = _softmax(logits)  # (..., V)
    py = np.take_along_axis(p, targets[..., None], axis=-1)[..., 0]  # (...)
    return -np.log(np.maximum(py, LOG_CLAMP))


def softmax_cross_entropy(logits: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy over all positions and its gradient `dlogits` (same shape/dtype).

    loss = mean_n -log softmax(logits_n)[y_n];  dlogits = (softmax(logits) - onehot(y)) / N.
    See the softmax cross-entropy chapter.
    """
    N = targets.size
    p = _softmax(logits)  # (..., V), becomes dlogits in place (p is our own array)
    py = np.take_along_axis(p, targets[..., None], axis=-1)  # (..., 1)
    loss = float(-np.log(np.maximum(py, LOG_CLAMP)).mean())
    # d loss / d logits = p - onehot(y): subtract 1 at each target, then divide by N.
    np.put_along_axis(p, targets[..., None], py - 1, axis=-1)
    p /= N
    return loss, p
