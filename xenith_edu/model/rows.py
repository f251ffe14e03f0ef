"""A block whose rows are independent, run on row shards: one thread per BLAS thread, each with
one BLAS thread, its products and its element-wise passes on a core of its own.

Which blocks: a frozen layer's feed-forward block (LoRA): rmsnorm and SwiGLU are row by row,
and with the weights frozen the backward sums nothing over rows but the gains' gradients (added
here). Why: on two OpenBLAS threads each large product synchronises its threads many times, and
on a shared machine a thread that waits for the other spins; two Python threads with one BLAS
thread each meet once per block. Measured at Llama-3.2-1B's SwiGLU sizes, (256, 2048) by (2048,
8192) and back, on a loaded 2-core machine: 150 CPU ms against 240, wall time no longer.
Also, NumPy's element-wise passes run on one core; here each shard's run on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from ..tools.workspace import empty

# Shape legend: N rows (positions), d width; a shard is rows [lo, hi).

MIN_ROWS = 32  # rows per shard at least: below, a product is too small to gain from a thread
_state: dict[str, Any] = {}  # the BLAS controller and the worker threads, made on first use


class Sharded(NamedTuple):
    """What the backward of a block run on row shards needs: each shard's rows and cache."""

    bounds: tuple[tuple[int, int], ...]  # the rows [lo, hi) of each shard, in order
    caches: tuple[Any, ...]  # each shard's cache, as the block's forward made it


def _blas() -> Any:
    if "blas" not in _state:
        from threadpoolctl import ThreadpoolController  # here: the model imports with NumPy alone

        _state["blas"] = ThreadpoolController().select(user_api="blas")
    return _state["blas"]


def row_shards(n: int) -> tuple[tuple[int, int], ...] | None:
    """The shards of n rows: as many as the BLAS has threads now, of at least MIN_ROWS rows
    each; None when that is one (one BLAS thread already: the trainer's threads, a small
    batch), and the block runs as it is."""
    threads = max((c.num_threads for c in _blas().lib_controllers), default=1)
    k = min(threads, n // MIN_ROWS)
    if k < 2:
        return None
    edges = [n * i // k for i in range(k + 1)]
    return tuple(zip(edges[:-1], edges[1:], strict=True))


def _run(calls: list[Callable[[], Any]]) -> list[Any]:
    """Each call on a thread of its own, the first in this one, with one BLAS thread each."""
    pool = _state.get("pool")
    if pool is None or _state["workers"] < len(calls) - 1:
        pool = _state["pool"] = ThreadPoolExecutor(len(calls) - 1)
        _state["workers"] = len(calls) - 1
    with _blas().limit(limits=1):
        others = [pool.submit(c) for c in calls[1:]]
        first = calls[0]()
        return [first] + [f.result() for f in others]


def forward_rows(block: Callable[..., tuple[np.ndarray, Any]], x: np.ndarray,
                 bounds: tuple[tuple[int, int], ...], *args: Any) -> tuple[np.ndarray, Sharded]:
    """`block(x, *args) -> (out, cache)` on each shard of x (N, d)'s rows; out (N, d_out)
    gathers the shards' outputs in order."""
    parts = _run([partial(block, x[lo:hi], *args) for lo, hi in bounds])
    first = parts[0][0]
    out = empty((x.shape[0], *first.shape[1:]), first.dtype)  # (N, d_out)
    for (lo, hi), (o, _) in zip(bounds, parts, strict=True):
        out[lo:hi] = o
    return out, Sharded(bounds, tuple(c for _, c in parts))


def backward_rows(block_backward: Callable[..., tuple[np.ndarray, dict[str, np.ndarray]]],
                  dout: np.ndarray, cache: Sharded) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The block's backward on each shard: dx (N, d) gathered in order, and the gradients
    summed over the shards (each shard's sums its own rows)."""
    parts = _run([partial(block_backward, dout[lo:hi], c)
                  for (lo, hi), c in zip(cache.bounds, cache.caches, strict=True)])
    first = parts[0][0]
    dx = empty((dout.shape[0], *first.shape[1:]), first.dtype)  # (N, d)
    grads = {k: g.copy() for k, g in parts[0][1].items()}
    for (lo, hi), (d, _) in zip(cache.bounds, parts, strict=True):
        dx[lo:hi] = d
    for _, g in parts[1:]:
        for k, v in g.items():
            grads[k] += v
    return dx, grads


__all__ = ["MIN_ROWS", "Sharded", "backward_rows", "forward_rows", "row_shards"]
