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

    A training step allocates and frees many arrays of a megabyte or so; where the workspace
    (`xenith_edu.tools.workspace`) does not reuse them, glibc would map each with mmap and unmap
    it when freed, so the next step pays a page fault per page it touches again. Keeping the
    memory in the heap avoids that, as the caching allocators of deep-learning frameworks do
    (benchmarks/README.md has the measured effect). Returns False where this is not glibc.
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
