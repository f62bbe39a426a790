"""The typed rows the ledger hands out: jobs, shards, item counts, import statistics and
pipeline pauses."""

import datetime as dt
import json
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict

from llm_assets.resources.ledger.tables import FIRST
from llm_assets.results.rows import DEAD_LETTER, SUCCEEDED


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def as_utc(moment: dt.datetime) -> dt.datetime:
    """SQLite hands timestamps back without a zone; the ledger always writes UTC."""
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


UtcDatetime = Annotated[dt.datetime, AfterValidator(as_utc)]


class JobRecord(BaseModel):
    model_config = ConfigDict(frozen=True, from_attributes=True)

    job_id: str
    pipeline: str
    partition_date: dt.date
    task_type: str
    provider: str
    model_name: str
    prompt_version: str
    code_version: str
    status: str
    total_items: int
    succeeded_items: int
    failed_items: int
    expired_items: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    estimated_cost_usd: float | None
    snapshot_uri: str | None
    budget_approved_usd: float | None = None
    budget_approved_by: str | None = None
    budget_approved_at: UtcDatetime | None = None
    cancelled_at: UtcDatetime | None = None
    """Set while an operator's cancel of the whole day stands (a requeue lifts it)."""
    cancelled_by: str | None = None
    cancel_reason: str | None = None
    personal_data_json: str | None = None
    """Values the personal-data policy found in the day's prompts, as JSON counts by
    "entity:action" (see `personal_data`)."""
    parent_pipeline: str | None = None
    """Set on an eval pipeline's job: the pipeline whose caps, pause and cancel it runs under."""
    validated_at: UtcDatetime | None = None
    reported_at: UtcDatetime | None = None
    retention_expired_at: UtcDatetime | None = None
    """When retention expired the day: its answers, outputs and pseudonyms are gone from the
    ledger (its ids, states, counts and costs stay), and no step works on it again."""
    created_by: str
    created_at: UtcDatetime
    updated_at: UtcDatetime

    @property
    def personal_data(self) -> dict[str, int]:
        return json.loads(self.personal_data_json) if self.personal_data_json else {}


class ShardRecord(BaseModel):
    model_config = ConfigDict(frozen=True, from_attributes=True)

    shard_id: str
    job_id: str
    round: int
    shard_index: int
    input_uri: str
    item_count: int
    size_bytes: int
    content_sha256: str
    provider: str
    kind: str = FIRST
    provider_batch_id: str | None
    estimated_input_tokens: int = 0
    estimated_output_tokens: int = 0
    estimated_cost_usd: float = 0.0
    estimated_cost_upper_usd: float = 0.0
    price_json: str | None = None
    actual_input_tokens: int | None = None
    actual_output_tokens: int | None = None
    actual_cost_usd: float | None = None
    output_uri: str | None
    error_uri: str | None
    status: str
    raw_status: str | None
    message: str | None
    retry_count: int
    completed_requests: int
    failed_requests: int
    not_before: UtcDatetime | None
    submit_intent_at: UtcDatetime | None
    cancelled_at: UtcDatetime | None = None
    """When an operator cancelled the shard: what it did not answer is a cancelled dead letter."""
    cancel_sent_at: UtcDatetime | None = None
    """When the provider was asked to cancel the shard's batch."""
    provider_files_deleted_at: UtcDatetime | None = None
    """When the shard's files at the provider were deleted after its import (retention)."""
    submitted_at: UtcDatetime | None
    started_at: UtcDatetime | None = None
    """When the provider was first seen working on the batch (or ended it, not for a quota)."""
    ended_at: UtcDatetime | None
    imported_at: UtcDatetime | None
    created_at: UtcDatetime | None = None
    updated_at: UtcDatetime | None = None
    """When the row last changed: a poll records the provider's word, so it is the last poll
    of a batch in flight."""


class PipelinePause(BaseModel):
    """An operator's pause of a pipeline: nothing new is submitted for it until it is resumed."""

    model_config = ConfigDict(frozen=True, from_attributes=True)

    pipeline: str
    paused_at: UtcDatetime
    paused_by: str
    reason: str = ""


class JobCounts(BaseModel):
    """Item counts of one job, by status and by error class."""

    total: int = 0
    by_status: dict[str, int] = {}
    dead_letters_by_class: dict[str, int] = {}
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    @property
    def succeeded(self) -> int:
        return self.by_status.get(SUCCEEDED, 0)

    @property
    def dead_letters(self) -> int:
        return self.by_status.get(DEAD_LETTER, 0)

    @property
    def terminal(self) -> int:
        return self.succeeded + self.dead_letters

    @property
    def open(self) -> int:
        return self.total - self.terminal


class UpsertStats(BaseModel):
    received: int = 0
    applied: int = 0
    duplicates: int = 0
    unknown: int = 0
    already_terminal: int = 0
    """Lines not applied to their item: it is terminal already, or the line is a failure
    and the item is no longer `submitted` in the shard whose results these are."""
    duplicate_ids: list[str] = []
    """Up to 100 custom_ids seen more than once in the import, for the duplicates check."""

    def note_duplicate(self, custom_id: str) -> None:
        self.duplicates += 1
        if len(self.duplicate_ids) < 100 and custom_id not in self.duplicate_ids:
            self.duplicate_ids.append(custom_id)


class QuotaKey(BaseModel):
    """One quota a provider keeps: what it counts (`kind`: "tokens" enqueued or "batches" in
    progress) of one model, for one account or endpoint."""

    model_config = ConfigDict(frozen=True)

    provider: str
    account: str
    model_name: str
    kind: str


class QuotaRecord(BaseModel):
    """What the ledger learned of one quota (see steps/quota.py)."""

    model_config = ConfigDict(frozen=True, from_attributes=True)

    provider: str
    account: str
    model_name: str
    kind: str
    learned_limit: int | None = None
    admitted_peak: int = 0
    refusals: int = 0
    admissions: int = 0
    probe_every: int = 8
    stated_limit: int | None = None
    how: str | None = None
    learned_at: UtcDatetime | None = None
    updated_at: UtcDatetime | None = None

    @property
    def key(self) -> QuotaKey:
        return QuotaKey(
            provider=self.provider, account=self.account, model_name=self.model_name, kind=self.kind
        )

    @classmethod
    def new(cls, key: QuotaKey) -> "QuotaRecord":
        return cls(**key.model_dump())


class ShardReport(BaseModel):
    """A job's shards as the cost report shows them, with what it derives from their items;
    shard_report reads them in one pass over the job's items."""

    shards: list[dict[str, Any]]
    """Per shard, in round and index order: its state, estimate and the tokens and cost it
    was billed."""
    input_token_estimate_error: float | None
    """Billed over estimated input tokens, minus one, over the items that were billed (their
    last attempt): how far the token count before submission was off."""
    cache_usage: list[tuple[str | None, str | None, int, int]]
    """Per shard with prompt-cache use, over its succeeded items' last attempts: its provider
    batch id, the prices it recorded at submission (`price_json`), and the tokens read from
    and written to the cache."""
