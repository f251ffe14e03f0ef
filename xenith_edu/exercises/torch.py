"""Exercises of the "Your backward inside PyTorch" chapter: a learned attention bias's backward,
and a rotate-half checkpoint's W_q in ours.

NumPy only (this module never imports torch); each check names the usual mistakes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..attention import AttentionCache, causal_attention_backward, causal_mask
from ..model.hf.layout import pair_rows
from .attention import softmax_terms
from .engine import check
from .fit import Term
from .kit import OVERFLOW, amax, fmt, int_sampler, magnitudes, randn
from .types import Case, CheckResult, Mistake, Spec

# Shape legend: d width, H heads, hd = d // H head width (even). A checkpoint's weight is
# nn.Linear's (out, in) = (d, d); ours is (in, out), the output coordinates of head c being the
# columns c*hd .. (c+1)*hd - 1.


def interleaved_rows(d: int, n_head: int) -> np.ndarray:
    """For our output coordinate c*hd + 2i + r, the checkpoint's output c*hd + r*hd/2 + i.

    Our pair i of a head is (2i, 2i+1); rotate-half's pair i is (i, i + hd/2). (d,) int array:
    the map that reading a Hugging Face checkpoint applies (`xenith_edu.model.hf.pair_rows`).
    """
    return pair_rows(n_head, d // n_head)  # (d,)


def half_rows(d: int, n_head: int) -> np.ndarray:
    """The inverse map: rotate-half coordinate c*hd + j comes from ours (the chapter's tau)."""
    hd = d // n_head
    tau = np.concatenate((np.arange(0, hd, 2), np.arange(1, hd, 2)))  # (hd,)
    return (np.arange(n_head)[:, None] * hd + tau[None, :]).reshape(-1)  # (d,)


def wq_from_rotate_half(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Our W_q (in, out) from a rotate-half checkpoint's nn.Linear weight (out, in), (d, d)."""
    return weight[interleaved_rows(weight.shape[0], n_head), :].T


def _swapped_rows(d: int, n_head: int) -> np.ndarray:
    """The members of each pair exchanged: our 2i + r read from rotate-half (1 - r)*hd/2 + i."""
    hd = d // n_head
    j = np.arange(hd)
    where = (1 - j % 2) * (hd // 2) + j // 2
    return (np.arange(n_head)[:, None] * hd + where[None, :]).reshape(-1)


def _cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)

    # (what, n_head, hd, dtype). The first case tells every known mistake apart: several heads,
    # and hd >= 6, where the permutation and its inverse differ (for hd = 4 they coincide). The
    # widths d are multiples of 8 where they can be, so that a head count typed in (2, 4)
    # still gives even heads, and the diagnosis can name it.
    sizes = [
        ("", 2 * ints(1, 2), 4 * ints(2, 3), np.float64),
        ("", ints(2, 3), 8 * ints(1, 2), np.float32),
        ("one head, ", 1, 4 * ints(2, 3), np.float64),
        ("hd = 4, ", ints(2, 5), 4, np.float64),
        ("hd = 2 (nothing to reorder), ", ints(2, 6), 2, np.float64),
        ("one head of width 2, ", 1, 2, np.float64),
    ]
    cases = []
    for what, H, hd, dtype in sizes:
        d = H * hd
        weight = randn(rng, (d, d), dtype)  # (d, d) nn.Linear's (out, in), distinct entries
        cases.append(Case(f"{np.dtype(dtype).name}, {what}weight ({d}, {d}), n_head={H}",
                          (weight, H)))
    return cases + magnitudes(rng, cases[0], 0, "weight")


def _mistakes(args: tuple, exp: dict) -> list[Mistake]:
    weight, n_head = args
    d = weight.shape[0]
    layout = {
        True: "",
        False: ("the result is in nn.Linear's (out, in) layout: our W_q is (in, out), the "
                "transpose."),
    }
    orders = {  # name -> (rows of the checkpoint for our output coordinates, what is wrong)
        "right": (interleaved_rows(d, n_head), ""),
        "tau": (half_rows(d, n_head),
                "the permutation goes the wrong way: tau maps our order to rotate-half's; "
                "the conversion needs its inverse (our 2i + r reads rotate-half r*hd/2 + i)."),
        "none": (np.arange(d),
                 "the output coordinates are still in rotate-half order: within each head, our "
                 "pair i is (2i, 2i+1), rotate-half's is (i, i + hd/2); reorder them."),
        "one head": (interleaved_rows(d, 1),
                     "the permutation treats the d columns as one head: reorder within each "
                     "head of width hd = d // n_head."),
        "swapped": (_swapped_rows(d, n_head),
                    "the two members of each pair are exchanged: our 2i is rotate-half's i "
                    "(first half of the head), our 2i + 1 is its i + hd/2."),
    }
    table: list[Mistake] = []
    for transposed in (True, False):
        for name, (rows, wrong_order) in orders.items():
            for axis in ("out", "in"):
                if name == "right" and axis == "out" and transposed:
                    continue  # the right answer
                if name == "none" and axis == "in":
                    continue  # the same as axis "out"
                wrong_axis = ("the permutation was applied to the input axis: it reorders the "
                              "output coordinates (the columns of our W_q, the rows of "
                              "nn.Linear's weight)." if axis == "in" else "")
                parts = [p for p in (layout[transposed], wrong_order, wrong_axis) if p]
                table.append((" And ".join(parts), _answer(weight, rows, axis, transposed)))
    for typed in (1, 2, 4, 8, 16, 32):  # n_head typed in instead of read from the argument
        table.append((f"the permutation is the one for n_head = {typed}: read n_head from the "
                      f"argument.",
                      _typed(weight, n_head, typed)))
    return table


def _answer(weight: np.ndarray, rows: np.ndarray, axis: str,
            transposed: bool) -> Callable[[], dict]:
    def make() -> dict:
        moved = weight[rows, :] if axis == "out" else weight[:, rows]
        return {"wq": moved.T if transposed else moved}

    return make


def _typed(weight: np.ndarray, n_head: int, typed: int) -> Callable[[], dict]:
    def make() -> dict:
        d = weight.shape[0]
        if typed == n_head or typed == 1 or d % typed or (d // typed) % 2:
            return {}  # no prediction: the right count, the one-head entry, or impossible
        if np.array_equal(interleaved_rows(d, typed), interleaved_rows(d, n_head)):
            return {}
        return {"wq": weight[interleaved_rows(d, typed), :].T}

    return make


def _diagnose(args: tuple, exp: dict, got: dict, wrong: set, tol: float) -> list[str]:
    """Where the entries of a wrong answer came from, when no known mistake explains it."""
    weight, n_head = args
    g = np.asarray(got["wq"], dtype=np.float64)
    if g.shape != weight.shape:
        return []
    where = {float(v): i for i, v in enumerate(weight.reshape(-1))}  # the entries are distinct
    src = [where.get(float(v)) for v in g.reshape(-1)]
    if any(s is None for s in src):
        if all(where.get(-float(v)) is not None for v in g.reshape(-1)):
            return ["your W_q holds the checkpoint's entries with their sign flipped: the "
                    "conversion only moves entries, it never negates them."]
        return ["your W_q has entries that are not in the checkpoint: the conversion only moves "
                "entries (a transpose and a reordering of rows), it computes nothing."]
    d = weight.shape[0]
    rows, cols = np.divmod(np.array(src).reshape(d, d), d)  # checkpoint (row, col) of each entry
    whole = np.all(rows == rows[:1, :]) and np.array_equal(cols, np.tile(np.arange(d)[:, None],
                                                                          (1, d)))
    if not whole:
        return ["your W_q is a rearrangement of the checkpoint's entries, but its column j is "
                "not one whole row of the checkpoint, transposed: the conversion moves whole "
                "rows (one per output coordinate) and keeps the order within each."]
    expected = interleaved_rows(d, n_head)
    j = int(np.argmax(rows[0] != expected))
    hd = d // n_head
    return [f"your column {j} (head {j // hd}, coordinate {j % hd}) is the checkpoint's row "
            f"{int(rows[0, j])}; it should be row {int(expected[j])} (our coordinate 2i + r "
            f"reads rotate-half r*hd/2 + i)."]


WQ = Spec(
    id="wq_from_rotate_half",
    reference_name="xenith_edu.exercises.torch.wq_from_rotate_half",
    arg_names=("weight", "n_head"),
    out_names=("wq",),
    kinds=("array",),
    reference=lambda weight, n_head: (wq_from_rotate_half(weight, n_head),),
    cases=_cases,
    seed=1414,
    summary="float64 and float32, 1 to 6 heads, hd = 2 to 16, weights from 1e-3 to 1e2",
    single=True,
    mistakes=_mistakes,
    diagnose=_diagnose,
    floor=lambda a: {"wq": amax(a[0])},
    shape_hints={"wq": "W_q is square: (d, d), the checkpoint's shape."},
    dtype_hint="A conversion keeps the checkpoint's dtype: index and transpose, do not cast.",
)


def check_wq_from_rotate_half(fn: Callable) -> CheckResult:
    """`fn(weight (d, d) nn.Linear layout, rotate-half; n_head) -> wq (d, d)`, ours.

    See the "Your backward inside PyTorch" chapter.
    """
    return check(WQ, fn)


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


SPECS = [BIAS, WQ]

__all__ = ["check_attention_bias_backward", "check_wq_from_rotate_half"]
