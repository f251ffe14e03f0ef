"""Exercises of the causal attention chapter: the backward, its relatives, the packed cache.

See the "Causal attention" chapter; each check diagnoses the usual mistakes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from ..attention import causal_attention_backward, causal_attention_forward
from .engine import check
from .fit import Term, term
from .kit import OVERFLOW, amax, fmt, int_sampler, magnitudes, randn, softmax64
from .types import Case, CheckResult, Mistake, Spec

# Shape legend: B batch, H heads (query heads), Hkv key/value heads, S positions, hd head width.


def _attention_reference(dout, q, k, v) -> tuple:
    _, cache = causal_attention_forward(q, k, v)
    return causal_attention_backward(dout, cache)


def _attention_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)

    sq = 2 * ints(2, 3)
    shapes = [  # label, B, H, S, hd, dtype, scale of q and k
        ("", ints(2, 3), ints(2, 3), ints(4, 6), 2 * ints(1, 3), np.float64, 1.0),
        ("", 1, ints(1, 2), ints(5, 7), 2 * ints(2, 4), np.float32, 1.0),
        ("S=1 (one position), ", ints(1, 2), 2, 1, 2 * ints(1, 3), np.float64, 1.0),
        (f"S=hd={sq} (square), ", 1, 2, sq, sq, np.float64, 1.0),
        ("large scores (up to ~1.5e3), ", 1, 2, ints(5, 7), 4, np.float64, 30.0),
        ("small scores (weights near uniform), S above hd, ", 2, 1, ints(9, 12), 2 * ints(1, 2),
         np.float64, 0.05),
    ]
    cases = []
    for what, B, H, S, hd, dtype, scale in shapes:
        q = randn(rng, (B, H, S, hd), dtype, scale)  # (B, H, S, hd)
        k = randn(rng, (B, H, S, hd), dtype, scale)  # (B, H, S, hd)
        v = randn(rng, (B, H, S, hd), dtype)  # (B, H, S, hd)
        dout = randn(rng, (B, H, S, hd), dtype)  # (B, H, S, hd)
        sizes = ", ".join(f"{n}={s}" for n, s in zip("BHS", (B, H, S), strict=True)
                          if f"{n}=" not in what)
        label = f"{np.dtype(dtype).name}, {what}{sizes}" + ("" if "hd=" in what else f", hd={hd}")
        cases.append(Case(label, (dout, q, k, v), OVERFLOW if scale > 1 else ""))
    return cases


def causal_probs(q: np.ndarray, k: np.ndarray, masked: bool = True) -> np.ndarray:
    """softmax(q k^T / sqrt(hd) + causal mask) in float64: (B, H, S, S)."""
    S, hd = q.shape[-2], q.shape[-1]
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(hd)  # (B, H, S, S)
    if masked:
        scores = np.where(np.triu(np.ones((S, S), dtype=bool), k=1), -np.inf, scores)
    return softmax64(scores)  # (B, H, S, S)


LEAK = ("gradient leaks through the causal mask: keys and values receive gradient from "
        "queries before them (with a gradient at query 0 only, a later key or value got some). "
        "The backward must use the masked attention weights, zero above the diagonal.")


def _attention_with(P: np.ndarray, dout, q, k, v, rowsum: bool = True) -> dict:
    scale = 1.0 / math.sqrt(q.shape[-1])
    dP = dout @ np.swapaxes(v, -1, -2)  # (B, H, S, S)
    if rowsum:
        dP = dP - np.sum(P * dP, axis=-1, keepdims=True)
    dS = P * dP * scale
    return {"dq": dS @ k, "dk": np.swapaxes(dS, -1, -2) @ q, "dv": np.swapaxes(P, -1, -2) @ dout}


def _attention_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    dout, q, k, v = args
    hd = q.shape[-1]
    P = causal_probs(q, k)
    scale = 1.0 / math.sqrt(hd)
    dP = dout @ np.swapaxes(v, -1, -2)
    dS = P * (dP - np.sum(P * dP, axis=-1, keepdims=True)) * scale  # (B, H, S, S)
    return [
        (LEAK, lambda: _attention_with(causal_probs(q, k, masked=False), dout, q, k, v)),
        (f"the 1/sqrt(hd) scale of the scores is missing from dq and dk (hd = {hd}).",
         lambda: {"dq": exp["dq"] * math.sqrt(hd), "dk": exp["dk"] * math.sqrt(hd)}),
        ("the 1/sqrt(hd) scale is applied twice in dq and dk.",
         lambda: {"dq": exp["dq"] / math.sqrt(hd), "dk": exp["dk"] / math.sqrt(hd)}),
        ("the softmax Jacobian's row-sum term is missing: dscores = P * (dP - sum(P * dP, "
         "axis=-1, keepdims=True)).",
         lambda: {k_: a for k_, a in _attention_with(P, dout, q, k, v, rowsum=False).items()
                  if k_ != "dv"}),
        ("dq and dk are swapped: dq = dscores @ k and dk = dscores^T @ q.",
         lambda: {"dq": exp["dk"], "dk": exp["dq"]}),
        ("dv needs the transposed weights: dv = P^T @ dout (each key collects from the queries "
         "that attend to it), not P @ dout.", lambda: {"dv": P @ dout}),
        ("dk needs the transposed score gradient: dk = dscores^T @ q, not dscores @ q.",
         lambda: {"dk": dS @ q}),
    ]


def softmax_terms(P: np.ndarray, dP: np.ndarray, q: np.ndarray, k: np.ndarray,
                  dout: np.ndarray) -> dict[str, list[Term]]:
    """dq, dk from the softmax's two terms, P * dP and -P * rowsum(P * dP), and dv = P^T @ dout,
    given the weights P and their gradient dP, (B, H, S, S) each: the fit's terms of attention's
    backward, which the PyTorch chapter's biased attention shares."""
    sc = 1.0 / math.sqrt(q.shape[-1])
    rows = P * np.sum(P * dP, axis=-1, keepdims=True)  # (B, H, S, S)
    cols = P * np.sum(P * dP, axis=-2, keepdims=True)  # the sum over the queries instead
    A, T = P * dP, np.swapaxes  # (B, H, S, S)
    axis = "its row sum runs over the queries (axis=-2), not over each row's keys (axis=-1)"
    flip = "the score gradient is transposed"
    return {
        "dq": [Term("(P * dP) @ k / sqrt(hd)", A @ k * sc, slips=((flip, T(A, -1, -2) @ k * sc),)),
               Term("-(P * rowsum(P * dP)) @ k / sqrt(hd)", -rows @ k * sc,
                    slips=((flip, -T(rows, -1, -2) @ k * sc), (axis, -cols @ k * sc)))],
        "dk": [Term("(P * dP)^T @ q / sqrt(hd)", T(A, -1, -2) @ q * sc,
                    slips=((flip, A @ q * sc),)),
               Term("-(P * rowsum(P * dP))^T @ q / sqrt(hd)", -T(rows, -1, -2) @ q * sc,
                    slips=((flip, -rows @ q * sc), (axis, -T(cols, -1, -2) @ q * sc)))],
        "dv": [Term("P^T @ dout", T(P, -1, -2) @ dout, slips=(("P is not transposed", P @ dout),))],
    }


