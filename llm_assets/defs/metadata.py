"""What the step assets report: a step's result as Dagster materialization metadata, with
the lineage every materialization carries (pipeline, prompt version, model, provider).

How values read in the UI, the same for every step: rates and ratios are rounded to four
decimals (`rate`), dollar amounts to six (`usd`), so a number shows what is known and not a
float's noise; a key with nothing to say is left out (no `quota` while nothing waits), and a
table cell with nothing in it shows – (steps.tables.MISSING). Shards name their provider
batch, with a link to its page in the provider's console where the adapter knows one, and
the Parquet outputs carry their columns as `dagster/column_schema`.
"""

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from llm_assets.names import DAY_STATE_TAG
from llm_assets.resources.ledger import JobCounts, JobRecord, ShardRecord
from llm_assets.resources.providers.base import BatchProvider
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec.model import PipelineSpec
from llm_assets.steps import (
    BudgetGate,
    CostReport,
    DeadLetterResult,
    ImportResult,
    PublishResult,
    SampleResult,
    ShardsResult,
    SnapshotResult,
    StepContext,
    SubmitResult,
    ValidateResult,
    no_source_rows_reason,
)
from llm_assets.steps.day_state import DayStateView
from llm_assets.steps.tables import case_table, shown_of

DAY_SUMMARY_JSON = "day_summary_json"
"""cost_report's metadata key of the day's summary as data: the notification sensor sends it."""


RATE_DIGITS = 4
"""Rates, shares and ratios in metadata: 0.2605, not 0.2605042016806723."""
USD_DIGITS = 6
"""Dollar amounts in metadata: enough for a day of a cheap model, whose cost is cents."""
SHARDS_SHOWN = 20
"""Shards listed by name (batch ids and console links) in one materialization's metadata."""
COLUMN_SCHEMA = "dagster/column_schema"


def rate(value: float) -> float:
    return round(float(value), RATE_DIGITS)


def usd(value: float) -> float:
    return round(float(value), USD_DIGITS)


def rates(values: Mapping[str, float]) -> dict[str, float]:
    return {name: rate(value) for name, value in values.items()}


def lineage(spec: PipelineSpec) -> dict[str, Any]:
    return {
        "pipeline": spec.name,
        "prompt_version": spec.prompt.version,
        "model": spec.model.name,
        "provider": spec.model.provider,
    }


def file_metadata(
    spec: PipelineSpec, rows: int, uri: str, *, job_id: str | None = None, **extra: Any
) -> dict[str, Any]:
    """A step that writes one file: its rows and path (and the job, where it has one), then
    the step's own keys."""
    head = {} if job_id is None else {"job_id": job_id}
    return {
        **lineage(spec),
        **head,
        "dagster/row_count": rows,
        "uri": dg.MetadataValue.path(uri),
        **extra,
    }


def preview(rows: Sequence[dict[str, Any]]) -> dg.MetadataValue:
    """The first rows of a step's output as a markdown table (a cell without a value: –)."""
    return dg.MetadataValue.md(case_table(rows))


def short_shard(job_id: str, shard_id: str) -> str:
    """A shard by the part of its id after the job's (`r00-s00003`), as status prints it."""
    return shard_id.removeprefix(f"{job_id}-")


def batch_links(
    job_id: str, batches: Mapping[str, str | None], provider: BatchProvider
) -> dict[str, Any]:
    """The shards and their provider batches: `provider_batches`, a table of each shard's
    provider batch id, and `console_url/<shard>`, the batch's page in the provider's
    console, for the providers that have one (BatchProvider.console_url)."""
    shown = sorted(batches.items())[:SHARDS_SHOWN]
    rows = [
        {"shard": short_shard(job_id, shard), "provider batch": batch} for shard, batch in shown
    ]
    table = case_table(rows, limit=SHARDS_SHOWN)
    caption = shown_of(len(shown), len(batches), "shards")
    links = {
        f"console_url/{short_shard(job_id, shard)}": dg.MetadataValue.url(url)
        for shard, batch in shown
        if batch and (url := provider.console_url(batch))
    }
    return {"provider_batches": dg.MetadataValue.md(f"{caption}\n\n{table}"), **links}


