"""What retention reads and records: imported shards whose files at the provider are still to
be deleted, when each day of a pipeline (or of one of its evals) finished, so that its
artifacts are deleted only once nothing of it is open, and the expiry of a day's jobs.

At a day's expiry (every item terminal, every batch imported, `retention.artifacts_days`
after its last item became terminal; compliance/expiry.py decides when) `expire_jobs`
deletes the PAYLOADS of its jobs and keeps the rest: every text column of the ledger is named
in PAYLOADS or KEPT_TEXT with its rule (a test holds the tables to it).
"""

import datetime as dt
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict
from sqlalchemy.engine import Connection, Engine

from llm_assets.resources.ledger.locks import check_fences
from llm_assets.resources.ledger.records import ShardRecord, UtcDatetime, as_utc, utcnow
from llm_assets.resources.ledger.tables import (
    job_table,
    output_table,
    pseudonym_table,
    result_table,
    shard_table,
)
from llm_assets.results.rows import DEAD_LETTER, TERMINAL

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
QUALITY = "quality"

PAYLOADS = {
    "llm_batch_pseudonym.mapping_json": "an item's placeholders and the values they stand "
    "for: its rows are deleted",
    "llm_batch_output.output_json": "validated answers, values restored: its rows are deleted",
    "llm_batch_output.source_id": "goes with its output row",
    "llm_batch_result.result_json": "the model's answer: set to null",
    "llm_batch_result.error_message": "a quality dead letter's quotes the offending value of "
    "the answer: set to null (its rule stays in error_code); other classes name no content",
}
"""The ledger's text that holds an answer or a pseudonym, and what expiry does with it."""
KEPT_TEXT = {
    "llm_batch_result.source_id": "the source's id of the item, kept with its state and cost",
    "llm_batch_job.snapshot_uri": "a URI",
    "llm_batch_job.cancel_reason": "the operator's words",
    "llm_batch_job.personal_data_json": "counts by entity type and action, never a value",
    "llm_batch_shard.input_uri": "a URI",
    "llm_batch_shard.output_uri": "a URI",
    "llm_batch_shard.error_uri": "a URI",
    "llm_batch_shard.price_json": "the prices the shard was estimated at",
    "llm_batch_shard.message": "the provider's status message",
    "llm_batch_notification.text": "a day summary: counts, costs and the outcome",
    "llm_batch_notification.delivery_error": "why a webhook failed (type and status)",
    "llm_batch_pipeline_state.reason": "the operator's words",
    "llm_lock_lease.holder": "the name of a run",
    "llm_id_key.key": "the key custom_ids are derived with",
    "llm_quota.how": "how a provider quota was learned (a fixed phrase)",
}
"""The ledger's text that holds no prompt, answer, reference or pseudonym: kept."""


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
    dead_letters: int = 0
    """Terminal items that did not succeed: what a requeue could send again."""
    cancelled: bool = False
    """An operator's cancel (or the spend breaker's) stands on one of the day's jobs."""
    expired_at: UtcDatetime | None = None
    """When retention expired every job of the day (None: one of them is not expired)."""

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
    with engine.connect() as conn:
        jobs = conn.execute(
            sa.select(
                job_table.c.job_id,
                job_table.c.partition_date,
                job_table.c.updated_at,
                job_table.c.cancelled_at,
                job_table.c.retention_expired_at,
            )
            .where(job_table.c.pipeline == pipeline, job_table.c.partition_date.in_(wanted))
            .order_by(job_table.c.partition_date, job_table.c.job_id)
        ).all()
        by_day: dict[dt.date, list[sa.Row[Any]]] = {}
        for job in jobs:
            by_day.setdefault(job.partition_date, []).append(job)
        return {day: _day_state(conn, day, day_jobs) for day, day_jobs in by_day.items()}


