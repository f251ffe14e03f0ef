"""Exercises of the chapter on many processes: the global gradient from the shards', and what a
ring all-reduce sends. See the "Many processes" chapter; each check diagnoses the usual slips.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .engine import check
from .kit import amax, magnitudes, randn
from .types import Case, CheckResult, Mistake, Spec

# Shape legend: K ranks (shards), n_r positions of shard r, N = sum of n_r; a gradient has the
# shape of its parameter (any shape), so the K shard gradients stack to (K, ...).


def global_gradient_reference(shard_grads: np.ndarray, shard_sizes: np.ndarray) -> tuple:
    """sum_r n_r g_r / sum_r n_r: the gradient of the mean loss over all N positions."""
    w = np.asarray(shard_sizes, dtype=np.float64)  # (K,)
    g = np.tensordot(w / w.sum(), shard_grads.astype(np.float64), axes=1)  # (...)
    return (g.astype(shard_grads.dtype),)


def _gradient_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    sq = int(rng.integers(9, 11))
    plans = [  # K, equal shards?, dtype, shape of one gradient
        (int(rng.integers(2, 5)), True, np.float64, (int(rng.integers(2, 5)), 3)),
        (int(rng.integers(3, 7)), False, np.float64, (int(rng.integers(3, 7)),)),
        (int(rng.integers(2, 4)), False, np.float32, (2, int(rng.integers(2, 4)), 3)),
        (1, True, np.float64, (4,)),
        (int(rng.integers(2, 4)), False, np.float64, (sq, sq)),  # a square gradient, 9 to 10
    ]
    for K, equal, dtype, shape in plans:
        n = int(rng.integers(8, 65))
        sizes = np.full(K, n) if equal else rng.integers(4, 65, K)
        if not equal and len(set(sizes.tolist())) == 1:
            sizes[0] += 3  # shards of different sizes, as the label says
        grads = randn(rng, (K, *shape), dtype) + float(rng.uniform(0.5, 1.5))  # no zero mean
        what = "equal shards" if equal else "shards of different sizes"
        cases.append(Case(f"{np.dtype(dtype).name}, K={K} {what} of {sizes.tolist()} "
                          f"positions, gradients of shape {shape}",
                          (grads, sizes.astype(np.int64))))
    return cases + magnitudes(rng, cases[0], 0, "grads")


def _gradient_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    grads, sizes = args
    w = sizes.astype(np.float64)
    equal = len(set(sizes.tolist())) == 1
    return [
        ("the shards' gradients are summed: each one is already a mean over its own shard, so "
         "their sum is K times too large. Average them, weighted by the shards' sizes.",
         lambda: {"grad": grads.sum(axis=0)} if len(sizes) > 1 else {}),
        ("the shards' gradients are averaged without weights: a shard with more positions "
         "holds more of the loss's terms. Weight shard r by n_r / sum(n).",
         lambda: {} if equal else {"grad": grads.mean(axis=0)}),
        ("each shard is weighted by its size n_r, but the sum is not divided by the number of "
         "positions sum(n): the gradient of a sum, not of the mean.",
         lambda: {"grad": np.tensordot(w, grads, axes=1)}),
        ("the sum of the shards' gradients is divided by the number of positions: each shard's "
         "gradient is already divided by its own n_r.",
         lambda: {"grad": grads.sum(axis=0) / w.sum()}),
    ]


GLOBAL_GRADIENT = Spec(
    id="global_gradient",
    reference_name="sum_r n_r g_r / sum_r n_r",
    arg_names=("shard_grads", "shard_sizes"),
    out_names=("grad",),
    kinds=("array",),
    reference=global_gradient_reference,
    cases=_gradient_cases,
    seed=1301,
    summary="equal and unequal shards, one shard alone, float32 and float64, a square gradient, "
            "gradients from 1e-3 to 1e2",
    single=True,
    mistakes=_gradient_mistakes,
    floor=lambda a: {"grad": amax(a[0])},
    shape_hints={"grad": "the shape of one shard's gradient: shard_grads[0].shape"},
)


def check_global_gradient(fn: Callable) -> CheckResult:
    """`fn(shard_grads (K, ...), shard_sizes (K,)) -> grad (...)`: the global batch's gradient
    from the gradients of its K shards' mean losses. See the "Many processes" chapter.
    """
    return check(GLOBAL_GRADIENT, fn)


def ring_bytes_reference(n_params: int, itemsize: int, K: int) -> tuple:
    """2 (K-1) messages of one chunk, ceil(n_params / K) numbers, each of itemsize bytes: a
    buffer that K does not divide is padded with zeros to the next multiple of K, so that the
    K chunks are equal, and the padding travels with the rest (the statement says so)."""
    chunk = -(-n_params // K)  # ceil(n_params / K) numbers in each of the K chunks
    return (2 * (K - 1) * chunk * itemsize,)


def _ring_cases(rng: np.random.Generator) -> list[Case]:
    # (n_params, itemsize, K, the remainder n_params % K it is given): most divide, two do
    # not (the padding), one of them leaving a single number over, one K - 1 of them
    sizes = [(813_696, 4, 2, 0), (813_696, 4, 64, 0),
             (int(rng.integers(2, 50)) * 81_369_600, 2, 8, 0),
             (int(rng.integers(1000, 9000)) * 3, 8, 3, 0), (int(rng.integers(10, 99)) * 7, 4, 7, 0),
             (int(rng.integers(100, 999)), 4, 1, 0),
             (int(rng.integers(1000, 9000)) * 5, 4, 5, 1),
             (int(rng.integers(100, 999)) * 6, 2, 6, 5)]
    cases = []
    for n, itemsize, K, rest in sizes:
        n += rest - n % K  # n_params % K == rest
        what = "" if rest == 0 else f" (K does not divide it: {rest} over)"
        cases.append(Case(f"n_params={n:,}{what}, itemsize={itemsize}, K={K}", (n, itemsize, K)))
    return cases


ROUNDED_DOWN = ("the chunks are rounded down: with n_params // K numbers each, the last "
                "n_params % K numbers never travel. The ring pads the buffer to a multiple of K, "
                "so a chunk holds ceil(n_params / K) numbers.")


def _ring_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    n, i, K = args
    base: list[tuple[str, Callable[[int], int | None]]] = [  # (what, chunk -> the answer)
        ("the count is in numbers, not bytes: multiply by the itemsize.",
         lambda c: 2 * (K - 1) * c if i > 1 and K > 1 else None),
        ("this is half the traffic: the reduce-scatter sends (K-1) chunks, and the all-gather "
         "that follows sends (K-1) more.", lambda c: (K - 1) * c * i if K > 1 else None),
        ("each of the 2 (K-1) messages carries one chunk of n_params / K numbers, not the "
         "whole buffer.", lambda c: 2 * (K - 1) * n * i if K > 1 else None),
        ("a ring of K ranks takes K-1 steps per phase, not K: a rank never sends to itself.",
         lambda c: 2 * K * c * i),
    ]
    table: list[Mistake] = [
        (ROUNDED_DOWN,
         lambda: {"bytes": 2 * (K - 1) * (n // K) * i} if n % K else {}),
        ("this is the exact share 2 (K-1) / K of the buffer, rounded: but a message carries "
         "whole chunks, and when K does not divide n_params each is ceil(n_params / K) numbers, "
         "the padding included.", lambda: {"bytes": 2 * (K - 1) * n * i // K} if n % K else {}),
    ]
    # each slip with the padded chunk, and again with the chunk rounded down as well (the
    # same answer where K divides n_params): a learner makes it with either
    for chunk, more in ((-(-n // K), ""), (n // K, " And " + ROUNDED_DOWN)):
        for what, answer in base:
            table.append((what + more, lambda answer=answer, chunk=chunk:
                          {} if answer(chunk) is None else {"bytes": answer(chunk)}))
    return table


RING_BYTES = Spec(
    id="ring_allreduce_bytes",
    reference_name="2 * (K - 1) * ceil(n_params / K) * itemsize",
    arg_names=("n_params", "itemsize", "K"),
    out_names=("bytes",),
    kinds=("int",),
    reference=ring_bytes_reference,
    cases=_ring_cases,
    seed=1302,
    summary="the book model on 2 and 64 ranks, a model of billions, odd K, K = 1, and two "
            "n_params that K does not divide",
    single=True,
    mistakes=_ring_mistakes,
)


def check_ring_allreduce_bytes(fn: Callable) -> CheckResult:
    """`fn(n_params, itemsize, K) -> int`: bytes each rank sends in a ring all-reduce.

    See the "Many processes" chapter.
    """
    return check(RING_BYTES, fn)


SPECS = [GLOBAL_GRADIENT, RING_BYTES]

__all__ = ["check_global_gradient", "check_ring_allreduce_bytes"]