def parquet_column_schema(spec: PipelineSpec, storage: ArtifactStorage, uri: str) -> dict[str, Any]:
    """`dagster/column_schema` of a Parquet output: its columns and their types as the file
    has them, each output field with its description from the spec."""
    import pyarrow.parquet as pq

    with storage.local_copy(uri) as path:
        schema = pq.read_schema(path)
    described = {name: field.description for name, field in spec.output.output_schema.items()}
    columns = [
        dg.TableColumn(
            name=column.name, type=str(column.type), description=described.get(column.name) or None
        )
        for column in schema
    ]
    return {COLUMN_SCHEMA: dg.TableSchema(columns=columns)}


def snapshot_metadata(spec: PipelineSpec, result: SnapshotResult, day: dt.date) -> dict[str, Any]:
    """input_snapshot: the snapshot file, its hash and what could not be read; a day with no
    source rows says so (`no_source_rows`)."""
    empty = {"no_source_rows": no_source_rows_reason(day)} if result.empty else {}
    return empty | file_metadata(
        spec,
        result.rows,
        result.uri,
        content_sha256=result.sha256,
        unreadable_rows=result.unreadable_rows,
        source_files=result.files,
        reused_existing_snapshot=result.reused,
    )


def submit_metadata(
    spec: PipelineSpec,
    result: SubmitResult,
    provider: BatchProvider,
    day_shards: Sequence[ShardRecord],
) -> dict[str, Any]:
    """provider_batches: how many shards this run submitted, every batch of the day (each
    shard's provider batch and its console link), what is in flight, what waits for the
    provider's quota and why, and when the next submission goes (left out when nothing
    waits). A run that submits nothing says so and keeps the day's batches."""
    next_at = result.next_submission_at
    batches = {s.shard_id: s.provider_batch_id for s in day_shards if s.provider_batch_id}
    idle = not (result.submitted or result.waiting_for_backoff or result.waiting_for_quota)
    return {
        **lineage(spec),
        "job_id": result.job_id,
        **(
            {"outcome": f"nothing to do: the day's {len(batches)} batches were submitted before"}
            if idle and batches
            else {}
        ),
        "submitted_shards": len(result.submitted),
        **(batch_links(result.job_id, batches, provider) if batches else {}),
        "in_flight_shards": result.in_flight,
        "retry_shards_waiting_for_backoff": result.waiting_for_backoff,
        "shards_waiting_for_quota": result.waiting_for_quota,
        **({"quota": result.quota_reason} if result.quota_reason else {}),
        **({"priming": result.priming} if result.priming else {}),
        **({"next_submission_at": next_at.isoformat()} if next_at else {}),
        "day_upper_bound_usd": usd(result.committed_cost_usd),
    }


def validated_metadata(ctx: StepContext, result: ValidateResult) -> dict[str, Any]:
    """validated_outputs: the rows that passed, the quality failures, a preview and the
    Parquet's columns."""
    spec = ctx.spec
    return file_metadata(
        spec,
        result.valid_rows,
        result.uri,
        job_id=result.job_id,
        quality_dead_letters=sum(result.quality_failures.values()),
        quality_dead_letters_total=result.quality_dead_letters,
        quality_failure_rate=rate(result.failure_rate),
        quality_failures_by_rule=result.quality_failures,
        open_items=result.open_items,
        label_distribution=rates(result.label_distribution),
        preview=preview(result.preview),
        **parquet_column_schema(spec, ctx.storage, result.uri),
    )


def published_metadata(ctx: StepContext, result: PublishResult) -> dict[str, Any]:
    """published_outputs: the published file, its hash and its columns."""
    return file_metadata(
        ctx.spec,
        result.rows,
        result.uri,
        content_sha256=result.sha256,
        **parquet_column_schema(ctx.spec, ctx.storage, result.uri),
    )


def sample_metadata(ctx: StepContext, result: SampleResult) -> dict[str, Any]:
    """qa_sample: the sample file and a preview of it."""
    return file_metadata(ctx.spec, result.rows, result.uri, preview=preview(result.preview))


def dead_letter_metadata(ctx: StepContext, result: DeadLetterResult) -> dict[str, Any]:
    """dead_letter: the dead-letter file, its counts by class and a preview."""
    return file_metadata(
        ctx.spec,
        result.rows,
        result.uri,
        job_id=result.job_id,
        by_class=result.by_class,
        preview=preview(result.preview),
    )


