"""Freed memory handed back to the operating system between large units of work.

A step that builds a shard of 50,000 request lines, frees it and builds the next one leaves
glibc's heap full of free holes between the few blocks still alive; glibc keeps them for
reuse, so the process's RSS grows shard by shard although its live data does not. At 1M
items that was about 70 MB of the shards step's peak (bench/README.md).
"""

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None


def release_free_memory() -> None:
    """Return the heap's free pages to the operating system (glibc's malloc_trim: tens of
    milliseconds on a large heap, so once per shard, not per chunk). Elsewhere: nothing."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