def _attention_terms(args: tuple) -> dict[str, list[Term]]:
    """dq, dk from the softmax's two terms, P * dP and -P * rowsum(P * dP), and dv = P^T @ dout."""
    dout, q, k, v = args
    P = causal_probs(q, k)  # (B, H, S, S)
    dP = dout @ np.swapaxes(v, -1, -2)  # (B, H, S, S)
    return softmax_terms(P, dP, q, k, dout)


def _attention_probes(rng: np.random.Generator) -> list[Case]:
    """A gradient at query 0 only: every key and value after position 0 must get exactly 0."""
    q, k, v = (randn(rng, (1, 2, 5, 4)) for _ in range(3))  # (B, H, S, hd)
    dout = np.zeros_like(q)
    dout[..., 0, :] = rng.standard_normal((1, 2, 4))
    return [Case("a gradient at query 0 only", (dout, q, k, v), probe=True)]


def _attention_probe_hint(args: tuple, outcome: object) -> str | None:
    dout = args[0]
    if not isinstance(outcome, tuple | list) or len(outcome) != 3:
        return None
    dk, dv = np.asarray(outcome[1], dtype=np.float64), np.asarray(outcome[2], dtype=np.float64)
    if dk.shape != dout.shape or dv.shape != dout.shape:
        return None
    later = max(float(np.max(np.abs(dk[..., 1:, :]))), float(np.max(np.abs(dv[..., 1:, :]))))
    return LEAK if later > 1e-6 * float(np.max(np.abs(dout))) else None


