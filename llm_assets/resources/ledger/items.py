"""Item rows: inserted with their shard, moved between statuses and shards, read back and
counted."""

import datetime as dt
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from llm_assets.items.ids import DUPLICATE_ID
from llm_assets.resources.ledger import limits
from llm_assets.resources.ledger.bulk import Bulk
from llm_assets.resources.ledger.locks import check_fences
from llm_assets.resources.ledger.pseudonyms import Mappings, record_pseudonyms
from llm_assets.resources.ledger.records import JobCounts, utcnow
from llm_assets.resources.ledger.schema import dialect_insert
from llm_assets.resources.ledger.tables import result_table, shard_table
from llm_assets.results.rows import DEAD_LETTER, PENDING, RETRY, SUBMITTED, SUCCEEDED
from llm_assets.util.parallel import chunked

_TABLE = result_table.name


def status_in(statuses: Iterable[str]) -> str:
    """`'a', 'b'` for `status IN (...)`, of known statuses only (they go into the SQL text)."""
    statuses = list(statuses)
    unknown = set(statuses) - {PENDING, SUBMITTED, RETRY, SUCCEEDED, DEAD_LETTER}
    if unknown:
        raise ValueError(f"unknown item status {sorted(unknown)}")
    return ", ".join(f"'{s}'" for s in statuses)


class ShardMismatch(Exception):
    """A shard would be recorded with other items than it was built with; nothing of it
    was recorded."""


def record_new_shard(conn: Connection, shard: dict[str, Any], now: dt.datetime) -> None:
    """Insert a shard row that must be new: a shard id is recorded once, with its items."""
    inserted = conn.execute(
        dialect_insert(conn, shard_table)
        .values(**shard, status="created", created_at=now, updated_at=now)
        .on_conflict_do_nothing()
        .returning(shard_table.c.shard_id)
    ).first()
    if inserted is None:
        raise ShardMismatch(
            f"shard {shard['shard_id']} is in the ledger already; it was built again by a "
            "run that did not hold its day, and nothing of it was recorded"
        )


def insert_items(conn: Connection, items: Sequence[dict[str, Any]], now: Any) -> int:
    """Insert item rows, leaving (job_id, custom_id) that exist alone; returns rows inserted."""
    if not items:
        return 0
    bulk = Bulk(conn)
    keys = list(items[0])
    columns = [*keys, "created_at", "updated_at"]
    inserted = 0
    # The item's datetimes are these two stamps, encoded once (not per row and value) on
    # SQLite; PostgreSQL's COPY takes the datetime itself.
    stamp = bulk.value(now)
    for chunk in chunked(items, limits.BULK_CHUNK):
        rows = [[item.get(k) for k in keys] + [stamp, stamp] for item in chunk]
        inserted += bulk.insert_ignoring_existing(
            result_table, columns, rows, "uq_result_job_custom_id"
        )
    return inserted


def add_items(engine: Engine, items: Iterable[dict[str, Any]]) -> int:
    """Insert item rows (e.g. input dead letters) in chunks; existing ones are kept."""
    now = utcnow()
    inserted = 0
    for chunk in chunked(items, limits.CHUNK):
        with engine.begin() as conn:
            check_fences(conn)
            inserted += insert_items(conn, chunk, now)
    return inserted


def _by_source() -> sa.ColumnElement[bool]:
    """Rows that are their source id's item (not a repeat of it, not a row without one):
    what the ledger finds by source id (see llm_assets/items/ids.py)."""
    r = result_table.c
    return sa.and_(
        r.source_id.is_not(None), sa.or_(r.error_code.is_(None), r.error_code != DUPLICATE_ID)
    )


def known_items(
    engine: Engine, job_id: str, *, beside_shards: Sequence[str] = ()
) -> tuple[set[str], set[str]]:
    """What of a day the ledger holds, read in one query: (the source ids of its items, the
    custom_ids of its rows without one or repeating one). An item is known by its source id
    whatever custom_id it was given, so a changed id key never adds it again. The items of
    `beside_shards` are left out (a slice's build reads past the other slices' shards)."""
    r = result_table.c
    keyed = _by_source()
    query = sa.select(
        sa.case((keyed, r.source_id), else_=sa.null()),
        sa.case((keyed, sa.null()), else_=r.custom_id),
    ).where(r.job_id == job_id)
    if beside_shards:
        query = query.where(sa.or_(r.shard_id.is_(None), r.shard_id.not_in(list(beside_shards))))
    sources: set[str] = set()
    unsent: set[str] = set()
    with engine.connect() as conn:
        for source_id, custom_id in conn.execute(query):
            if custom_id is None:
                sources.add(source_id)
            else:
                unsent.add(custom_id)
    return sources, unsent