def _day_state(conn: Connection, day: dt.date, jobs: list[sa.Row[Any]]) -> DayState:
    job_ids = [job.job_id for job in jobs]
    open_items, dead_letters, last_item = conn.execute(
        sa.select(
            sa.func.count().filter(result_table.c.status.not_in(list(TERMINAL))),
            sa.func.count().filter(result_table.c.status == DEAD_LETTER),
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
    last = as_utc(last_item) if last_item else max(as_utc(job.updated_at) for job in jobs)
    is_open = bool(open_items) or bool(unimported)
    expired = [job.retention_expired_at for job in jobs]
    return DayState(
        partition_date=day,
        job_ids=tuple(job_ids),
        open_items=int(open_items or 0),
        unimported_shards=int(unimported),
        finished_at=None if is_open else last,
        dead_letters=int(dead_letters or 0),
        cancelled=any(job.cancelled_at is not None for job in jobs),
        expired_at=as_utc(min(expired)) if all(expired) else None,
    )


def unexpired_days(engine: Engine, pipeline: str) -> list[dt.date]:
    """The days of a pipeline with a job retention has not expired yet: those whose ledger
    payloads a retention round still has to look at, whatever is left in the storage."""
    query = (
        sa.select(job_table.c.partition_date)
        .where(job_table.c.pipeline == pipeline, job_table.c.retention_expired_at.is_(None))
        .distinct()
        .order_by(job_table.c.partition_date)
    )
    with engine.connect() as conn:
        return list(conn.execute(query).scalars())


def eval_pipelines(engine: Engine, parent: str) -> list[str]:
    """The eval pipelines that ran under `parent` (their jobs name it as parent_pipeline)."""
    query = (
        sa.select(job_table.c.pipeline)
        .where(job_table.c.parent_pipeline == parent)
        .distinct()
        .order_by(job_table.c.pipeline)
    )
    with engine.connect() as conn:
        return list(conn.execute(query).scalars())


class PayloadPurge(BaseModel):
    """What the expiry of a day's jobs deleted from the ledger (see the module docstring)."""

    model_config = ConfigDict(frozen=True)

    jobs_expired: int = 0
    """Jobs marked expired now (those expired before are not counted again)."""
    answers: int = 0
    """Items whose `result_json` was set to null."""
    quality_messages: int = 0
    """Quality dead letters whose `error_message` (quoting the answer) was set to null."""
    outputs: int = 0
    """`llm_batch_output` rows deleted."""
    pseudonyms: int = 0
    """`llm_batch_pseudonym` rows (an item's placeholders and values) deleted."""

    @property
    def deleted_anything(self) -> bool:
        return bool(self.answers or self.quality_messages or self.outputs or self.pseudonyms)


def expire_jobs(
    engine: Engine, job_ids: Iterable[str], *, at: dt.datetime | None = None
) -> PayloadPurge:
    """Expire jobs: record when (so no step works on them again), and delete their answers,
    output payloads and pseudonyms, in one transaction so a day is never half expired. Ids,
    states, counts and costs stay; nothing's `updated_at` changes, so the day's finish time
    stays what retention measured. Idempotent: an expired job is purged again (a payload
    written since is deleted) without moving its expiry time. Fenced: a caller holding the
    day's lock writes nothing once another run took it over."""
    ids = sorted(set(job_ids))
    if not ids:
        return PayloadPurge()
    results = result_table.c
    with engine.begin() as conn:
        check_fences(conn)
        marked = conn.execute(
            sa.update(job_table)
            .where(job_table.c.job_id.in_(ids), job_table.c.retention_expired_at.is_(None))
            .values(retention_expired_at=at or utcnow())
        ).rowcount
        answers = conn.execute(
            sa.update(result_table)
            .where(results.job_id.in_(ids), results.result_json.is_not(None))
            .values(result_json=None)
        ).rowcount
        messages = conn.execute(
            sa.update(result_table)
            .where(
                results.job_id.in_(ids),
                results.error_class == QUALITY,
                results.error_message.is_not(None),
            )
            .values(error_message=None)
        ).rowcount
        outputs = conn.execute(
            sa.delete(output_table).where(output_table.c.job_id.in_(ids))
        ).rowcount
        pseudonyms = conn.execute(
            sa.delete(pseudonym_table).where(pseudonym_table.c.job_id.in_(ids))
        ).rowcount
    return PayloadPurge(
        jobs_expired=marked,
        answers=answers,
        quality_messages=messages,
        outputs=outputs,
        pseudonyms=pseudonyms,
    )
