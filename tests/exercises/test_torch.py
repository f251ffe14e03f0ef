"""The exercise checks of the "Your backward inside PyTorch" chapter, mutation-tested.

Each mistake of the catalogue is rejected with its diagnosis; several right answers, written
in different ways, pass; the attention bias's reference matches finite differences. The checks
themselves are NumPy only: nothing here imports torch.
"""

from __future__ import annotations

import math

import numpy as np

from xenith_edu.exercises.engine import close
from xenith_edu.exercises.torch import (
    BIAS,
    attention_bias_backward,
    attention_bias_forward,
    half_rows,
    wq_from_rotate_half,
)
from xenith_edu.tools.gradcheck import check_gradient

from .helpers import catalogue_tests, kw

# Shape legend: d width, H heads (n_head), hd = d // H head width. A checkpoint's `weight` is
# nn.Linear's (out, in) = (d, d) with rotate-half output order; ours is (in, out), interleaved.
# The attention bias: B batch, S positions; q, k, v, dout (B, H, S, hd), bias (H, S, S).


# ---------------------------------------------------------------- the learned attention bias
def biased(dout, q, k, v, bias, *, batch="sum", masked=True, leak=False, dbias_from="dZ",
           scale_qk=True, scale_dbias=False, bias_in="added", transpose_dbias=False,
           rowsum=True, rowsum_sign=-1.0, swap_qk=False, dv_no_t=False, shift=True,
           np_sqrt=False, in_place=False):
    """From scratch, with one switch per mistake of the catalogue."""
    S, hd = q.shape[-2:]
    root = np.sqrt(hd) if np_sqrt else hd**0.5  # np.sqrt: a float64 scalar, promotes float32
    T = lambda a: np.swapaxes(a, -1, -2)  # noqa: E731
    b = {"added": bias, "none": 0 * bias, "scaled": bias / root}[bias_in]
    with np.errstate(all="ignore"):
        Z = q @ T(k) / root + b  # (B, H, S, S)
        if masked:
            Z = np.where(np.triu(np.ones((S, S), dtype=bool), k=1), -np.inf, Z)
        P = np.exp(Z - Z.max(axis=-1, keepdims=True) if shift else Z)
        P = P / P.sum(axis=-1, keepdims=True)  # (B, H, S, S)
    dP = dout @ T(v)  # (B, H, S, S)
    dZ = P * (dP + rowsum_sign * np.sum(P * dP, axis=-1, keepdims=True)) if rowsum else P * dP
    g = {"dZ": dZ, "dP": dP}[dbias_from]
    if transpose_dbias:
        g = T(g)
    dbias = {"sum": lambda: g.sum(axis=0), "first": lambda: g[0], "last": lambda: g[-1],
             "mean": lambda: g.mean(axis=0), "none": lambda: g,
             "heads": lambda: g.sum(axis=(0, 1))}[batch]()
    if bias_in == "scaled" or scale_dbias:
        dbias = dbias / root
    if leak:
        dbias = dbias + 0.25 * np.triu(np.ones((S, S), dtype=q.dtype), k=1)
    sc = 1 / root if scale_qk else 1.0
    dq, dk = dZ @ k * sc, T(dZ) @ q * sc
    dv = (P if dv_no_t else T(P)) @ dout
    if in_place:
        dout *= 1.0
        dout += 1.0
    return (dk, dq, dv, dbias) if swap_qk else (dq, dk, dv, dbias)


def bias_by_heads(dout, q, k, v, bias):
    """Head by head with the softmax Jacobian diag(p) - p p^T formed row by row; dbias
    accumulated one sequence at a time."""
    B, H, S, hd = q.shape
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    dbias = np.zeros_like(bias)
    for b in range(B):
        for h in range(H):
            Z = q[b, h] @ k[b, h].T / math.sqrt(hd) + bias[h]  # (S, S)
            Z[np.triu_indices(S, 1)] = -np.inf
            P = np.exp(Z - Z.max(axis=1, keepdims=True))
            P /= P.sum(axis=1, keepdims=True)
            dP = dout[b, h] @ v[b, h].T  # (S, S)
            dZ = np.stack([dP[i] @ (np.diag(P[i]) - np.outer(P[i], P[i])) for i in range(S)])
            dq[b, h] = dZ @ k[b, h] / math.sqrt(hd)
            dk[b, h] = dZ.T @ q[b, h] / math.sqrt(hd)
            dv[b, h] = P.T @ dout[b, h]
            dbias[h] += dZ
    return dq, dk, dv, dbias


