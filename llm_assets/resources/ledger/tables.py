"""The ledger's tables: jobs, shards, one row per item, validated outputs, budget
reservations, the day summaries sent and the pipelines an operator paused."""

import sqlalchemy as sa

from llm_assets.util import column_sizes as size

RESULT_FILLFACTOR = 36
"""Percent of each llm_batch_result page filled on insert; the rest is room for in-place
updates. An item's row is rewritten twice (submitted, then with its result, about twice as
wide); at 36 both rewrites fit on the row's own page, so PostgreSQL updates it without moving
it or adding index entries (see docs/decisions.md)."""

# Why a shard was made: an item's first send, a retry round, an operator's requeue, or the
# first send of the few items that prime the provider's prompt cache (steps/priming.py). Cost
# of `retry` and `requeue` shards is the retry overhead.
FIRST = "first"
RETRY_SHARD = "retry"
REQUEUE_SHARD = "requeue"
PRIME_SHARD = "prime"

metadata = sa.MetaData()
BigInt = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Timestamp = sa.DateTime(timezone=True)

schema_version = sa.Table(
    "llm_schema_version",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("applied_at", Timestamp, nullable=False),
)

job_table = sa.Table(
    "llm_batch_job",
    metadata,
    sa.Column("job_id", sa.String(128), primary_key=True),
    sa.Column("pipeline", sa.String(128), nullable=False),
    sa.Column("partition_date", sa.Date, nullable=False),
    sa.Column("task_type", sa.String(32), nullable=False),
    sa.Column("provider", sa.String(32), nullable=False),
    sa.Column("model_name", sa.String(size.MODEL_NAME), nullable=False),
    sa.Column("prompt_version", sa.String(size.PROMPT_VERSION), nullable=False),
    sa.Column("code_version", sa.String(128), nullable=False),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("total_items", sa.Integer, nullable=False, server_default="0"),
    sa.Column("succeeded_items", sa.Integer, nullable=False, server_default="0"),
    sa.Column("failed_items", sa.Integer, nullable=False, server_default="0"),
    sa.Column("expired_items", sa.Integer, nullable=False, server_default="0"),
    sa.Column("input_tokens", BigInt, nullable=False, server_default="0"),
    sa.Column("output_tokens", BigInt, nullable=False, server_default="0"),
    sa.Column("cost_usd", sa.Float, nullable=False, server_default="0"),
    sa.Column("estimated_cost_usd", sa.Float, nullable=True),
    sa.Column("snapshot_uri", sa.Text, nullable=True),
    sa.Column("budget_approved_usd", sa.Float, nullable=True),
    sa.Column("budget_approved_by", sa.String(128), nullable=True),
    sa.Column("budget_approved_at", Timestamp, nullable=True),
    sa.Column("cancelled_at", Timestamp, nullable=True),
    sa.Column("cancelled_by", sa.String(128), nullable=True),
    sa.Column("cancel_reason", sa.Text, nullable=True),
    # What the personal-data policy found in the day's prompts: {"email:redact": 3, ...}.
    sa.Column("personal_data_json", sa.Text, nullable=True),
    # An eval pipeline's job: the pipeline whose caps, pause and cancel it runs under.
    sa.Column("parent_pipeline", sa.String(128), nullable=True),
    # When the day's validation and its report last ran (the lifecycle's finish steps).
    sa.Column("validated_at", Timestamp, nullable=True),
    sa.Column("reported_at", Timestamp, nullable=True),
    # When retention expired the day (compliance/expiry.py): its answers, outputs and
    # pseudonyms are deleted from the ledger, and no step works on it again.
    sa.Column("retention_expired_at", Timestamp, nullable=True),
    sa.Column("created_by", sa.String(128), nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
    sa.UniqueConstraint(
        "pipeline", "partition_date", "prompt_version", "provider", "model_name", name="uq_job_key"
    ),
)

shard_table = sa.Table(
    "llm_batch_shard",
    metadata,
    sa.Column("shard_id", sa.String(160), primary_key=True),
    sa.Column("job_id", sa.String(128), sa.ForeignKey("llm_batch_job.job_id"), nullable=False),
    sa.Column("round", sa.Integer, nullable=False),
    sa.Column("shard_index", sa.Integer, nullable=False),
    sa.Column("input_uri", sa.Text, nullable=False),
    sa.Column("item_count", sa.Integer, nullable=False),
    sa.Column("size_bytes", BigInt, nullable=False),
    sa.Column("content_sha256", sa.String(64), nullable=False),
    sa.Column("provider", sa.String(32), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False, server_default=FIRST),
    sa.Column("provider_batch_id", sa.String(256), nullable=True),
    sa.Column("estimated_input_tokens", BigInt, nullable=False, server_default="0"),
    sa.Column("estimated_output_tokens", BigInt, nullable=False, server_default="0"),
    sa.Column("estimated_cost_usd", sa.Float, nullable=False, server_default="0"),
    sa.Column("estimated_cost_upper_usd", sa.Float, nullable=False, server_default="0"),
    sa.Column("price_json", sa.Text, nullable=True),
    sa.Column("actual_input_tokens", BigInt, nullable=True),
    sa.Column("actual_output_tokens", BigInt, nullable=True),
    sa.Column("actual_cost_usd", sa.Float, nullable=True),
    sa.Column("output_uri", sa.Text, nullable=True),
    sa.Column("error_uri", sa.Text, nullable=True),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("raw_status", sa.String(size.RAW_STATUS), nullable=True),
    sa.Column("message", sa.Text, nullable=True),
    sa.Column("retry_count", sa.Integer, nullable=False, server_default="0"),
    sa.Column("completed_requests", sa.Integer, nullable=False, server_default="0"),
    sa.Column("failed_requests", sa.Integer, nullable=False, server_default="0"),
    sa.Column("not_before", Timestamp, nullable=True),
    sa.Column("submit_intent_at", Timestamp, nullable=True),
    sa.Column("cancelled_at", Timestamp, nullable=True),
    # When the provider was asked to cancel the shard's batch.
    sa.Column("cancel_sent_at", Timestamp, nullable=True),
    # When the shard's files at the provider were deleted after its import (retention).
    sa.Column("provider_files_deleted_at", Timestamp, nullable=True),
    sa.Column("submitted_at", Timestamp, nullable=True),
    # When the provider was first seen working on the batch (or ended it, not for a quota):
    # how long batches wait to start, and, where a quota refuses batches after their
    # creation (OpenAI's), that this one was admitted (steps/quota.py).
    sa.Column("started_at", Timestamp, nullable=True),
    sa.Column("ended_at", Timestamp, nullable=True),
    sa.Column("imported_at", Timestamp, nullable=True),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
    sa.Index("ix_shard_job_status", "job_id", "status"),
)

result_table = sa.Table(
    "llm_batch_result",
    metadata,
    sa.Column("id", BigInt, primary_key=True, autoincrement=True),
    # No foreign key to llm_batch_job: PostgreSQL checks one per inserted row (about 10 µs,
    # 10 s for a million items); the job row is always made first (get_or_create_job).
    sa.Column("job_id", sa.String(128), nullable=False),
    sa.Column("custom_id", sa.String(64), nullable=False),
    sa.Column("source_id", sa.Text, nullable=True),
    sa.Column("shard_id", sa.String(160), nullable=True),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("error_class", sa.String(32), nullable=True),
    sa.Column("error_code", sa.String(size.ERROR_CODE), nullable=True),
    sa.Column("error_message", sa.Text, nullable=True),
    sa.Column("model_name", sa.String(size.MODEL_NAME), nullable=True),
    sa.Column("estimated_input_tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Column("input_tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Column("cached_input_tokens", sa.Integer, nullable=False, server_default="0"),
    # The part of input_tokens written to the provider's prompt cache, billed at its rate.
    sa.Column("cache_write_input_tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Column("output_tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Column("cost_usd", sa.Float, nullable=False, server_default="0"),
    sa.Column("prior_cost_usd", sa.Float, nullable=False, server_default="0"),
    sa.Column("finish_reason", sa.String(size.FINISH_REASON), nullable=True),
    sa.Column("result_json", sa.Text, nullable=True),
    # Where the item's request line starts in its shard's input file, in bytes: a retry round
    # reads the lines it sends again there (null in rows of ledgers before version 5).
    sa.Column("request_offset", BigInt, nullable=True),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
    sa.UniqueConstraint("job_id", "custom_id", name="uq_result_job_custom_id"),
    sa.Index("ix_result_shard", "shard_id"),
    # No index on status: an import changes every row's status, and with no indexed column
    # changing (and room left in each page) PostgreSQL updates rows in place (HOT), without
    # touching any index. Queries by job and status read the job's rows by the unique index.
)
sa.event.listen(
    result_table,
    "after_create",
    sa.DDL(f"ALTER TABLE llm_batch_result SET (fillfactor = {RESULT_FILLFACTOR})").execute_if(
        dialect="postgresql"
    ),
)


output_table = sa.Table(
    "llm_batch_output",
    metadata,
    # No surrogate key: a row is its (job_id, custom_id), and a day's millions of outputs are
    # copied in at once, where a serial key's sequence and index cost a quarter of each row.
    sa.Column("job_id", sa.String(128), nullable=False),  # no foreign key: see result_table
    sa.Column("custom_id", sa.String(64), nullable=False),
    sa.Column("source_id", sa.Text, nullable=True),
    sa.Column("prompt_version", sa.String(size.PROMPT_VERSION), nullable=False),
    sa.Column("model_name", sa.String(size.MODEL_NAME), nullable=False),
    sa.Column("output_json", sa.Text, nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.UniqueConstraint("job_id", "custom_id", name="uq_output_job_custom_id"),
)


reservation_table = sa.Table(
    "llm_budget_reservation",
    metadata,
    sa.Column("shard_id", sa.String(160), primary_key=True),
    sa.Column("pipeline", sa.String(128), nullable=False),
    sa.Column("job_id", sa.String(128), nullable=False),
    sa.Column("spend_date", sa.Date, nullable=False),
    sa.Column("reserved_usd", sa.Float, nullable=False),
    sa.Column("actual_usd", sa.Float, nullable=True),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("settled_at", Timestamp, nullable=True),
    sa.Index("ix_reservation_pipeline_date", "pipeline", "spend_date"),
)

budget_lock_table = sa.Table(
    "llm_budget_lock",
    metadata,
    sa.Column("pipeline", sa.String(128), primary_key=True),
    sa.Column("touched_at", Timestamp, nullable=False),
)

notification_table = sa.Table(
    "llm_batch_notification",
    metadata,
    sa.Column("id", BigInt, primary_key=True, autoincrement=True),
    # By pipeline and day, not only job: a day can fail before its job exists.
    sa.Column("pipeline", sa.String(128), nullable=False),
    sa.Column("partition_date", sa.Date, nullable=False),
    sa.Column("job_id", sa.String(128), nullable=True),
    sa.Column("fingerprint", sa.String(64), nullable=False),
    sa.Column("outcome", sa.String(32), nullable=False),
    sa.Column("run_id", sa.String(64), nullable=True),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("delivered_at", Timestamp, nullable=True),
    sa.Column("delivery_error", sa.Text, nullable=True),
    sa.UniqueConstraint(
        "pipeline", "partition_date", "fingerprint", name="uq_notification_day_fingerprint"
    ),
)

pipeline_state_table = sa.Table(
    "llm_batch_pipeline_state",
    metadata,
    sa.Column("pipeline", sa.String(128), primary_key=True),
    # Set while the pipeline is paused (nothing new is submitted for it); null once resumed.
    sa.Column("paused_at", Timestamp, nullable=True),
    sa.Column("paused_by", sa.String(128), nullable=True),
    sa.Column("reason", sa.Text, nullable=True),
    sa.Column("resumed_at", Timestamp, nullable=True),
    sa.Column("resumed_by", sa.String(128), nullable=True),
)

lock_lease_table = sa.Table(
    "llm_lock_lease",
    metadata,
    # One row per lock (a day's or a shard's): its generation grows by one each time a run
    # takes the lock, and every fenced write checks it in its own transaction (locks.py).
    sa.Column("name", sa.String(192), primary_key=True),
    sa.Column("generation", BigInt, nullable=False),
    sa.Column("holder", sa.Text, nullable=True),
    sa.Column("taken_at", Timestamp, nullable=False),
    sa.Column("checked_at", Timestamp, nullable=True),
)

pseudonym_table = sa.Table(
    "llm_batch_pseudonym",
    metadata,
    # An item's placeholders and the values they stand for (compliance `pseudonymize`): sent
    # to no provider, read back when the item's validated output is written.
    sa.Column("job_id", sa.String(128), primary_key=True),
    sa.Column("custom_id", sa.String(64), primary_key=True),
    sa.Column("mapping_json", sa.Text, nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
)

id_key_table = sa.Table(
    "llm_id_key",
    metadata,
    # The key custom_ids are derived with when LLM_ASSETS_ID_KEY is not set: made at random by
    # the first process that needs one, so every run and process of this ledger agrees.
    sa.Column("name", sa.String(32), primary_key=True),
    sa.Column("key", sa.Text, nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
)

quota_table = sa.Table(
    "llm_quota",
    metadata,
    # What a provider admits in flight for one model of one account, learned from what it
    # did (steps/quota.py): every run, day and worker of this ledger admits shards by it.
    sa.Column("provider", sa.String(32), primary_key=True),
    sa.Column("account", sa.String(256), primary_key=True),
    sa.Column("model_name", sa.String(size.MODEL_NAME), primary_key=True),
    # What the quota counts: "tokens" (prompt tokens enqueued) or "batches" (in progress).
    sa.Column("kind", sa.String(16), primary_key=True),
    # The most in flight that is admitted; NULL until a refusal (or the provider) told it.
    sa.Column("learned_limit", BigInt, nullable=True),
    # The most seen admitted in flight at once: how far submission may go while unknown.
    sa.Column("admitted_peak", BigInt, nullable=False, server_default="0"),
    sa.Column("refusals", sa.Integer, nullable=False, server_default="0"),
    # Admissions since the last refusal or probe: one shard above the limit is tried
    # (a probe) after `probe_every` of them; a refused probe doubles it.
    sa.Column("admissions", sa.Integer, nullable=False, server_default="0"),
    sa.Column("probe_every", sa.Integer, nullable=False, server_default="8"),
    sa.Column("stated_limit", BigInt, nullable=True),
    sa.Column("how", sa.Text, nullable=True),
    sa.Column("learned_at", Timestamp, nullable=True),
    sa.Column("updated_at", Timestamp, nullable=False),
)
