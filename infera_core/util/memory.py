"""Give freed heap memory back to the OS (glibc ``malloc_trim``), after a rare big job.

A tokenization of a long text allocates (in Rust and in Python) a hundred megabytes or so
and frees it; glibc keeps the freed pages in the thread's arena, so the process's RSS
stays up as if the memory were still in use. ``trim()`` returns them. Where the C library
is not glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        fn: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return fn


def trim() -> bool:
    """Release free heap pages to the OS; False where ``malloc_trim`` does not exist."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True
