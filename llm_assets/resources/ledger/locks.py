"""Locks that die with their holder and fence out a holder that lost them: the right to
submit one shard, and the right to write one day (a job).

Two runs of the same day (a sensor's, a backfill's, an operator's `run --wait`) may work at
once. A shard gets one batch because its submission holds the shard's lock; the day's other
writes (building shards, submitting, importing with retry planning, requeueing, cancelling)
hold the day's lock, so one run does them at a time and the next finds them done.

On PostgreSQL the locks are session advisory locks, each on a connection held for the hold;
beside a SQLite ledger file they are flocks on files in a folder next to it (mutex.py). Either
way the operating system or the database drops a lock when its holder dies, so a crashed run
never blocks the next one.

A lock can also be lost while its holder lives on: the connection's backend is terminated
(pg_terminate_backend, a failover, an idle-session timeout) or the lock file is removed. Then
another run takes it and both would write. So every lock carries a fencing token: a row of
`llm_lock_lease` whose generation grows by one each time a run takes the lock. While a block
holds locks, every ledger write that spends money or changes an item's state checks, in its
own transaction, that each held lock's generation is still the one this run took
(`check_fences`); a run that lost a lock raises LostLock before it writes anything more.
"""

import contextlib
import contextvars
import dataclasses
import os
import socket
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from llm_assets.resources.ledger import mutex
from llm_assets.resources.ledger.records import utcnow
from llm_assets.resources.ledger.tables import lock_lease_table

DAY_LOCK_WAIT_SECONDS = 1800.0
"""How long a run waits for another run's hold on the same day before it gives up."""


class DayBusy(Exception):
    """Another run held the day for longer than this run may wait."""


class LostLock(Exception):
    """Another run took over a lock this run held (its connection was cut, or its lock file
    removed): this run stopped before its next write, and the other run carries on."""


@dataclasses.dataclass(frozen=True)
class Fence:
    """A lock as this run took it: its name and the generation that was current then."""

    name: str
    generation: int
    holder: str


_fences: contextvars.ContextVar[tuple[Fence, ...]] = contextvars.ContextVar(
    "llm_assets_fences", default=()
)
"""The locks the running code holds. A context variable, so threads the holder starts with
its context (the ledger's writer thread, asyncio.to_thread) write under the same fences."""


def held_fences() -> tuple[Fence, ...]:
    return _fences.get()


@contextlib.contextmanager
def _fenced(fence: Fence) -> Iterator[None]:
    token = _fences.set((*_fences.get(), fence))
    try:
        yield
    finally:
        _fences.reset(token)


_CHECK_FENCE = (
    sa.update(lock_lease_table)
    .where(
        lock_lease_table.c.name == sa.bindparam("lease"),
        lock_lease_table.c.generation == sa.bindparam("held"),
    )
    .values(checked_at=sa.bindparam("now"))
)
"""Built once: every fenced write checks its fences first."""


def check_fences(conn: Connection) -> None:
    """Raise LostLock unless every lock the running code holds is still the one it took,
    checked in the caller's transaction (before its first write): on PostgreSQL the check
    keeps the lease row locked until that transaction ends, so a run taking the lock over
    waits for it; on SQLite the check is the transaction's first write, which takes the
    database's write lock."""
    for fence in _fences.get():
        kept = conn.execute(
            _CHECK_FENCE,
            {"lease": fence.name, "held": fence.generation, "now": utcnow()},
        ).rowcount
        if kept:
            continue
        now = conn.execute(
            sa.select(lock_lease_table.c.generation, lock_lease_table.c.holder).where(
                lock_lease_table.c.name == fence.name
            )
        ).first()
        by = f" by {now.holder} (generation {now.generation})" if now is not None else ""
        raise LostLock(
            f"{fence.holder} lost its hold on {fence.name}: it was taken "
            f"over{by} while this run held it (generation {fence.generation}), after its "
            "connection to the ledger was cut or its lock file removed. This run stopped "
            "before writing anything more; the run that holds it now carries the work on"
        )


def _lease_name(lock: str) -> str:
    return lock.replace("\0", ":")  # PostgreSQL text holds no NUL


def _lease_upsert(insert: Any) -> Any:
    table = lock_lease_table
    return (
        insert(table)
        .values(
            name=sa.bindparam("lease"),
            generation=1,
            holder=sa.bindparam("by"),
            taken_at=sa.bindparam("at"),
        )
        .on_conflict_do_update(
            index_elements=["name"],
            set_={
                "generation": table.c.generation + 1,
                "holder": sa.bindparam("by"),
                "taken_at": sa.bindparam("at"),
            },
        )
    )


_TAKE_LEASE = _lease_upsert(postgresql.insert).returning(lock_lease_table.c.generation)
_TAKE_LEASE_SQLITE = _lease_upsert(sqlite.insert)  # RETURNING needs SQLite 3.35, not 3.33
_LEASE_GENERATION = sa.select(lock_lease_table.c.generation).where(
    lock_lease_table.c.name == sa.bindparam("lease")
)
"""Built once: every lock taken takes its lease."""


