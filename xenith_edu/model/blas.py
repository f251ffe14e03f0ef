"""One BLAS thread for the small products (attention's, the LoRA adapters' thin ones), whatever
the process's setting. The large products (projections, SwiGLU, the head) keep every thread.

Why: attention makes one product per key/value head and query block, (G*S, hd) by (hd, S) at
the sizes of a real model (S = 256, hd = 64: 8 to 33 MFLOP each). OpenBLAS threads every
product above 2**18 multiply-adds, and on two threads each of these waits for both at its end:
at Llama-3.2-1B's shape the attention took 0.31 CPU seconds a layer on two threads against
0.035 on one (forward and backward, measured on a shared 2-core machine), more than the
layer's large products gained. A LoRA adapter's thin products ((N, n) by (n, r), r = 16) are
worse: 0.21 CPU seconds a step at two layers on two threads, 0.008 on one.
benchmarks/README.md has the figures.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

# Shape legend: a product of (m, k) by (k, n).

SMALL = 2 ** 18  # multiply-adds: OpenBLAS threads no product below this (its own threshold)
_controller: list[Any] = []  # threadpoolctl's controller, made once, on first use (it scans
# the libraries; imported there too, so that importing the model needs NumPy alone)


@contextmanager
def _one_thread() -> Iterator[None]:
    if not _controller:
        from threadpoolctl import ThreadpoolController  # here: the model imports with NumPy

        _controller.append(ThreadpoolController())
    with _controller[0].limit(limits=1, user_api="blas"):  # restored on leaving, even on error
        yield


def one_blas_thread(m: int, k: int, n: int) -> AbstractContextManager[None]:
    """A context in which the BLAS runs on one thread, for products of (m, k) by (k, n) (the
    largest the context makes); a context that changes nothing when they are too small for the
    BLAS to thread anyway (decoding's, the book model's: no call to the library at all)."""
    if m * k * n <= SMALL:
        return nullcontext()
    return _one_thread()


__all__ = ["SMALL", "one_blas_thread"]