def custom_ids_by_source(
    engine: Engine, job_id: str, source_ids: Iterable[str] | None = None
) -> dict[str, str]:
    """Source id → custom_id of a day's items (of `source_ids` only, when given): the ids
    they were given, which they keep whatever the id key is now."""
    r = result_table.c
    query = sa.select(r.source_id, r.custom_id).where(r.job_id == job_id, _by_source())
    queries = (
        [query]
        if source_ids is None
        else [query.where(r.source_id.in_(chunk)) for chunk in chunked(source_ids, limits.CHUNK)]
    )
    with engine.connect() as conn:
        return {source_id: cid for q in queries for source_id, cid in conn.execute(q)}


def set_item_errors(
    engine: Engine, job_id: str, rows: Iterable[dict[str, Any]], *, from_status: Sequence[str]
) -> int:
    """Per-item updates (different values per row), guarded by the current status."""
    allowed = status_in(from_status)
    moved = 0
    now = utcnow()
    for chunk in chunked(rows, limits.BULK_CHUNK):
        keys = [k for k in chunk[0] if k != "custom_id"]
        with engine.begin() as conn:
            check_fences(conn)
            bulk = Bulk(conn)
            if not bulk.postgres:
                sets = ", ".join(f"{k} = ?" for k in keys)
                moved += bulk.executemany(
                    f"UPDATE {_TABLE} SET {sets}, updated_at = ? WHERE job_id = ? "
                    f"AND custom_id = ? AND status IN ({allowed})",
                    ([row.get(k) for k in keys] + [now, job_id, row["custom_id"]] for row in chunk),
                )
                continue
            bulk.stage(
                result_table,
                ["custom_id", *keys],
                ([row["custom_id"]] + [row.get(k) for k in keys] for row in chunk),
            )
            sets = ", ".join(f"{k} = s.{k}" for k in keys)
            bulk.join_by_index()
            bulk.execute(
                f"UPDATE {_TABLE} AS r SET {sets}, updated_at = %(now)s "
                f"FROM {bulk.STAGE} AS s WHERE r.job_id = %(job)s "
                f"AND r.custom_id = s.custom_id AND r.status IN ({allowed})",
                {"now": now, "job": job_id},
            )
            moved += int(bulk.cursor.rowcount)
    return moved


def move_into_shard(
    engine: Engine,
    job_id: str,
    shard: dict[str, Any],
    lines: Sequence[tuple[str, int]],
    from_status: str,
    pseudonyms: Mappings | None = None,
) -> int:
    """Record a new shard and move its items (custom_id, request_offset in its file) from
    `from_status` into it, pending, atomically: all of them or, with ShardMismatch, none
    (and no shard). Returns how many moved.

    `pseudonyms` (lines rendered anew: a requeue): the mappings of the new lines, which
    replace whatever the items had in the same transaction (pseudonyms.py). None: the
    lines are the items' earlier lines again, and so are their mappings."""
    now = utcnow()
    # The last attempt's cost stays with the shard that paid it.
    sets = f"status = '{PENDING}', prior_cost_usd = r.prior_cost_usd + r.cost_usd, cost_usd = 0, "
    guard = f"status = {status_in([from_status])}"
    moved = 0
    with engine.begin() as conn:
        check_fences(conn)
        record_new_shard(conn, shard, now)
        bulk = Bulk(conn)
        for chunk in chunked(lines, limits.BULK_CHUNK):
            if not bulk.postgres:
                moved += bulk.executemany(
                    f"UPDATE {_TABLE} AS r SET {sets}shard_id = ?, request_offset = ?, "
                    f"updated_at = ? WHERE job_id = ? AND custom_id = ? AND {guard}",
                    [
                        (shard["shard_id"], offset, bulk.value(now), job_id, cid)
                        for cid, offset in chunk
                    ],
                    encoded=True,
                )
                continue
            bulk.stage(result_table, ["custom_id", "request_offset"], chunk)
            bulk.join_by_index()
            bulk.execute(
                f"UPDATE {_TABLE} AS r SET {sets}shard_id = %(shard)s, "
                "request_offset = s.request_offset, updated_at = %(now)s "
                f"FROM {bulk.STAGE} AS s WHERE r.job_id = %(job)s "
                f"AND r.custom_id = s.custom_id AND r.{guard}",
                {"shard": shard["shard_id"], "now": now, "job": job_id},
            )
            moved += int(bulk.cursor.rowcount)
        if moved != len(lines):
            raise ShardMismatch(
                f"shard {shard['shard_id']} was built with {len(lines)} items in "
                f"{from_status}, but only {moved} of them still were; nothing of it was "
                "recorded and no item moved"
            )
        if pseudonyms is not None:
            record_pseudonyms(conn, job_id, pseudonyms, [cid for cid, _ in lines])
    return moved


