"""Read-only questions for reports, sensors and estimates: cost per job and per shard, shards
to poll, days ready to validate, items never answered, dead letters."""

import datetime as dt
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from llm_assets.resources.ledger import limits
from llm_assets.resources.ledger.records import JobRecord, ShardRecord, ShardReport, as_utc
from llm_assets.resources.ledger.tables import (
    REQUEUE_SHARD,
    RETRY_SHARD,
    job_table,
    result_table,
    shard_table,
)
from llm_assets.results.rows import DEAD_LETTER, SUBMITTED, SUCCEEDED

_r = result_table.c
_s = shard_table.c
_j = job_table.c

_JOB_COST_COLUMNS = {
    "date": str,
    "job_id": str,
    "provider": str,
    "model": str,
    "prompt_version": str,
    "items": int,
    "succeeded": int,
    "dead_letters": int,
    "estimated_input_tokens": int,
    "input_tokens": int,
    "output_tokens": int,
    "cost_usd": float,
    "retry_cost_usd": float,
    "estimated_cost_usd": float,
    "estimated_cost_upper_usd": float,
}
"""A row of job_cost_rows: its keys in order, each with the type it is given."""


def _count_of(condition: Any) -> Any:
    return sa.func.sum(sa.case((condition, 1), else_=0))


def _live_job_totals(jobs: Any) -> Any:
    """Per job: its items now, by outcome, and the cost of all their attempts."""
    return (
        sa.select(
            _r.job_id,
            sa.func.count().label("n_items"),
            _count_of(_r.status == SUCCEEDED).label("succeeded"),
            _count_of(_r.status == DEAD_LETTER).label("dead_letters"),
            sa.func.sum(_r.cost_usd + _r.prior_cost_usd).label("cost_usd"),
        )
        .where(_r.job_id.in_(jobs))
        .group_by(_r.job_id)
        .subquery()
    )


def _billed_job_totals(jobs: Any) -> Any:
    """Per job, from its shards' settled numbers: tokens billed, the cost of retry and requeue
    shards, and the estimates."""
    return (
        sa.select(
            _s.job_id,
            sa.func.sum(sa.func.coalesce(_s.actual_input_tokens, 0)).label("tin"),
            sa.func.sum(sa.func.coalesce(_s.actual_output_tokens, 0)).label("tout"),
            sa.func.sum(
                sa.case((_s.kind.in_((RETRY_SHARD, REQUEUE_SHARD)), _s.actual_cost_usd), else_=0.0)
            ).label("retry_cost"),
            sa.func.sum(_s.estimated_input_tokens).label("est_in"),
            sa.func.sum(_s.estimated_cost_usd).label("est"),
            sa.func.sum(_s.estimated_cost_upper_usd).label("upper"),
        )
        .where(_s.job_id.in_(jobs))
        .group_by(_s.job_id)
        .subquery()
    )


def job_cost_rows(
    engine: Engine, pipeline: str, start: dt.date | None = None, end: dt.date | None = None
) -> list[dict[str, Any]]:
    """Per job of a pipeline (one per day, prompt version and model): items, billed tokens
    and cost, retry overhead and the estimate, from the shards' settled numbers."""
    # Only the window's jobs are summed: their items, not the pipeline's whole history.
    jobs = sa.select(_j.job_id).where(_j.pipeline == pipeline)
    if start is not None:
        jobs = jobs.where(_j.partition_date >= start)
    if end is not None:
        jobs = jobs.where(_j.partition_date <= end)
    live = _live_job_totals(jobs)
    billed = _billed_job_totals(jobs)
    query = (
        sa.select(
            _j.partition_date,
            _j.job_id,
            _j.provider,
            _j.model_name,
            _j.prompt_version,
            *(
                sa.func.coalesce(column, 0)
                for column in (live.c.n_items, live.c.succeeded, live.c.dead_letters)
            ),
            *(sa.func.coalesce(column, 0) for column in (billed.c.est_in, billed.c.tin)),
            sa.func.coalesce(billed.c.tout, 0),
            *(
                sa.func.coalesce(column, 0.0)
                for column in (live.c.cost_usd, billed.c.retry_cost, billed.c.est, billed.c.upper)
            ),
        )
        .select_from(
            job_table.outerjoin(live, live.c.job_id == _j.job_id).outerjoin(
                billed, billed.c.job_id == _j.job_id
            )
        )
        .where(_j.pipeline == pipeline)
        .order_by(_j.partition_date, _j.created_at)
    )
    if start is not None:
        query = query.where(_j.partition_date >= start)
    if end is not None:
        query = query.where(_j.partition_date <= end)
    with engine.connect() as conn:
        return [_job_cost_row(row) for row in conn.execute(query)]


def _job_cost_row(values: Sequence[Any]) -> dict[str, Any]:
    row = dict(zip(_JOB_COST_COLUMNS, values, strict=True))
    for key, kind in _JOB_COST_COLUMNS.items():
        row[key] = row[key].isoformat() if key == "date" else kind(row[key])
    return row


