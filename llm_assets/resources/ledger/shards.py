"""Shards: recorded with their items, moved through their states by compare-and-set,
submitted under a lock that dies with its holder, and closed with what they were billed."""

import contextlib
import datetime as dt
import hashlib
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from llm_assets import file_lock
from llm_assets.resources.ledger import limits
from llm_assets.resources.ledger.items import insert_items
from llm_assets.resources.ledger.records import ShardRecord, utcnow
from llm_assets.resources.ledger.schema import dialect_insert
from llm_assets.resources.ledger.tables import reservation_table, result_table, shard_table
from llm_assets.result_rows import PENDING, SUBMITTED

BILLED = {"input_tokens", "cached_input_tokens", "output_tokens", "cost_usd"}
"""The columns of an item's bill."""


def add_shard_with_items(
    engine: Engine, shard: dict[str, Any], new_items: Sequence[dict[str, Any]]
) -> int:
    """Record a new shard and its items in one transaction; returns items inserted.

    Items already in the ledger are left alone, so a crash between writing the shard file and
    this call is repaired by simply running the step again.
    """
    now = utcnow()
    with engine.begin() as conn:
        conn.execute(
            dialect_insert(conn, shard_table)
            .values(**shard, status="created", created_at=now, updated_at=now)
            .on_conflict_do_nothing()
        )
        return insert_items(conn, new_items, now)


def shards(engine: Engine, job_id: str, statuses: Iterable[str] | None = None) -> list[ShardRecord]:
    query = sa.select(shard_table).where(shard_table.c.job_id == job_id)
    if statuses is not None:
        query = query.where(shard_table.c.status.in_(list(statuses)))
    query = query.order_by(shard_table.c.round, shard_table.c.shard_index)
    with engine.connect() as conn:
        return [ShardRecord.model_validate(r._mapping) for r in conn.execute(query)]


def get_shard(engine: Engine, shard_id: str) -> ShardRecord | None:
    with engine.connect() as conn:
        row = conn.execute(sa.select(shard_table).where(shard_table.c.shard_id == shard_id)).first()
    return ShardRecord.model_validate(row._mapping) if row else None


def next_round(engine: Engine, job_id: str) -> int:
    with engine.connect() as conn:
        found = conn.execute(
            sa.select(sa.func.max(shard_table.c.round)).where(shard_table.c.job_id == job_id)
        ).scalar()
    return 0 if found is None else int(found) + 1


def update_shard(
    engine: Engine, shard_id: str, *, expect_status: Iterable[str] | None = None, **values: Any
) -> bool:
    """Compare-and-set on the shard's status; returns whether the row changed."""
    query = sa.update(shard_table).where(shard_table.c.shard_id == shard_id)
    if expect_status is not None:
        query = query.where(shard_table.c.status.in_(list(expect_status)))
    with engine.begin() as conn:
        return conn.execute(query.values(**values, updated_at=utcnow())).rowcount > 0


@contextlib.contextmanager
def submission_lock(engine: Engine, shard_id: str) -> Iterator[bool]:
    """Hold the right to submit one shard; yields False when another process holds it.

    Two runs of the same day (a sensor's and a backfill's) must not both create a batch for a
    shard. The lock dies with its holder, so a crashed run never blocks the next one, which
    then reconciles from the recorded intent: a PostgreSQL advisory lock on its own
    connection, or an flock beside a SQLite ledger file.
    """
    if engine.dialect.name == "postgresql":
        with _advisory_lock(engine, shard_id) as got:
            yield got
        return
    database = engine.url.database
    if not database or database == ":memory:":
        yield True
        return
    with _file_lock(Path(f"{database}.submission-locks"), shard_id) as got:
        yield got


@contextlib.contextmanager
def _advisory_lock(engine: Engine, shard_id: str) -> Iterator[bool]:
    """Advisory locks belong to the whole database, so the key includes the ledger's schema:
    two ledgers in one database never block each other's shards."""
    with engine.connect() as conn:
        schema = conn.execute(sa.select(sa.func.current_schema())).scalar() or ""
        scoped = hashlib.sha256(f"{schema}\0{shard_id}".encode()).digest()
        key = int.from_bytes(scoped[:8], "big", signed=True)
        got = bool(conn.execute(sa.select(sa.func.pg_try_advisory_lock(key))).scalar())
        conn.commit()
        try:
            yield got
        finally:
            if got:
                conn.execute(sa.select(sa.func.pg_advisory_unlock(key)))
                conn.commit()


