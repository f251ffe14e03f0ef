"""Exercises of the memory chapter: the online-softmax merge, the row sums D, a KV-cache budget.

See the "Memory: attention without the S×S matrix" chapter; each check diagnoses the usual slips.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..attention import causal_attention_forward
from .engine import check
from .fit import Term, term
from .kit import OVERFLOW, amax, int_sampler, magnitudes, randn
from .types import Case, CheckResult, Mistake, Spec

# Shape legend: R rows (queries), b1, b2 keys of two blocks, B batch, H heads, S positions,
# hd head width, L layers.


# ----------------------------------------------------------------------------------------------
# The online-softmax merge of two blocks of keys.


def merge_reference(m1, sigma1, o1, m2, sigma2, o2) -> tuple:
    """(m, sigma, o) of the union of two blocks from each block's (max, sum, normalised output):
    sigma is the chapter's running sum Sigma of exp(z - m)."""
    m = np.maximum(m1, m2)  # (R,)
    w1 = sigma1 * np.exp(m1 - m)  # (R,) block 1's sum of exp, against the new max
    w2 = sigma2 * np.exp(m2 - m)  # (R,)
    sigma = w1 + w2  # (R,)
    o = (w1[:, None] * o1 + w2[:, None] * o2) / sigma[:, None]  # (R, hd)
    return m, sigma, o