def shards_metadata(
    spec: PipelineSpec,
    result: ShardsResult,
    gate: BudgetGate,
    day_items: int,
    day_shards: Sequence[ShardRecord],
) -> dict[str, Any]:
    """request_shards: what this run added (new items, input dead letters, shards) and the
    day as a whole (its items, first-round shards and their estimate), so a run that finds
    nothing new says so and keeps the day's figures."""
    estimate = result.estimate
    planned = [s for s in day_shards if s.round == 0]
    this_run = {}
    if result.new_items:
        this_run = {
            "input_tokens_exact": estimate.input_tokens_exact,
            "token_counter": estimate.token_counter,
            "expected_output_tokens_per_item": estimate.expected_output_tokens_per_item,
            "output_estimate_basis": estimate.output_basis,
            **({"cache_estimate_basis": estimate.cache_basis} if estimate.cache_basis else {}),
        }
    return {
        **lineage(spec),
        "job_id": result.job_id,
        "code_version": spec.prompt_code_version,
        **({} if result.new_items else {"outcome": nothing_new(day_items, len(planned))}),
        "snapshot_rows": result.snapshot_rows,
        "items": day_items,
        "shards": len(planned),
        "new_items": result.new_items,
        "already_in_ledger": result.already_known,
        "input_dead_letters": sum(result.input_dead_letters.values()),
        "input_dead_letters_by_reason": result.input_dead_letters,
        "compliance_dead_letters": result.compliance_dead_letters,
        "personal_data_found": result.personal_data,
        "shards_created": len(result.shards_created),
        "shard_uris": result.shard_uris[:20],
        "estimated_input_tokens": sum(s.estimated_input_tokens for s in planned),
        **this_run,
        "estimated_cost_usd": usd(sum(s.estimated_cost_usd for s in planned)),
        "estimated_cost_upper_bound_usd": usd(sum(s.estimated_cost_upper_usd for s in planned)),
        "day_upper_bound_usd": usd(gate.committed_usd),
    }


def nothing_new(items: int, shards: int) -> str:
    """What a re-run of request_shards that found no new item says."""
    return f"nothing to do: the day's {items} items are in {shards} shards an earlier run built"


def import_metadata(
    spec: PipelineSpec,
    result: ImportResult,
    batches: Mapping[str, str | None],
    provider: BatchProvider,
) -> dict[str, Any]:
    """batch_results: the shards imported (with their provider batches, `batches` by shard
    id), the lines, retries planned and the job's counts after them."""
    counts = result.counts
    return {
        **lineage(spec),
        "job_id": result.job_id,
        "imported_shards": len(result.imported_shards),
        **(batch_links(result.job_id, batches, provider) if batches else {}),
        "in_flight_shards": result.in_flight_shards,
        "result_lines": result.lines.received,
        "applied": result.lines.applied,
        "duplicate_lines": result.lines.duplicates,
        "unknown_custom_ids": result.lines.unknown,
        "already_terminal": result.lines.already_terminal,
        "missing_results": result.missing,
        "retry_shards_planned": len(result.retry_shards),
        "gave_up": result.gave_up,
        "provider_files_deleted_shards": result.provider_files_deleted,
        "dagster/row_count": counts.total,
        "succeeded": counts.succeeded,
        "dead_letters": counts.dead_letters,
        "open_items": counts.open,
        "input_tokens": counts.input_tokens,
        "output_tokens": counts.output_tokens,
        "cost_usd": usd(counts.cost_usd),
        **({"spend_breaker": result.breaker} if result.breaker else {}),
    }