@contextlib.contextmanager
def _file_lock(folder: Path, shard_id: str) -> Iterator[bool]:
    digest = hashlib.sha256(shard_id.encode()).digest()
    folder.mkdir(exist_ok=True)
    fd = os.open(folder / f"{digest.hex()[:32]}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        with file_lock.exclusive(fd) as taken:
            yield taken
    finally:
        os.close(fd)


def mark_submitted(engine: Engine, shard_id: str, provider_batch_id: str, status: str) -> None:
    """Record the provider batch and count an attempt for each item, atomically."""
    now = utcnow()
    with engine.begin() as conn:
        changed = conn.execute(
            sa.update(shard_table)
            .where(shard_table.c.shard_id == shard_id, shard_table.c.provider_batch_id.is_(None))
            .values(
                provider_batch_id=provider_batch_id,
                status=status,
                submitted_at=now,
                updated_at=now,
            )
        ).rowcount
        if changed:
            conn.execute(
                sa.update(result_table)
                .where(result_table.c.shard_id == shard_id, result_table.c.status == PENDING)
                .values(status=SUBMITTED, attempts=result_table.c.attempts + 1, updated_at=now)
            )


def close_shard(
    engine: Engine,
    shard_id: str,
    *,
    from_status: Sequence[str],
    items: dict[str, Any],
    expect_status: Iterable[str] | None = None,
    **values: Any,
) -> tuple[int, bool]:
    """End a shard in one transaction: its items still in one of `from_status` get `items`
    (what its batch did not answer), what it was billed is frozen and its budget reservation
    settled, and the shard gets `values` if its status is in `expect_status`. Returns how many
    items moved and whether the shard row changed."""
    if BILLED & items.keys():
        raise ValueError(f"closing a shard does not change what was billed: {sorted(items)}")
    now = utcnow()
    with engine.begin() as conn:
        moved, totals = _close_items(conn, shard_id, list(from_status), items, now)
        _settle(conn, shard_id, totals, now)
        query = sa.update(shard_table).where(shard_table.c.shard_id == shard_id)
        if expect_status is not None:
            query = query.where(shard_table.c.status.in_(list(expect_status)))
        changed = conn.execute(query.values(**values, updated_at=now)).rowcount > 0
    return moved, changed


def _close_items(
    conn: Connection, shard_id: str, from_status: list[str], values: dict[str, Any], now: Any
) -> tuple[int, list[Any]]:
    """Move a shard's items still in one of `from_status`; returns how many moved and the
    shard's bill (input tokens, output tokens, cost), which moving them leaves as it was."""
    still_open = result_table.c.status.in_(from_status)
    in_shard = result_table.c.shard_id == shard_id
    move = sa.update(result_table).values(**values, updated_at=now)
    billed = [
        sa.func.coalesce(sa.func.sum(result_table.c.input_tokens), 0),
        sa.func.coalesce(sa.func.sum(result_table.c.output_tokens), 0),
        sa.func.coalesce(sa.func.sum(result_table.c.cost_usd), 0.0),
    ]
    if conn.dialect.name != "postgresql":
        moved = conn.execute(move.where(in_shard, still_open)).rowcount
        return moved, list(conn.execute(sa.select(*billed).where(in_shard)).one())
    # One read of the shard's rows gives both its bill and its open items (none or a few
    # after an import), which are then moved by id.
    *totals, ids = conn.execute(
        sa.select(*billed, sa.func.array_agg(result_table.c.id).filter(still_open)).where(in_shard)
    ).one()
    if not ids:
        return 0, totals
    if len(ids) <= limits.CHUNK:
        return conn.execute(move.where(result_table.c.id.in_(ids), still_open)).rowcount, totals
    return conn.execute(move.where(in_shard, still_open)).rowcount, totals


def _settle(conn: Connection, shard_id: str, totals: Sequence[Any], now: dt.datetime) -> None:
    """Freeze what an ended shard was billed (its items' last attempts, all from this shard's
    batch: input tokens, output tokens, cost) and settle its budget reservation; safe to
    repeat until the shard is marked imported, as nothing moves its items before that."""
    tin, tout, cost = totals
    conn.execute(
        sa.update(shard_table)
        .where(shard_table.c.shard_id == shard_id)
        .values(
            actual_input_tokens=int(tin),
            actual_output_tokens=int(tout),
            actual_cost_usd=float(cost),
            updated_at=now,
        )
    )
    conn.execute(
        sa.update(reservation_table)
        .where(reservation_table.c.shard_id == shard_id)
        .values(actual_usd=float(cost), settled_at=now)
    )
