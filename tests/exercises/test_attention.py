"""The exercise checks of the "Causal attention" chapter, mutation-tested.

Each mistake of the catalogue is rejected with its diagnosis; the right answers pass.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import xenith_edu.exercises as ex
from xenith_edu.attention import causal_attention_backward, causal_attention_forward
from xenith_edu.exercises.attention import _cache_wrong, buggy_attention_backward, cache_bytes

from .helpers import catalogue_tests, kw

# Shape legend: B batch, S positions, N positions, d width, H heads, hd head width, f hidden,
# V vocab.


def attn(dout, q, k, v, *, masked=True, scale="right", rowsum=True, swap_qk=False,
         dv_no_t=False, dk_no_t=False, shift=True, mask_future=True, keepdims=True):
    S, hd = q.shape[-2], q.shape[-1]
    c = {"right": 1 / math.sqrt(hd), "missing": 1.0, "twice": 1 / hd}[scale]
    with np.errstate(all="ignore"):
        s = q @ np.swapaxes(k, -1, -2) / math.sqrt(hd)  # (B, H, S, S)
        if masked:
            upper = np.triu(np.ones((S, S), dtype=bool), k=1)
            s = np.where(upper if mask_future else upper.T, -np.inf, s)
        if shift:
            s = s - s.max(axis=-1, keepdims=True)
        P = np.exp(s)
        P = P / (P.sum(axis=-1, keepdims=True) if keepdims else P.sum(axis=-1))
    dP = dout @ np.swapaxes(v, -1, -2)
    if rowsum:
        dP = dP - np.sum(P * dP, axis=-1, keepdims=True)
    dS = P * dP * c
    dq = dS @ k
    dk = (dS if dk_no_t else np.swapaxes(dS, -1, -2)) @ q
    dv = (P if dv_no_t else np.swapaxes(P, -1, -2)) @ dout
    if swap_qk:
        dq, dk = dk, dq
    return dq, dk, dv


def attn_jacobian(dout, q, k, v):
    """A correct alternative: each row's softmax Jacobian diag(p) - p p^T formed explicitly."""
    S, hd = q.shape[-2], q.shape[-1]
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(hd)  # (B, H, S, S)
    s = np.where(np.triu(np.ones((S, S), dtype=bool), k=1), -np.inf, s)
    P = np.exp(s - s.max(axis=-1, keepdims=True))
    P = P / P.sum(axis=-1, keepdims=True)
    J = P[..., :, None] * np.eye(S, dtype=q.dtype) - P[..., :, None] * P[..., None, :]
    dP = dout @ np.swapaxes(v, -1, -2)  # (B, H, S, S)
    dS = np.einsum("bhijk,bhik->bhij", J, dP) / math.sqrt(hd)  # row i: J_i @ dP_i
    return dS @ k, np.swapaxes(dS, -1, -2) @ q, np.swapaxes(P, -1, -2) @ dout


def gqa(dout, q, k, v, *, reduce="sum", group="repeat", masked=True):
    """Grouped-query attention, head by head: query head h reads kv head h // (H // G)."""
    H, G = q.shape[1], k.shape[1]
    r = H // G
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for h in range(H):
        j = h // r if group == "repeat" else h % G
        gq, gk, gv = attn(dout[:, h:h + 1], q[:, h:h + 1], k[:, j:j + 1], v[:, j:j + 1],
                          masked=masked)
        dq[:, h:h + 1] = gq
        if reduce == "sum" or (reduce == "first" and h % r == 0 and group == "repeat"):
            dk[:, j:j + 1] += gk
            dv[:, j:j + 1] += gv
        elif reduce == "mean":
            dk[:, j:j + 1] += gk / r
            dv[:, j:j + 1] += gv / r
    return dq, dk, dv


def gqa_expanded(dout, q, k, v):
    """The same by expanding k and v to every query head, then scatter-adding back."""
    r = q.shape[1] // k.shape[1]
    dq, dke, dve = attn(dout, q, np.repeat(k, r, axis=1), np.repeat(v, r, axis=1))
    index = np.arange(q.shape[1]) // r
    dk, dv = np.zeros_like(k), np.zeros_like(v)
    np.add.at(dk, (slice(None), index), dke)
    np.add.at(dv, (slice(None), index), dve)
    return dq, dk, dv


