"""The exercise checks of the "A real LLaMA" chapter, mutation-tested: the padded cross-entropy
(a derivation) and a grouped-query checkpoint's k_proj in our layout.
"""

from __future__ import annotations

import numpy as np

from xenith_edu.exercises.llama import wk_from_hf

from .helpers import catalogue_tests, kw

# Shape legend: N positions, V vocab, M counted positions; Hkv key/value heads, hd head width.


def padded(logits, targets, ignore_index, *, over="M", mask_grad=True, mask_loss=True,
           sign=1.0):
    """From scratch, with one switch per mistake of the catalogue."""
    N, V = logits.shape
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)  # (N, V)
    keep = targets != ignore_index  # (N,)
    safe = np.where(keep, targets, 0)
    M = int(keep.sum())
    nll = -np.log(p[np.arange(N), safe])
    loss = nll[keep].sum() / M if mask_loss else nll.mean()
    d = p.copy()
    d[np.arange(N)[keep], safe[keep]] -= 1
    if mask_grad:
        d[~keep] = 0
    d /= M if over == "M" else N
    return float(loss), (sign * d).astype(logits.dtype)


def padded_by_loops(logits, targets, ignore_index):
    N, V = logits.shape
    rows = [n for n in range(N) if targets[n] != ignore_index]
    d = np.zeros((N, V))
    loss = 0.0
    for n in rows:
        z = logits[n].astype(np.float64)
        p = np.exp(z - z.max())
        p /= p.sum()
        loss -= np.log(p[targets[n]])
        p[targets[n]] -= 1
        d[n] = p / len(rows)
    return loss / len(rows), d.astype(logits.dtype)


def wk_by_reshape(weight, n_head, n_kv_head):
    rows, d = weight.shape
    hd = d // n_head
    return weight.reshape(n_kv_head, 2, hd // 2, d).transpose(0, 2, 1, 3).reshape(rows, d).T


def wk_heads(weight, n_head, n_kv_head, *, heads=None, width=None, transpose=True):
    rows, d = weight.shape
    hd = d // n_head if width is None else width
    H = n_kv_head if heads is None else heads
    j = np.arange(hd)
    where = (j % 2) * (hd // 2) + j // 2
    order = (np.arange(H)[:, None] * hd + where).reshape(-1)
    out = weight[order]
    return out.T if transpose else out


RIGHT = {
    "padded_cross_entropy": (padded, padded_by_loops),
    "wk_from_hf": (wk_from_hf, wk_by_reshape, wk_heads),
}

MUTANTS = [
    ("padded_cross_entropy", kw(padded, over="N"), ["divided by N", "not by M"]),
    ("padded_cross_entropy", kw(padded, mask_loss=False), ["counted in the loss"]),
    ("padded_cross_entropy", kw(padded, mask_grad=False), ["ignored rows of dlogits"]),
    ("padded_cross_entropy", kw(padded, sign=-1.0), ["sign flipped"]),
    ("wk_from_hf", lambda w, H, hkv: w.T.copy(), ["still in rotate-half order"]),
    ("wk_from_hf", kw(wk_heads, transpose=False), ["transposed"]),
    ("wk_from_hf", lambda w, H, hkv: wk_heads(w, H, hkv, heads=1, width=w.shape[0]),
     ["treats all the rows as one head"]),
]

(test_right_answers_pass, test_mutant_is_rejected_with_its_diagnosis,
 test_the_catalogue_covers_the_chapter) = catalogue_tests(RIGHT, MUTANTS)