def _take_lease(engine: Engine, lock: str, holder: str) -> Fence:
    """The next generation of the lock's lease, recorded for a run that has just taken it:
    a lease's first take is generation 1, and each take after adds one."""
    name = _lease_name(lock)
    lease = {"lease": name, "by": holder, "at": utcnow()}
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            generation = conn.execute(_TAKE_LEASE, lease).scalar_one()
        else:
            conn.execute(_TAKE_LEASE_SQLITE, lease)
            generation = conn.execute(_LEASE_GENERATION, lease).scalar_one()
    return Fence(name=name, generation=int(generation), holder=holder)


def holder_name(who: str) -> str:
    """How a holder names itself to a run that waits for it: who, process and host."""
    return f"{who} (pid {os.getpid()} on {socket.gethostname()})"


def _day_name(job_id: str) -> str:
    return f"day\0{job_id}"


def _shard_name(shard_id: str) -> str:
    return f"shard\0{shard_id}"


@contextlib.contextmanager
def submission_lock(
    engine: Engine, shard_id: str, *, holder: str = "", wait_seconds: float = 0.0
) -> Iterator[bool]:
    """Hold the right to submit (or work) one shard; yields False when another process
    holds it (still, after `wait_seconds`). Fenced: the block's writes stop with LostLock
    once another run has taken it.

    Two runs of the same day must not both create a batch for a shard. A crashed holder's
    successor reconciles from the recorded intent.
    """
    name = _shard_name(shard_id)
    wait = (wait_seconds, lambda _who, _waited: None) if wait_seconds > 0 else None
    with mutex.exclusive(engine, name, wait=wait, holder=holder) as got:
        if not got:
            yield False
            return
        with _fenced(_take_lease(engine, name, holder_name(holder or "a run"))):
            yield True


def held(engine: Engine, shard_ids: Iterable[str]) -> set[str]:
    """The shards among `shard_ids` whose submission lock some run holds now."""
    names = {_shard_name(shard_id): shard_id for shard_id in shard_ids}
    return {names[name] for name in mutex.held(engine, names)}


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
    wait runs out. Code that holds the day already goes on at once. Fenced: the block's
    writes stop with LostLock once another run has taken the day over."""
    with _waited_lock(engine, _day_name(job_id), f"day {job_id}", holder, wait_seconds, log):
        yield


@contextlib.contextmanager
def slice_lock(
    engine: Engine,
    job_id: str,
    slice_name: str,
    *,
    holder: str,
    wait_seconds: float = DAY_LOCK_WAIT_SECONDS,
    log: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """Hold the right to build one slice of a job's day (`slice_name`, e.g. "2/8"), as
    `day_lock` holds the whole day: the slices of a day are built at once, each by one run
    at a time; the day's lock is taken by their join."""
    name = f"slice\0{job_id}\0{slice_name}"
    what = f"slice {slice_name} of day {job_id}"
    with _waited_lock(engine, name, what, holder, wait_seconds, log):
        yield


@contextlib.contextmanager
def _waited_lock(
    engine: Engine,
    name: str,
    what: str,
    holder: str,
    wait_seconds: float,
    log: Callable[[str], None] | None,
) -> Iterator[None]:
    """A fenced lock `name` (on `what`) held for the block, waited for; DayBusy when the wait
    runs out. Held already by the running code: it goes on at once."""
    if any(fence.name == _lease_name(name) for fence in _fences.get()):
        yield
        return

    def waiting(other: str, waited: float) -> None:
        if log is not None:
            log(
                f"waiting for {other or 'another run'}, which is writing {what} "
                f"(waited {waited:.0f} s of at most {wait_seconds:.0f} s)"
            )

    with mutex.exclusive(engine, name, wait=(wait_seconds, waiting), holder=holder) as got:
        if not got:
            raise DayBusy(
                f"another run has been writing {what} for over {wait_seconds:.0f} s; "
                "this run changed nothing. Run it again when that run has finished "
                "(`llm-assets status` shows the day)"
            )
        with _fenced(_take_lease(engine, name, holder)):
            yield


@contextlib.contextmanager
def quota_lock(
    engine: Engine, quota: str, *, holder: str, wait_seconds: float = 60.0
) -> Iterator[bool]:
    """Hold the right to admit a shard under one provider quota (`quota` names it): runs
    admit one shard at a time, each seeing what the one before it sent. Yields False when
    another run kept it for `wait_seconds`. Not fenced: it orders admissions, and the writes
    made under it are the shard's, fenced by the shard's and the day's locks."""
    wait = (wait_seconds, lambda _who, _waited: None)
    with mutex.exclusive(engine, f"quota\0{quota}", wait=wait, holder=holder) as got:
        yield got
