"""Budget: shards' upper cost bounds reserved against a pipeline's daily and monthly caps,
all or none, serialized per pipeline so concurrent partitions cannot overspend together."""

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from llm_assets.resources.ledger.records import utcnow
from llm_assets.resources.ledger.schema import dialect_insert
from llm_assets.resources.ledger.tables import budget_lock_table, reservation_table, shard_table


def spent_since(conn: Connection, pipeline: str, since: dt.date) -> float:
    """A pipeline's reservations since a date: actual cost once settled, else the bound."""
    spent = sa.func.coalesce(reservation_table.c.actual_usd, reservation_table.c.reserved_usd)
    query = sa.select(sa.func.coalesce(sa.func.sum(spent), 0.0)).where(
        reservation_table.c.pipeline == pipeline, reservation_table.c.spend_date >= since
    )
    return float(conn.execute(query).scalar() or 0.0)


def reserve_budget(
    engine: Engine,
    *,
    pipeline: str,
    job_id: str,
    shards: dict[str, float],
    max_per_day: float | None,
    max_per_month: float | None,
) -> str | None:
    """Reserve the upper bounds of a partition's shards (shard_id -> USD) against the
    pipeline's daily and monthly caps, all or none.

    Returns None when reserved (shards reserved by an earlier attempt count as reserved) and
    the reason otherwise. Reservations of one pipeline are serialized by a row lock, so
    concurrent partitions see each other's reservations and cannot overspend together; a
    settled reservation counts its actual cost instead of its bound.
    """
    now = utcnow()
    today = now.date()
    with engine.begin() as conn:
        _lock_pipeline(conn, pipeline, now)
        held = set(
            conn.execute(
                sa.select(reservation_table.c.shard_id).where(
                    reservation_table.c.shard_id.in_(list(shards))
                )
            ).scalars()
        )
        wanted = {sid: usd for sid, usd in shards.items() if sid not in held}
        if not wanted:
            return None
        amount = sum(wanted.values())
        for cap, since, period in (
            (max_per_day, today, f"day {today} (UTC)"),
            (max_per_month, today.replace(day=1), f"month {today:%Y-%m}"),
        ):
            if cap is None:
                continue
            used = spent_since(conn, pipeline, since)
            if used + amount > cap:
                return (
                    f"pipeline {pipeline} has ${used:.4f} spent or reserved for the {period}; "
                    f"{len(wanted)} shard(s) of {job_id} need up to ${amount:.4f} more, over "
                    f"the cap of ${cap:.4f}"
                )
        conn.execute(
            sa.insert(reservation_table),
            [
                {
                    "shard_id": sid,
                    "pipeline": pipeline,
                    "job_id": job_id,
                    "spend_date": today,
                    "reserved_usd": usd,
                    "created_at": now,
                }
                for sid, usd in wanted.items()
            ],
        )
    return None


def _lock_pipeline(conn: Connection, pipeline: str, now: dt.datetime) -> None:
    """Take the pipeline's budget row lock for the rest of the transaction (on SQLite the
    write takes the database's write lock): every reservation of the pipeline waits for it."""
    conn.execute(
        dialect_insert(conn, budget_lock_table)
        .values(pipeline=pipeline, touched_at=now)
        .on_conflict_do_nothing()
    )
    conn.execute(
        sa.update(budget_lock_table)
        .where(budget_lock_table.c.pipeline == pipeline)
        .values(touched_at=now)
    )


def committed_cost(engine: Engine, job_id: str) -> float:
    """What a job has spent or may still spend: billed cost of settled shards plus the upper
    bound of every other shard."""
    bound = sa.func.coalesce(shard_table.c.actual_cost_usd, shard_table.c.estimated_cost_upper_usd)
    query = sa.select(sa.func.coalesce(sa.func.sum(bound), 0.0)).where(
        shard_table.c.job_id == job_id
    )
    with engine.connect() as conn:
        return float(conn.execute(query).scalar() or 0.0)
