"""Data parallelism inside one process: threads share each batch, one shard of windows each.
The "Many processes" chapter derives why it is exact: the gradient of a mean is the mean of the
shards' means, each weighted by its share of the windows.

Why threads, and why one BLAS thread each. NumPy runs its element-wise work (about half of a
step of the book model) on one core; OpenBLAS threads only the matrix products, and between two
products its idle threads spin, so a second Python thread finds no free core (measured: two
threads splitting the attention were no faster). With one BLAS thread per worker, each of the
workers runs the whole forward and backward of its windows on a core of its own, products and
element-wise work alike. The BLAS limit holds only while `loss_and_grads` runs: nothing else in
the process sees it. benchmarks/README.md has the measured figures.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from threadpoolctl import ThreadpoolController

from ..model import Config, loss_and_grads

# Shape legend: B batch (windows), S positions.

Params = dict[str, np.ndarray]


def shard_bounds(B: int, threads: int) -> list[tuple[int, int]]:
    """The windows [lo, hi) of each of min(threads, B) shards of a batch of B, as even as
    whole windows allow (sizes differ by at most one)."""
    n = min(threads, B)
    edges = [B * i // n for i in range(n + 1)]
    return list(zip(edges[:-1], edges[1:], strict=True))


def check_count(name: str, value: object) -> int:
    """`value` as a count of workers (an int of at least 1), or TypeError/ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return int(value)


def average_shards(bounds: list[tuple[int, int]], B: int,
                   results: list[tuple[float, Params]]) -> tuple[float, Params]:
    """The batch's loss and gradients from its shards' (`bounds`, B windows in all): the mean of
    the shards' means, weighted by their sizes, written into the first shard's arrays."""
    weights = [(hi - lo) / B for lo, hi in bounds]
    loss = sum(w * shard_loss for w, (shard_loss, _) in zip(weights, results, strict=True))
    grads = results[0][1]  # the calling thread's arrays: the sum is written into them
    equal = len(set(weights)) == 1
    for name, g in grads.items():
        if equal:  # shards of one size: sum, then scale once (two passes, not three)
            for _, other in results[1:]:
                g += other[name]
            g *= weights[0]
        else:
            g *= weights[0]
            for w, (_, other) in zip(weights[1:], results[1:], strict=True):
                other[name] *= w  # a worker's array, not needed after this
                g += other[name]
    return float(loss), grads


class ThreadShards:
    """`loss_and_grads` over `threads` threads, each computing the loss and gradients of its
    shard of the batch with one BLAS thread; the calling thread takes the first shard.

    The result is the single-call figure up to rounding (the shards' means are averaged,
    weighted by their sizes), and the same for the same batch every time. `close()` (or a
    `with` block) ends the worker threads; so does dropping the object (the pool's workers
    end when it is collected).
    """

    def __init__(self, threads: int) -> None:
        self.threads = check_count("threads", threads)
        self._pool = ThreadPoolExecutor(self.threads - 1) if self.threads > 1 else None
        self._blas = ThreadpoolController()  # finds the BLAS libraries NumPy loaded

    def loss_and_grads(self, params: Params, cfg: Config, x: np.ndarray, y: np.ndarray,
                       recompute: bool = False) -> tuple[float, Params]:
        """The mean loss and gradients of the batch x, y (B, S), as `model.loss_and_grads`."""

        def grads_fn(params, cfg, x, y):
            return loss_and_grads(params, cfg, x, y, recompute=recompute)

        if self._pool is None or len(x) < 2:
            return grads_fn(params, cfg, x, y)
        bounds = shard_bounds(len(x), self.threads)
        with self._blas.limit(limits=1, user_api="blas"):  # one core per worker, for this call
            others = [self._pool.submit(grads_fn, params, cfg, x[lo:hi], y[lo:hi])
                      for lo, hi in bounds[1:]]
            lo, hi = bounds[0]
            results = [grads_fn(params, cfg, x[lo:hi], y[lo:hi])]  # the first shard, here
            results += [f.result() for f in others]
        return average_shards(bounds, len(x), results)

    def shared(self, params: Params) -> Params:
        """`params` itself: threads read the caller's arrays (see `ProcessShards.shared`)."""
        return params

    def close(self) -> None:
        """End the worker threads; later calls compute in the calling thread alone."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __enter__(self) -> ThreadShards:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["ThreadShards", "average_shards", "check_count", "shard_bounds"]