def attention_floor(args: tuple) -> dict[str, float]:
    """The size of the terms of dq, dk and dv, even where the softmax saturates."""
    dout, q, k, v = args[:4]
    root = math.sqrt(q.shape[-1])  # dP sums hd products, the scores divide by sqrt(hd)
    return {"dq": amax(dout, v, k) * root, "dk": amax(dout, v, q) * root, "dv": amax(dout)}


ATTENTION = Spec(
    id="attention_backward",
    reference_name="xenith_edu.attention.causal_attention_backward",
    arg_names=("dout", "q", "k", "v"),
    out_names=("dq", "dk", "dv"),
    kinds=("array",) * 3,
    reference=_attention_reference,
    cases=_attention_cases,
    seed=404,
    summary="float64 and float32, B = 1 to 3 distinct sequences, S = 1 to 12, square S = hd, "
            "scores from near 0 up to ~1.5e3",
    mistakes=_attention_mistakes,
    terms=_attention_terms,
    hints=("Three rows of the duality table, in reverse order of the forward: out = P v and "
           "the scores q k^T are matmuls (each gradient keeps the other factor, transposed, on "
           "its own side); the softmax acts row by row, and its vector-Jacobian product "
           "subtracts from each row of dP its average under the weights P; the masked entries "
           "of P are 0, so no gradient crosses the mask.",
           "dv = P^T @ dout and dP = dout @ v^T; dscores = P * (dP - sum(P * dP, axis=-1, "
           "keepdims=True)); then dq = dscores @ k and dk = dscores^T @ q, each divided by "
           "sqrt(hd). The masked P is zero above the diagonal, so no gradient crosses the mask.",
           "dq = (P * dP) @ k / sqrt(hd) - (P * rowsum(P * dP)) @ k / sqrt(hd); dk = the same with "
           "the score gradient transposed and q; dv = P^T @ dout"),
    probes=_attention_probes,
    probe_hint=_attention_probe_hint,
    factors=lambda a: {f"sqrt(hd) = {fmt(math.sqrt(a[1].shape[-1]))}":
                       math.sqrt(a[1].shape[-1]), f"S = {a[1].shape[-2]}": float(a[1].shape[-2])},
    floor=attention_floor,
)


def check_attention_backward(fn: Callable) -> CheckResult:
    """`fn(dout, q, k, v)` all (B, H, S, hd) `-> (dq, dk, dv)`, causal attention.

    See the "Causal attention" chapter.
    """
    return check(ATTENTION, fn)


def gqa_backward64(dout, q, k, v, group: str = "repeat", reduce: str = "sum",
                   masked: bool = True) -> dict:
    """Grouped-query attention backward in float64: H query heads share Hkv key/value heads.

    Query head h reads kv head h // (H // Hkv) (consecutive query heads share, as LLaMA's
    repeat_kv); the shared heads' gradients sum over the query heads that read them.
    """
    H, Hkv = q.shape[1], k.shape[1]
    G = H // Hkv  # the group: query heads per key/value head
    expand = (lambda a: np.repeat(a, G, axis=1)) if group == "repeat" else (
        lambda a: np.tile(a, (1, G, 1, 1)))
    ke, ve = expand(k), expand(v)  # (B, H, S, hd)
    full = _attention_with(causal_probs(q, ke, masked), dout, q, ke, ve)
    B, _, S, hd = k.shape

    def fold(d: np.ndarray) -> np.ndarray:  # (B, H, S, hd) -> (B, Hkv, S, hd)
        d = d.reshape(B, Hkv, G, S, hd) if group == "repeat" else \
            np.swapaxes(d.reshape(B, G, Hkv, S, hd), 1, 2)
        return {"sum": d.sum(axis=2), "mean": d.mean(axis=2), "first": d[:, :, 0]}[reduce]

    return {"dq": full["dq"], "dk": fold(full["dk"]), "dv": fold(full["dv"])}


