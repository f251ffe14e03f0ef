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
    ALIBI,
    BIAS,
    alibi_slopes_grad,
    attention_bias_backward,
    attention_bias_forward,
)
from xenith_edu.tools.gradcheck import check_gradient

from .helpers import catalogue_tests, kw

# Shape legend: B batch, H heads, S positions, hd head width; q, k, v, dout (B, H, S, hd),
# bias (H, S, S), slopes (H,); D (S, S) the distances i - j of ALiBi.


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


def alibi(dout, q, k, v, slopes, *, sign=-1.0, batch="sum", from_dP=False, rowsum=True,
          scale=False, bias_in=True, heads="own", dist="i-j", cast=None):
    """From scratch, with one switch per mistake of the catalogue."""
    B, H, S, hd = q.shape
    t = np.arange(S)
    D = {"i-j": np.tril(t[:, None] - t[None, :]),
         "i-j+1": np.tril(t[:, None] - t[None, :] + 1)}[dist].astype(np.float64)  # (S, S)
    m = slopes.astype(np.float64)
    bias = -m[:, None, None] * D if bias_in else 0.0 * D
    Z = q.astype(np.float64) @ np.swapaxes(k, -1, -2) / math.sqrt(hd) + bias
    Z = np.where(np.tri(S, dtype=bool), Z, -np.inf)
    P = np.exp(Z - Z.max(axis=-1, keepdims=True))
    P /= P.sum(axis=-1, keepdims=True)  # (B, H, S, S)
    dP = dout.astype(np.float64) @ np.swapaxes(v, -1, -2)
    dZ = dP if from_dP else (P * (dP - np.sum(P * dP, axis=-1, keepdims=True)) if rowsum
                             else P * dP)
    g = {"sum": dZ.sum(axis=0), "first": dZ[0], "mean": dZ.mean(axis=0)}[batch]
    out = sign * np.sum(g * D, axis=(1, 2))  # (H,)
    if scale:
        out = out / math.sqrt(hd)
    if heads == "all":
        out = np.full(H, out.sum())
    return out.astype(cast or q.dtype)


def alibi_by_loops(dout, q, k, v, slopes):
    """Sequence by sequence, head by head, query by query: the softmax's Jacobian row by row,
    and the slope's gradient as the derivative of the scores, -(i - j), summed."""
    B, H, S, hd = q.shape
    out = np.zeros(H)
    for b in range(B):
        for h in range(H):
            for i in range(S):
                z = np.array([q[b, h, i] @ k[b, h, j] / math.sqrt(hd) - slopes[h] * (i - j)
                              for j in range(i + 1)], dtype=np.float64)
                p = np.exp(z - z.max())
                p /= p.sum()
                dp = np.array([dout[b, h, i] @ v[b, h, j] for j in range(i + 1)])
                dz = (np.diag(p) - np.outer(p, p)) @ dp
                out[h] += sum(dz[j] * -(i - j) for j in range(i + 1))
    return out.astype(q.dtype)


def alibi_by_bias(dout, q, k, v, slopes):
    """The learned bias's backward (the package), then the chain rule through bias = -m D."""
    S = q.shape[-2]
    D = np.tril(np.subtract.outer(np.arange(S), np.arange(S))).astype(q.dtype)
    dbias = bias_by_package(dout, q, k, v, -slopes[:, None, None] * D)[3]
    return -np.einsum("hij,ij->h", dbias, D)


RIGHT = {
    "attention_bias_backward": (biased, bias_by_heads, bias_by_package),
    "alibi_slopes_grad": (alibi, alibi_by_loops, alibi_by_bias, alibi_slopes_grad,
                          # i - j + 1: each row of dZ sums to 0, so a constant per row is lost
                          kw(alibi, dist="i-j+1")),
}

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
    ("alibi_slopes_grad", kw(alibi, sign=1.0), ["sign flipped"]),
    ("alibi_slopes_grad", kw(alibi, batch="first"), ["only the first sequence's"]),
    ("alibi_slopes_grad", kw(alibi, batch="mean"), ["averaged, not summed"]),
    ("alibi_slopes_grad", kw(alibi, from_dP=True), ["dP", "gradient of the scores"]),
    ("alibi_slopes_grad", kw(alibi, rowsum=False), ["row-sum term is missing"]),
    ("alibi_slopes_grad", kw(alibi, scale=True), ["1/sqrt(hd) is applied"]),
    ("alibi_slopes_grad", kw(alibi, bias_in=False), ["recomputed without the bias"]),
    ("alibi_slopes_grad", kw(alibi, heads="all"), ["summed together"]),
    ("alibi_slopes_grad", lambda dout, q, k, v, m: -alibi(dout, q, k, v, -m),
     ["enters the scores as +m_h (i - j)"], ["sign flipped"]),
    ("alibi_slopes_grad", kw(alibi, cast=np.float64), ["dtype float64, expected float32"]),
    ("alibi_slopes_grad", lambda dout, q, k, v, m: alibi(dout, q, k, v, m)[None].repeat(2, 0),
     ["dslopes has shape", "(H,)"]),
]

(test_right_answers_pass, test_mutant_is_rejected_with_its_diagnosis,
 test_the_catalogue_covers_the_chapter) = catalogue_tests(RIGHT, MUTANTS)


def test_the_alibi_reference_matches_finite_differences() -> None:
    """dslopes against central differences of sum(out * G) in float64, the forward written here
    with the bias -m_h (i - j), on B = 2 sequences."""
    rng = np.random.default_rng(12)
    B, H, S, hd = 2, 3, 5, 6
    q, k, v, G = (rng.standard_normal((B, H, S, hd)) for _ in range(4))
    slopes = np.array([0.5, 0.25, 0.125]) * np.exp(0.3 * rng.standard_normal(H))
    t = np.arange(S)

    def loss(m):
        Z = q @ np.swapaxes(k, -1, -2) / math.sqrt(hd) - m[:, None, None] * (t[:, None] - t)
        Z = np.where(np.tri(S, dtype=bool), Z, -np.inf)
        P = np.exp(Z - Z.max(axis=-1, keepdims=True))
        return float(np.sum((P / P.sum(axis=-1, keepdims=True)) @ v * G))

    res = check_gradient(loss, slopes.copy(), alibi_slopes_grad(G, q, k, v, slopes),
                         name="dslopes")
    assert res.passed, str(res)


def test_the_alibi_cases_tell_the_mistakes_apart() -> None:
    """On the first case of every draw (B >= 2, H >= 2), every known mistake gives an answer
    of its own, none the right one."""
    for seed in [None, 0, 1, 2, 3, 4]:
        cases = ALIBI.make_cases(None if seed is None else np.random.default_rng(seed))
        args = cases[0].args
        B, H = args[1].shape[:2]
        assert B >= 2 and H >= 2
        exp = dict(zip(ALIBI.out_names, ALIBI.reference(*args), strict=True))
        answers = [{**exp, **make()} for _, make in ALIBI.mistakes(args, exp)]
        assert all(_differ(a, exp) for a in answers)
        assert all(_differ(a, b) for i, a in enumerate(answers) for b in answers[i + 1:])
