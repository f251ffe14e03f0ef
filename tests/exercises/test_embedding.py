"""The exercise checks of the "Embedding scatter-add" chapter, mutation-tested.

Each mistake of the catalogue is rejected with its diagnosis; the right answers pass.
"""

from __future__ import annotations

import numpy as np

from xenith_edu.embedding import EmbeddingCache, embedding_backward

from .helpers import catalogue_tests, kw

# Shape legend: B batch, S positions, N positions, d width, H heads, hd head width, f hidden,
# V vocab.


def emb(x, dh, V, *, mode="add", dtype=None):
    d = dh.shape[-1]
    dwte = np.zeros((V, d), dtype=dh.dtype if dtype is None else dtype)
    flat, rows = x.reshape(-1), dh.reshape(-1, d)
    if mode == "add":
        np.add.at(dwte, flat, rows)
    elif mode == "assign":
        dwte[flat] = rows
    elif mode == "buffered":
        dwte[flat] += rows
    elif mode == "mean":
        np.add.at(dwte, flat, rows)
        counts = np.bincount(flat, minlength=V)
        dwte /= np.maximum(counts, 1)[:, None]
    elif mode == "loop":
        for n, v in enumerate(flat):
            dwte[v] += rows[n]
    elif mode == "loop-first-wins":  # an overwrite in the other order: the first stays
        for n in range(len(flat) - 1, -1, -1):
            dwte[flat[n]] = rows[n]
    elif mode.startswith("sequence"):  # one sequence of the batch only
        b = int(mode.split()[-1]) % x.shape[0]
        np.add.at(dwte, x[b], dh[b])
    return dwte


def emb_flatten_inplace(x, dh, V):
    x.shape = (-1,)  # reshapes the caller's array, not a view of it
    return emb(x, dh, V)


def tied(x, dh, dlogits, xf, V, *, mode="add", proj=1.0, scatter=True, transposed=False):
    p = xf.T @ dlogits if transposed else dlogits.T @ xf
    out = proj * p
    if scatter:
        out = out + emb(x, dh, V, mode=mode)
    return out


def pos(x, dh, V, block, *, mode="add", reduce="sum", full=True):
    dwte = emb(x, dh, V, mode=mode)
    S, d = x.shape[1], dh.shape[-1]
    g = {"sum": dh.sum(axis=0), "mean": dh.mean(axis=0), "first": dh[0]}[reduce]
    if not full:
        return dwte, g
    dwpe = np.zeros((block, d), dtype=dh.dtype)
    dwpe[:S] = g
    return dwte, dwpe


def pos_loop(x, dh, V, block):
    """Position by position, token by token: every use of a row adds to its gradient."""
    B, S = x.shape
    dwte = np.zeros((V, dh.shape[-1]), dtype=dh.dtype)
    dwpe = np.zeros((block, dh.shape[-1]), dtype=dh.dtype)
    for b in range(B):
        for t in range(S):
            dwte[x[b, t]] += dh[b, t]
            dwpe[t] += dh[b, t]
    return dwte, dwpe


# exercise -> (the right answer from scratch, the package's reference in the learner's signature)
RIGHT = {
    "embedding_backward": (lambda x, dh, V: emb(x, dh, V, mode="loop"),
                           lambda x, dh, V: embedding_backward(dh, EmbeddingCache(x, V))),
    "position_embedding_backward": (pos, pos_loop),
    "tied_wte_grad": (tied, lambda x, dh, dl, xf, V: embedding_backward(
        dh, EmbeddingCache(x, V)) + dl.T @ xf),
}

# (exercise, mutant, words the verdict must contain[, words it must not contain])
MUTANTS = [
    ("embedding_backward", kw(emb, mode="assign"), ["repeated tokens overwrite instead of "
                                                     "accumulate", "np.add.at"]),
    ("embedding_backward", kw(emb, mode="buffered"), ["repeated tokens overwrite instead of "
                                                       "accumulate"]),
    ("embedding_backward", kw(emb, mode="mean"), ["averaged instead of summed"]),
    ("embedding_backward", kw(emb, mode="loop-first-wins"),
     ["repeated tokens overwrite instead of accumulate"]),
    # one sequence only: its rows are single gradients of their tokens, not an overwrite
    ("embedding_backward", kw(emb, mode="sequence 0"), ["only the tokens of the first sequence",
                                                        "every sequence"], ["overwrite"]),
    ("embedding_backward", kw(emb, mode="sequence 1"), ["only the tokens of sequence 1"],
     ["overwrite"]),
    ("embedding_backward", kw(emb, mode="sequence -1"), ["re:only the tokens of sequence \\d"],
     ["overwrite"]),
    ("embedding_backward", kw(emb, dtype=np.float64), ["float32", "dwte has dtype float64, "
                                                        "expected float32", "dtype=dh.dtype"]),
    ("embedding_backward", lambda x, dh, V: dh.reshape(-1, dh.shape[-1]).copy(),
     [r"re:dwte has shape \(\d+, (\d+)\), expected \(\d+, \1\)", "One row per vocabulary entry"]),
    ("embedding_backward", lambda x, dh, V: emb(x, dh, V).T.copy(), ["transposed"]),
    ("embedding_backward", emb_flatten_inplace, ["changed its input `x` in place"]),
    ("tied_wte_grad", kw(tied, scatter=False), ["only the output-projection term"]),
    ("tied_wte_grad", kw(tied, proj=0.0), ["only the embedding scatter-add"]),
    ("tied_wte_grad", kw(tied, proj=-1.0), ["output-projection term has its sign flipped"]),
    ("tied_wte_grad", kw(tied, mode="assign"), ["repeated tokens overwrite instead of "
                                                 "accumulate"]),
    ("tied_wte_grad", kw(tied, transposed=True), ["raised ValueError", "transpose"]),
    ("tied_wte_grad", kw(tied, mode="sequence 0"), ["only the tokens of the first sequence"],
     ["overwrite"]),
    ("tied_wte_grad", kw(tied, transposed=True, scatter=False),
     [r"re:dwte has shape \((\d+), (\d+)\), expected \(\2, \1\): transposed"]),
    ("position_embedding_backward", kw(pos, reduce="mean"), ["dwpe is averaged over the B",
                                                             "(dwte is right.)"]),
    ("position_embedding_backward", kw(pos, reduce="first"), ["only the first sequence's"]),
    ("position_embedding_backward", kw(pos, mode="assign"), ["repeated tokens overwrite"]),
    ("position_embedding_backward", kw(pos, full=False), ["One row per position of the table"]),
    ("position_embedding_backward", lambda x, dh, V, b: pos(x, dh, V, b)[::-1],
     ["re:are the outputs in the order|dwpe and dwte are swapped"]),
]

(test_right_answers_pass, test_mutant_is_rejected_with_its_diagnosis,
 test_the_catalogue_covers_the_chapter) = catalogue_tests(RIGHT, MUTANTS)