def _gqa_reference(dout, q, k, v) -> tuple:
    out = gqa_backward64(*(np.asarray(a, dtype=np.float64) for a in (dout, q, k, v)))
    return tuple(out[n].astype(q.dtype) for n in ("dq", "dk", "dv"))


def _gqa_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)

    sq = 2 * ints(2, 3)
    plans = [("", 2, ints(2, 3), ints(2, 3), ints(3, 6), np.float64, 2 * ints(1, 3)),
             ("", 1, 2, ints(2, 4), ints(4, 7), np.float32, 2 * ints(1, 3)),
             ("multi-query (one kv head), ", ints(1, 2), 1, ints(2, 4), ints(3, 5), np.float64,
              2 * ints(1, 3)),
             ("S=1 (one position), ", 1, 2, 2, 1, np.float64, 2 * ints(1, 3)),
             (f"S=hd={sq} (square), ", 1, 2, 2, sq, np.float64, sq),
             ("S above hd, ", 2, 1, 2, ints(9, 11), np.float64, 2)]
    cases = []
    for what, B, Hkv, G, S, dtype, hd in plans:
        H = Hkv * G
        q = randn(rng, (B, H, S, hd), dtype)  # (B, H, S, hd)
        k, v = (randn(rng, (B, Hkv, S, hd), dtype) for _ in range(2))  # (B, Hkv, S, hd)
        dout = randn(rng, (B, H, S, hd), dtype)  # (B, H, S, hd)
        cases.append(Case(f"{np.dtype(dtype).name}, {what}B={B}, H={H} query heads, Hkv={Hkv} kv "
                          f"heads, S={S}, hd={hd}", (dout, q, k, v)))
    return cases + magnitudes(rng, cases[0], 0, "dout")


def _gqa_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    dout, q, k, v = args
    G = q.shape[1] // k.shape[1]

    def kv(**kw) -> dict:
        out = gqa_backward64(dout, q, k, v, **kw)
        return {"dk": out["dk"], "dv": out["dv"]}

    return [
        ("dk and dv keep only one query head's gradient: each kv head is read by "
         f"H // Hkv = {G} query heads, so its gradient sums over all of them.",
         lambda: kv(reduce="first")),
        (f"dk and dv are averaged over the {G} query heads that share a kv head: a variable "
         "used several times gets the sum of its gradients.", lambda: kv(reduce="mean")),
        ("the query heads are grouped the wrong way: query head h reads kv head h // (H // Hkv) "
         "(consecutive heads share, np.repeat), not h % Hkv (np.tile).",
         lambda: gqa_backward64(dout, q, k, v, group="tile")),
        (LEAK, lambda: gqa_backward64(dout, q, k, v, masked=False)),
    ]


GQA = Spec(
    id="gqa_backward",
    reference_name="the grouped-query attention backward",
    arg_names=("dout", "q", "k", "v"),
    out_names=("dq", "dk", "dv"),
    kinds=("array",) * 3,
    reference=_gqa_reference,
    cases=_gqa_cases,
    seed=406,
    summary="float64 and float32, 2 to 4 query heads per kv head, multi-query, one position, "
            "square S = hd, S above hd, dout from 1e-3 to 1e2",
    mistakes=_gqa_mistakes,
    floor=lambda a: {"dq": amax(a[0], a[3], a[2]) * math.sqrt(a[1].shape[-1]),
                     "dk": amax(a[0], a[3], a[1]) * math.sqrt(a[1].shape[-1]) * a[1].shape[1],
                     "dv": amax(a[0]) * a[1].shape[1]},
    shape_hints={n: "One gradient per kv head: (B, Hkv, S, hd), summed over the query heads that "
                    "share it." for n in ("dk", "dv")},
)


def check_gqa_backward(fn: Callable) -> CheckResult:
    """`fn(dout (B,H,S,hd), q (B,H,S,hd), k (B,Hkv,S,hd), v (B,Hkv,S,hd)) -> (dq, dk, dv)`.

    Causal grouped-query attention: query head h attends with kv head h // (H // Hkv).
    See the "Causal attention" chapter.
    """
    return check(GQA, fn)