def bias_by_package(dout, q, k, v, bias):
    return attention_bias_backward(dout, attention_bias_forward(q, k, v, bias)[1])


def test_the_bias_reference_matches_finite_differences() -> None:
    """The reference against central differences in float64, each input, from a forward written
    here (not the module's), on B = 2 sequences with masked entries."""
    rng = np.random.default_rng(11)
    B, H, S, hd = 2, 2, 4, 6
    q, k, v, G = (rng.standard_normal((B, H, S, hd)) for _ in range(4))  # G plays dout
    bias = rng.standard_normal((H, S, S))

    def loss(q, k, v, bias):  # sum(out * G), out = softmax(q k^T / sqrt(hd) + bias + mask) v
        Z = q @ np.swapaxes(k, -1, -2) / math.sqrt(hd) + bias
        Z = np.where(np.tril(np.ones((S, S), dtype=bool)), Z, -np.inf)
        P = np.exp(Z - Z.max(axis=-1, keepdims=True))
        return float(np.sum((P / P.sum(axis=-1, keepdims=True)) @ v * G))

    grads = bias_by_package(G, q, k, v, bias)
    args = {"q": q, "k": k, "v": v, "bias": bias}
    for (name, x), grad in zip(args.items(), grads, strict=True):
        f = lambda a, name=name: loss(**{**args, name: a})  # noqa: E731
        res = check_gradient(f, x.copy(), grad, name=f"d{name}")
        assert res.passed, str(res)
    # masked entries get exactly 0; query 0 sees key 0 only, so its row is 0 too; every row
    # sums to 0 (a constant added to a row of scores does not change the softmax)
    future, seen = np.triu(np.ones((S, S), dtype=bool), k=1), np.tri(S, dtype=bool)
    seen[0] = False
    dbias = grads[3]  # (H, S, S)
    assert np.all(dbias[:, future] == 0) and np.all(dbias[:, 0] == 0)
    assert np.all(dbias[:, seen] != 0) and np.allclose(dbias.sum(axis=-1), 0, atol=1e-12)


def _differ(a: dict, b: dict) -> bool:
    return any(not close(a[n], b[n], 1e-8) for n in a)


def test_the_bias_cases_tell_the_mistakes_apart() -> None:
    """On the first case of every draw (B >= 2, H >= 2, S >= 4, masked entries), every known
    mistake gives an answer of its own, and none is the right one."""
    for seed in [None, 0, 1, 2, 3, 4]:
        cases = BIAS.make_cases(None if seed is None else np.random.default_rng(seed))
        assert {c.args[1].dtype for c in cases} == {np.dtype(np.float64), np.dtype(np.float32)}
        args = cases[0].args
        B, H, S, _ = args[1].shape
        assert args[1].dtype == np.float64 and B >= 2 and H >= 2 and S >= 4
        exp = dict(zip(BIAS.out_names, BIAS.reference(*args), strict=True))
        answers = [{**exp, **make()} for _, make in BIAS.mistakes(args, exp)]
        assert all(_differ(a, exp) for a in answers)
        assert all(_differ(a, b) for i, a in enumerate(answers) for b in answers[i + 1:])


