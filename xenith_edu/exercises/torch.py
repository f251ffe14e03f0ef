"""Exercises of the "Your backward inside PyTorch" chapter: a learned attention bias's backward,
and the gradient of ALiBi's slopes, a bias made from one learned number per head.

NumPy only (this module never imports torch); each check names the usual mistakes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..attention import AttentionCache, causal_attention_backward, causal_mask
from .attention import softmax_terms
from .engine import check
from .fit import Term
from .kit import OVERFLOW, amax, fmt, int_sampler, magnitudes, randn
from .types import Case, CheckResult, Mistake, Spec

# Shape legend: B batch, H heads, S positions, hd head width; q, k, v, dout (B, H, S, hd),
# bias (H, S, S), slopes (H,).


# ----------------------------------------------------------------------------------------------
# A learned attention bias: Z = q k^T / sqrt(hd) + bias + causal mask, the bias shared by the
# batch, as scaled_dot_product_attention's float attn_mask (ALiBi, T5's relative positions).
# Shape legend: B batch, H heads, S positions, hd head width; q, k, v, dout (B, H, S, hd),
# bias (H, S, S).


def attention_bias_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                           bias: np.ndarray) -> tuple[np.ndarray, AttentionCache]:
    """softmax(q k^T / sqrt(hd) + bias + causal mask) @ v; `(out (B, H, S, hd), cache)`.

    The cache is causal attention's, (q, k, v, P), with the biased weights P: what the backward
    reads is the same. See the "Your backward inside PyTorch" chapter.
    """
    S, hd = q.shape[-2:]
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(hd) + bias  # (B, H, S, S)
    scores = scores + causal_mask(S, q.dtype)  # a key after the query gets -inf
    scores = scores - scores.max(axis=-1, keepdims=True)  # the diagonal is never masked
    P = np.exp(scores)  # masked entries become exactly 0
    P = P / P.sum(axis=-1, keepdims=True)  # (B, H, S, S) rows sum to 1
    return P @ v, AttentionCache(q, k, v, P)


def attention_bias_backward(dout: np.ndarray, cache: AttentionCache) -> tuple:
    """`(dq, dk, dv, dbias)`: causal attention's backward on the biased weights, and the bias rule.

    The bias is added to the scores, so it receives their gradient dZ unchanged; shared by the B
    sequences, it gets the sum over the batch (the broadcast row). dZ is zero where P is.
    """
    dq, dk, dv = causal_attention_backward(dout, cache)  # (B, H, S, hd) each
    P = cache.att  # (B, H, S, S)
    dP = dout @ np.swapaxes(cache.v, -1, -2)  # (B, H, S, S)
    dZ = P * (dP - np.sum(P * dP, axis=-1, keepdims=True))  # (B, H, S, S)
    return dq, dk, dv, dZ.sum(axis=0)  # dbias (H, S, S)


def _bias_reference(dout, q, k, v, bias) -> tuple:
    return attention_bias_backward(dout, attention_bias_forward(q, k, v, bias)[1])


def _bias_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)

    def hd() -> int:  # sqrt(hd) is never 2 or 3, so the scale is never a batch size
        return int(rng.choice([2, 6, 8]))

    # (what, B, H, S, hd, dtype, shift of the bias). The first two cases have B >= 2 (a missing
    # batch sum shows), H >= 2 and S >= 4 (the bias is (H, S, S), masked entries present). The
    # last one's scores are near 750, where exp overflows: a shift of every score leaves the
    # softmax, and so every gradient, as it is, and the weights do not saturate.
    plans = [("", ints(2, 3), ints(2, 3), ints(4, 6), hd(), np.float64, 0.0),
             ("", ints(2, 3), 2, ints(5, 7), hd(), np.float32, 0.0),
             ("one sequence, ", 1, 2, ints(3, 5), hd(), np.float64, 0.0),
             ("S=1 (one position), ", 2, 2, 1, hd(), np.float64, 0.0),
             ("a bias near 750, ", 2, 2, ints(4, 6), 6, np.float64, 750.0),
             ("longer, ", 2, 1, ints(9, 11), 2, np.float64, 0.0)]
    cases = []
    for what, B, H, S, w, dtype, shift in plans:
        q, k, v, dout = (randn(rng, (B, H, S, w), dtype) for _ in range(4))  # (B, H, S, hd)
        bias = (shift + rng.standard_normal((H, S, S))).astype(dtype)  # (H, S, S), all entries
        sizes = ", ".join(f"{n}={x}" for n, x in zip("BHS", (B, H, S), strict=True)
                          if f"{n}=" not in what and not (n == "B" and what.startswith("one")))
        cases.append(Case(f"{np.dtype(dtype).name}, {what}{sizes}, hd={w}",
                          (dout, q, k, v, bias), OVERFLOW if shift else ""))
    return cases + magnitudes(rng, cases[0], 0, "dout")


def biased64(dout, q, k, v, bias, *, bias_in=1.0, bias_grad=1.0, masked=True,
             rowsum=True) -> dict:
    """Everything of the biased attention in float64, with a switch per slip: P, dP, dZ
    (B, H, S, S), dq, dk, dv (B, H, S, hd), dbias (H, S, S). `bias_in` multiplies the bias in Z,
    `bias_grad` its gradient."""
    S, hd = q.shape[-2:]
    T = np.swapaxes
    Z = q @ T(k, -1, -2) / math.sqrt(hd) + bias_in * bias  # (B, H, S, S)
    if masked:
        Z = Z + causal_mask(S, np.float64)
    P = np.exp(Z - Z.max(axis=-1, keepdims=True))
    P = P / P.sum(axis=-1, keepdims=True)  # (B, H, S, S)
    dP = dout @ T(v, -1, -2)  # (B, H, S, S)
    dZ = P * (dP - np.sum(P * dP, axis=-1, keepdims=True)) if rowsum else P * dP
    sc = 1.0 / math.sqrt(hd)
    return {"P": P, "dP": dP, "dZ": dZ, "dq": dZ @ k * sc, "dk": T(dZ, -1, -2) @ q * sc,
            "dv": T(P, -1, -2) @ dout, "dbias": bias_grad * dZ.sum(axis=0)}


SHARED = ("the bias is shared by the B sequences, so its gradient is the sum of their dZ over "
          "the batch (the broadcast row)")
BIAS_LEAK = ("dbias is right on and below the diagonal but not zero above it: there Z = -inf "
             "whatever the bias holds, so P = 0 and dZ = P * (...) = 0; a masked entry of the "
             "bias gets no gradient.")
OUTS = ("dq", "dk", "dv", "dbias")


def _bias_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    dout, q, k, v, bias = args
    hd, B = q.shape[-1], q.shape[0]
    r = math.sqrt(hd)
    f = biased64(*args)
    dZ, T = f["dZ"], np.swapaxes

    def full(**kw) -> Callable[[], dict]:
        return lambda: {n: a for n, a in biased64(*args, **kw).items() if n in OUTS}

    return [
        (f"dbias keeps the first sequence's dZ only: {SHARED}.", lambda: {"dbias": dZ[0]}),
        (f"dbias keeps the last sequence's dZ only (overwritten, not accumulated): {SHARED}.",
         lambda: {"dbias": dZ[-1]}),
        (f"dbias is averaged over the batch (divided by B = {B}): {SHARED}, not their mean.",
         lambda: {"dbias": dZ.mean(axis=0)}),
        ("dbias is summed from dP, the gradient of the weights: the bias is added to the "
         "scores before the softmax, so it receives dZ = P * (dP - rowsum(P * dP)).",
         lambda: {"dbias": f["dP"].sum(axis=0)}),
        ("the softmax ignores the causal mask: the weights must be zero above the diagonal, "
         "and so must dZ, dbias and what keys and values receive from earlier queries.",
         full(masked=False)),
        ("the weights P leave out the bias: Z = q k^T / sqrt(hd) + bias + mask, so P, and with "
         "it every gradient, depends on the bias.", full(bias_in=0.0)),
        (f"the bias is divided by sqrt(hd) = {fmt(r)} with q k^T: the scale multiplies q k^T "
         "only, the bias is added after it (as attn_mask is).",
         full(bias_in=1 / r, bias_grad=1 / r)),
        (f"the 1/sqrt(hd) scale of q k^T is missing from dq and dk (hd = {hd}).",
         lambda: {"dq": exp["dq"] * r, "dk": exp["dk"] * r}),
        (f"dbias is divided by sqrt(hd) = {fmt(r)}: the scale belongs to q k^T, the bias is "
         "added after it, so dbias = sum over the batch of dZ, unscaled.",
         lambda: {"dbias": exp["dbias"] / r}),
        ("dbias is transposed: bias[h, i, j] is added to query i's score of key j, so "
         "dbias[h, i, j] sums dZ[b, h, i, j], zero above the diagonal like P.",
         lambda: {"dbias": T(dZ, -1, -2).sum(axis=0)}),
        ("the softmax Jacobian's row-sum term is missing: dZ = P * (dP - sum(P * dP, axis=-1, "
         "keepdims=True)).", lambda: {n: a for n, a in full(rowsum=False)().items()
                                      if n != "dv"}),
        ("dq and dk are swapped: dq = dZ @ k / sqrt(hd) and dk = dZ^T @ q / sqrt(hd).",
         lambda: {"dq": exp["dk"], "dk": exp["dq"]}),
        ("dv needs the transposed weights: dv = P^T @ dout, not P @ dout.",
         lambda: {"dv": f["P"] @ dout}),
    ]


def _bias_diagnose(args: tuple, exp: dict, got: dict, wrong: set, tol: float) -> list[str]:
    """A dbias right where the mask lets the scores through and not zero where it does not,
    when no known mistake explains it."""
    g, e = np.asarray(got["dbias"], dtype=np.float64), exp["dbias"]
    S = e.shape[-1]
    if "dbias" not in wrong or g.shape != e.shape or S < 2:
        return []
    future = np.triu(np.ones((S, S), dtype=bool), k=1)  # (S, S) the masked entries
    size = float(np.max(np.abs(e)))
    seen_right = float(np.max(np.abs(g[..., ~future] - e[..., ~future]))) <= 10 * tol * size
    leaks = float(np.max(np.abs(g[..., future]))) > 10 * tol * size
    return [BIAS_LEAK] if seen_right and leaks else []


def _bias_terms(args: tuple) -> dict[str, list[Term]]:
    """dq, dk, dv as attention's (the softmax's two terms), and dbias: both terms summed over
    the batch."""
    dout, q, k, v, bias = args
    f = biased64(*args)
    P, dP, T = f["P"], f["dP"], np.swapaxes
    A = P * dP  # (B, H, S, S)
    rows = P * np.sum(A, axis=-1, keepdims=True)  # (B, H, S, S)
    cols = P * np.sum(A, axis=-2, keepdims=True)  # the sum over the queries instead
    axis = "its row sum runs over the queries (axis=-2), not over each row's keys (axis=-1)"
    flip, one = "the score gradient is transposed", "only the first sequence's, not the batch sum"
    return {**softmax_terms(P, dP, q, k, dout),
            "dbias": [Term("sum over the batch of P * dP", A.sum(axis=0),
                           slips=((one, A[0]), (flip, T(A, -1, -2).sum(axis=0)))),
                      Term("-sum over the batch of P * rowsum(P * dP)", -rows.sum(axis=0),
                           slips=((one, -rows[0]), (flip, -T(rows, -1, -2).sum(axis=0)),
                                  (axis, -cols.sum(axis=0))))]}


def _bias_floor(args: tuple) -> dict[str, float]:
    """The size of the terms of each gradient, even where the softmax saturates."""
    dout, q, k, v, _ = args
    B, hd = q.shape[0], q.shape[-1]
    dP = amax(dout, v) * hd  # dP sums hd products
    return {"dq": dP * amax(k), "dk": dP * amax(q), "dv": amax(dout), "dbias": dP * B}


BIAS = Spec(
    id="attention_bias_backward",
    reference_name="xenith_edu.exercises.torch.attention_bias_backward",
    arg_names=("dout", "q", "k", "v", "bias"),
    out_names=OUTS,
    kinds=("array",) * 4,
    reference=_bias_reference,
    cases=_bias_cases,
    seed=1415,
    summary="float64 and float32, B = 1 to 3, S = 1 to 11, scores near 750, dout from 1e-3 to "
            "1e2",
    mistakes=_bias_mistakes,
    diagnose=_bias_diagnose,
    terms=_bias_terms,
    factors=lambda a: {f"sqrt(hd) = {fmt(math.sqrt(a[1].shape[-1]))}": math.sqrt(a[1].shape[-1]),
                       f"B = {a[1].shape[0]}": float(a[1].shape[0])},
    floor=_bias_floor,
    shape_hints={"dbias": "The bias is (H, S, S), shared by the B sequences: dbias has its "
                          "shape, dZ summed over the batch axis (the broadcast row)."},
    dtype_hint=("Divide by hd**0.5, a Python float, not by np.sqrt(hd), a float64 scalar that "
                "makes float32 arrays float64."),
    hints=("The bias is added to the scores, Z = q k^T / sqrt(hd) + bias + mask: addition "
           "passes dZ to it unchanged, and a parameter shared by the B sequences gets the sum "
           "of their gradients (the broadcast row). dq, dk, dv are causal attention's, with the "
           "biased weights P.",
           "P = softmax(q k^T / hd**0.5 + bias + mask); dP = dout @ v^T; dZ = P * (dP - "
           "sum(P * dP, axis=-1, keepdims=True)); dq = dZ @ k / hd**0.5, dk = dZ^T @ q / "
           "hd**0.5, dv = P^T @ dout; dbias = dZ.sum(axis=0).",
           "dbias[h] = sum over b of P[b, h] * (dP[b, h] - rowsum(P[b, h] * dP[b, h])), "
           "(H, S, S), zero above the diagonal; no 1/sqrt(hd) in it."),
    may_call=("xenith_edu.attention.causal_mask",),
)


def check_attention_bias_backward(fn: Callable) -> CheckResult:
    """`fn(dout, q, k, v (B, H, S, hd), bias (H, S, S)) -> (dq, dk, dv, dbias)`.

    Causal attention with a learned bias added to the scores, shared by the batch.
    See the "Your backward inside PyTorch" chapter.
    """
    return check(BIAS, fn)


# ----------------------------------------------------------------------------------------------
# ALiBi with learned slopes: the bias of head h is -m_h (i - j) for query i and key j <= i. The
# slopes are the parameters: the bias rule's dbias, then one more step of the chain rule.


def alibi_distances(S: int) -> np.ndarray:
    """(S, S) float64: i - j for a key j at or before the query i, 0 above the diagonal (where
    the mask hides the key whatever the bias holds)."""
    t = np.arange(S)
    return np.tril(t[:, None] - t[None, :]).astype(np.float64)  # (S, S)


def alibi_slopes_grad(dout: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                      slopes: np.ndarray) -> np.ndarray:
    """dslopes (H,) of attention with the bias -slopes[h] * (i - j): the learned bias's dbias
    (H, S, S), then through bias = -m_h D, a product with a constant: dm_h = -sum(dbias_h * D).

    See the "Your backward inside PyTorch" chapter.
    """
    D = alibi_distances(q.shape[-2]).astype(q.dtype)  # (S, S)
    bias = -slopes[:, None, None] * D  # (H, S, S)
    dbias = attention_bias_backward(dout, attention_bias_forward(q, k, v, bias)[1])[3]
    return -np.sum(dbias * D, axis=(1, 2))  # (H,)


def _alibi_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)

    def hd() -> int:  # sqrt(hd) is never 2 or 3, so the scale is never a batch size
        return int(rng.choice([2, 6, 8]))

    # (what, B, H, S, hd, dtype): the first two have B >= 2 and H >= 2 (a missing batch sum
    # or a sum over the heads shows), one case is square in its last two axes, one is long
    plans = [("", ints(2, 3), ints(2, 3), ints(5, 7), hd(), np.float64),
             ("", ints(2, 3), 2, ints(4, 6), hd(), np.float32),
             ("one sequence, ", 1, ints(2, 3), ints(4, 6), hd(), np.float64),
             ("one head, ", 2, 1, ints(4, 6), hd(), np.float64),
             ("S = hd (square), ", 2, 2, 6, 6, np.float64),
             ("longer, ", 2, 2, ints(9, 12), 2, np.float64)]
    cases = []
    for what, B, H, S, w, dtype in plans:
        q, k, v, dout = (randn(rng, (B, H, S, w), dtype) for _ in range(4))  # (B, H, S, hd)
        alibi = 2.0 ** (-8.0 * np.arange(1, H + 1) / H)  # (H,) ALiBi's initial slopes
        slopes = (alibi * np.exp(0.5 * rng.standard_normal(H))).astype(dtype)  # (H,) learned
        cases.append(Case(f"{np.dtype(dtype).name}, {what}B={B}, H={H}, S={S}, hd={w}",
                          (dout, q, k, v, slopes)))
    return cases + magnitudes(rng, cases[0], 0, "dout")


def _alibi_parts(args: tuple, slopes: np.ndarray | None = None, **switches) -> dict:
    """biased64 of the ALiBi bias made from `slopes` (the argument's when None), and D."""
    dout, q, k, v, m = args
    D = alibi_distances(q.shape[-2])  # (S, S)
    m = m if slopes is None else slopes
    return {**biased64(dout, q, k, v, -m[:, None, None] * D, **switches), "D": D}


def _alibi_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    dout, q, k, v, m = args
    B, H, S, hd = q.shape
    f = _alibi_parts(args)
    D, dZ = f["D"], f["dZ"]

    def through(g: np.ndarray) -> np.ndarray:  # (B, H, S, S) score gradients -> (H,)
        return -np.sum(g.sum(axis=0) * D, axis=(1, 2))

    geometric = 2.0 ** (-8.0 * np.arange(1, H + 1) / H)
    return [
        ("sign flipped: the bias is -m_h (i - j), so dm_h = -sum(dbias_h * (i - j)); the "
         "minus of the bias stays in its gradient.", lambda: {"dslopes": -through(dZ)}),
        (f"only the first sequence's gradient: the slopes are shared by the B = {B} "
         "sequences, so their gradients add (the broadcast row).",
         lambda: {"dslopes": -np.sum(dZ[0] * D, axis=(1, 2))}),
        (f"the batch's gradients are averaged, not summed over the B = {B} sequences.",
         lambda: {"dslopes": through(dZ) / B}),
        ("dP, the gradient of the weights, is used where dZ, the gradient of the scores, is "
         "needed: the bias is added to the scores, before the softmax.",
         lambda: {"dslopes": through(f["dP"])}),
        ("the softmax's row-sum term is missing: dZ = P * (dP - rowsum(P * dP)).",
         lambda: {"dslopes": through(f["P"] * f["dP"])}),
        ("1/sqrt(hd) is applied to the slopes' gradient: the scale multiplies q k^T only, "
         "the bias is added after it.", lambda: {"dslopes": through(dZ) / math.sqrt(hd)}),
        ("the weights P are recomputed without the bias: the slopes change the scores, so "
         "P = softmax(q k^T / sqrt(hd) - m_h (i - j) + mask).",
         lambda: {"dslopes": through(_alibi_parts(args, slopes=0 * m)["dZ"])}),
        ("the slopes are ALiBi's fixed 2**(-8 (h+1) / H), not the argument `slopes`: they are "
         "learned, read them.",
         lambda: {"dslopes": through(_alibi_parts(args, slopes=geometric)["dZ"])}),
        ("the bias enters the scores as +m_h (i - j): ALiBi's bias is a penalty, -m_h (i - j), "
         "so that a distant key gets a lower score.",
         lambda: {"dslopes": -through(_alibi_parts(args, slopes=-m)["dZ"])}),
        ("the heads' gradients are summed together: each head has its own slope, so dm_h sums "
         "over the batch and the (i, j) entries of head h only.",
         lambda: {"dslopes": np.full(H, through(dZ).sum())}),
    ]


def _alibi_terms(args: tuple) -> dict[str, list[Term]]:
    """dm_h = -sum(P * dP * D) + sum(P * rowsum(P * dP) * D), over the batch and (i, j)."""
    f = _alibi_parts(args)
    P, dP, D = f["P"], f["dP"], f["D"]
    A = P * dP  # (B, H, S, S)
    rows = P * np.sum(A, axis=-1, keepdims=True)  # (B, H, S, S)
    one = "only the first sequence's, not the batch sum"
    return {"dslopes": [
        Term("-sum(P * dP * (i - j))", -np.sum(A * D, axis=(0, 2, 3)),
             slips=((one, -np.sum(A[0] * D, axis=(1, 2))),)),
        Term("sum(P * rowsum(P * dP) * (i - j))", np.sum(rows * D, axis=(0, 2, 3)),
             slips=((one, np.sum(rows[0] * D, axis=(1, 2))),))]}


ALIBI = Spec(
    id="alibi_slopes_grad",
    reference_name="xenith_edu.exercises.torch.alibi_slopes_grad",
    arg_names=("dout", "q", "k", "v", "slopes"),
    out_names=("dslopes",),
    may_call=("xenith_edu.attention.causal_mask",),  # the mask, as the chapter builds it
    kinds=("array",),
    reference=lambda dout, q, k, v, slopes: (alibi_slopes_grad(dout, q, k, v, slopes),),
    cases=_alibi_cases,
    seed=1416,
    summary="float64 and float32, B = 1 to 3, H = 1 to 3, S = 4 to 12, dout from 1e-3 to 1e2",
    single=True,
    mistakes=_alibi_mistakes,
    terms=_alibi_terms,
    factors=lambda a: {f"sqrt(hd) = {fmt(math.sqrt(a[1].shape[-1]))}": math.sqrt(a[1].shape[-1]),
                       f"B = {a[1].shape[0]}": float(a[1].shape[0])},
    floor=lambda a: {"dslopes": amax(a[0], a[3]) * a[1].shape[-1] * a[1].shape[0]
                     * a[1].shape[2] ** 2},
    shape_hints={"dslopes": "One slope per head: dslopes is (H,), the slopes' shape; sum over "
                            "the batch and over the (i, j) entries of each head."},
    dtype_hint=("Divide by hd**0.5, a Python float, not by np.sqrt(hd); and make the distances "
                "in the inputs' dtype: a float64 array makes float32 arrays float64."),
    hints=("m_h reaches the loss only through the bias of head h, bias_h = -m_h (i - j): what "
           "does a product with a constant matrix pass back to m_h, and from which sequences?",
           "Get dZ as in the learned-bias exercise, with the bias -m_h (i - j) in the scores; "
           "dbias = dZ.sum(axis=0) (H, S, S); then dm_h = -sum over (i, j) of dbias_h * (i - j).",
           "D = np.tril(i - j); dslopes = -np.sum(dZ.sum(axis=0) * D, axis=(1, 2)), with dZ = P * "
           "(dP - sum(P * dP, axis=-1, keepdims=True)) and P the biased weights."),
)


def check_alibi_slopes_grad(fn: Callable) -> CheckResult:
    """`fn(dout, q, k, v (B, H, S, hd), slopes (H,)) -> dslopes (H,)`: causal attention with
    ALiBi's bias -slopes[h] * (i - j), the slopes learned.

    See the "Your backward inside PyTorch" chapter.
    """
    return check(ALIBI, fn)


SPECS = [BIAS, ALIBI]

__all__ = ["alibi_distances", "alibi_slopes_grad", "check_alibi_slopes_grad",
           "check_attention_bias_backward"]
