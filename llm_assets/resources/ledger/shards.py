"""Shards: recorded with exactly their items, moved through their states by compare-and-set,
and closed with what they were billed. Their locks are in `locks`."""

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from llm_assets.resources.ledger import limits
from llm_assets.resources.ledger.items import ShardMismatch, insert_items, record_new_shard
from llm_assets.resources.ledger.locks import check_fences
from llm_assets.resources.ledger.pseudonyms import Mappings, record_pseudonyms
from llm_assets.resources.ledger.records import ShardRecord, utcnow
from llm_assets.resources.ledger.schema import durable_begin
from llm_assets.resources.ledger.tables import reservation_table, result_table, shard_table
from llm_assets.results.rows import PENDING, SUBMITTED

BILLED = {
    "input_tokens",
    "cached_input_tokens",
    "cache_write_input_tokens",
    "output_tokens",
    "cost_usd",
}
"""The columns of an item's bill."""


def add_shard_with_items(
    engine: Engine,
    shard: dict[str, Any],
    new_items: Sequence[dict[str, Any]],
    pseudonyms: Mappings | None = None,
    *,
    stale_pseudonyms: bool = False,
) -> int:
    """Record a new shard and exactly its items in one transaction; returns items inserted.

    The shard, its items and their `pseudonyms` go in together or not at all (ShardMismatch
    when any of its items is in the ledger already), so a crash between writing the shard
    file and this call is repaired by running the step again, and an item is never recorded
    without the mapping of its line. `stale_pseudonyms`: the job holds mappings, some maybe
    of items never recorded (left by versions that wrote them apart); the items' own are
    dropped first.
    """
    now = utcnow()
    with engine.begin() as conn:
        check_fences(conn)
        record_new_shard(conn, shard, now)
        rendered = [item["custom_id"] for item in new_items] if stale_pseudonyms else []
        record_pseudonyms(conn, shard["job_id"], pseudonyms or {}, rendered)
        inserted = insert_items(conn, new_items, now)
        if inserted != len(new_items):
            raise ShardMismatch(
                f"shard {shard['shard_id']} was built with {len(new_items)} new items, but "
                f"{len(new_items) - inserted} of them are in the ledger already; nothing of "
                "it was recorded"
            )
        return inserted


# The reads every look at a day makes, built once: building a statement costs more than
# SQLite takes to run it. Their values are bound at execution.
_SHARDS = (
    sa.select(shard_table)
    .where(shard_table.c.job_id == sa.bindparam("job_id"))
    .order_by(shard_table.c.round, shard_table.c.shard_index)
)
_SHARDS_IN = _SHARDS.where(shard_table.c.status.in_(sa.bindparam("statuses", expanding=True)))
_SHARD = sa.select(shard_table).where(shard_table.c.shard_id == sa.bindparam("shard_id"))


def shards(engine: Engine, job_id: str, statuses: Iterable[str] | None = None) -> list[ShardRecord]:
    values: dict[str, Any] = {"job_id": job_id}
    query = _SHARDS
    if statuses is not None:
        query, values["statuses"] = _SHARDS_IN, list(statuses)
    with engine.connect() as conn:
        return [ShardRecord.model_validate(r._mapping) for r in conn.execute(query, values)]


def get_shard(engine: Engine, shard_id: str) -> ShardRecord | None:
    with engine.connect() as conn:
        row = conn.execute(_SHARD, {"shard_id": shard_id}).first()
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
        check_fences(conn)
        return conn.execute(query.values(**values, updated_at=utcnow())).rowcount > 0


def mark_started(engine: Engine, shard_id: str) -> bool:
    """Record that the provider began the shard's batch; True for the one call that did
    (two runs polling it at once record it once)."""
    query = (
        sa.update(shard_table)
        .where(shard_table.c.shard_id == shard_id, shard_table.c.started_at.is_(None))
        .values(started_at=utcnow())
    )
    with engine.begin() as conn:
        return conn.execute(query).rowcount > 0


