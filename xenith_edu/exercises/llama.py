"""Exercises of the "A real LLaMA" chapter: the loss of a padded batch and its gradient, and a
grouped-query checkpoint's k_proj in the book's layout.

See the "A real LLaMA" chapter; each check names the usual mistakes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..model.hf.layout import pair_rows
from ..softmax_ce import softmax_cross_entropy
from .engine import check
from .kit import amax, int_sampler, randn, softmax64
from .types import Case, CheckResult, Mistake, Spec

# Shape legend: N positions, V vocab, M the positions that count (target != ignore_index);
# d width, H query heads, Hkv key/value heads, hd = d // H head width.


# -- the padded cross-entropy: a derivation ---------------------------------------------------

def _padded_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)
    cases = []
    n_eq = ints(5, 9)  # N = V: a row sum broadcast along the wrong axis fits the shapes
    big = float(rng.uniform(750, 850))  # exp overflows past ~709 without the max subtracted
    for what, N, V, dtype, ignore, n_pad, scale, shift in (
            ("", ints(6, 10), ints(9, 12), np.float64, "pad", 3, 2.0, 0.0),
            ("N = V, ", n_eq, n_eq, np.float32, "pad", 2, 2.0, 0.0),
            ("ignore_index = -100 (outside the vocabulary), small logits, ", ints(5, 9),
             ints(4, 8), np.float64, -100, 2, 0.02, 0.0),
            ("no padding, large logits, ", ints(3, 6), ints(4, 8), np.float64, "pad", 0, 5.0,
             big),
            ("one position counts, two tokens, ", ints(4, 7), 2, np.float64, "pad", -1, 2.0,
             0.0)):
        logits = randn(rng, (N, V), dtype, scale) + dtype(shift)  # (N, V)
        ignore_index = int(rng.integers(0, V)) if ignore == "pad" else ignore
        targets = rng.integers(0, V, size=N)  # (N,)
        targets[targets == ignore_index] = (ignore_index + 1) % V  # padding only where placed
        n_pad = N - 1 if n_pad < 0 else n_pad
        targets[rng.choice(N, size=n_pad, replace=False)] = ignore_index
        label = f"{np.dtype(dtype).name}, {what}N={N}, V={V}, {n_pad} padded"
        cases.append(Case(label, (logits, targets, ignore_index)))
    return cases


def _padded_reference(logits: np.ndarray, targets: np.ndarray, ignore_index: int) -> tuple:
    return softmax_cross_entropy(logits, targets, ignore_index)


def _padded_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    logits, targets, ignore = args
    N, V = logits.shape
    keep = targets != ignore  # (N,)
    M = int(keep.sum())
    p = softmax64(logits)  # (N, V)
    safe = np.where(keep, targets, 0)
    onehot = np.eye(V)[safe] * keep[:, None]  # (N, V), zero rows where ignored
    nll = -np.log(p[np.arange(N), safe])  # (N,)
    loss, dl = exp["loss"], exp["dlogits"]
    unmasked = (p - onehot) / M  # the ignored rows keep their softmax
    return [
        (f"dlogits is divided by N = {N}, the positions, not by M = {M}, those that count: "
         "the mean is over the counted positions only.", lambda: {"dlogits": dl * M / N}),
        (f"the loss is averaged over all N = {N} positions, not over the M = {M} that count.",
         lambda: {"loss": float(nll[keep].sum() / N)}),
        ("the ignored rows of dlogits are not zero: a padded position contributes nothing, "
         "so its whole row of the gradient is 0, softmax included.",
         lambda: {"dlogits": np.where(keep[:, None], dl, unmasked)}),
        ("the padded positions are counted in the loss: leave them out of the sum and of M.",
         lambda: {"loss": float(nll.mean())}),
        ("sign flipped: dlogits = (softmax - onehot) / M on the counted rows.",
         lambda: {"dlogits": -dl}),
        (f"dlogits is M = {M} times too large: the 1/M of the mean is missing.",
         lambda: {"dlogits": dl * M}),
        ("the loss is summed, not averaged over the counted positions.",
         lambda: {"loss": loss * M}),
    ]


PADDED = Spec(
    id="padded_cross_entropy",
    reference_name="xenith_edu.softmax_ce.softmax_cross_entropy(logits, targets, ignore_index)",
    arg_names=("logits", "targets", "ignore_index"),
    out_names=("loss", "dlogits"),
    kinds=("float", "array"),
    reference=_padded_reference,
    cases=_padded_cases,
    seed=2701,
    summary="float64 and float32, a pad id inside the vocabulary and -100 outside it, no "
            "padding, one counted position",
    mistakes=_padded_mistakes,
    factors=lambda a: {f"N = {a[0].shape[0]}": float(a[0].shape[0]),
                       f"M = {int((a[1] != a[2]).sum())}": float((a[1] != a[2]).sum())},
    floor=lambda a: {"loss": 1.0 + float(np.max(np.abs(a[0]))), "dlogits": 1.0},
)


def check_padded_cross_entropy(fn: Callable) -> CheckResult:
    """`fn(logits (N, V), targets (N,), ignore_index) -> (loss, dlogits (N, V))`: the mean over
    the positions whose target is not `ignore_index`, and its gradient.

    See the "A real LLaMA" chapter.
    """
    return check(PADDED, fn)


# -- a grouped-query checkpoint's k_proj ------------------------------------------------------

def wk_from_hf(weight: np.ndarray, n_head: int, n_kv_head: int) -> np.ndarray:
    """Our W_k (d, Hkv*hd) from a rotate-half checkpoint's k_proj weight (Hkv*hd, d)."""
    hd = weight.shape[1] // n_head
    return weight[pair_rows(n_kv_head, hd)].T