def _sum(column: Any, where: Any = None) -> Any:
    """The column's sum over a group's rows (those under `where`), 0 for none."""
    summed = column if where is None else sa.case((where, column), else_=0)
    return sa.func.coalesce(sa.func.sum(summed), 0)


def shard_report(engine: Engine, job_id: str) -> ShardReport:
    """The job's shards with their items' totals, its token estimate's error and its prompt
    cache use, from one read of its items grouped by shard.

    A shard's billed numbers are frozen when it is imported (`close_shard`), because items may
    later move to retry or requeue shards; before that they are the live sums of its items.
    """
    billed = sa.and_(_r.input_tokens > 0, _r.estimated_input_tokens > 0)
    succeeded = _r.status == SUCCEEDED
    sums = {
        "items_now": sa.func.count(),
        "succeeded": _count_of(succeeded),
        "input_tokens": _sum(_r.input_tokens),
        "output_tokens": _sum(_r.output_tokens),
        "cost_usd": _sum(_r.cost_usd),
        "billed_estimate": _sum(_r.estimated_input_tokens, billed),
        "billed_input": _sum(_r.input_tokens, billed),
        "cache_read": _sum(_r.cached_input_tokens, succeeded),
        "cache_written": _sum(_r.cache_write_input_tokens, succeeded),
    }
    per_shard = (
        sa.select(_r.shard_id, *sums.values()).where(_r.job_id == job_id).group_by(_r.shard_id)
    )
    shards = sa.select(shard_table).where(_s.job_id == job_id).order_by(_s.round, _s.shard_index)
    with engine.connect() as conn:
        live = {row[0]: dict(zip(sums, row[1:], strict=True)) for row in conn.execute(per_shard)}
        shard_rows = list(conn.execute(shards))
    estimated = sum(int(group["billed_estimate"]) for group in live.values())
    billed_input = sum(int(group["billed_input"]) for group in live.values())
    empty = dict.fromkeys(sums, 0)
    rows: list[dict[str, Any]] = []
    cache: list[tuple[str | None, str | None, int, int]] = []
    for shard in shard_rows:
        items = live.get(shard.shard_id, empty)
        rows.append(
            {
                "shard_id": shard.shard_id,
                "kind": shard.kind,
                "round": shard.round,
                "status": shard.status,
                "provider_batch_id": shard.provider_batch_id,
                "requests": shard.item_count,
                "items_now": int(items["items_now"]),
                "succeeded": int(items["succeeded"]),
                "estimated_input_tokens": shard.estimated_input_tokens,
                "input_tokens": _settled(shard.actual_input_tokens, int(items["input_tokens"])),
                "output_tokens": _settled(shard.actual_output_tokens, int(items["output_tokens"])),
                "estimated_cost_usd": shard.estimated_cost_usd,
                "estimated_cost_upper_usd": shard.estimated_cost_upper_usd,
                "cost_usd": _settled(shard.actual_cost_usd, float(items["cost_usd"])),
            }
        )
        read, written = int(items["cache_read"]), int(items["cache_written"])
        if read or written:
            cache.append((shard.provider_batch_id, shard.price_json, read, written))
    return ShardReport(
        shards=rows,
        input_token_estimate_error=billed_input / estimated - 1 if estimated else None,
        cache_usage=cache,
    )


def _settled(frozen: Any, live: Any) -> Any:
    """A shard's billed number: frozen at its import, its items' live sum before."""
    return live if frozen is None else frozen


def output_tokens_per_billed_item(engine: Engine, job_ids: Sequence[str]) -> dict[str, float]:
    """Per job, output tokens over the items that were billed (their last attempt), those
    that later failed the quality gate included: what an item's answer costs."""
    query = (
        sa.select(_r.job_id, sa.func.sum(_r.output_tokens), sa.func.count())
        .where(_r.job_id.in_(list(job_ids)), _r.input_tokens > 0)
        .group_by(_r.job_id)
    )
    with engine.connect() as conn:
        return {job: int(out) / n for job, out, n in conn.execute(query) if n}


def cache_usage(engine: Engine, job_ids: Sequence[str]) -> tuple[int, int, int]:
    """Over the succeeded items of the jobs: input tokens, and of them those read from and
    written to the provider's prompt cache."""
    query = sa.select(
        sa.func.coalesce(sa.func.sum(_r.input_tokens), 0),
        sa.func.coalesce(sa.func.sum(_r.cached_input_tokens), 0),
        sa.func.coalesce(sa.func.sum(_r.cache_write_input_tokens), 0),
    ).where(_r.job_id.in_(list(job_ids)), _r.status == SUCCEEDED)
    with engine.connect() as conn:
        tokens, read, written = conn.execute(query).one()
    return int(tokens), int(read), int(written)


