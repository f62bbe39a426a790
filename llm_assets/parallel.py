"""Per-item work of a large day spread over worker processes, results in input order.

Rendering, counting and parsing a million items is Python on one core; the ledger and the
files are written by the calling process while workers prepare the next chunks. A day is
worked in the calling process until it passes `inline_rows`, so small days and tests of
everything else never start a process. Workers are spawned (not forked: a Dagster run has
threads of its own) and get the work's context once, pickled. `LLM_ASSETS_WORKERS` sets how
many; 0 works everything in the calling process. The default is one fewer than the machine's
cores: the calling process keeps a core for reading, writing files and the ledger, and each
worker holds its own tokenizer (about 190 MB; see bench/README.md).
"""

import collections
import concurrent.futures
import multiprocessing
import os
import pickle
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

Context = TypeVar("Context")
Chunk = TypeVar("Chunk")
Result = TypeVar("Result")

CHUNK_ROWS = 5_000
"""Rows per task: large enough that pickling is a small part of a task."""
INLINE_ROWS = 50_000
"""Rows worked in the calling process before workers are started."""


def worker_count() -> int:
    configured = os.environ.get("LLM_ASSETS_WORKERS", "").strip()
    if configured:
        try:
            count = int(configured)
        except ValueError:
            raise ValueError(
                f"LLM_ASSETS_WORKERS must be a whole number, got {configured!r}"
            ) from None
        if count < 0:
            raise ValueError(f"LLM_ASSETS_WORKERS must be 0 or more, got {count}")
        return count
    return max((os.cpu_count() or 1) - 1, 0)


def chunked(rows: Iterable[Chunk], size: int | None = None) -> Iterator[list[Chunk]]:
    size = size or CHUNK_ROWS
    batch: list[Chunk] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


_context: Any = None


def _install(pickled: bytes) -> None:
    global _context
    _context = pickle.loads(pickled)


def _call(work: Callable[[Any, Any], Any], chunk: Any) -> Any:
    return work(_context, chunk)


def ordered_map(
    work: Callable[[Context, list[Chunk]], Result],
    context: Context,
    rows: Iterable[Chunk],
    *,
    workers: int | None = None,
) -> Iterator[Result]:
    """`work(context, chunk)` for consecutive chunks of `rows`, yielded in order.

    `work` must be a module-level function and `context` picklable. The first `INLINE_ROWS`
    rows are worked here; after that, chunks go to `workers` processes, with at most two
    chunks per worker waiting, so memory stays bounded however long the input is. An error in
    a worker is raised here, and nothing after it is yielded. A context that does not pickle
    is worked here to the end.
    """
    workers = worker_count() if workers is None else workers
    chunks = chunked(rows)
    done = 0
    for chunk in chunks:
        done += len(chunk)
        yield work(context, chunk)
        if workers > 0 and done >= INLINE_ROWS:
            break
    else:
        return
    try:
        pickled = pickle.dumps(context)
    except (pickle.PicklingError, TypeError, AttributeError):
        # Work that cannot travel (a provider that encodes each line itself) stays here.
        for chunk in chunks:
            yield work(context, chunk)
        return
    pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_install,
        initargs=(pickled,),
    )
    pending: collections.deque[concurrent.futures.Future[Result]] = collections.deque()
    try:
        for chunk in chunks:
            pending.append(pool.submit(_call, work, chunk))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
