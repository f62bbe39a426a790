"""Jobs: one per (pipeline, partition date, prompt version, provider, model), their totals
recomputed from their items."""

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from llm_assets.resources.ledger import items
from llm_assets.resources.ledger.locks import check_fences
from llm_assets.resources.ledger.records import JobCounts, JobRecord, utcnow
from llm_assets.resources.ledger.schema import dialect_insert
from llm_assets.resources.ledger.tables import job_table, shard_table

# Reads that every step of a day makes, built once: building a statement costs more than
# SQLite takes to run it. Their values are bound at execution.
_JOB = sa.select(job_table).where(job_table.c.job_id == sa.bindparam("job_id"))
_JOB_CANCELLED_AT = sa.select(job_table.c.cancelled_at).where(
    job_table.c.job_id == sa.bindparam("job_id")
)
_ANY_SUBMITTED = (
    sa.select(sa.literal(1))
    .where(
        shard_table.c.job_id == sa.bindparam("job_id"),
        shard_table.c.provider_batch_id.is_not(None),
        shard_table.c.provider_batch_id != "",
    )
    .limit(1)
)


def get_or_create_job(engine: Engine, **job: Any) -> JobRecord:
    """The job of these key columns, created (status `created`) when there is none. Runs
    that create it at once (the slices of a new day) all get it: the insert gives way on any
    of the job's unique keys, not only its id, which a concurrent insert may hit first."""
    now = utcnow()
    with engine.begin() as conn:
        conn.execute(
            dialect_insert(conn, job_table)
            .values(**job, status="created", created_at=now, updated_at=now)
            .on_conflict_do_nothing()
        )
    found = get_job(engine, job["job_id"])
    assert found is not None
    return found


def get_job(engine: Engine, job_id: str) -> JobRecord | None:
    with engine.connect() as conn:
        row = conn.execute(_JOB, {"job_id": job_id}).first()
    return JobRecord.model_validate(row._mapping) if row else None


def add_personal_data(engine: Engine, job_id: str, found: Mapping[str, int]) -> None:
    """Add counts of personal data found (by "entity:action") to the job's, in one
    transaction: the slices of a day add theirs at once."""
    if not found:
        return
    where = job_table.c.job_id == job_id
    with engine.begin() as conn:
        # The row is written first, so that the transaction holds it while it reads it.
        conn.execute(sa.update(job_table).where(where).values(updated_at=utcnow()))
        current = conn.execute(sa.select(job_table.c.personal_data_json).where(where)).scalar()
        merged: dict[str, int] = json.loads(current) if current else {}
        for key, count in found.items():
            merged[key] = merged.get(key, 0) + count
        conn.execute(
            sa.update(job_table)
            .where(where)
            .values(personal_data_json=json.dumps(dict(sorted(merged.items()))))
        )


def jobs_for_partition(engine: Engine, pipeline: str, partition_date: dt.date) -> list[JobRecord]:
    query = (
        sa.select(job_table)
        .where(job_table.c.pipeline == pipeline, job_table.c.partition_date == partition_date)
        .order_by(job_table.c.created_at)
    )
    with engine.connect() as conn:
        return [JobRecord.model_validate(r._mapping) for r in conn.execute(query)]


def update_job(engine: Engine, job_id: str, **values: Any) -> None:
    with engine.begin() as conn:
        check_fences(conn)
        conn.execute(
            sa.update(job_table)
            .where(job_table.c.job_id == job_id)
            .values(**values, updated_at=utcnow())
        )


def refresh_job(engine: Engine, job_id: str) -> JobCounts:
    """Recompute a job's totals and status from its items."""
    counts = items.counts(engine, job_id)
    if _cancelled(engine, job_id):
        status = "cancelled"
    elif counts.total and counts.open == 0:
        status = "completed"
    elif _any_submitted(engine, job_id):
        status = "running"
    else:
        status = "created"
    update_job(
        engine,
        job_id,
        status=status,
        total_items=counts.total,
        succeeded_items=counts.succeeded,
        failed_items=counts.dead_letters,
        expired_items=counts.dead_letters_by_class.get("expired", 0),
        input_tokens=counts.input_tokens,
        output_tokens=counts.output_tokens,
        cost_usd=counts.cost_usd,
    )
    return counts


def _cancelled(engine: Engine, job_id: str) -> bool:
    """Whether an operator's cancel of the whole day stands."""
    with engine.connect() as conn:
        return conn.execute(_JOB_CANCELLED_AT, {"job_id": job_id}).scalar() is not None


def _any_submitted(engine: Engine, job_id: str) -> bool:
    """Whether a shard of the job has a provider batch."""
    with engine.connect() as conn:
        return conn.execute(_ANY_SUBMITTED, {"job_id": job_id}).first() is not None


def earlier_jobs(
    engine: Engine, pipeline: str, before: dt.date, partitions: int
) -> list[JobRecord]:
    """Completed jobs on the `partitions` latest days before `before`, the last created per
    day: the history that estimates and drift checks learn from."""
    query = (
        sa.select(job_table)
        .where(
            job_table.c.pipeline == pipeline,
            job_table.c.partition_date < before,
            job_table.c.status == "completed",
        )
        .order_by(job_table.c.partition_date.desc(), job_table.c.created_at.desc())
    )
    latest: dict[dt.date, JobRecord] = {}
    with engine.connect() as conn:
        for row in conn.execution_options(yield_per=100).execute(query):
            job = JobRecord.model_validate(row._mapping)
            if job.partition_date not in latest:
                if len(latest) == partitions:
                    break
                latest[job.partition_date] = job
    return list(latest.values())
