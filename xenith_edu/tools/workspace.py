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

Its limits: arrays of at most `_SMALL` elements come from np.empty (malloc reuses those without
page faults). A step whose arrays outgrow the limit (a real model's) fills the workspace; a
full workspace gives a backward's released caches back (`give_back`, `return_freed`), so that
their memory serves the gradients instead of waiting for the next step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
from numpy.typing import DTypeLike

_LIMIT_BYTES = 512 * 2**20  # beyond this the workspace stops keeping new arrays
_SMALL = 8192  # elements (64 KiB at most): `empty` makes arrays this small with np.empty. glibc
# serves blocks below its mmap threshold (128 KiB) from its own free lists, with no page fault,
# and searching the workspace costs more than that (decoding asks for hundreds per token)


def _free_index(arrays: list[np.ndarray], start: int, free_refs: int) -> int:
    """The index of the first array, from `start` on and wrapping around, that nothing but the
    list refers to; -1 if every one is in use. A step asks for its arrays in the same order
    every time, so the search starting after the last one handed out usually stops at once."""
    n = len(arrays)
    start = start % n if n else 0  # a hint: the list may have shrunk since it was set
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

    def __init__(self, limit_bytes: int | None = None) -> None:
        self._lock = threading.Lock()  # `give_back` may come from another thread (see below)
        self._arrays: dict[tuple, list[np.ndarray]] = {}
        self._next: dict[int, int] = {}  # where the next search starts, per list (by its id)
        self.nbytes = 0  # bytes held, free or in use
        self.limit_bytes = _LIMIT_BYTES if limit_bytes is None else limit_bytes
        self._used: set[int] = set()  # the arrays handed out inside `keeping_all`, by id
        self.full = False  # whether it has declined to keep an array (the limit reached)

    def empty(self, shape: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
        with self._lock:
            return self._empty(shape, dtype)

    def _empty(self, shape: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
        if type(shape) is not tuple:
            shape = tuple(shape)
        key = (shape, dtype)  # as the caller spells it: a step asks with the same spelling
        arrays = self._arrays.get(key)
        if arrays is None:  # first ask with this spelling: np.float32 and dtype("float32") meet
            arrays = self._arrays.setdefault((shape, np.dtype(dtype)), [])
            self._arrays[key] = arrays
        i = _free_index(arrays, self._next.get(id(arrays), 0), _FREE_REFS)  # nobody holds it
        keep_all = _keeping[0] > 0
        if i >= 0:
            self._next[id(arrays)] = i + 1 if i + 1 < len(arrays) else 0
            if keep_all:
                self._used.add(id(arrays[i]))
            return arrays[i]
        a = np.empty(shape, dtype)
        if keep_all or self.nbytes + a.nbytes <= self.limit_bytes:
            arrays.append(a)
            self.nbytes += a.nbytes
            if keep_all:
                self._used.add(id(a))
        else:
            self.full = True
        return a

    def keep_used(self) -> None:
        """Forget every array that was not handed out since `keeping_all` began (another
        call's shapes); full again if what is kept is above the limit."""
        with self._lock:
            lists = {id(a): a for a in self._arrays.values()}  # a list may sit under two
            for arrays in lists.values():  # spellings of its dtype: each list once
                kept = [a for a in arrays if id(a) in self._used]
                if len(kept) < len(arrays):
                    self.nbytes -= sum(a.nbytes for a in arrays if id(a) not in self._used)
                    arrays[:] = kept
                    self._next.pop(id(arrays), None)
            self._used.clear()
            self.full = self.nbytes > self.limit_bytes

    def give_back(self, held: object) -> bool:
        """When the workspace is full, stop keeping the arrays that `held` refers to (an array,
        a NamedTuple cache, a list or dict of them, nested): their memory then goes back to the
        system once their holders drop them, and can serve what a full workspace cannot keep.
        Below the limit it keeps them, for the next step. Returns whether it is full: whether
        what `held` refers to may go back to the system (it may hold arrays never kept).
        Inside `keeping_all` it keeps them, full or not."""
        if not self.full or _keeping[0]:
            return False
        with self._lock:
            self._forget(held)
        return True

    def _forget(self, held: object) -> None:
        for a in _roots(held):
            arrays = self._arrays.get((a.shape, a.dtype)) or []
            for i, b in enumerate(arrays):
                if b is a:
                    del arrays[i]
                    self.nbytes -= a.nbytes
                    break

    def clear(self) -> None:
        """Forget every array: the memory goes back once nothing else refers to it."""
        self._arrays.clear()
        self._next.clear()
        self.nbytes = 0
        self.full = False


def _roots(held: object) -> Iterator[np.ndarray]:
    """The arrays that own the memory `held` refers to: each array's, or each view's base."""
    if isinstance(held, np.ndarray):
        while isinstance(held.base, np.ndarray):
            held = held.base
        yield held
    elif isinstance(held, (tuple, list)):
        for h in held:
            yield from _roots(h)
    elif isinstance(held, dict):
        for h in held.values():
            yield from _roots(h)


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None elsewhere: freed blocks inside the heap stay resident until
    it returns their pages (blocks above the mmap threshold go back at once, but glibc raises
    that threshold to the size of the blocks freed, up to 32 MiB)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
        return trim
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def give_back(held: object) -> bool:
    """`give_back` of this thread's workspace and of every other thread's: a cache may hold
    arrays that the threads running a block's parts made (`xenith_edu.model.parts`). Returns
    whether any of them is full. Once the holders have dropped what `held` refers to,
    `return_freed()` hands its pages back to the system."""
    return any([ws.give_back(held) for ws in _spaces()])


def _spaces() -> list[Workspace]:
    """Every thread's workspace: this thread's (even one that a caller set in place of its
    own), then the others'. Makes none: a thread without one has nothing to give back."""
    with _every_lock:
        others = list(_every)
    own = getattr(_local, "ws", None)
    return list({id(ws): ws for ws in ([own] if own is not None else []) + others}.values())


_keeping = [0]  # how many `keeping_all` blocks are running (in any thread)


@contextmanager
def keeping_all() -> Iterator[None]:
    """While the block runs, every thread's workspace keeps every array it makes, whatever its
    limit; when it ends, each forgets the arrays the block did not use, and so holds exactly
    the block's own, for its next run with the same shapes.

    For a step whose backward makes nothing large that its caches' memory could serve (a frozen
    model's, LoRA: only the adapters' small gradients), a limit only costs: its arrays beyond
    the limit are new at every step, a page fault each 4 KiB (Llama-3.2-1B's shape: 180,000
    faults, 0.7 s of a 6 s step), while keeping them costs nothing at the step's peak, where
    they are all alive anyway."""
    with _every_lock:
        _keeping[0] += 1
    try:
        yield
    finally:
        with _every_lock:
            _keeping[0] -= 1
            last = not _keeping[0]
        if last:  # (outside the lock: `_spaces` takes it)
            for ws in _spaces():
                ws.keep_used()


def return_freed() -> None:
    """Return the heap's free pages to the system (glibc; nothing elsewhere)."""
    if _TRIM is not None:
        _TRIM(0)


_local = threading.local()  # one workspace per thread: two threads never share a free array
_every: weakref.WeakSet[Workspace] = weakref.WeakSet()  # each thread's, while it lives
_every_lock = threading.Lock()


def workspace() -> Workspace:
    """This thread's workspace (made on first use)."""
    ws = getattr(_local, "ws", None)
    if ws is None:
        ws = _local.ws = Workspace()
        with _every_lock:
            _every.add(ws)
    return ws


def empty(shape: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
    """An uninitialized array from this thread's workspace, like `np.empty(shape, dtype)`; a
    small one (at most `_SMALL` elements) straight from np.empty."""
    if getattr(_local, "poison", False):
        return _poisoned_array(shape, dtype)
    if math.prod(shape) <= _SMALL:
        return np.empty(shape, dtype)
    ws = getattr(_local, "ws", None) or workspace()
    return ws.empty(shape, dtype)


def empty_like(a: np.ndarray) -> np.ndarray:
    """`empty(a.shape, a.dtype)`."""
    return empty(a.shape, a.dtype)


def _poisoned_array(shape: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
    a = np.empty(shape, dtype)
    a.fill(np.nan if a.dtype.kind in "fc" else 0)
    return a


@contextmanager
def poisoned() -> Iterator[None]:
    """In this thread, while the block runs, every array `empty` hands out is new and holds NaN
    (0 for integers): code that reads an element it never wrote gets NaN, never what the memory
    held before, so its answer is the same on every run (the exercises' mutated references
    run under it: a change that leaves an output unwritten is then NaN, not noise)."""
    before = getattr(_local, "poison", False)
    _local.poison = True
    try:
        yield
    finally:
        _local.poison = before
