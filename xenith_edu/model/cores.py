"""The threads that run a frozen block's parts (`model/parts.py`): one per BLAS thread, each with
one BLAS thread, its products and its element-wise passes on a core of its own.

Why: on two OpenBLAS threads each large product synchronises its threads many times, a thread
that waits for the other spins, and between products NumPy's element-wise passes run on one
core; two Python threads with one BLAS thread each meet once per block. Measured at
Llama-3.2-1B's feed-forward sizes on a loaded 2-core machine: 150 CPU ms against 240.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

_state: dict[str, Any] = {}  # the BLAS controller and the worker threads, made on first use
_lock = threading.Lock()
_local = threading.local()


def _blas() -> Any:
    if "blas" not in _state:
        from threadpoolctl import ThreadpoolController  # here: the model imports with NumPy alone

        _state["blas"] = ThreadpoolController().select(user_api="blas")
    return _state["blas"]


def blas_threads() -> int:
    """The BLAS's threads now: how many parts a block may run as."""
    return max((c.num_threads for c in _blas().lib_controllers), default=1)


def on_threads(calls: Sequence[Callable[[], Any]]) -> list[Any]:
    """Each call on a thread of its own, the first in this one, with one BLAS thread each;
    their results in order. Called from one of these threads (a part that has parts), the
    calls run in turn: a worker never waits for the pool it belongs to.

    The one-thread setting is made and undone by the calling thread: threadpoolctl lets only
    one thread of a process set OpenBLAS's threads (the first that does, usually the main
    one), and other threads' settings do nothing. Parts that another thread runs at the same
    time are as right, but their products may use the BLAS's own threads.
    """
    if getattr(_local, "worker", False):
        return [c() for c in calls]
    with _lock:
        pool = _state.get("pool")
        if pool is None or _state["workers"] < len(calls) - 1:
            workers = max(1, len(calls) - 1)
            pool = _state["pool"] = ThreadPoolExecutor(workers, initializer=_mark)
            _state["workers"] = workers
    with _blas().limit(limits=1):
        others = [pool.submit(c) for c in calls[1:]]
        first = calls[0]()
        return [first] + [f.result() for f in others]


def _mark() -> None:
    _local.worker = True  # a thread of the pool


__all__ = ["blas_threads", "on_threads"]