def set_shard_items(
    engine: Engine, shard_id: str, *, from_status: Sequence[str], **values: Any
) -> int:
    """Move every item of a shard that is still in one of `from_status`."""
    with engine.begin() as conn:
        check_fences(conn)
        return conn.execute(
            sa.update(result_table)
            .where(
                result_table.c.shard_id == shard_id,
                result_table.c.status.in_(list(from_status)),
            )
            .values(**values, updated_at=utcnow())
        ).rowcount


def iter_items(
    engine: Engine,
    job_id: str,
    statuses: Iterable[str] | None = None,
    *,
    shard_id: str | None = None,
    columns: Sequence[str] | None = None,
    few: int | None = None,
    custom_ids: tuple[str | None, str | None] = (None, None),
) -> Iterator[dict[str, Any]]:
    """Stream item rows in custom_id order without loading them all.

    `custom_ids`: (low, high): only the items whose custom_id is at least `low` and below
    `high` (None: no bound), read along the (job, custom_id) index: a slice of a day's
    validation.

    `few`: the caller expects about that many rows at most (the items to retry among a day's,
    say). Up to that many are read by one query, which PostgreSQL can spread over its parallel
    workers (it reads a cursor in one process); only when there are more is the rest streamed,
    after the last custom_id read. The rows also hold their custom_id then."""
    if few is not None and few < 1:
        raise ValueError(f"few must be 1 or more, got {few}")
    key = result_table.c.custom_id
    cols: list[sa.Column[Any] | sa.Table] = (
        [result_table.c[c] for c in columns] if columns else [result_table]
    )
    if few is not None and columns and "custom_id" not in columns:
        cols.append(key)
    query = sa.select(*cols).where(result_table.c.job_id == job_id)
    if statuses is not None:
        query = query.where(result_table.c.status.in_(list(statuses)))
    if shard_id is not None:
        query = query.where(result_table.c.shard_id == shard_id)
    low, high = custom_ids
    if low is not None:
        query = query.where(key >= low)
    if high is not None:
        query = query.where(key < high)
    query = query.order_by(key)
    with engine.connect() as conn:
        if few is not None:
            result = conn.execute(query.limit(few + 1))
            keys = list(result.keys())
            rows = result.all()
            for row in rows[:few]:
                yield dict(zip(keys, row, strict=True))
            if len(rows) <= few:
                return
            query = query.where(key > rows[few - 1].custom_id)
        result = conn.execution_options(yield_per=limits.CHUNK).execute(query)
        keys = list(result.keys())
        for row in result:
            yield dict(zip(keys, row, strict=True))


_COUNTS = (
    sa.select(
        result_table.c.status,
        result_table.c.error_class,
        sa.func.count(),
        sa.func.coalesce(sa.func.sum(result_table.c.input_tokens), 0),
        sa.func.coalesce(sa.func.sum(result_table.c.output_tokens), 0),
        sa.func.coalesce(sa.func.sum(result_table.c.cost_usd + result_table.c.prior_cost_usd), 0.0),
    )
    .where(result_table.c.job_id == sa.bindparam("job_id"))
    .group_by(result_table.c.status, result_table.c.error_class)
)
"""Built once (every look at a day counts its items); the job is bound at execution."""


def counts(engine: Engine, job_id: str) -> JobCounts:
    """A job's items by status and dead letters by error class, with tokens and cost."""
    with engine.connect() as conn:
        rows = conn.execute(_COUNTS, {"job_id": job_id}).all()
    found = JobCounts()
    by_status: dict[str, int] = {}
    by_class: dict[str, int] = {}
    for status, error_class, n, tin, tout, cost in rows:
        found.total += n
        by_status[status] = by_status.get(status, 0) + n
        if status == DEAD_LETTER:
            key = error_class or "unknown"
            by_class[key] = by_class.get(key, 0) + n
        found.input_tokens += int(tin)
        found.output_tokens += int(tout)
        found.cost_usd += float(cost)
    found.by_status = by_status
    found.dead_letters_by_class = by_class
    return found


def analyze(engine: Engine) -> None:
    """Fresh planner statistics after a large load (PostgreSQL). Without them a day's first
    updates can be planned as scans of the whole job, one per row."""
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text(f"ANALYZE {_TABLE}"))