def fixed_bug(dout, q, k, v):
    """The buggy backward with its one line fixed (the row sum over axis=-1)."""
    S, hd = q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(hd)
    scores = q @ np.swapaxes(k, -1, -2) * scale
    scores = np.where(np.triu(np.ones((S, S), dtype=bool), k=1), -np.inf, scores)
    P = np.exp(scores - scores.max(axis=-1, keepdims=True))
    P = P / P.sum(axis=-1, keepdims=True)
    dv = np.swapaxes(P, -1, -2) @ dout
    dP = dout @ np.swapaxes(v, -1, -2)
    dscores = P * (dP - np.sum(P * dP, axis=-1, keepdims=True))
    return dscores @ k * scale, np.swapaxes(dscores, -1, -2) @ q * scale, dv


def cache(B, H, S, hd, itemsize, *, tri="right", qkv=3, full_width=False, bytes_=True,
          batch=True):
    """Bytes of one layer's cache: q, k, v in full, the weights' lower triangle packed."""
    P = {"right": S * (S + 1) // 2, "square": S * S, "no diagonal": S * (S - 1) // 2,
         "half": S * S // 2, "no half": S * (S + 1), "none": 0}[tri]  # per head
    width = H * hd if full_width else hd  # one head's slice of q, k, v is hd wide
    n = (B if batch else 1) * H * (qkv * S * width + P)
    return n * itemsize if bytes_ else n


def cache_rows(B, H, S, hd, itemsize):
    """A correct alternative: the kept entries counted row by row, query i keeping i + 1 keys."""
    kept = sum(i + 1 for i in range(S))  # per head
    return B * H * itemsize * (3 * S * hd + kept)


# exercise -> (the right answer from scratch, the package's reference in the learner's signature)
RIGHT = {
    "attention_backward": (attn, lambda dout, q, k, v: causal_attention_backward(
        dout, causal_attention_forward(q, k, v)[1]), attn_jacobian),
    "attention_cache_bytes": (cache, cache_rows),
    "gqa_backward": (gqa, gqa_expanded),
    "attention_find_the_bug": (fixed_bug, attn, attn_jacobian),
}

# (exercise, mutant, words the verdict must contain[, words it must not contain])
MUTANTS = [
    ("attention_backward", kw(attn, masked=False), ["gradient leaks through the causal mask"]),
    ("attention_backward", kw(attn, mask_future=False), ["gradient leaks through the causal "
                                                          "mask"]),
    ("attention_backward", kw(attn, scale="missing"), ["1/sqrt(hd) scale of the scores is "
                                                        "missing", "(dv is right.)"], ["leaks"]),
    ("attention_backward", kw(attn, scale="twice"), ["1/sqrt(hd) scale is applied twice"]),
    ("attention_backward", kw(attn, rowsum=False), ["row-sum term is missing"]),
    ("attention_backward", kw(attn, swap_qk=True), ["dq and dk are swapped"]),
    ("attention_backward", kw(attn, dv_no_t=True), ["dv needs the transposed weights"],
     ["leaks"]),
    ("attention_backward", kw(attn, dk_no_t=True), ["dk needs the transposed score gradient"]),
    ("attention_backward", kw(attn, shift=False), ["large scores", "NaN", "Subtract each row's "
                                                                         "max"]),
    ("attention_backward", kw(attn, keepdims=False), ["raised ValueError", "keepdims=True"]),
    ("attention_cache_bytes", kw(cache, tri="square"), ["keeps the full S x S matrix"]),
    ("attention_cache_bytes", kw(cache, tri="no diagonal"), ["the diagonal is left out"]),
    ("attention_cache_bytes", kw(cache, tri="half"), ["S**2 / 2 is not the triangle"]),
    ("attention_cache_bytes", kw(cache, qkv=0), ["q, k and v are missing"]),
    ("attention_cache_bytes", kw(cache, tri="none"), ["the weights are missing"]),
    ("attention_cache_bytes", kw(cache, bytes_=False), ["counts numbers, not bytes"],
     ["batch is missing", "heads are missing"]),
    ("attention_cache_bytes", lambda B, H, S, hd, i: 8 * cache(B, H, S, hd, i),
     ["bits, not bytes"]),
    ("attention_cache_bytes", kw(cache, batch=False), ["the batch is missing"]),
    ("attention_cache_bytes", kw(cache, full_width=True), ["model width d = H hd"]),
    ("attention_cache_bytes", lambda B, H, S, hd, i: cache(B, H, S, hd, i) / 1,
     ["should be an int", "// rather than /"]),
    # no catalogue entry: named by fitting the reference's two terms
    ("attention_cache_bytes", kw(cache, qkv=1), ["the factor 3 is missing from the term 3 B H S "
                                                 "hd itemsize (q, k, v)"]),
    ("attention_cache_bytes", kw(cache, qkv=2), ["two of q, k, v are counted, not three"]),
    ("attention_cache_bytes", kw(cache, tri="no half"), ["the division by 2 is missing from the "
                                                         "term B H S (S + 1) / 2 itemsize"]),
    ("attention_cache_bytes", kw(cache, tri="square", bytes_=False),
     ["the full S x S matrix is counted, not its triangle", "times too small (off by a factor "
                                                             "of itemsize)"]),
    ("attention_cache_bytes", lambda B, H, S, hd, i: B * H * (3 * S * hd * i + S * (S + 1) // 2),
     ["the factor itemsize is missing from the term B H S (S + 1) / 2 itemsize"]),
    ("gqa_backward", kw(gqa, reduce="first"), ["keep only one query head's gradient",
                                               "(dq is right.)"]),
    ("gqa_backward", kw(gqa, reduce="mean"), ["averaged over the"]),
    ("gqa_backward", kw(gqa, group="tile"), ["grouped the wrong way"]),
    ("gqa_backward", kw(gqa, masked=False), ["leaks through the causal mask"]),
    ("gqa_backward", lambda dout, q, k, v: attn(dout, q, np.repeat(k, q.shape[1] // k.shape[1],
                                                                   axis=1),
                                                np.repeat(v, q.shape[1] // k.shape[1], axis=1)),
     ["One gradient per kv head"]),
    ("attention_find_the_bug", buggy_attention_backward, ["still what the given code computes",
                                                          "(dv is right.)"]),
    ("attention_find_the_bug", kw(attn, rowsum=False), ["row-sum term is missing"]),
    ("attention_find_the_bug", kw(attn, scale="missing"), ["1/sqrt(hd) scale"]),
]

(test_right_answers_pass, test_mutant_is_rejected_with_its_diagnosis,
 test_the_catalogue_covers_the_chapter) = catalogue_tests(RIGHT, MUTANTS)


def test_the_explicit_jacobian_is_not_rejected_where_the_softmax_saturates():
    # on the large-scores case dq and dk are ~1e-33: without the floor tied to the inputs'
    # magnitudes, the relative test compares rounding noise and rejects a right answer
    spec = ex.SPECS["attention_backward"]
    inputs = spec.inputs()
    large = next(c for c in inputs if c.label.startswith("float64, large scores"))
    exact = RIGHT["attention_backward"][1](*large.args)
    assert float(np.max(np.abs(exact[0]))) < 1e-20
    calls = [(c, ex.run(attn_jacobian, c.args)) for c in inputs]
    assert ex.judge(spec, calls).passed
    unfloored = dataclasses.replace(spec, floor=None)
    verdict = ex.judge(unfloored, calls).message
    assert "large scores" in verdict and "dq is wrong" in verdict


@pytest.mark.parametrize("seed", [None, 1, 2, 3, 4, 5])
def test_the_cache_cases_tell_every_mistake_apart(seed):
    # on every case but S = 1 the reference and each named mistake give different numbers, and
    # the factors a mistake can leave out or confuse (2, 3, B, H, itemsize) are all different
    rng = None if seed is None else np.random.default_rng(seed)
    cases = ex.SPECS["attention_cache_bytes"].make_cases(rng)
    assert len({c.args[4] for c in cases}) == 2  # itemsize 4 and 8 both occur
    for c in cases:
        B, H, S, hd, i = c.args
        values = [cache_bytes(*c.args)] + [v for _, v in _cache_wrong(*c.args)]
        assert S == 1 or len(set(values)) == len(values), c.label
        assert len({2, 3, B, H, i}) == 5, c.label
