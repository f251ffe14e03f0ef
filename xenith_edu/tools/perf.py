"""Process-level settings that make the NumPy training step faster, applied on request.

The trainer and the benchmark call `keep_freed_memory()`; importing the package changes nothing.
"""

from __future__ import annotations

import ctypes
import sys

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3


def keep_freed_memory() -> bool:
    """Let glibc keep freed blocks for reuse instead of returning them to the system.

    A training step allocates and frees dozens of arrays of 0.1 to 2 MB. By default glibc
    maps each with mmap and unmaps it when freed, so the next step pays a page fault for
    every 4 KiB page it touches again (measured: about 14,000 faults and a third of the
    step's time on the book config). Keeping the memory in the heap removes them, as the
    caching allocators of deep-learning frameworks do. Returns False where this is not glibc.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, 32 * 1024 * 1024)
        ok &= libc.mallopt(_M_TRIM_THRESHOLD, 1024 * 1024 * 1024)
    except (OSError, AttributeError):
        return False
    return bool(ok)
