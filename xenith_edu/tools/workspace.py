"""A workspace of reusable arrays: the training step's memory, kept from one call to the next.
The components take their large outputs and temporaries from it instead of from `np.empty`.

Why: one step of the book model allocates about 50 MB in arrays of 0.1 to 2 MB and frees them
all at its end. With glibc's default settings that memory goes back to the system, and the next
step pays a page fault for each 4 KiB page it touches again (13,000 faults, a third of the
step). Deep-learning frameworks avoid this with a caching allocator; this module is a small one.
It changes nothing outside the arrays it hands out: no process setting, no environment.

How: `empty(shape, dtype)` returns an array of the workspace that nothing else refers to, or a
new one that the workspace then keeps. An array is free when the only references to it are the
workspace's own: as long as a cache, a view or a caller holds it, it is never handed out again.
So reuse is safe without any rule about lifetimes, and the arrays a function returns are the
caller's until the caller drops them.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
from numpy.typing import DTypeLike

_LIMIT_BYTES = 512 * 2**20  # beyond this the workspace stops keeping new arrays


def _free_index(arrays: list[np.ndarray], start: int, free_refs: int) -> int:
    """The index of the first array, from `start` on and wrapping around, that nothing but the
    list refers to; -1 if every one is in use. A step asks for its arrays in the same order
    every time, so the search starting after the last one handed out usually stops at once."""
    n = len(arrays)
    for j in range(n):
        i = start + j - n if start + j >= n else start + j
        if sys.getrefcount(arrays[i]) == free_refs:
            return i
    return -1


def _free_refs() -> int:
    """How many references `_free_index` sees on an array that nothing else holds.

    Measured, not assumed: 2 on CPython 3.10 to 3.13 (the list's and getrefcount's argument),
    and an interpreter that borrows references may count fewer.
    """
    probe = [np.empty(0)]
    for n in range(1, 8):
        if _free_index(probe, 0, n) == 0:
            return n
    raise RuntimeError("cannot tell free arrays from used ones on this interpreter")


_FREE_REFS = _free_refs()


class Workspace:
    """Arrays grouped by (shape, dtype); `empty` reuses a free one or makes and keeps a new one."""

    def __init__(self, limit_bytes: int = _LIMIT_BYTES) -> None:
        self._arrays: dict[tuple, list[np.ndarray]] = {}
        self._next: dict[int, int] = {}  # where the next search starts, per list (by its id)
        self.nbytes = 0  # bytes held, free or in use
        self.limit_bytes = limit_bytes

    def empty(self, shape: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
        if type(shape) is not tuple:
            shape = tuple(shape)
        key = (shape, dtype)  # as the caller spells it: a step asks with the same spelling
        arrays = self._arrays.get(key)
        if arrays is None:  # first ask with this spelling: np.float32 and dtype("float32") meet
            arrays = self._arrays.setdefault((shape, np.dtype(dtype)), [])
            self._arrays[key] = arrays
        i = _free_index(arrays, self._next.get(id(arrays), 0), _FREE_REFS)  # nobody holds it
        if i >= 0:
            self._next[id(arrays)] = i + 1 if i + 1 < len(arrays) else 0
            return arrays[i]
        a = np.empty(shape, dtype)
        if self.nbytes + a.nbytes <= self.limit_bytes:
            arrays.append(a)
            self.nbytes += a.nbytes
        return a

    def clear(self) -> None:
        """Forget every array: the memory goes back once nothing else refers to it."""
        self._arrays.clear()
        self._next.clear()
        self.nbytes = 0


_local = threading.local()  # one workspace per thread: two threads never share a free array


def workspace() -> Workspace:
    """This thread's workspace (made on first use)."""
    ws = getattr(_local, "ws", None)
    if ws is None:
        ws = _local.ws = Workspace()
    return ws


def empty(shape: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
    """An uninitialized array from this thread's workspace, like `np.empty(shape, dtype)`."""
    ws = getattr(_local, "ws", None) or workspace()
    return ws.empty(shape, dtype)


def empty_like(a: np.ndarray) -> np.ndarray:
    """`empty(a.shape, a.dtype)`."""
    return (getattr(_local, "ws", None) or workspace()).empty(a.shape, a.dtype)