def cost_metadata(spec: PipelineSpec, report: CostReport, day: dt.date) -> dict[str, Any]:
    """cost_report: billed tokens and cost, why it is $0 when the model is priced at zero,
    the prompt cache's tokens and saving (on a day that used it), the estimate's error and
    the month so far, as of when the report was made; the day's
    outcome and summary, as the notification sensor announces them (`day_summary_json`)."""
    month = report.pipeline_months[-1] if report.pipeline_months else {}
    errors = (
        ("cost_estimate_error", report.cost_estimate_error),
        ("input_token_estimate_error", report.input_token_estimate_error),
    )
    return {
        **lineage(spec),
        "job_id": report.job_id,
        "uri": dg.MetadataValue.path(report.uri),
        "markdown_uri": dg.MetadataValue.path(report.markdown_uri),
        "items": report.items,
        "succeeded": report.succeeded,
        "dead_letters": report.dead_letters,
        "open_items": report.open_items,
        "input_tokens": report.input_tokens,
        "output_tokens": report.output_tokens,
        "input_tokens_per_item": round(report.input_tokens_per_item, 2),
        "output_tokens_per_item": round(report.output_tokens_per_item, 2),
        "cost_usd": usd(report.cost_usd),
        **({"zero_cost_reason": report.zero_cost_reason} if report.zero_cost_reason else {}),
        "retry_cost_usd": usd(report.retry_cost_usd),
        "cost_per_1k_items_usd": usd(report.cost_per_1k_items_usd),
        **(
            {
                "cache_read_tokens": report.cache_read_tokens,
                "cache_write_tokens": report.cache_write_tokens,
                "cache_saved_usd": usd(report.cache_saved_usd),
            }
            if report.cache_read_tokens or report.cache_write_tokens
            else {}
        ),
        "estimated_cost_usd": usd(report.estimated_cost_usd),
        "estimated_cost_upper_bound_usd": usd(report.estimated_cost_upper_usd),
        **{name: rate(value) for name, value in errors if value is not None},
        "pipeline_month_cost_usd": usd(month.get("cost_usd", 0.0)),
        "pipeline_totals_as_of": dg.MetadataValue.timestamp(report.computed_at),
        "prices_as_of": report.prices_as_of,
        "price_source": report.price_source,
        "report": dg.MetadataValue.md(report.markdown(spec, day)),
        "outcome": report.day_summary.outcome,
        "day_summary": dg.MetadataValue.md(report.day_summary.markdown()),
        DAY_SUMMARY_JSON: dg.MetadataValue.json(report.day_summary.model_dump(mode="json")),
    }


def day_state_observation(
    key: dg.AssetKey, day: dt.date, view: DayStateView, counts: JobCounts, shards: Sequence[Any]
) -> dg.AssetObservation:
    """The day's state on its partition of provider_batches (the batch-status sensor's, when
    it changes): the state as a tag and the observation's description, the day's items and
    each shard's batch and progress."""
    shown = sorted(shards, key=lambda s: s.shard_id)[:SHARDS_SHOWN]
    rows = [
        {
            "shard": short_shard(s.job_id, s.shard_id),
            "provider batch": s.provider_batch_id,
            "status": s.status,
            "provider status": s.raw_status,
            "requests done": f"{s.completed_requests + s.failed_requests}/{s.item_count}",
        }
        for s in shown
    ]
    table = (
        f"{shown_of(len(shown), len(shards), 'shards')}\n\n{case_table(rows, limit=SHARDS_SHOWN)}"
    )
    return dg.AssetObservation(
        asset_key=key,
        partition=day.isoformat(),
        description=f"{view.state}: {view.description}",
        tags={DAY_STATE_TAG: view.state.replace(" ", "_")},
        metadata={
            "day_state": view.state,
            "state": view.description,
            "items": counts.total,
            "open_items": counts.open,
            "succeeded": counts.succeeded,
            "dead_letters": counts.dead_letters,
            "provider_batches": dg.MetadataValue.md(table),
        },
    )


def empty_day_metadata(spec: PipelineSpec, reason: str) -> dict[str, Any]:
    """A step's materialization of a day with no source rows: nothing to do, and why."""
    return {**lineage(spec), "no_source_rows": reason, "day_state": "empty"}


def cancel_metadata(pipeline: str, day: dt.date, job: JobRecord) -> dict[str, Any]:
    """What a cancelled day's batch_results and cost_report add: the day's state `cancelled`,
    who cancelled it, when and why, and how its cancelled items are sent again. Nothing for a
    day that is not cancelled."""
    if job.cancelled_at is None:
        return {}
    return {
        "day_state": "cancelled",
        "cancelled": f"by {job.cancelled_by or 'an operator'} at "
        f"{job.cancelled_at:%Y-%m-%d %H:%M} UTC ({job.cancel_reason or 'no reason given'}); "
        f"`llm-assets requeue {pipeline} --date {day} --class cancelled` sends its cancelled "
        "items again",
    }
