"""Provider quotas as the ledger knows them: what each quota was learned to admit (one row of
`llm_quota` per provider, account, model and kind), what is in flight against it, and the
history the waiting loop plans by (when a batch of a model last ended, how long batches took).

A row changes only through `learn_quota`, which reads it under a row lock (PostgreSQL) or the
database's write lock (SQLite) and writes what the caller's pure rule (steps/quota.py) makes of
it, so runs, days and processes learning at once each build on the other's word.
"""

import datetime as dt
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from llm_assets.resources.ledger.records import QuotaKey, QuotaRecord, utcnow
from llm_assets.resources.ledger.schema import dialect_insert
from llm_assets.resources.ledger.tables import job_table, quota_table, shard_table

_q, _s, _j = quota_table.c, shard_table.c, job_table.c
_IN_FLIGHT = ("submitted", "running")


def _where(key: QuotaKey) -> sa.ColumnElement[bool]:
    return sa.and_(
        _q.provider == key.provider,
        _q.account == key.account,
        _q.model_name == key.model_name,
        _q.kind == key.kind,
    )


_QUOTA = sa.select(quota_table).where(
    _q.provider == sa.bindparam("provider"),
    _q.account == sa.bindparam("account"),
    _q.model_name == sa.bindparam("model_name"),
    _q.kind == sa.bindparam("kind"),
)
"""Built once, as the reads below: submission reads quotas and loads shard by shard."""


def quota_record(engine: Engine, key: QuotaKey) -> QuotaRecord:
    """What is known of the quota (a blank record when nothing is)."""
    with engine.connect() as conn:
        row = conn.execute(_QUOTA, key.model_dump()).first()
    return QuotaRecord.model_validate(row._mapping) if row else QuotaRecord.new(key)


def learn_quota(
    engine: Engine, key: QuotaKey, change: Callable[[QuotaRecord], dict[str, Any]]
) -> QuotaRecord:
    """Apply `change` (the record as it is -> the columns to set) to the quota's row in one
    transaction, the row locked meanwhile; returns the record as written."""
    with engine.begin() as conn:
        conn.execute(
            dialect_insert(conn, quota_table)
            .values(**key.model_dump(), updated_at=utcnow())
            .on_conflict_do_nothing()
        )
        row = conn.execute(sa.select(quota_table).where(_where(key)).with_for_update()).one()
        values = change(QuotaRecord.model_validate(row._mapping))
        if values:
            conn.execute(
                sa.update(quota_table).where(_where(key)).values(**values, updated_at=utcnow())
            )
        row = conn.execute(sa.select(quota_table).where(_where(key))).one()
    return QuotaRecord.model_validate(row._mapping)


def quota_records(engine: Engine, provider: str | None = None) -> list[QuotaRecord]:
    query = sa.select(quota_table).order_by(_q.provider, _q.model_name, _q.account, _q.kind)
    if provider is not None:
        query = query.where(_q.provider == provider)
    with engine.connect() as conn:
        return [QuotaRecord.model_validate(r._mapping) for r in conn.execute(query)]


def reset_quotas(engine: Engine, *, provider: str | None = None, model: str | None = None) -> int:
    """Forget what was learned (of one provider's, one model's or every quota): submission
    starts learning again from what it sees. Returns how many quotas were forgotten."""
    query = sa.delete(quota_table)
    if provider is not None:
        query = query.where(_q.provider == provider)
    if model is not None:
        query = query.where(_q.model_name == model)
    with engine.begin() as conn:
        return int(conn.execute(query).rowcount or 0)


def _of_model(*conditions: sa.ColumnElement[bool]) -> sa.Select[Any]:
    """The batches of the provider and model bound at execution (`provider`, `model`)."""
    return (
        sa.select(shard_table)
        .join(job_table, _s.job_id == _j.job_id)
        .where(
            _s.provider == sa.bindparam("provider"),
            _j.model_name == sa.bindparam("model"),
            _s.provider_batch_id.is_not(None),
            # Shards sent request by request are no batches.
            sa.not_(_s.provider_batch_id.startswith("online-")),
            *conditions,
        )
    )


def _load(*conditions: sa.ColumnElement[bool]) -> sa.Select[Any]:
    inner = _of_model(_s.status.in_(_IN_FLIGHT), *conditions).subquery()
    return sa.select(
        sa.func.count(), sa.func.coalesce(sa.func.sum(inner.c.estimated_input_tokens), 0)
    )


_LOAD = _load()
_LOAD_STARTED = _load(_s.started_at.is_not(None))


def in_flight_load(
    engine: Engine, provider: str, model: str, *, started_only: bool = False
) -> tuple[int, int]:
    """(batches, estimated prompt tokens) of a provider's model in flight, every pipeline's:
    what its quota counts. With `started_only`, only batches the provider was seen working on."""
    with engine.connect() as conn:
        batches, tokens = conn.execute(
            _LOAD_STARTED if started_only else _LOAD, {"provider": provider, "model": model}
        ).one()
    return int(batches), int(tokens)


_of_any = _of_model().subquery()
_FREED = sa.select(sa.func.max(_of_any.c.ended_at))
_FREED_OR_STARTED = sa.select(sa.func.max(_of_any.c.ended_at), sa.func.max(_of_any.c.started_at))


def model_freed_at(
    engine: Engine, provider: str, model: str, *, starts: bool = False
) -> dt.datetime | None:
    """When a batch of the provider's model last ended (room freed under its quota), or,
    with `starts`, ended or was seen started (admitted, where admission shows at a poll)."""
    query = _FREED_OR_STARTED if starts else _FREED
    with engine.connect() as conn:
        row = conn.execute(query, {"provider": provider, "model": model}).one()
    found = [moment for moment in row if moment]
    if not found:
        return None
    return max(m if m.tzinfo else m.replace(tzinfo=dt.UTC) for m in found)


_HISTORY = (
    _of_model(
        _s.submitted_at.is_not(None),
        _s.ended_at.is_not(None),
        _s.started_at.is_not(None),
    )
    .with_only_columns(_s.submitted_at, _s.started_at, _s.ended_at)
    .order_by(_s.ended_at.desc())
    .limit(sa.bindparam("limit", type_=sa.Integer))
)


def batch_history(
    engine: Engine, provider: str, model: str, limit: int = 20
) -> list[tuple[float, float]]:
    """The latest batches of the model that were seen started and ran to their end: (seconds
    from submission to their start, seconds from submission to their end)."""
    with engine.connect() as conn:
        rows = conn.execute(_HISTORY, {"provider": provider, "model": model, "limit": limit}).all()
    return [
        (
            (r.started_at - r.submitted_at).total_seconds(),
            max((r.ended_at - r.submitted_at).total_seconds(), 0.0),
        )
        for r in rows
    ]


def older_waiting(
    engine: Engine,
    provider: str,
    model: str,
    *,
    before: dt.date,
    since: dt.datetime,
) -> int:
    """Shards of the model's days older than `before` (any pipeline's) that wait for quota
    and were looked at since `since` (a run still waits for them): they go first."""
    query = (
        sa.select(sa.func.count())
        .select_from(shard_table.join(job_table, _s.job_id == _j.job_id))
        .where(
            _s.provider == provider,
            _j.model_name == model,
            _j.partition_date < before,
            _s.status.in_(("created", "uploaded")),
            _s.raw_status == "waiting_for_quota",
            _s.updated_at >= since,
        )
    )
    with engine.connect() as conn:
        return int(conn.execute(query).scalar() or 0)