def _wk_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)
    cases = []
    for what, H, hkv, hd, dtype in (("", 6, 2, 2 * ints(3, 4), np.float64),
                                    ("", 4, 2, 2 * ints(2, 4), np.float32),
                                    ("one key/value head, ", 4, 1, 6, np.float64),
                                    ("no grouping (Hkv = H), ", 3, 3, 8, np.float64)):
        weight = randn(rng, (hkv * hd, H * hd), dtype)  # (Hkv*hd, d) nn.Linear's (out, in)
        cases.append(Case(f"{np.dtype(dtype).name}, {what}n_head={H}, n_kv_head={hkv}, "
                          f"hd={hd}", (weight, H, hkv)))
    return cases


def _wk_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    weight, H, hkv = args
    rows, d = weight.shape
    hd = d // H

    def moved(order: np.ndarray) -> Callable[[], dict]:
        return lambda: {"wk": weight[order].T}

    table = [
        ("the rows are still in rotate-half order: within each key/value head, our pair i is "
         "(2i, 2i+1), rotate-half's is (i, i + hd/2).", moved(np.arange(rows))),
        ("the result is in nn.Linear's (out, in) layout: our W_k is (in, out), the transpose.",
         lambda: {"wk": weight[pair_rows(hkv, hd)]}),
        ("the permutation treats all the rows as one head: reorder within each key/value "
         "head of width hd.", moved(pair_rows(1, rows))),
    ]
    return table


WK = Spec(
    id="wk_from_hf",
    reference_name="xenith_edu.exercises.llama.wk_from_hf",
    arg_names=("weight", "n_head", "n_kv_head"),
    out_names=("wk",),
    kinds=("array",),
    reference=lambda weight, n_head, n_kv_head: (wk_from_hf(weight, n_head, n_kv_head),),
    cases=_wk_cases,
    seed=2702,
    summary="float64 and float32, 1 to 3 key/value heads for 3 to 6 query heads",
    single=True,
    mistakes=_wk_mistakes,
    floor=lambda a: {"wk": amax(a[0])},
    shape_hints={"wk": "W_k is (d, n_kv_head * hd): the checkpoint's k_proj, transposed."},
    dtype_hint="A conversion keeps the checkpoint's dtype: index and transpose, do not cast.",
)


def check_wk_from_hf(fn: Callable) -> CheckResult:
    """`fn(weight (Hkv*hd, d) k_proj, rotate-half; n_head; n_kv_head) -> wk (d, Hkv*hd)`.

    See the "A real LLaMA" chapter.
    """
    return check(WK, fn)


SPECS = [PADDED, WK]

__all__ = ["check_padded_cross_entropy", "check_wk_from_hf"]
