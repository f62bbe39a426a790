"""Locks that die with their holder: the right to submit one shard, and the right to write
one day (a job).

Two runs of the same day (a sensor's, a backfill's, an operator's `run --wait`) may work at
once. A shard gets one batch because its submission holds the shard's lock; the day's other
writes (building shards, importing with retry planning, requeueing, writing validated
outputs) hold the day's lock, so one run does them at a time and the next finds them done.

On PostgreSQL the locks are session advisory locks on a connection of their own; beside a
SQLite ledger file they are flocks on files in a folder next to it. Either way the operating
system or the database drops a lock when its holder dies, so a crashed run never blocks the
next one.
"""

import contextlib
import hashlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from llm_assets import file_lock

DAY_LOCK_WAIT_SECONDS = 1800.0
"""How long a run waits for another run's hold on the same day before it gives up."""
WAIT_LOG_EVERY_SECONDS = 60.0
"""A waiting run says again whom it waits for after this long."""
_POLL_FIRST, _POLL_MOST = 0.05, 1.0


class DayBusy(Exception):
    """Another run held the day for longer than this run may wait."""


_held = threading.local()


def _held_here() -> set[str]:
    """The day locks this thread holds: a step that holds its day never waits for itself."""
    if not hasattr(_held, "keys"):
        _held.keys = set()
    return _held.keys


def holder_name(who: str) -> str:
    """How a holder names itself to a run that waits for it: who, process and host."""
    return f"{who} (pid {os.getpid()} on {socket.gethostname()})"


@contextlib.contextmanager
def submission_lock(engine: Engine, shard_id: str) -> Iterator[bool]:
    """Hold the right to submit one shard; yields False when another process holds it.

    Two runs of the same day must not both create a batch for a shard. A crashed holder's
    successor reconciles from the recorded intent.
    """
    with _lock(engine, f"shard\0{shard_id}", wait=None) as got:
        yield got


@contextlib.contextmanager
def day_lock(
    engine: Engine,
    job_id: str,
    *,
    holder: str,
    wait_seconds: float = DAY_LOCK_WAIT_SECONDS,
    log: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """Hold the right to write one job's day for the block, waiting (at most `wait_seconds`)
    while another run holds it; `log` hears whom this run waits for. Raises DayBusy when the
    wait runs out. A thread that holds the day already goes on at once."""
    held = _held_here()
    if job_id in held:
        yield
        return

    def waiting(other: str, waited: float) -> None:
        if log is not None:
            log(
                f"waiting for {other or 'another run'}, which is writing day {job_id} "
                f"(waited {waited:.0f} s of at most {wait_seconds:.0f} s)"
            )

    with _lock(engine, f"day\0{job_id}", wait=(wait_seconds, waiting), holder=holder) as got:
        if not got:
            raise DayBusy(
                f"another run has been writing day {job_id} for over {wait_seconds:.0f} s; "
                "this run changed nothing. Run it again when that run has finished "
                "(`llm-assets status` shows the day)"
            )
        held.add(job_id)
        try:
            yield
        finally:
            held.discard(job_id)


_Wait = tuple[float, Callable[[str, float], None]]


@contextlib.contextmanager
def _lock(engine: Engine, name: str, *, wait: _Wait | None, holder: str = "") -> Iterator[bool]:
    """An exclusive lock named `name` in this ledger: yields whether it was taken. Without
    `wait` it is tried once; with (seconds, report) it is tried until taken or the seconds
    run out, telling `report` whom it waits for now and then."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn, _advisory_lock(conn, name, wait, holder) as got:
            yield got
        return
    database = engine.url.database
    if not database or database == ":memory:":
        yield True  # one connection, one process: nothing to share it with
        return
    with _file_lock(Path(f"{database}.locks"), name, wait, holder) as got:
        yield got


def _retrying(attempt: Callable[[], bool], wait: _Wait | None, who: Callable[[], str]) -> bool:
    """Call `attempt` until it succeeds or the wait runs out (once without a wait)."""
    if attempt():
        return True
    if wait is None:
        return False
    seconds, report = wait
    started = time.monotonic()
    said_at = None
    pause = _POLL_FIRST
    while True:
        waited = time.monotonic() - started
        if said_at is None or waited - said_at >= WAIT_LOG_EVERY_SECONDS:
            report(who(), waited)
            said_at = waited
        if waited >= seconds:
            return False
        time.sleep(min(pause, max(seconds - waited, 0.0)))
        pause = min(pause * 2, _POLL_MOST)
        if attempt():
            return True


def _advisory_key(conn: Connection, name: str) -> int:
    """Advisory locks belong to the whole database, so the key includes the ledger's schema:
    two ledgers in one database never block each other."""
    schema = conn.execute(sa.select(sa.func.current_schema())).scalar() or ""
    scoped = hashlib.sha256(f"{schema}\0{name}".encode()).digest()
    return int.from_bytes(scoped[:8], "big", signed=True)


@contextlib.contextmanager
def _advisory_lock(conn: Connection, name: str, wait: _Wait | None, holder: str) -> Iterator[bool]:
    key = _advisory_key(conn, name)
    conn.commit()

    def attempt() -> bool:
        got = bool(conn.execute(sa.select(sa.func.pg_try_advisory_lock(key))).scalar())
        conn.commit()
        return got

    def who() -> str:
        # A 64-bit advisory key shows in pg_locks as two 32-bit halves.
        unsigned = key & 0xFFFFFFFFFFFFFFFF
        found = conn.execute(
            sa.text(
                "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a "
                "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
                "AND l.classid = :high AND l.objid = :low AND l.objsubid = 1"
            ),
            {"high": unsigned >> 32, "low": unsigned & 0xFFFFFFFF},
        ).scalar()
        conn.commit()
        return found or ""

    got = _retrying(attempt, wait, who)
    if not got:
        yield False
        return
    if holder:
        conn.execute(
            sa.text("SELECT set_config('application_name', :name, false)"),
            {"name": f"llm-assets {holder}"[:63]},
        )
        conn.commit()
    try:
        yield True
    finally:
        if holder:
            conn.execute(sa.text("RESET application_name"))
        conn.execute(sa.select(sa.func.pg_advisory_unlock(key)))
        conn.commit()


@contextlib.contextmanager
def _file_lock(folder: Path, name: str, wait: _Wait | None, holder: str) -> Iterator[bool]:
    """An flock on a file named by the lock's digest; the holder writes its name into it."""
    folder.mkdir(exist_ok=True)
    path = folder / f"{hashlib.sha256(name.encode()).hexdigest()[:32]}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        stack = contextlib.ExitStack()

        def attempt() -> bool:
            taken = stack.enter_context(file_lock.exclusive(fd))
            if not taken:
                stack.close()
            return taken

        def who() -> str:
            return path.read_text(errors="replace").strip() if path.exists() else ""

        with stack:
            if not _retrying(attempt, wait, who):
                yield False
                return
            if holder:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"llm-assets {holder}\n".encode(), 0)
            yield True
    finally:
        os.close(fd)