def pipeline_shards(
    engine: Engine, pipeline: str, statuses: Iterable[str]
) -> list[tuple[ShardRecord, dt.date]]:
    """Shards of a pipeline in some states with their partition date, least recently touched
    first, so a poller cut short by its deadline continues where it stopped."""
    query = (
        sa.select(shard_table, _j.partition_date)
        .join(job_table, _j.job_id == _s.job_id)
        .where(_j.pipeline == pipeline, _s.status.in_(list(statuses)))
        .order_by(_s.updated_at, _s.shard_id)
    )
    with engine.connect() as conn:
        return [
            (ShardRecord.model_validate(row._mapping), row.partition_date)
            for row in conn.execute(query)
        ]


def finished_jobs(
    engine: Engine, pipeline: str, since: dt.datetime
) -> list[tuple[JobRecord, int, dt.datetime]]:
    """Completed jobs whose shards are all imported, the last import since `since`, with their
    shard count and last import time: the days ready to be validated and reported. Bounded by
    `since` so the sensor's work does not grow with the pipeline's history."""
    shard_count = sa.func.count(_s.shard_id)
    query = (
        sa.select(
            job_table,
            shard_count.label("n_shards"),
            sa.func.max(_s.imported_at).label("last_imported"),
        )
        .join(shard_table, _s.job_id == _j.job_id)
        .where(_j.pipeline == pipeline, _j.status == "completed")
        .group_by(*job_table.c)
        .having(
            sa.and_(
                _count_of(_s.status == "imported") == shard_count,
                sa.func.max(_s.imported_at) >= since,
            )
        )
        .order_by(_j.partition_date)
    )
    with engine.connect() as conn:
        return [
            (JobRecord.model_validate(row._mapping), int(row.n_shards), as_utc(row.last_imported))
            for row in conn.execute(query)
        ]


def active_jobs(engine: Engine, pipeline: str, since: dt.datetime) -> list[JobRecord]:
    """The jobs of a pipeline and of its evals that the lifecycle may have something to do
    for: a shard not imported yet, or every shard imported (the last since `since`) and the
    day not validated and reported since. Bounded by `since` so a sensor's work does not grow
    with the pipeline's history."""
    last = sa.func.max(_s.imported_at)
    open_shards = sa.func.count(_s.shard_id).filter(_s.status != "imported")
    unfinished = sa.or_(
        _j.reported_at.is_(None),
        _j.reported_at < last,
        _j.validated_at.is_(None),
        _j.validated_at < last,
    )
    query = (
        sa.select(job_table)
        .join(shard_table, _s.job_id == _j.job_id)
        .where(sa.or_(_j.pipeline == pipeline, _j.parent_pipeline == pipeline))
        .group_by(*job_table.c)
        .having(sa.or_(open_shards > 0, sa.and_(last >= since, unfinished)))
        .order_by(_j.partition_date, _j.pipeline)
    )
    with engine.connect() as conn:
        return [JobRecord.model_validate(row._mapping) for row in conn.execute(query)]


def recent_provider_batch_ids(engine: Engine, provider: str, since: dt.datetime) -> frozenset[str]:
    """Provider batch ids recorded for shards submitted since `since`."""
    query = sa.select(_s.provider_batch_id).where(
        _s.provider == provider, _s.provider_batch_id.is_not(None), _s.submitted_at >= since
    )
    with engine.connect() as conn:
        return frozenset(conn.execute(query).scalars())


def missing_results(engine: Engine, job_id: str, limit: int = 1000) -> list[str]:
    """Items sent but never answered: dead letters that ran out of attempts without a result,
    and items still `submitted` although their shard was imported."""
    imported = sa.select(_s.shard_id).where(_s.job_id == job_id, _s.status == "imported")
    orphaned = sa.and_(_r.status == SUBMITTED, _r.shard_id.in_(imported))
    never_answered = sa.and_(_r.status == DEAD_LETTER, _r.error_code.like("missing_result%"))
    query = (
        sa.select(_r.custom_id)
        .where(_r.job_id == job_id, sa.or_(orphaned, never_answered))
        .order_by(_r.custom_id)
        .limit(limit)
    )
    with engine.connect() as conn:
        return list(conn.execute(query).scalars())


def iter_dead_letters(engine: Engine, job_id: str) -> Iterator[dict[str, Any]]:
    """Dead letters with the provider batch of their last attempt, in source id order (rows
    without one last): custom_ids are hashes, in no order a reader would follow."""
    query = (
        sa.select(
            _r.custom_id,
            _r.source_id,
            _r.error_class,
            _r.error_code,
            _r.error_message,
            _r.attempts,
            _s.provider_batch_id.label("last_provider_batch"),
        )
        .select_from(result_table.outerjoin(shard_table, _s.shard_id == _r.shard_id))
        .where(_r.job_id == job_id, _r.status == DEAD_LETTER)
        .order_by(_r.source_id.asc().nulls_last(), _r.custom_id)
    )
    with engine.connect() as conn:
        for row in conn.execution_options(yield_per=limits.CHUNK).execute(query):
            yield dict(row._mapping)
