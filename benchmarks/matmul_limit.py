"""The machine's own limit for a step: its matrix products alone, and the BLAS kernel in use.

`record` runs a function once with `np.matmul` watched, and notes each call's operands (shape,
strides, dtype) thread by thread; `replay_ms` times those products alone, in fresh arrays of the
same layout, in as many threads as recorded them (one BLAS thread each when there are several,
as the trainer runs). A step can be no faster than its products: the step's time divided by the
replay's is how far the rest (element-wise passes, Python) keeps it from that limit.
Run alone: python benchmarks/matmul_limit.py  (the BLAS in use and a large product's GFLOP/s)
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from threadpoolctl import ThreadpoolController, threadpool_info

KERNEL_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")  # what forces OpenBLAS's kernel


class Operand(NamedTuple):
    """One operand of a recorded product: enough to make an array of the same layout."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype


class Product(NamedTuple):
    """One recorded `np.matmul(a, b, out=out)` call."""

    a: Operand
    b: Operand
    out: Operand | None
    flops: int  # 2 per multiply-add


def blas() -> dict:
    """The BLAS library NumPy uses: its internal API, kernel (core name), version, threads,
    and the kernel variables the environment sets (None where unset)."""
    info = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    lib = info[0] if info else {}
    return {"internal_api": lib.get("internal_api"), "kernel": lib.get("architecture"),
            "version": lib.get("version"), "num_threads": lib.get("num_threads"),
            **{k: os.environ.get(k) for k in KERNEL_VARS}}


def _operand(a: np.ndarray) -> Operand:
    return Operand(a.shape, a.strides, a.dtype)


def _flops(a: np.ndarray, b: np.ndarray) -> int:
    m = a.shape[-2] if a.ndim > 1 else 1
    n = b.shape[-1] if b.ndim > 1 else 1
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return 2 * int(np.prod(batch, dtype=np.int64)) * m * a.shape[-1] * n


def record(fn: Callable[[], object]) -> list[list[Product]]:
    """Run `fn()` once with `np.matmul` watched: the products each thread computed, in order
    (the calling thread's first). Products written with the `@` operator are not seen."""
    calls: dict[int, list[Product]] = defaultdict(list)
    main = threading.get_ident()
    matmul = np.matmul

    def watched(a, b, *args, out=None, **kwargs):
        a_, b_ = np.asarray(a), np.asarray(b)
        calls[threading.get_ident()].append(Product(
            _operand(a_), _operand(b_), None if out is None else _operand(out), _flops(a_, b_)))
        return matmul(a, b, *args, out=out, **kwargs)

    np.matmul = watched
    try:
        fn()
    finally:
        np.matmul = matmul
    return [calls[main]] + [v for k, v in calls.items() if k != main]


def _array(op: Operand, rng: np.random.Generator) -> np.ndarray:
    """A new array of op's shape, strides and dtype (a view of a buffer just large enough)."""
    if any(s < 0 for s in op.strides):
        return rng.standard_normal(op.shape).astype(op.dtype)
    span = sum((n - 1) * s for n, s in zip(op.shape, op.strides, strict=True)) if all(op.shape) \
        else 0
    base = (0.1 * rng.standard_normal(span // op.dtype.itemsize + 1)).astype(op.dtype)
    return np.lib.stride_tricks.as_strided(base, op.shape, op.strides)


def _operands(products: list[Product], rng: np.random.Generator) -> list[tuple]:
    """Arrays for each product; one set per (role, layout), as a step reuses its workspace."""
    made: dict[tuple, np.ndarray] = {}

    def get(role: str, op: Operand | None) -> np.ndarray | None:
        if op is None:
            return None
        key = (role, op)
        if key not in made:
            made[key] = _array(op, rng)
        return made[key]

    return [(get("a", p.a), get("b", p.b), get("out", p.out)) for p in products]


def replay_ms(per_thread: list[list[Product]], repeats: int = 15, warmup: int = 3,
              clock: Callable[[], float] = time.perf_counter) -> float:
    """Median ms (wall, or the process's CPU time with clock=time.process_time) of running every
    recorded product once, each thread's list in a thread of its own (started together); with
    several threads, one BLAS thread each."""
    rng = np.random.default_rng(0)
    work = [_operands(p, rng) for p in per_thread]

    def run(items: list[tuple]) -> None:
        for a, b, out in items:
            np.matmul(a, b, out=out)

    if len(work) == 1:
        times = []
        for i in range(warmup + repeats):
            t0 = clock()
            run(work[0])
            if i >= warmup:
                times.append(clock() - t0)
        return 1e3 * statistics.median(times)
    n = len(work)
    start, done = threading.Barrier(n), threading.Barrier(n)
    times: list[float] = []

    def worker(k: int) -> None:
        for i in range(warmup + repeats):
            start.wait()
            t0 = clock()
            run(work[k])
            done.wait()  # the round ends when the slowest thread does
            if k == 0 and i >= warmup:
                times.append(clock() - t0)

    with ThreadpoolController().limit(limits=1, user_api="blas"):
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(1, n)]
        for t in threads:
            t.start()
        worker(0)
        for t in threads:
            t.join()
    return 1e3 * statistics.median(times)


def peak_gflops(n: int = 1024, repeats: int = 10, dtype=np.float32) -> float:
    """GFLOP/s of one large (n, n) @ (n, n) product, the BLAS's best case, default threads."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(dtype) for _ in range(2))
    out = np.empty((n, n), dtype)
    times = []
    for i in range(repeats + 2):
        t0 = time.perf_counter()
        np.matmul(a, b, out=out)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return 2 * n**3 / min(times) / 1e9


if __name__ == "__main__":
    print(blas())
    print(f"float32 (1024, 1024) @ (1024, 1024): {peak_gflops():.0f} GFLOP/s")
