"""Memory work of steps that hold a large day: freed memory handed back to the operating
system between large units of work, and the cyclic garbage collector kept out of the way.

A step that builds a shard of 50,000 request lines, frees it and builds the next one leaves
glibc's heap full of free holes between the few blocks still alive; glibc keeps them for
reuse, so the process's RSS grows shard by shard although its live data does not (tens of
MB of the shards step's peak at a million items).
"""

import contextlib
import ctypes
import ctypes.util
import functools
import gc
from collections.abc import Callable, Iterator


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


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection inside the block; afterwards the collector is as it was.

    The shards step keeps a shard's items alive (tuples and dicts, which the collector
    tracks) while it makes millions of short-lived ones, and every full collection walks all
    the live ones again: at 1M items, in a fresh process as a Dagster step runs, pausing it
    saves this process several CPU seconds of the step (docs/decisions.md).

    What the step frees is freed by reference counting; the few cycles it may leave are
    collected once the block ends. Process-wide: a block in another thread may find the
    collector paused, or running again before it ends, which changes only when cycles go."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
