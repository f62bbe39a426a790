"""Per-item work of a large day spread over worker processes, results in input order.

Rendering, counting and parsing a million items is Python on one core; the ledger and the
files are written by the calling process while workers work the next chunks. Work is done in
the calling process until `INLINE_ROWS` rows have gone through, so small days and tests of
everything else never start a process. Workers are spawned (not forked: a Dagster run has
threads of its own). `LLM_ASSETS_WORKERS` sets how many; 0 works everything in the calling
process. The default is one fewer than the machine's cores: the calling process keeps a core
for reading, writing files and the ledger, and each worker holds its own tokenizer (a worker
of the shards step is about 125 MB; docs/decisions.md). Chunks and their results go between
the processes in files (in /dev/shm where the system has it) rather than through the pool's
pipe.
"""

import collections
import concurrent.futures
import contextlib
import functools
import itertools
import multiprocessing
import os
import pickle
import shutil
import signal
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple, TypeVar

Context = TypeVar("Context")
Row = TypeVar("Row")
Result = TypeVar("Result")

CHUNK_ROWS = 5_000
"""Rows per task: large enough that pickling is a small part of a task."""
INLINE_ROWS = 50_000
"""Rows worked in the calling process before workers are started."""
QUEUED_PER_WORKER = 6
"""Chunks sent to each worker and not back yet, at most: enough that a worker always has the
next one while this process writes a shard file or works a chunk itself."""


def _configured(name: str) -> int | None:
    """The whole number 0 or more in environment variable `name`; None when it is unset."""
    configured = os.environ.get(name, "").strip()
    if not configured:
        return None
    try:
        count = int(configured)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, got {configured!r}") from None
    if count < 0:
        raise ValueError(f"{name} must be 0 or more, got {count}")
    return count


def worker_count() -> int:
    """A step's worker processes: `LLM_ASSETS_WORKERS`, by default one fewer than the cores."""
    configured = _configured("LLM_ASSETS_WORKERS")
    return max((os.cpu_count() or 1) - 1, 0) if configured is None else configured


def slice_worker_count() -> int:
    """A slice step's worker processes: `LLM_ASSETS_SLICE_WORKERS`, by default none. The
    slices are the day's parallelism: an executor or a Celery worker runs as many steps at once
    as the machine has cores, and a pool in each would put two processes on every core. On
    2 cores, two slice steps at once build their slices of a 1M day in about 0.8 of the time
    without pools of their own as with them (bench/README.md)."""
    configured = _configured("LLM_ASSETS_SLICE_WORKERS")
    return 0 if configured is None else configured


def chunked(
    rows: Iterable[Row], size: int | None = None, weight: Callable[[Row], int] | None = None
) -> Iterator[list[Row]]:
    """Consecutive lists of `size` rows, or of rows weighing `size` together (a block of
    lines about as many as its lines, say) when `weight` is given."""
    size = size or CHUNK_ROWS
    batch: list[Row] = []
    if weight is None:
        for row in rows:
            batch.append(row)
            if len(batch) >= size:
                yield batch
                batch = []
    else:
        held = 0
        for row in rows:
            batch.append(row)
            held += weight(row)
            if held >= size:
                yield batch
                batch, held = [], 0
    if batch:
        yield batch


BLOCK_ROWS = 500
"""Rows per numbered block (`numbered_blocks`)."""


def numbered_blocks(rows: Iterable[Row]) -> Iterator[tuple[int, list[Row]]]:
    """Consecutive blocks of `rows`, each with the position of its first row: what a worker
    needs to number rows, without a tuple per row to pickle (three times the cost of a
    line's bytes)."""
    position = 0
    for block in chunked(rows, BLOCK_ROWS):
        yield position, block
        position += len(block)