def block_stats(z: np.ndarray, V: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One block's (m, sigma, o): row max (R,), sum of exp(z - m) (R,), softmax average
    (R, hd)."""
    m = z.max(axis=1)  # (R,)
    e = np.exp(z - m[:, None])  # (R, b)
    sigma = e.sum(axis=1)  # (R,)
    return m, sigma, (e @ V) / sigma[:, None]


def _merge_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)

    cases = []
    settings = [  # label, dtype, score scale, how block 2 relates to block 1
        ("float64", np.float64, 1.0, ""),
        ("float32", np.float32, 1.0, ""),
        ("float64, large scores (maxima above 700: exp overflows)", np.float64, 100.0, ""),
        ("float64, both blocks share each row's max", np.float64, 1.0, "tie"),
        ("float64, block 2 fully masked (m2 = -inf, sigma2 = 0, o2 = 0)", np.float64, 1.0,
         "masked"),
        ("float64, more rows, R = hd (square o)", np.float64, 1.0, "square"),
    ]
    for label, dtype, scale, how in settings:
        # two keys per block at least: a block of one key has sigma = 1, where sigma-slips hide
        R, hd, b1, b2 = ints(2, 5), ints(2, 5), ints(2, 4), ints(2, 4)
        if how == "square":
            R = hd = ints(9, 11)
        shift = 12 * scale if scale > 1 else 0.0  # large scores: 1200 +- 300, exp(z) = inf
        z1 = randn(rng, (R, b1), scale=scale) + shift  # (R, b1) block 1's scores
        z2 = randn(rng, (R, b2), scale=scale) + shift  # (R, b2)
        if how == "tie":
            z2[:, 0] = z1.max(axis=1) + 0.0
            z2 = np.minimum(z2, z1.max(axis=1)[:, None])
        V1, V2 = randn(rng, (b1, hd)), randn(rng, (b2, hd))
        m1, sigma1, o1 = block_stats(z1, V1)
        m2, sigma2, o2 = block_stats(z2, V2)
        if how == "masked":
            m2, sigma2, o2 = np.full(R, -np.inf), np.zeros(R), np.zeros((R, hd))
        args = tuple(a.astype(dtype) for a in (m1, sigma1, o1, m2, sigma2, o2))
        cases.append(Case(f"{label}, R={R}, hd={hd}", args, OVERFLOW if scale > 1 else ""))
    return cases


def _finite(cand: dict) -> dict:
    """The candidate, or no prediction where it is not finite (it cannot be told apart)."""
    return cand if all(np.all(np.isfinite(c)) for c in cand.values()) else {}


def _merge_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    m1, sigma1, o1, m2, sigma2, o2 = args
    m = exp["m"]

    def combine(w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
        return (w1[:, None] * o1 + w2[:, None] * o2) / (w1 + w2)[:, None]

    def inverted() -> dict:
        w1, w2 = sigma1 * np.exp(m - m1), sigma2 * np.exp(m - m2)
        return _finite({"sigma": w1 + w2, "o": combine(w1, w2)})

    def by_min() -> dict:
        mn = np.minimum(m1, m2)
        return _finite({"m": mn,
                        "sigma": sigma1 * np.exp(m1 - mn) + sigma2 * np.exp(m2 - mn)})

    e1, e2 = np.exp(m1 - m), np.exp(m2 - m)
    return [
        ("the sums are not rescaled to the new max: each block's sigma was computed against its "
         "own max, so multiply it by exp(m_k - m) before adding (sigma = sigma1 + sigma2 is "
         "wrong unless both maxima are equal).",
         lambda: {"sigma": sigma1 + sigma2, "o": combine(sigma1, sigma2)}),
        ("the rescaling factor is inverted: a sum against m_k becomes a sum against the new max "
         "m >= m_k when multiplied by exp(m_k - m) <= 1, not exp(m - m_k).", inverted),
        ("sigma is not rescaled (sigma = sigma1 + sigma2), though o is: sigma must be the sum "
         "against the new max, sigma1 * exp(m1 - m) + sigma2 * exp(m2 - m).",
         lambda: {"sigma": sigma1 + sigma2}),
        ("the outputs are weighted by exp(m_k - m) alone: each block's weight is its whole sum "
         "against the new max, sigma_k * exp(m_k - m).",
         lambda: {"o": combine(e1, e2)}),
        ("o is not divided by the merged sigma: each block's o is an average, so the merged o is "
         "the weighted sum of the two divided by the total weight sigma.",
         lambda: {"o": (sigma1 * e1)[:, None] * o1 + (sigma2 * e2)[:, None] * o2}),
        ("o is the plain mean (o1 + o2) / 2: the blocks must be weighted by how much of the "
         "softmax each holds, sigma_k * exp(m_k - m).", lambda: _finite({"o": (o1 + o2) / 2})),
        ("the weights of the two blocks are swapped in o: o1 goes with sigma1 * exp(m1 - m).",
         lambda: {"o": combine(sigma2 * e2, sigma1 * e1)}),
        ("m is the smaller of the two maxima: the running max must be the larger, "
         "max(m1, m2), so that every exponential is at most 1.", by_min),
    ]


def _merge_terms(args: tuple) -> dict[str, list[Term]]:
    """m = max(m1, m2), sigma = sum of sigma_k exp(m_k - m),
    o = sum of sigma_k exp(m_k - m) o_k / sigma."""
    m1, sigma1, o1, m2, sigma2, o2 = args
    m, sigma, _ = merge_reference(m1, sigma1, o1, m2, sigma2, o2)
    e1, e2 = np.exp(m1 - m), np.exp(m2 - m)  # (R,)

    def col(a: np.ndarray) -> np.ndarray:
        return a[:, None]  # (R, 1): one number per row, along the features of o

    def weighted(k: int, sigmak, ek, ok) -> Term:
        return term(f"sigma{k} * exp(m{k} - m) * o{k} / sigma", (f"sigma{k}", col(sigmak)),
                    (f"exp(m{k} - m)", col(ek)), (f"o{k}", ok), ("1 / sigma", col(1.0 / sigma)))

    return {"m": [Term("max(m1, m2)", m)],
            "sigma": [term("sigma1 * exp(m1 - m)", ("sigma1", sigma1), ("exp(m1 - m)", e1)),
                      term("sigma2 * exp(m2 - m)", ("sigma2", sigma2), ("exp(m2 - m)", e2))],
            "o": [weighted(1, sigma1, e1, o1), weighted(2, sigma2, e2, o2)]}


def _merge_floor(args: tuple) -> dict[str, float]:
    m1, sigma1, o1, m2, sigma2, o2 = args
    finite = [abs(float(x)) for x in np.concatenate((m1, m2)) if np.isfinite(x)]
    return {"m": max(finite, default=0.0), "sigma": amax(sigma1) + amax(sigma2),
            "o": amax(o1) + amax(o2)}


MERGE = Spec(
    id="softmax_merge",
    reference_name="xenith_edu.exercises.memory.merge_reference",
    arg_names=("m1", "sigma1", "o1", "m2", "sigma2", "o2"),
    out_names=("m", "sigma", "o"),
    kinds=("array",) * 3,
    reference=merge_reference,
    cases=_merge_cases,
    seed=1201,
    summary="float64 and float32, maxima above 700, a shared max, a fully masked block, a "
            "square o with 9 to 11 rows",
    mistakes=_merge_mistakes,
    terms=_merge_terms,
    hints=("Each block's sigma and o were computed against its own max m_k; against the new max "
           "m = max(m1, m2), a sum of exponentials scales by exp(m_k - m), and an average is "
           "re-weighted by how much of the softmax each block holds.",
           "m = max(m1, m2); w_k = sigma_k * exp(m_k - m); sigma = w1 + w2; "
           "o = (w1 * o1 + w2 * o2) / sigma, with w_k[:, None] along the features of o.",
           "m = max(m1, m2); sigma = sigma1 exp(m1 - m) + sigma2 exp(m2 - m); "
           "o = (sigma1 exp(m1 - m) o1 + sigma2 exp(m2 - m) o2) / sigma"),
    floor=_merge_floor,
)


def check_softmax_merge(fn: Callable) -> CheckResult:
    """`fn(m1, sigma1, o1, m2, sigma2, o2) -> (m, sigma, o)`: merge two blocks' online softmax.

    See the "Memory: attention without the S×S matrix" chapter.
    """
    return check(MERGE, fn)


# ----------------------------------------------------------------------------------------------
# D = rowsum(dO * O), the row sums of the softmax's vector-Jacobian product.


def rowsum_reference(dout, out) -> tuple:
    return (np.sum(dout * out, axis=-1),)  # (B, H, S)


def _rowsum_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)

    cases = []
    for label, dtype, S in (("float64", np.float64, ints(3, 7)), ("float32", np.float32,
                            ints(3, 7)), ("float64, S=1 (one position)", np.float64, 1)):
        B, H, hd = ints(1, 3), ints(1, 3), 2 * ints(1, 3) + 1  # odd hd: never equal to S
        q, k, v, dout = (randn(rng, (B, H, S, hd), dtype) for _ in range(4))
        out, _ = causal_attention_forward(q, k, v)  # (B, H, S, hd) a real attention output
        cases.append(Case(f"{label}, B={B}, H={H}, S={S}, hd={hd}", (dout, out)))
    sq = ints(9, 11)  # S = hd: a sum over the positions has the shape of the right answer
    q, k, v, dout = (randn(rng, (2, 2, sq, sq)) for _ in range(4))
    out, _ = causal_attention_forward(q, k, v)  # (B, H, S, hd)
    cases.append(Case(f"float64, S = hd = {sq} (square), B=2, H=2", (dout, out)))
    return cases + magnitudes(rng, cases[0], 0, "dout")


def _rowsum_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    dout, out = args
    return [
        ("that multiplies the row sums of dout and of out: D_i = sum_c dO_ic * O_ic sums the "
         "products, feature by feature.", lambda: {"D": dout.sum(-1) * out.sum(-1)}),
        ("that is the mean over the hd features, not the sum.",
         lambda: {"D": exp["D"] / dout.shape[-1]}),
        ("that is rowsum(dout * dout): the second factor is the forward's output O.",
         lambda: {"D": np.sum(dout * dout, axis=-1)}),
        ("that is rowsum(out * out): the first factor is the upstream gradient dO.",
         lambda: {"D": np.sum(out * out, axis=-1)}),
    ]


ROWSUM = Spec(
    id="softmax_rowsum",
    reference_name="np.sum(dout * out, axis=-1)",
    arg_names=("dout", "out"),
    out_names=("D",),
    kinds=("array",),
    reference=rowsum_reference,
    cases=_rowsum_cases,
    seed=1202,
    summary="float64 and float32, S = 1 to 11, S = hd, outputs of real causal attention, dout "
            "from 1e-3 to 1e2",
    single=True,
    mistakes=_rowsum_mistakes,
    terms=lambda a: {"D": [Term("sum(dout * out, axis=-1)", np.sum(a[0] * a[1], axis=-1))]},
    hints=("The softmax's backward needs, per query row, the dot product of dP and P; with dP = "
           "dout @ v^T and out = P @ v, that dot product is the dot product of dout and out.",
           "One number per row: multiply dout and out elementwise and sum over the last axis "
           "(the hd features), without keepdims, so that D has shape (B, H, S).",
           "D = sum(dout * out, axis=-1)"),
    factors=lambda a: {f"hd = {a[0].shape[-1]}": float(a[0].shape[-1])},
    shape_hints={"D": "D has one number per row (query): shape (B, H, S), the sum over the "
                      "last axis, hd, without keepdims."},
    floor=lambda a: {"D": amax(a[0], a[1]) * a[0].shape[-1]},
)


def check_softmax_rowsum(fn: Callable) -> CheckResult:
    """`fn(dout, out)` both (B, H, S, hd) `-> D` (B, H, S), the softmax's row sums.

    See the "Memory: attention without the S×S matrix" chapter.
    """
    return check(ROWSUM, fn)


# ----------------------------------------------------------------------------------------------
# A cache-memory budget: the longest context whose KV cache fits.


def max_context_reference(budget, n_layer, batch, n_head, head_dim, itemsize) -> tuple:
    per_position = 2 * n_layer * batch * n_head * head_dim * itemsize  # keys and values
    return (int(budget) // per_position,)


def _budget_sizes(rng: np.random.Generator) -> tuple[int, int, int, int, int]:
    """(L, B, H, hd, itemsize) such that no two mistakes give the same answer: the factors a
    mistake leaves out (2, L, B, H, itemsize) all differ, and H (counted twice) is not 8 (bits).
    With itemsize = 2, a missing itemsize and missing values would give the same number."""
    ints = int_sampler(rng)
    while True:
        L, B, H = ints(3, 12), ints(3, 7), ints(3, 16)
        hd, itemsize = int(rng.choice([16, 32, 64, 128])), int(rng.choice([4, 8]))
        if len({2, L, B, H, itemsize}) == 5 and H != 8:
            return L, B, H, hd, itemsize


def _budget_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)

    cases = []
    for what in ("", "", "exact", "small"):
        L, B, H, hd, itemsize = _budget_sizes(rng)
        per = 2 * L * B * H * hd * itemsize
        if what == "exact":  # the budget is an exact multiple: the last position just fits
            budget, label = per * ints(100, 4000), "a budget that fits a whole number of positions"
        elif what == "small":  # less than one position: nothing fits
            budget, label = per - ints(1, per - 1), "a budget below one position"
        else:
            budget, label = ints(2**28, 2**34), "a budget of a few GiB"
        sizes = f"L={L}, B={B}, H={H}, hd={hd}, itemsize={itemsize}"
        cases.append(Case(f"{label}: {budget} bytes, {sizes}", (budget, L, B, H, hd, itemsize)))
    return cases


def _budget_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    budget, L, B, H, hd, itemsize = (int(a) for a in args)
    per = 2 * L * B * H * hd * itemsize

    def answer(per_position: float, rounding: Callable = math.floor) -> Callable[[], dict]:
        return lambda: {"S": int(rounding(budget / per_position))}

    return [
        ("the values are missing: the cache keeps keys AND values, 2 arrays per layer.",
         answer(per / 2)),
        ("the layers are missing: every layer keeps its own keys and values (L).",
         answer(per / L)),
        ("the batch is missing: every sequence has its own cache (B).", answer(per / B)),
        ("the heads are missing: each head keeps keys and values of width hd (H heads).",
         answer(per / H)),
        ("the bytes per number are missing: multiply by itemsize.", answer(per / itemsize)),
        ("the width is counted twice: a head's key has hd numbers, and H heads give d = H * hd, "
         "not H * d.", answer(per * H)),
        ("that counts bits, not bytes.", answer(per * 8)),
        ("that rounds up: a context must fit in the budget, so round down (floor).",
         answer(per, math.ceil)),
        ("that stops one short: when the budget is an exact multiple, the last position fits "
         "(use <=, i.e. budget // bytes per position).",
         lambda: {"S": (budget - 1) // per} if budget % per == 0 else {}),
    ]


BUDGET = Spec(
    id="kv_cache_budget",
    reference_name="budget // (2 * n_layer * batch * n_head * head_dim * itemsize)",
    arg_names=("budget", "n_layer", "batch", "n_head", "head_dim", "itemsize"),
    out_names=("S",),
    kinds=("int",),
    reference=max_context_reference,
    cases=_budget_cases,
    seed=1203,
    summary="budgets of a few GiB, an exact multiple, less than one position",
    single=True,
    mistakes=_budget_mistakes,
    hints=("The cache holds, for every position, a key and a value (2 arrays) in every layer, for "
           "every sequence of the batch and every head, each of head_dim numbers of itemsize "
           "bytes.",
           "bytes per position = 2 * n_layer * batch * n_head * head_dim * itemsize; the longest "
           "context is the largest S with S * (bytes per position) <= budget.",
           "S = budget // (2 * n_layer * batch * n_head * head_dim * itemsize)"),
)


def check_kv_cache_budget(fn: Callable) -> CheckResult:
    """`fn(budget, n_layer, batch, n_head, head_dim, itemsize) -> int`, the longest context.

    See the "Memory: attention without the S×S matrix" chapter.
    """
    return check(BUDGET, fn)


SPECS = [MERGE, ROWSUM, BUDGET]

__all__ = ["check_kv_cache_budget", "check_softmax_merge", "check_softmax_rowsum"]
