"""The SQL ledger: the source of truth for jobs, shards and every item's state.

SQLAlchemy Core on SQLite (default) or PostgreSQL. Every write is either an insert that
ignores what already exists or an upsert keyed by `(job_id, custom_id)` that never touches a
terminal row, so re-running any step adds nothing twice and loses nothing.

Modules by job: `tables` and `schema` (tables, engines, upgrades), `bulk` (COPY, staging, the
writer thread), `jobs`, `shards`, `locks` (a shard's submission, a day's writes), `items`,
`results` (imports), `budget`, `reporting`, `outputs`, `notifications` (the day summaries
sent), `pauses` (pipelines an operator paused) and `retention` (provider files to delete, days
finished, a day's expiry); `LedgerResource` is the one Dagster resource over them.
"""

from llm_assets.resources.ledger.bulk import BackgroundWriter
from llm_assets.resources.ledger.items import ShardMismatch
from llm_assets.resources.ledger.locks import DayBusy, LostLock
from llm_assets.resources.ledger.records import (
    JobCounts,
    JobRecord,
    PipelinePause,
    QuotaKey,
    QuotaRecord,
    ShardRecord,
    ShardReport,
    UpsertStats,
    as_utc,
    utcnow,
)
from llm_assets.resources.ledger.resource import LedgerResource
from llm_assets.resources.ledger.schema import (
    SCHEMA_VERSION,
    ConnectionLimits,
    LedgerUnavailable,
    _engines,
    dispose_engines,
    get_engine,
)
from llm_assets.resources.ledger.tables import (
    FIRST,
    PRIME_SHARD,
    REQUEUE_SHARD,
    RETRY_SHARD,
    job_table,
    metadata,
    notification_table,
    output_table,
    pipeline_state_table,
    quota_table,
    reservation_table,
    result_table,
    shard_table,
)
from llm_assets.results.rows import (
    DEAD_LETTER,
    PENDING,
    RESULT_COLUMNS,
    RETRY,
    SUBMITTED,
    SUCCEEDED,
    TERMINAL,
    StagedResults,
)

__all__ = [
    "DEAD_LETTER",
    "FIRST",
    "PENDING",
    "PRIME_SHARD",
    "REQUEUE_SHARD",
    "RESULT_COLUMNS",
    "RETRY",
    "RETRY_SHARD",
    "SCHEMA_VERSION",
    "SUBMITTED",
    "SUCCEEDED",
    "TERMINAL",
    "BackgroundWriter",
    "ConnectionLimits",
    "DayBusy",
    "LostLock",
    "JobCounts",
    "JobRecord",
    "LedgerResource",
    "LedgerUnavailable",
    "PipelinePause",
    "QuotaKey",
    "QuotaRecord",
    "ShardMismatch",
    "ShardRecord",
    "ShardReport",
    "StagedResults",
    "UpsertStats",
    "_engines",
    "as_utc",
    "dispose_engines",
    "get_engine",
    "job_table",
    "metadata",
    "notification_table",
    "output_table",
    "pipeline_state_table",
    "quota_table",
    "reservation_table",
    "result_table",
    "shard_table",
    "utcnow",
]