def buggy_attention_backward(dout: np.ndarray, q: np.ndarray, k: np.ndarray,
                             v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A complete causal attention backward with one planted bug, for the learner to find."""
    S, hd = q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(hd)
    scores = q @ np.swapaxes(k, -1, -2) * scale  # (B, H, S, S)
    scores = np.where(np.triu(np.ones((S, S), dtype=bool), k=1), -np.inf, scores)
    P = np.exp(scores - scores.max(axis=-1, keepdims=True))
    P = P / P.sum(axis=-1, keepdims=True)  # (B, H, S, S)
    dv = np.swapaxes(P, -1, -2) @ dout  # out = P @ v
    dP = dout @ np.swapaxes(v, -1, -2)  # (B, H, S, S)
    dscores = P * (dP - np.sum(P * dP, axis=-2, keepdims=True))  # P = softmax(scores)
    dq = dscores @ k * scale  # scores = q @ k^T * scale
    dk = np.swapaxes(dscores, -1, -2) @ q * scale
    return dq, dk, dv


def _bug_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    return [("this is still what the given code computes: its bug is not fixed yet (dv is "
             "right there; follow dq and dk back to what they share).",
             lambda: dict(zip(("dq", "dk", "dv"), buggy_attention_backward(*args),
                              strict=True)))] + _attention_mistakes(args, exp)


# the same inputs and judge as the attention backward, with the planted bug among the mistakes
ATTENTION_BUG = replace(ATTENTION, id="attention_find_the_bug", seed=407,
                        mistakes=_bug_mistakes, factors=None)


def check_attention_find_the_bug(fn: Callable) -> CheckResult:
    """`fn(dout, q, k, v) -> (dq, dk, dv)`: your fix of `buggy_attention_backward`.

    The verdict says which gradient is still wrong. See the "Causal attention" chapter.
    """
    return check(ATTENTION_BUG, fn)


# ----------------------------------------------------------------------------------------------
# The cache the mask leaves: q, k, v in full and the weights' lower triangle, packed.


def cache_bytes(B: int, H: int, S: int, hd: int, itemsize: int) -> int:
    """Bytes of one layer's attention cache with P packed: B H (3 S hd + S (S + 1) / 2)."""
    return B * H * (3 * S * hd + S * (S + 1) // 2) * itemsize


def _cache_wrong(B: int, H: int, S: int, hd: int, i: int) -> list[tuple[str, int]]:
    tri, qkv = S * (S + 1) // 2, 3 * S * hd  # per head: P's kept entries, q, k and v
    n = B * H * (qkv + tri)  # numbers kept
    return [
        ("that keeps the full S x S matrix: the mask leaves row i only the keys j <= i, "
         "S (S + 1) / 2 entries per head, not S**2.", B * H * (qkv + S * S) * i),
        ("the diagonal is left out: row i keeps the keys 0 to i, i + 1 of them (the diagonal is "
         "never masked), so S (S + 1) / 2 per head, not S (S - 1) / 2.",
         B * H * (qkv + S * (S - 1) // 2) * i),
        ("S**2 / 2 is not the triangle: with its diagonal it is S (S + 1) / 2 = S**2 / 2 + S / 2.",
         B * H * (qkv + S * S // 2) * i),
        ("q, k and v are missing: the backward reads them too (dq needs k, dk needs q, dP needs "
         "v), 3 S hd numbers per head.", B * H * tri * i),
        ("the weights are missing: the backward reads P (dv = P^T dO, dZ needs P).",
         B * H * qkv * i),
        ("that counts numbers, not bytes: multiply by itemsize.", n),
        ("that counts bits, not bytes.", 8 * n * i),
        ("the batch is missing: every sequence keeps its own q, k, v and weights (B).",
         H * (qkv + tri) * i),
        ("the heads are missing: every head keeps its own slices and weights (H).",
         B * (qkv + tri) * i),
        ("q, k, v are counted at the model width d = H hd per head: one head's slice is hd "
         "wide, so B H S hd numbers each.", B * H * (3 * S * H * hd + tri) * i),
    ]


def _cache_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    return [(text, lambda value=value: {"bytes": value})
            for text, value in _cache_wrong(*(int(a) for a in args))]


def _cache_terms(args: tuple) -> dict[str, list[Term]]:
    """bytes = 3 B H S hd itemsize (q, k, v) + B H S (S + 1) / 2 itemsize (P's triangle)."""
    B, H, S, hd, i = (float(a) for a in args)
    shared = (("B", B), ("H", H))
    return {"bytes": [
        term("3 B H S hd itemsize (q, k, v)", ("3", 3.0), *shared, ("S hd", S * hd),
             ("itemsize", i), slips=(("two of q, k, v are counted, not three",
                                      2 * B * H * S * hd * i),)),
        term("B H S (S + 1) / 2 itemsize (the weights' triangle)", *shared,
             ("S (S + 1)", S * (S + 1)), ("1 / 2", 0.5), ("itemsize", i),
             slips=(("the full S x S matrix is counted, not its triangle", B * H * S * S * i),
                    ("the diagonal is left out, S (S - 1) / 2", B * H * S * (S - 1) / 2 * i))),
    ]}


def _cache_sizes(rng: np.random.Generator, S_lo: int, S_hi: int, hds: list[int],
                 itemsize: int) -> tuple:
    """(B, H, S, hd, itemsize) on which the reference and every mistake give different numbers,
    and no two of the factors a mistake can leave out or confuse (2, 3, B, H, itemsize) agree."""
    ints = int_sampler(rng)
    while True:
        B, H, S, hd = ints(2, 9), ints(3, 16), ints(S_lo, S_hi), int(rng.choice(hds))
        values = [cache_bytes(B, H, S, hd, itemsize)]
        values += [v for _, v in _cache_wrong(B, H, S, hd, itemsize)]
        if len({2, 3, B, H, itemsize}) == 5 and len(set(values)) == len(values):
            return B, H, S, hd, itemsize


def _cache_cases(rng: np.random.Generator) -> list[Case]:
    plans = [("a short context", 5, 15, [8, 16], 8), ("S below hd", 9, 31, [64, 128], 4),
             ("near the book's context", 48, 300, [16, 32], 4),
             ("a long context", 1000, 5000, [128], 8)]
    cases = []
    for what, lo, hi, hds, itemsize in plans:
        B, H, S, hd, i = _cache_sizes(rng, lo, hi, hds, itemsize)
        cases.append(Case(f"{what}: B={B}, H={H}, S={S}, hd={hd}, itemsize={i}",
                          (B, H, S, hd, i)))
    B, H, _, hd, i = _cache_sizes(rng, 5, 15, [4, 8], 4)
    cases.append(Case(f"one position: B={B}, H={H}, S=1, hd={hd}, itemsize={i}", (B, H, 1, hd, i)))
    return cases


CACHE = Spec(
    id="attention_cache_bytes",
    reference_name="B * H * (3 * S * hd + S * (S + 1) // 2) * itemsize",
    arg_names=("B", "H", "S", "hd", "itemsize"),
    out_names=("bytes",),
    kinds=("int",),
    reference=lambda B, H, S, hd, itemsize: (cache_bytes(B, H, S, hd, itemsize),),
    cases=_cache_cases,
    seed=408,
    summary="S = 1 to 5000, S below and above hd, itemsize 4 and 8",
    single=True,
    mistakes=_cache_mistakes,
    terms=_cache_terms,
    factors=lambda a: {"itemsize": float(a[4])},
    hints=("The backward reads the cache (q, k, v, P). Under the causal mask, row i of P is "
           "nonzero only at the keys j <= i, and the diagonal is never masked.",
           "Per head, q, k and v hold 3 * S * hd numbers and P's lower triangle holds "
           "1 + 2 + ... + S of them; there are B * H heads, and each number has itemsize bytes.",
           "bytes = B * H * (3 * S * hd + S * (S + 1) // 2) * itemsize"),
)


def check_attention_cache_bytes(fn: Callable) -> CheckResult:
    """`fn(B, H, S, hd, itemsize) -> int`, bytes of one layer's attention cache: q, k, v in
    full and the weights' lower triangle (the diagonal included), packed.

    See the "Causal attention" chapter.
    """
    return check(CACHE, fn)


SPECS = [ATTENTION, CACHE, GQA, ATTENTION_BUG]

__all__ = ["check_attention_backward", "check_attention_cache_bytes", "check_gqa_backward",
           "check_attention_find_the_bug"]
