"""Ledger reads and writes only tests need, in plain SQLAlchemy over a LedgerResource."""

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from llm_assets.resources.ledger import (
    JobRecord,
    LedgerResource,
    ShardRecord,
    job_table,
    reservation_table,
    result_table,
    shard_table,
    utcnow,
)
from llm_assets.resources.ledger.tables import schema_version as version_table


def schema_version(ledger: LedgerResource) -> int:
    """The schema version recorded in the ledger (made on first use)."""
    with ledger.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.max(version_table.c.version))).scalar())


def jobs_for_pipeline(ledger: LedgerResource, pipeline: str) -> list[JobRecord]:
    query = (
        sa.select(job_table)
        .where(job_table.c.pipeline == pipeline)
        .order_by(job_table.c.partition_date, job_table.c.created_at)
    )
    with ledger.engine.connect() as conn:
        return [JobRecord.model_validate(r._mapping) for r in conn.execute(query)]


def shards_in_states(
    ledger: LedgerResource, statuses: Iterable[str], pipeline: str | None = None
) -> list[ShardRecord]:
    query = sa.select(shard_table).where(shard_table.c.status.in_(list(statuses)))
    if pipeline is not None:
        query = query.join(job_table, job_table.c.job_id == shard_table.c.job_id).where(
            job_table.c.pipeline == pipeline
        )
    with ledger.engine.connect() as conn:
        return [ShardRecord.model_validate(r._mapping) for r in conn.execute(query)]


def set_item_status(
    ledger: LedgerResource,
    job_id: str,
    custom_ids: Iterable[str],
    *,
    from_status: Sequence[str],
    **values: Any,
) -> int:
    """Move items from one of `from_status` to new values; returns rows moved."""
    query = (
        sa.update(result_table)
        .where(
            result_table.c.job_id == job_id,
            result_table.c.custom_id.in_(list(custom_ids)),
            result_table.c.status.in_(list(from_status)),
        )
        .values(**values, updated_at=utcnow())
    )
    with ledger.begin() as conn:
        return conn.execute(query).rowcount


def set_shard_items(
    ledger: LedgerResource, shard_id: str, *, from_status: Sequence[str], **values: Any
) -> int:
    """Move every item of a shard that is still in one of `from_status`."""
    query = (
        sa.update(result_table)
        .where(result_table.c.shard_id == shard_id, result_table.c.status.in_(list(from_status)))
        .values(**values, updated_at=utcnow())
    )
    with ledger.begin() as conn:
        return conn.execute(query).rowcount


def spend(ledger: LedgerResource, pipeline: str, since: dt.date) -> float:
    """Spent or reserved by a pipeline since a date (what the budget caps count)."""
    spent = sa.func.coalesce(reservation_table.c.actual_usd, reservation_table.c.reserved_usd)
    query = sa.select(sa.func.coalesce(sa.func.sum(spent), 0.0)).where(
        reservation_table.c.pipeline == pipeline, reservation_table.c.spend_date >= since
    )
    with ledger.engine.connect() as conn:
        return float(conn.execute(query).scalar() or 0.0)
