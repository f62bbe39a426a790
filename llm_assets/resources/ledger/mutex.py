"""Exclusive locks that die with their holder, the way the ledger's database can hold them:
on PostgreSQL a session advisory lock on a connection kept for the hold (in autocommit: one
round trip to take the lock, one to let it go), beside a SQLite ledger file an flock on a file
in a folder next to it. What the locks are for, and the fences that stop a holder that lost
one, are locks.py's.
"""

import contextlib
import hashlib
import os
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from llm_assets.util import file_lock

WAIT_LOG_EVERY_SECONDS = 60.0
"""A waiting run says again whom it waits for after this long."""
_POLL_FIRST, _POLL_MOST = 0.05, 1.0

Wait = tuple[float, Callable[[str, float], None]]
"""How long to wait for a lock, and whom to tell (holder, seconds waited) now and then."""


@contextlib.contextmanager
def exclusive(engine: Engine, name: str, *, wait: Wait | None, holder: str = "") -> Iterator[bool]:
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


def held(engine: Engine, names: Iterable[str]) -> set[str]:
    """The locks among `names` that someone holds now. On PostgreSQL read from pg_locks in
    one query; beside SQLite each lock is taken for a moment (a submission waits a moment for
    a lock it finds taken, see submit.SUBMISSION_LOCK_WAIT_SECONDS)."""
    names = list(names)
    if not names:
        return set()
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            granted = {(row.classid, row.objid) for row in conn.execute(_GRANTED)}
            return {name for name in names if _halves(_advisory_key(conn, name)) in granted}
    found = set()
    for name in names:
        with exclusive(engine, name, wait=None) as got:
            if not got:
                found.add(name)
    return found


def _retrying(attempt: Callable[[], bool], wait: Wait | None, who: Callable[[], str]) -> bool:
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


_schemas: "weakref.WeakKeyDictionary[Engine, str]" = weakref.WeakKeyDictionary()
"""Each engine's schema, read on its first lock: an engine's connections share one URL, and
with it one search path."""


def _halves(key: int) -> tuple[int, int]:
    """How pg_locks shows a 64-bit advisory key: two 32-bit halves."""
    unsigned = key & 0xFFFFFFFFFFFFFFFF
    return unsigned >> 32, unsigned & 0xFFFFFFFF


def _advisory_key(conn: Connection, name: str) -> int:
    """Advisory locks belong to the whole database, so the key includes the ledger's schema:
    two ledgers in one database never block each other."""
    schema = _schemas.get(conn.engine)
    if schema is None:
        schema = conn.execute(sa.select(sa.func.current_schema())).scalar() or ""
        _schemas[conn.engine] = schema
    scoped = hashlib.sha256(f"{schema}\0{name}".encode()).digest()
    return int.from_bytes(scoped[:8], "big", signed=True)


_TRY = sa.text("SELECT pg_try_advisory_lock(:key)")
_TRY_AS = sa.text(
    "SELECT CASE WHEN pg_try_advisory_lock(:key) "
    "THEN set_config('application_name', :name, false) IS NOT NULL ELSE false END"
)
"""Take the lock and, when taken, name the session after its holder: one round trip."""
_UNLOCK = sa.text("SELECT pg_advisory_unlock(:key)")
_UNLOCK_AS = sa.text(
    "SELECT pg_advisory_unlock(:key), set_config('application_name', reset_val, false) "
    "FROM pg_settings WHERE name = 'application_name'"
)
"""Let the lock go and give the session back its own name (RESET's value): one round trip."""
_GRANTED = sa.text(
    "SELECT classid::bigint AS classid, objid::bigint AS objid FROM pg_locks "
    "WHERE locktype = 'advisory' AND granted AND objsubid = 1"
)
"""The advisory locks held now, each key as its two halves."""
_HOLDER_OF = sa.text(
    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a "
    "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
    "AND l.classid = :high AND l.objid = :low AND l.objsubid = 1"
)


@contextlib.contextmanager
def _advisory_lock(conn: Connection, name: str, wait: Wait | None, holder: str) -> Iterator[bool]:
    """A session advisory lock on `conn`, which runs in autocommit: the lock outlives any
    transaction, and each statement is one round trip with no BEGIN or COMMIT around it."""
    conn = conn.execution_options(isolation_level="AUTOCOMMIT")
    key = _advisory_key(conn, name)
    named = {"key": key, "name": f"llm-assets {holder}"[:63]}

    def attempt() -> bool:
        if holder:
            return bool(conn.execute(_TRY_AS, named).scalar())
        return bool(conn.execute(_TRY, {"key": key}).scalar())

    def who() -> str:
        high, low = _halves(key)
        return conn.execute(_HOLDER_OF, {"high": high, "low": low}).scalar() or ""

    if not _retrying(attempt, wait, who):
        yield False
        return
    try:
        yield True
    finally:
        try:
            conn.execute(_UNLOCK_AS if holder else _UNLOCK, {"key": key})
        except sa.exc.DBAPIError:
            # The connection is gone, and the lock with it: the fence stopped any write made
            # after that. The broken connection is not handed back to the pool.
            conn.invalidate()


@contextlib.contextmanager
def _file_lock(folder: Path, name: str, wait: Wait | None, holder: str) -> Iterator[bool]:
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
