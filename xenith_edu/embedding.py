"""Token embedding: a gather forward, a scatter-add backward.

Chapter 6 of the book derives it, with repeated tokens and tied embeddings.
"""

from __future__ import annotations

import numpy as np

# Shape legend: B batch, S positions, d width, V vocab.


def embedding_forward(wte: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Rows of `wte` (V, d) for the token ids `x` (B, S): h (B, S, d). See chapter 6."""
    return wte[x]  # (B, S, d) a gather makes a new array


def embedding_backward(x: np.ndarray, dh: np.ndarray, vocab_size: int) -> np.ndarray:
    """Gradient of wte (V, d) given dh (B, S, d): row v sums dh at every position holding v.

    A token that appears twice receives both gradients: the scatter must add, not assign.
    See chapter 6 (embedding scatter-add).
    """
    d = dh.shape[-1]
    dwte = np.zeros((vocab_size, d), dtype=dh.dtype)  # (V, d)
    np.add.at(dwte, x.reshape(-1), dh.reshape(-1, d))  # dwte[x[n]] += dh[n], repeats add up
    return dwte
