"""The exercise checks of the "Memory: attention without the S×S matrix" chapter, mutation-tested.

Each mistake of the catalogue is rejected with its diagnosis; the right answers pass.
"""

from __future__ import annotations

import math

import numpy as np

import xenith_edu.exercises as ex
from xenith_edu.attention import causal_attention_forward
from xenith_edu.exercises.memory import block_stats, merge_reference

from .helpers import catalogue_tests, kw

# Shape legend: R rows, hd head width, B batch, H heads, S positions, L layers.


def merge(m1, sigma1, o1, m2, sigma2, o2, *, rescale=True, inverted=False, sigma_plain=False,
          no_sigma_weight=False, no_divide=False, mean=False, swap=False, use_min=False,
          naive=False):
    with np.errstate(all="ignore"):
        m = np.minimum(m1, m2) if use_min else np.maximum(m1, m2)
        if naive:  # exp of the raw maxima: overflows for large scores
            w1, w2 = sigma1 * np.exp(m1), sigma2 * np.exp(m2)
            sigma = w1 + w2
            o = (w1[:, None] * o1 + w2[:, None] * o2) / sigma[:, None]
            return m, sigma * np.exp(-m), o
        if inverted:
            a1, a2 = np.exp(m - m1), np.exp(m - m2)
        elif rescale:
            a1, a2 = np.exp(m1 - m), np.exp(m2 - m)
        else:
            a1, a2 = np.ones_like(m1), np.ones_like(m2)
        w1, w2 = (a1, a2) if no_sigma_weight else (sigma1 * a1, sigma2 * a2)
        sigma = sigma1 + sigma2 if sigma_plain else sigma1 * a1 + sigma2 * a2
        if swap:
            w1, w2 = w2, w1
        o = w1[:, None] * o1 + w2[:, None] * o2
        if mean:
            o = (o1 + o2) / 2
        elif not no_divide:
            o = o / (w1 + w2)[:, None]
        return m, sigma, o


def merge_logsumexp(m1, sigma1, o1, m2, sigma2, o2):
    """A correct alternative: through the log-sum-exps lse_k = m_k + log sigma_k."""
    with np.errstate(divide="ignore"):
        lse1, lse2 = m1 + np.log(sigma1), m2 + np.log(sigma2)
    lse = np.logaddexp(lse1, lse2)  # (R,)
    m = np.maximum(m1, m2)
    o = np.exp(lse1 - lse)[:, None] * o1 + np.exp(lse2 - lse)[:, None] * o2
    return m, np.exp(lse - m), o


def rowsum(dout, out, *, how="right"):
    if how == "mean":
        return np.mean(dout * out, axis=-1)
    if how == "sums":
        return dout.sum(-1) * out.sum(-1)
    if how == "dd":
        return np.sum(dout * dout, axis=-1)
    if how == "oo":
        return np.sum(out * out, axis=-1)
    if how == "keepdims":
        return np.sum(dout * out, axis=-1, keepdims=True)
    if how == "positions":
        return np.sum(dout * out, axis=-2)
    if how == "float64":
        return np.sum(dout.astype(np.float64) * out, axis=-1)
    return np.einsum("...c,...c->...", dout, out)


def budget(b, L, B, H, hd, i, *, kv=2, layers=True, batch=True, heads=True, item=True,
           width=1, bits=False, ceil=False, strict=False):
    per = kv * (L if layers else 1) * (B if batch else 1) * (H if heads else 1) * hd * width
    per *= (i if item else 1) * (8 if bits else 1)
    if ceil:
        return math.ceil(b / per)
    if strict:  # the largest S with S * per < b
        return (b - 1) // per
    return b // per


RIGHT = {
    "softmax_merge": (merge, merge_logsumexp, merge_reference),
    "softmax_rowsum": (rowsum, lambda dout, out: (dout * out).sum(axis=3)),
    "kv_cache_budget": (budget, lambda b, L, B, H, hd, i: int(b / (2 * L * B * H * hd * i))),
}