def _die_with(parent: int) -> None:
    """Worker initializer: end when the process that started us ends, even by SIGKILL (a
    terminated run), instead of living on as an orphan holding its own tokenizer."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
        told = True
    except (OSError, AttributeError):
        told = False
    if os.getppid() != parent:  # the parent died before prctl
        os._exit(1)
    if told:
        return

    def watch() -> None:  # elsewhere than Linux: poll
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


# In a worker: the contexts of the latest maps, unpickled once each.
_contexts: "collections.OrderedDict[str, Any]" = collections.OrderedDict()


def _context(key: str, context: bytes) -> Any:
    found = _contexts.get(key)
    if found is None:
        found = _contexts[key] = pickle.loads(context)
        while len(_contexts) > 4:
            _contexts.popitem(last=False)
    return found


class _Spilled(NamedTuple):
    """A chunk the calling process left in a file for a worker (see `_call`)."""

    path: str


def _call(
    work: Callable[[Any, Any], Any], key: str, context: bytes, chunk: Any, spill: str
) -> tuple[Any] | None:
    """Work a chunk in a worker. The result is left in the file `spill` (None returned): the
    pool's pipe carries 64 KB at a time, each piece waiting for the calling process's busy
    interpreter to read it, which leaves the worker blocked in its send. Where the file
    cannot be written (a full /dev/shm), the result comes through the pipe. A chunk comes
    the same way, in a file (`_Spilled`): through the pipe, 64 KB at a time from the pool's
    feeder thread, which waits for the calling process's interpreter before each piece, a
    chunk of a few MB took a large part of the time it takes to work."""
    if isinstance(chunk, _Spilled):
        with open(chunk.path, "rb") as handle:
            data = handle.read()
        os.unlink(chunk.path)
        chunk = pickle.loads(data)  # the calling process's own file
    result = work(_context(key, context), chunk)
    data = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        with open(spill, "wb") as handle:
            handle.write(data)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(spill)
        return (result,)
    return None


SPILLS_ROOT = "/dev/shm"
"""Where workers' result folders go when the system has it writable: memory, not disk."""
SPILLS_PREFIX = "llm-assets-results-"
STALE_SPILLS_SECONDS = 600
_PID_LIMIT = 2**31
"""Above every process id a system hands out (pid_t is a signed 32-bit number)."""


def _spill_dir() -> str:
    """A folder for this process's workers to leave results in: under `SPILLS_ROOT` where
    the system has it, else in the temp folder. Folders left by processes that were killed
    are removed first (`_remove_stale_spills`)."""
    usable = os.path.isdir(SPILLS_ROOT) and os.access(SPILLS_ROOT, os.W_OK)
    root = SPILLS_ROOT if usable else tempfile.gettempdir()
    _remove_stale_spills(root)
    return tempfile.mkdtemp(prefix=f"{SPILLS_PREFIX}{os.getpid()}-", dir=root)


def _spill_owner(name: str) -> int | None:
    """The process id in the name of a result folder, None for any other name: a file of
    another program, or a name that only looks like ours (no id, letters or digits of
    other scripts where the id goes, an id no process can have)."""
    if not name.startswith(SPILLS_PREFIX):
        return None
    owner = name[len(SPILLS_PREFIX) :].partition("-")[0]
    if not (owner.isascii() and owner.isdigit()):
        return None
    pid = int(owner)
    return pid if 0 < pid < _PID_LIMIT else None


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # running, another user's
        return True
    return True


def _remove_stale_spills(root: str) -> None:
    """Remove the result folders of processes that are gone and left untouched for
    `STALE_SPILLS_SECONDS` (a folder of a live run in another PID namespace sharing
    /dev/shm changes with every chunk). Only real folders of this user are removed; any
    other entry (a file or a symlink under such a name, another user's folder, a name that
    only looks like ours) is left as found, and a root or folder that cannot be read or
    removed is passed over: a stale entry never stops a step from starting its workers."""
    try:
        names = os.listdir(root)
    except OSError:
        return
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    stale_before = time.time() - STALE_SPILLS_SECONDS
    for name in names:
        pid = _spill_owner(name)
        if pid is None or _running(pid):
            continue
        path = os.path.join(root, name)
        try:
            found = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(found.st_mode) or (uid is not None and found.st_uid != uid):
            continue
        if found.st_mtime < stale_before:
            shutil.rmtree(path, ignore_errors=True)  # refuses a symlink swapped in since


def _warm(work: Callable[[Any, Any], Any], key: str, context: bytes) -> None:
    """Load what a map's chunks will need (the modules of `work` and of its context) in a
    worker, and nothing else: done when the worker is ready for chunks."""
    _context(key, context)