def convert(weight, n_head, *, transpose=True, order="inverse", axis="out", heads=None,
            cast=None):
    """From scratch, with one switch per mistake of the catalogue."""
    d = weight.shape[0]
    H = n_head if heads is None else heads
    hd = d // H
    i = np.arange(hd // 2)
    ours = {  # our coordinate -> the rotate-half coordinate it is read from, within a head
        "inverse": np.stack([i, i + hd // 2], axis=1).reshape(-1),  # 2i -> i, 2i+1 -> i + hd/2
        "tau": np.concatenate([2 * i, 2 * i + 1]),  # the chapter's tau, the wrong way
        "none": np.arange(hd),
        "swapped": np.stack([i + hd // 2, i], axis=1).reshape(-1),
    }[order]
    rows = (np.arange(H)[:, None] * hd + ours[None, :]).reshape(-1)  # (d,)
    moved = weight[rows, :] if axis == "out" else weight[:, rows]
    out = moved.T if transpose else moved
    return out.astype(cast) if cast is not None else out


def by_reshape(weight, n_head):
    """The inverse of the Hugging Face conversion script's permute, then the transpose."""
    d = weight.shape[0]
    hd = d // n_head
    return weight.reshape(n_head, 2, hd // 2, d).transpose(0, 2, 1, 3).reshape(d, d).T


def by_loops(weight, n_head):
    d = weight.shape[0]
    hd = d // n_head
    out = np.empty_like(weight)
    for c in range(n_head):
        for i in range(hd // 2):
            for r in range(2):
                out[:, c * hd + 2 * i + r] = weight[c * hd + r * hd // 2 + i, :]
    return out


def by_argsort(weight, n_head):
    d = weight.shape[0]
    hd = d // n_head
    tau = np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])
    tau_d = (np.arange(n_head)[:, None] * hd + tau).reshape(-1)  # half j <- ours tau_d[j]
    return weight.T[:, np.argsort(tau_d)]


def by_matrix_product(weight, n_head):
    """A permutation matrix: a product with ones and zeros moves entries exactly."""
    d = weight.shape[0]
    hd = d // n_head
    c, m = np.divmod(np.arange(d), hd)  # head and coordinate of each of our columns
    rows = c * hd + (m % 2) * (hd // 2) + m // 2  # (d,) the checkpoint's row for each
    P = np.eye(d, dtype=weight.dtype)[rows]  # (d, d) row j of P @ weight is weight[rows[j]]
    return (P @ weight).T


def two_columns_swapped(weight, n_head):
    out = by_reshape(weight, n_head).copy()
    out[:, [0, 1]] = out[:, [1, 0]]
    return out


def shuffled_within_columns(weight, n_head):
    out = by_reshape(weight, n_head).copy()
    return out[::-1, :]  # every column's entries in reverse: not whole rows of the checkpoint


def in_place(weight, n_head):
    weight[:] = by_reshape(weight, n_head).T
    return weight.T


RIGHT = {
    "attention_bias_backward": (biased, bias_by_heads, bias_by_package),
    "wq_from_rotate_half": (convert, by_reshape, by_loops, by_argsort, by_matrix_product,
                            wq_from_rotate_half),
}

ORDER = "the permutation goes the wrong way"
LAYOUT = "in nn.Linear's (out, in) layout"

SHARED = "shared by the B sequences"

# (exercise, mutant, words the verdict must contain[, words it must not contain])
MUTANTS = [
    ("attention_bias_backward", kw(biased, batch="first"), ["first sequence's dZ only", SHARED,
                                                            "broadcast row"]),
    ("attention_bias_backward", kw(biased, batch="last"), ["last sequence's dZ only", SHARED]),
    ("attention_bias_backward", kw(biased, batch="mean"), ["averaged over the batch", SHARED]),
    ("attention_bias_backward", kw(biased, batch="none"),
     ["dbias has shape", "summed over the batch axis"]),
    ("attention_bias_backward", kw(biased, batch="heads"), ["dbias has shape", "(H, S, S)"]),
    ("attention_bias_backward", kw(biased, masked=False), ["ignores the causal mask"]),
    ("attention_bias_backward", kw(biased, leak=True),
     ["right on and below the diagonal but not zero above it"], ["transposed"]),
    ("attention_bias_backward", kw(biased, dbias_from="dP"), ["summed from dP"]),
    ("attention_bias_backward", kw(biased, scale_qk=False), ["missing from dq and dk"],
     ["dbias is divided"]),
    ("attention_bias_backward", kw(biased, scale_dbias=True), ["dbias is divided by sqrt(hd)"],
     ["missing from dq and dk"]),
    ("attention_bias_backward", kw(biased, bias_in="scaled"),
     ["with q k^T: the scale multiplies q k^T only"]),
    ("attention_bias_backward", kw(biased, bias_in="none"), ["leave out the bias"]),
    ("attention_bias_backward", kw(biased, transpose_dbias=True), ["dbias is transposed"],
     ["not zero above it"]),
    ("attention_bias_backward", kw(biased, rowsum=False), ["row-sum term is missing"]),
    ("attention_bias_backward", kw(biased, swap_qk=True), ["dq and dk are swapped"]),
    ("attention_bias_backward", kw(biased, dv_no_t=True), ["dv needs the transposed weights"]),
    # two slips at once: no entry of the table, the fit in the reference's terms names both
    ("attention_bias_backward", kw(biased, batch="first", scale_dbias=True),
     ["in dbias, every term: only the first sequence's", "off by a factor of sqrt(hd)"]),
    ("attention_bias_backward", kw(biased, rowsum_sign=1.0),
     ["-(P * rowsum(P * dP)) @ k / sqrt(hd) has its sign flipped"]),
    ("attention_bias_backward", kw(biased, shift=False), ["Overflow in exp"]),
    ("attention_bias_backward", kw(biased, np_sqrt=True),
     ["dq has dtype float64, expected float32"]),
    ("attention_bias_backward", kw(biased, in_place=True), ["changed its input `dout` in place"]),
    ("wq_from_rotate_half", kw(convert, transpose=False), [LAYOUT], [ORDER]),
    ("wq_from_rotate_half", kw(convert, order="none"), ["still in rotate-half order"], [LAYOUT]),
    ("wq_from_rotate_half", kw(convert, order="tau"), [ORDER, "its inverse"], [LAYOUT]),
    ("wq_from_rotate_half", kw(convert, heads=1), ["treats the d columns as one head"]),
    ("wq_from_rotate_half", kw(convert, order="swapped"),
     ["two members of each pair are exchanged"]),
    ("wq_from_rotate_half", kw(convert, axis="in"), ["applied to the input axis"], [ORDER]),
    ("wq_from_rotate_half", kw(convert, order="tau", axis="in"),
     [ORDER, "applied to the input axis"]),
    ("wq_from_rotate_half", kw(convert, transpose=False, order="tau"), [LAYOUT, ORDER]),
    ("wq_from_rotate_half", kw(convert, transpose=False, order="none"),
     [LAYOUT, "still in rotate-half order"]),
    ("wq_from_rotate_half", lambda w, H: w.copy(), [LAYOUT, "still in rotate-half order"]),
    ("wq_from_rotate_half", kw(convert, heads=2), ["the one for n_head = 2"]),
    ("wq_from_rotate_half", kw(convert, heads=4), ["the one for n_head = 4"]),
    ("wq_from_rotate_half", two_columns_swapped, ["re:your column \\d+ \\(head 0, coordinate "
                                                  "\\d\\) is the checkpoint's row \\d+; it "
                                                  "should be row \\d+"]),
    ("wq_from_rotate_half", shuffled_within_columns, ["not one whole row of the checkpoint"]),
    ("wq_from_rotate_half", lambda w, H: 2.0 * by_reshape(w, H), ["only moves entries"]),
    ("wq_from_rotate_half", lambda w, H: -by_reshape(w, H), ["sign flipped"]),
    ("wq_from_rotate_half", lambda w, H: -w[half_rows(w.shape[0], H)].T,
     ["sign flipped"], [ORDER]),
    ("wq_from_rotate_half", kw(convert, cast=np.float64),
     ["wq has dtype float64, expected float32", "do not cast"]),
    ("wq_from_rotate_half", in_place, ["changed its input `weight` in place"]),
    ("wq_from_rotate_half", lambda w, H: by_reshape(w, H).reshape(H, -1, w.shape[0]),
     ["wq has shape", "(d, d)"]),
]

(test_right_answers_pass, test_mutant_is_rejected_with_its_diagnosis,
 test_the_catalogue_covers_the_chapter) = catalogue_tests(RIGHT, MUTANTS)


def test_the_cases_tell_the_mistakes_apart() -> None:
    """The first case of every draw has several heads and hd >= 6, where tau and its inverse
    differ; the cases vary n_head, hd and the dtype."""
    from xenith_edu.exercises import SPECS

    spec = SPECS["wq_from_rotate_half"]
    for seed in [None, 0, 1, 2, 3, 4]:
        cases = spec.make_cases(None if seed is None else np.random.default_rng(seed))
        weight, H = cases[0].args
        assert H >= 2 and weight.shape[0] // H >= 6
        assert {c.args[0].dtype for c in cases} == {np.dtype(np.float64), np.dtype(np.float32)}
        assert len({c.args[1] for c in cases}) >= 3
        assert len({c.args[0].shape[0] // c.args[1] for c in cases}) >= 3



def test_every_diagnosis_holds_on_many_draws() -> None:
    """The grader draws its cases at random: each mutant keeps its diagnosis on 20 draws."""
    from .helpers import assert_rejected

    for seed in range(20):
        for name, fn, words, *absent in MUTANTS:
            assert_rejected(name, fn, words, absent[0] if absent else [],
                            np.random.default_rng(100 + seed))
