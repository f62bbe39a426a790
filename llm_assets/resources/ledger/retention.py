"""What retention reads and records: imported shards whose files at the provider are still to
be deleted, and when each day of a pipeline finished, so that its artifacts are deleted only
once nothing of it is open."""

import datetime as dt
from collections.abc import Iterable

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict
from sqlalchemy.engine import Engine

from llm_assets.resources.ledger.records import ShardRecord, UtcDatetime, as_utc, utcnow
from llm_assets.resources.ledger.tables import job_table, result_table, shard_table
from llm_assets.result_rows import TERMINAL

IMPORTED = "imported"
UNIMPORTED_BATCH_STATES = (
    "submitted",
    "running",
    "completed",
    "failed",
    "expired",
    "cancelled",
)
"""A shard in one of these has a provider batch whose results are not in the ledger yet."""


class DayState(BaseModel):
    """One day of a pipeline as retention sees it: its jobs, whether any work of them is open,
    and when the last of their items became terminal."""

    model_config = ConfigDict(frozen=True)

    partition_date: dt.date
    job_ids: tuple[str, ...]
    open_items: int
    unimported_shards: int
    finished_at: UtcDatetime | None
    """When the day's last item became terminal (None: it has open work)."""

    @property
    def open(self) -> bool:
        return self.open_items > 0 or self.unimported_shards > 0


def provider_files_to_delete(
    engine: Engine, *, job_id: str | None = None, pipeline: str | None = None
) -> list[ShardRecord]:
    """Imported shards with a provider batch whose files at the provider were not deleted
    yet, of one job or of a whole pipeline, oldest import first."""
    query = sa.select(shard_table).where(
        shard_table.c.status == IMPORTED,
        shard_table.c.provider_files_deleted_at.is_(None),
        shard_table.c.provider_batch_id.is_not(None),
        shard_table.c.provider_batch_id != "",
    )
    if job_id is not None:
        query = query.where(shard_table.c.job_id == job_id)
    if pipeline is not None:
        query = query.join(job_table, job_table.c.job_id == shard_table.c.job_id).where(
            job_table.c.pipeline == pipeline
        )
    query = query.order_by(shard_table.c.imported_at, shard_table.c.shard_id)
    with engine.connect() as conn:
        return [ShardRecord.model_validate(r._mapping) for r in conn.execute(query)]


def mark_provider_files_deleted(engine: Engine, shard_id: str) -> bool:
    """Record that an imported shard's files at the provider are gone; False when the shard
    is not imported (nothing is recorded then) or was recorded already."""
    now = utcnow()
    with engine.begin() as conn:
        changed = conn.execute(
            sa.update(shard_table)
            .where(
                shard_table.c.shard_id == shard_id,
                shard_table.c.status == IMPORTED,
                shard_table.c.provider_files_deleted_at.is_(None),
            )
            .values(provider_files_deleted_at=now, updated_at=now)
        ).rowcount
    return bool(changed)


def day_states(engine: Engine, pipeline: str, days: Iterable[dt.date]) -> dict[dt.date, DayState]:
    """The state of each of `days` that has a job in the ledger (days without one are left
    out): open items and unimported shards over all its jobs, and when it finished."""
    wanted = sorted(set(days))
    if not wanted:
        return {}
    found: dict[dt.date, DayState] = {}
    with engine.connect() as conn:
        jobs = conn.execute(
            sa.select(job_table.c.job_id, job_table.c.partition_date, job_table.c.updated_at)
            .where(job_table.c.pipeline == pipeline, job_table.c.partition_date.in_(wanted))
            .order_by(job_table.c.partition_date, job_table.c.job_id)
        ).all()
        by_day: dict[dt.date, list[tuple[str, dt.datetime]]] = {}
        for job_id, day, updated_at in jobs:
            by_day.setdefault(day, []).append((job_id, as_utc(updated_at)))
        for day, day_jobs in by_day.items():
            job_ids = [job_id for job_id, _ in day_jobs]
            open_items, last_item = conn.execute(
                sa.select(
                    sa.func.count().filter(result_table.c.status.not_in(list(TERMINAL))),
                    sa.func.max(result_table.c.updated_at),
                ).where(result_table.c.job_id.in_(job_ids))
            ).one()
            unimported = conn.execute(
                sa.select(sa.func.count()).where(
                    shard_table.c.job_id.in_(job_ids),
                    shard_table.c.status.in_(UNIMPORTED_BATCH_STATES),
                )
            ).scalar_one()
            # A day without items (an empty source) finished when its job was last written.
            last = as_utc(last_item) if last_item else max(updated for _, updated in day_jobs)
            is_open = bool(open_items) or bool(unimported)
            found[day] = DayState(
                partition_date=day,
                job_ids=tuple(job_ids),
                open_items=int(open_items or 0),
                unimported_shards=int(unimported),
                finished_at=None if is_open else last,
            )
    return found