MUTANTS = [
    ("softmax_merge", kw(merge, rescale=False), ["not rescaled to the new max"]),
    ("softmax_merge", kw(merge, inverted=True), ["rescaling factor is inverted"]),
    ("softmax_merge", kw(merge, sigma_plain=True),
     ["sigma is not rescaled (sigma = sigma1 + sigma2), though o is", "(m, o are right.)"]),
    ("softmax_merge", kw(merge, no_sigma_weight=True), ["weighted by exp(m_k - m) alone"]),
    ("softmax_merge", kw(merge, no_divide=True), ["not divided by the merged sigma"]),
    ("softmax_merge", kw(merge, mean=True), ["plain mean"]),
    ("softmax_merge", kw(merge, swap=True), ["weights of the two blocks are swapped"]),
    ("softmax_merge", kw(merge, use_min=True), ["smaller of the two maxima"]),
    ("softmax_merge", kw(merge, naive=True), ["large scores", "Overflow in exp"]),
    ("softmax_rowsum", kw(rowsum, how="mean"), ["mean over the hd features"]),
    ("softmax_rowsum", kw(rowsum, how="sums"), ["multiplies the row sums"]),
    ("softmax_rowsum", kw(rowsum, how="dd"), ["rowsum(dout * dout)"]),
    ("softmax_rowsum", kw(rowsum, how="oo"), ["rowsum(out * out)"]),
    ("softmax_rowsum", kw(rowsum, how="keepdims"), ["shape", "without keepdims"]),
    ("softmax_rowsum", kw(rowsum, how="positions"), ["shape", "one number per row"]),
    ("softmax_rowsum", kw(rowsum, how="float64"), ["float32"]),
    ("kv_cache_budget", kw(budget, kv=1), ["keys AND values"]),
    ("kv_cache_budget", kw(budget, layers=False), ["layers are missing"]),
    ("kv_cache_budget", kw(budget, batch=False), ["batch is missing"]),
    ("kv_cache_budget", kw(budget, heads=False), ["heads are missing"]),
    ("kv_cache_budget", kw(budget, item=False), ["bytes per number are missing"]),
    ("kv_cache_budget", lambda b, L, B, H, hd, i: budget(b, L, B, H, hd, i, width=H),
     ["width is counted twice"]),
    ("kv_cache_budget", kw(budget, bits=True), ["bits, not bytes"]),
    ("kv_cache_budget", kw(budget, ceil=True), ["rounds up"]),
    ("kv_cache_budget", kw(budget, strict=True), ["stops one short"]),
    ("kv_cache_budget", lambda b, L, B, H, hd, i: b / (2 * L * B * H * hd * i), ["int"]),
]

(test_right_answers_pass, test_mutant_is_rejected_with_its_diagnosis,
 test_the_catalogue_covers_the_chapter) = catalogue_tests(RIGHT, MUTANTS)


def test_merging_block_stats_gives_the_whole_rows_softmax() -> None:
    rng = np.random.default_rng(0)
    z, V = 30 * rng.standard_normal((4, 9)), rng.standard_normal((9, 3))
    m, sigma, o = merge_reference(*block_stats(z[:, :4], V[:4]), *block_stats(z[:, 4:], V[4:]))
    m_all, sigma_all, o_all = block_stats(z, V)
    np.testing.assert_allclose(m, m_all, rtol=0, atol=0)
    np.testing.assert_allclose(sigma, sigma_all, rtol=1e-13)
    np.testing.assert_allclose(o, o_all, rtol=1e-12, atol=1e-13)


def test_D_is_the_row_sum_of_the_softmax_vjp() -> None:
    rng = np.random.default_rng(1)
    q, k, v, dout = (rng.standard_normal((2, 2, 6, 4)) for _ in range(4))
    out, cache = causal_attention_forward(q, k, v)
    dP = dout @ np.swapaxes(v, -1, -2)  # (B, H, S, S)
    D = ex.SPECS["softmax_rowsum"].reference(dout, out)[0]
    np.testing.assert_allclose(D, np.sum(cache.att * dP, axis=-1), rtol=1e-12, atol=1e-13)


def test_every_case_of_the_budget_is_distinct() -> None:
    # a budget below one position gives 0; an exact multiple fits its last position
    cases = ex.SPECS["kv_cache_budget"].make_cases()
    answers = [ex.SPECS["kv_cache_budget"].reference(*c.args)[0] for c in cases]
    assert answers[-1] == 0 and all(a > 0 for a in answers[:-1])
    b, *sizes = cases[2].args
    assert b % (2 * math.prod(sizes)) == 0