class Workers:
    """A pool of worker processes, started when first needed and shared by every `map` in
    the `with` block (a day's shards, say), so a process starts once per step."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = worker_count() if workers is None else workers
        self._done = 0
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._spills: str | None = None
        self._sent = 0

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, *_: Any) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._spills is not None:  # results of chunks sent and not taken back
            shutil.rmtree(self._spills, ignore_errors=True)
            self._spills = None

    def _send(self, call: Any, chunk: Any) -> tuple[concurrent.futures.Future[Any], str | None]:
        """Send a chunk to the workers in a file (through the pipe where it cannot be
        written); its result is to be left in the file `spill`."""
        assert self._pool is not None and self._spills is not None
        self._sent += 1
        spill = os.path.join(self._spills, str(self._sent))
        given = f"{spill}.chunk"
        try:
            with open(given, "wb") as handle:
                handle.write(pickle.dumps(chunk, protocol=pickle.HIGHEST_PROTOCOL))
            sent: Any = _Spilled(given)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(given)
            sent = chunk
        return self._pool.submit(call, sent, spill), spill

    @staticmethod
    def _take(sent: tuple[concurrent.futures.Future[Any], str | None]) -> Any:
        """A chunk's result: from its worker's file, or as worked here (spill None)."""
        future, spill = sent
        got = future.result()  # a worker's error is raised here
        if spill is None:
            return got
        if got is not None:  # it came through the pipe
            return got[0]
        with open(spill, "rb") as handle:
            data = handle.read()
        os.unlink(spill)
        return pickle.loads(data)  # our own worker's file

    def map(
        self,
        work: Callable[[Context, list[Row]], Result],
        context: Context,
        rows: Iterable[Row],
        weight: Callable[[Row], int] | None = None,
    ) -> Iterator[Result]:
        """`work(context, chunk)` for consecutive chunks of `rows`, yielded in order; with
        `weight`, a row counts as that many (a block of lines as its lines) in a chunk's size
        and in the rows worked here before the workers start.

        `work` must be a module-level function and `context` picklable. Chunks are worked
        here until the block has seen `INLINE_ROWS` rows; after that they go to the workers,
        up to `QUEUED_PER_WORKER` per worker at a time, and this process works the next
        chunk itself while that many are out; at most two such results wait for the oldest
        sent one, so memory stays bounded however long the input is. An error in a worker
        is raised here, and nothing after it is yielded. A context that does not pickle is
        worked here.
        """
        chunks = chunked(rows, weight=weight)
        for chunk in chunks:
            self._done += len(chunk) if weight is None else sum(map(weight, chunk))
            yield work(context, chunk)
            if self.workers > 0 and self._done >= INLINE_ROWS:
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
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_die_with,
                initargs=(os.getpid(),),
            )
            self._spills = _spill_dir()
        key = uuid.uuid4().hex
        call = functools.partial(_call, work, key, pickled)
        # A worker takes about a second to start and import what the work needs; this
        # process goes on alone until one is ready, instead of waiting for its first result.
        ready = self._pool.submit(_warm, work, key, pickled)
        for chunk in chunks:
            if ready.done():
                ready.result()  # a worker that cannot load the work fails here
                chunks = itertools.chain([chunk], chunks)
                break
            yield work(context, chunk)
        else:
            return
        # Results in input order: chunks sent to the workers, and chunks worked here while
        # the oldest sent one is not back (so this process never idles behind the workers).
        pending: collections.deque[tuple[concurrent.futures.Future[Any], str | None]]
        pending = collections.deque()
        queued = QUEUED_PER_WORKER * self.workers
        try:
            for chunk in chunks:
                while pending and pending[0][0].done():
                    yield self._take(pending.popleft())
                if sum(1 for future, _ in pending if not future.done()) < queued:
                    pending.append(self._send(call, chunk))
                    continue
                if len(pending) >= queued + 2:
                    yield self._take(pending.popleft())
                here: concurrent.futures.Future[Result] = concurrent.futures.Future()
                here.set_result(work(context, chunk))
                pending.append((here, None))
            while pending:
                yield self._take(pending.popleft())
        finally:
            for future, _ in pending:
                future.cancel()


def ordered_map(
    work: Callable[[Context, list[Row]], Result],
    context: Context,
    rows: Iterable[Row],
    *,
    workers: int | None = None,
    weight: Callable[[Row], int] | None = None,
) -> Iterator[Result]:
    """`Workers.map` with a pool of its own."""
    with Workers(workers) as pool:
        yield from pool.map(work, context, rows, weight)