def record_submit_intent(engine: Engine, shard_id: str, price_json: str) -> None:
    """Record that the shard is about to be sent, and the price its results are charged at.
    The intent is what tells a later run to look for a batch the provider may have made
    before a crash, so it is committed durably (`durable_begin`) before the create call:
    it survives the machine dying right after that call."""
    now = utcnow()
    with durable_begin(engine) as conn:
        check_fences(conn)
        conn.execute(
            sa.update(shard_table)
            .where(shard_table.c.shard_id == shard_id)
            .values(submit_intent_at=now, price_json=price_json, updated_at=now)
        )


def mark_submitted(engine: Engine, shard_id: str, provider_batch_id: str, status: str) -> bool:
    """Record the provider batch and count an attempt for each item, atomically; False when
    the shard has a batch recorded already."""
    now = utcnow()
    with engine.begin() as conn:
        check_fences(conn)
        changed = conn.execute(
            sa.update(shard_table)
            .where(shard_table.c.shard_id == shard_id, shard_table.c.provider_batch_id.is_(None))
            .values(
                provider_batch_id=provider_batch_id,
                status=status,
                # A wait for quota is over; the provider's own word comes with the first poll.
                raw_status=None,
                message=None,
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
        return changed > 0


def close_shard(
    engine: Engine,
    shard_id: str,
    *,
    from_status: Sequence[str],
    items: dict[str, Any],
    expect_status: Iterable[str] | None = None,
    uncount_attempt: bool = False,
    **values: Any,
) -> tuple[int, bool]:
    """End a shard in one transaction: its items still in one of `from_status` get `items`
    (what its batch did not answer; with `uncount_attempt`, the attempt its submission
    counted is taken back), what it was billed is frozen and its budget reservation settled,
    and the shard gets `values` if its status is in `expect_status`. Returns how many items
    moved and whether the shard row changed."""
    if BILLED & items.keys():
        raise ValueError(f"closing a shard does not change what was billed: {sorted(items)}")
    if uncount_attempt:
        items = {**items, "attempts": result_table.c.attempts - 1}
    now = utcnow()
    with engine.begin() as conn:
        check_fences(conn)
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


def count_pending(engine: Engine, shard_id: str) -> int:
    """How many of a shard's items wait to be sent in it."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count()).where(
                    result_table.c.shard_id == shard_id, result_table.c.status == PENDING
                )
            ).scalar()
            or 0
        )


def pending_offsets(engine: Engine, shard_id: str) -> dict[str, int | None]:
    """Where the line of each of a shard's pending items starts in its file."""
    query = sa.select(result_table.c.custom_id, result_table.c.request_offset).where(
        result_table.c.shard_id == shard_id, result_table.c.status == PENDING
    )
    with engine.connect() as conn:
        return {cid: offset for cid, offset in conn.execute(query)}


def narrow_shard(
    engine: Engine, shard_id: str, lines: Sequence[tuple[str, int]], **values: Any
) -> None:
    """A shard not sent yet, rewritten with only its pending items' lines: its row gets
    `values` (file, size, item count) and each item its new offset, all or nothing."""
    now = utcnow()
    with engine.begin() as conn:
        check_fences(conn)
        conn.execute(
            sa.update(shard_table)
            .where(shard_table.c.shard_id == shard_id, shard_table.c.provider_batch_id.is_(None))
            .values(**values, updated_at=now)
        )
        moved = 0
        for cid, offset in lines:
            moved += conn.execute(
                sa.update(result_table)
                .where(
                    result_table.c.shard_id == shard_id,
                    result_table.c.custom_id == cid,
                    result_table.c.status == PENDING,
                )
                .values(request_offset=offset, updated_at=now)
            ).rowcount
        if moved != len(lines):
            raise ShardMismatch(
                f"shard {shard_id}: {len(lines) - moved} of the {len(lines)} items of its "
                "rewritten file are no longer pending in it; nothing was changed"
            )
