"""Token embedding: a gather forward, a scatter-add backward.
The fast form the model runs; the readable form is the "Embedding scatter-add" chapter's
(`np.add.at`, "The vectorized version"), which derives it with repeated tokens and tied
embeddings.

Fast how: the scatter-add sorts the positions by token and sums each run; the same sums as
`np.add.at` (a test compares them). No input checks: the model checks the token ids at its
boundary. Measured figures are in benchmarks/README.md.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# Shape legend: B batch, S positions, d width, V vocab.


class EmbeddingCache(NamedTuple):
    """What `embedding_backward` needs: where each row went, and how many rows the table has."""

    x: np.ndarray  # (B, S) the token ids: the rows that were gathered
    vocab_size: int  # V, the number of rows of the gradient


def embedding_forward(wte: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, EmbeddingCache]:
    """Rows of `wte` (V, d) for the token ids `x` (B, S): `(h, cache)`, h (B, S, d).

    See the "Embedding scatter-add" chapter.
    """
    h = wte[x]  # (B, S, d) a gather makes a new array
    return h, EmbeddingCache(x, wte.shape[0])


def embedding_backward(dh: np.ndarray, cache: EmbeddingCache) -> np.ndarray:
    """Gradient `dwte` (V, d) given dh (B, S, d): row v sums dh at every position holding v.

    A token that appears twice receives both gradients: the scatter must add, not assign.
    See the "Embedding scatter-add" chapter.
    """
    d = dh.shape[-1]
    ids, rows = cache.x.reshape(-1), dh.reshape(-1, d)  # (N,) token ids, (N, d) gradients
    # The chapter's form is np.add.at(dwte, ids, rows): dwte[ids[n]] += rows[n], repeats add up.
    # The same sums, four times faster: sort the positions by token, then add up each run.
    order = np.argsort(ids, kind="stable")  # (N,) the positions, grouped by token
    sorted_ids = ids[order]
    starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])  # each run's first
    dwte = np.zeros((cache.vocab_size, d), dtype=dh.dtype)  # (V, d): unused tokens get zero
    dwte[sorted_ids[starts]] = np.add.reduceat(rows[order], starts, axis=0)  # one sum per token
    return dwte
