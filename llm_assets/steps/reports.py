"""The steps after the gate: dead-letter export, cost report, publishing the validated
Parquet and the QA sample."""

import datetime as dt
import json
import random
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

from pydantic import BaseModel

from llm_assets.resources.ledger import JobRecord, ShardReport, utcnow
from llm_assets.resources.pricing import (
    ModelPrice,
    load_price_table,
    price_source,
    zero_price_reason,
)
from llm_assets.resources.providers.registry import adapter_class
from llm_assets.results import quality
from llm_assets.spec.model import PipelineSpec
from llm_assets.steps import notify
from llm_assets.steps.context import StepContext, artifact_key, refuse_expired
from llm_assets.steps.gate import settled_block
from llm_assets.steps.judge import outputs_key
from llm_assets.steps.tables import case_table

DEAD_LETTER_PREVIEW = 20


class DeadLetterResult(BaseModel):
    job_id: str
    uri: str
    rows: int
    by_class: dict[str, int]
    preview: list[dict[str, Any]]


def export_dead_letters(ctx: StepContext) -> DeadLetterResult:
    """Every item that will not succeed, with its class and reason, as one JSONL file."""
    job = ctx.job()
    refuse_expired(ctx.spec, job)  # its quality messages are gone from the ledger
    by_class: dict[str, int] = defaultdict(int)
    preview: list[dict[str, Any]] = []

    def lines() -> Iterator[bytes]:
        for item in ctx.ledger.iter_dead_letters(job.job_id):
            by_class[item["error_class"] or "unknown"] += 1
            if len(preview) < DEAD_LETTER_PREVIEW:
                preview.append(item)
            yield json.dumps(item, ensure_ascii=False).encode()

    key = artifact_key("dead_letters", ctx.spec.name, ctx.day.isoformat(), f"{job.job_id}.jsonl")
    written = ctx.storage.write_lines(key, lines())
    return DeadLetterResult(
        job_id=job.job_id,
        uri=written.uri,
        rows=written.line_count,
        by_class=dict(by_class),
        preview=preview,
    )


class Drift(BaseModel):
    """Per-item tokens and cost against the trailing median of earlier partitions."""

    window: int
    factor: float
    history: int
    current: dict[str, float]
    median: dict[str, float]
    ratio: dict[str, float]
    drifted: list[str]


def _per_item(job: JobRecord) -> dict[str, float]:
    n = job.succeeded_items or 1
    return {
        "input_tokens_per_item": job.input_tokens / n,
        "output_tokens_per_item": job.output_tokens / n,
        "cost_per_item_usd": job.cost_usd / n,
    }


def cost_drift(ctx: StepContext, job: JobRecord) -> Drift:
    """The job's per-item tokens and cost against the median of the pipeline's earlier
    partitions; a ratio beyond `budget.drift_factor` either way is drift."""
    window, factor = ctx.spec.budget.history_window, ctx.spec.budget.drift_factor
    history = [
        j
        for j in ctx.ledger.earlier_jobs(ctx.spec.name, job.partition_date, window)
        if j.succeeded_items
    ]
    current = _per_item(job) if job.succeeded_items else {}
    medians: dict[str, float] = {}
    ratios: dict[str, float] = {}
    drifted: list[str] = []
    if history and current:
        for name, value in current.items():
            medians[name] = statistics.median(_per_item(j)[name] for j in history)
            if medians[name] > 0 and value > 0:
                ratios[name] = value / medians[name]
                if ratios[name] > factor or ratios[name] < 1 / factor:
                    drifted.append(name)
            elif value != medians[name]:
                drifted.append(name)
    return Drift(
        window=window,
        factor=factor,
        history=len(history),
        current=current,
        median=medians,
        ratio=ratios,
        drifted=drifted,
    )


class CostReport(BaseModel):
    job_id: str
    uri: str = ""
    markdown_uri: str = ""
    items: int
    succeeded: int
    dead_letters: int
    open_items: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    retry_cost_usd: float
    estimated_input_tokens: int
    estimated_cost_usd: float
    estimated_cost_upper_usd: float
    input_token_estimate_error: float | None
    cost_estimate_error: float | None
    input_tokens_per_item: float
    output_tokens_per_item: float
    cost_per_1k_items_usd: float
    cache_read_tokens: int = 0
    """Input tokens read from the provider's prompt cache (succeeded items' last attempts)."""
    cache_write_tokens: int = 0
    """Input tokens written to the provider's prompt cache."""
    cache_saved_usd: float = 0.0
    """What the cached tokens would have cost as plain input, less what they cost (reads at
    their price, writes at theirs): the cache's saving, negative when writes outweigh reads."""
    prices_as_of: str
    """The date of the model's prices (the pinned genai-prices data's, or the table's)."""
    price_source: str
    """Where the model's prices come from: a price-table file or `genai-prices <version>`."""
    price: ModelPrice
    zero_cost_reason: str | None = None
    """Why the cost is $0 when the price table prices the model at zero; None otherwise."""
    computed_at: dt.datetime
    """When the report read the ledger: the day and month tables hold what was billed then."""
    shards: list[dict[str, Any]]
    pipeline_days: list[dict[str, Any]]
    pipeline_months: list[dict[str, Any]]
    drift: Drift
    day_summary: notify.PartitionSummary
    """The day's summary as the notification sensor announces it: "finished" once no item
    is open, "in progress" before."""

    @property
    def as_of(self) -> str:
        """The label of the period tables: they are read once, when the report is made."""
        return f"as of {self.computed_at:%Y-%m-%d %H:%M} UTC"

    def markdown(self, spec: PipelineSpec, day: dt.date) -> str:
        summary: list[dict[str, Any]] = [
            {"": "items", "value": self.items},
            {"": "succeeded", "value": self.succeeded},
            {"": "dead letters", "value": self.dead_letters},
            {"": "input tokens (billed)", "value": self.input_tokens},
            {"": "output tokens (billed)", "value": self.output_tokens},
            {"": "cost", "value": f"${self.cost_usd:.4f}"},
            {"": "of which retries", "value": f"${self.retry_cost_usd:.4f}"},
            {
                "": "estimate / upper bound",
                "value": f"${self.estimated_cost_usd:.4f} / ${self.estimated_cost_upper_usd:.4f}",
            },
            {"": "cost per 1k items", "value": f"${self.cost_per_1k_items_usd:.4f}"},
        ]
        if self.cache_read_tokens or self.cache_write_tokens:
            summary += [
                {"": "prompt cache: tokens read", "value": self.cache_read_tokens},
                {"": "prompt cache: tokens written", "value": self.cache_write_tokens},
                {"": "prompt cache: saved", "value": f"${self.cache_saved_usd:.4f}"},
            ]
        return "\n\n".join(
            [
                f"# Cost of {spec.name} on {day} ({self.price.provider}/{self.price.name}, "
                f"prices from {self.price_source} as of {self.prices_as_of})",
                *([f"Why $0: {self.zero_cost_reason}."] if self.zero_cost_reason else []),
                case_table(summary),
                "## Shards",
                case_table(self.shards, limit=200),
                f"## {spec.name} per day, {day:%Y-%m} up to {day} ({self.as_of})",
                case_table(self.pipeline_days, limit=62),
                f"## {spec.name} per month, up to {day} ({self.as_of})",
                case_table(self.pipeline_months, limit=24),
            ]
        )


def cache_savings(ctx: StepContext, price: ModelPrice, shards: ShardReport) -> dict[str, Any]:
    """The day's prompt-cache tokens and what the cache saved: per shard, at the prices it
    recorded at submission (the spec's today when it recorded none), in a batch or not as
    the shard was sent."""
    adapter = adapter_class(ctx.spec.model.provider).model_construct()
    read = written = 0
    saved = Decimal(0)
    for batch_id, price_json, shard_read, shard_written in shards.cache_usage:
        charged = ModelPrice.model_validate_json(price_json) if price_json else price
        batch = adapter.priced_as_batch and not adapter.runs_shard_in_step(ctx.spec, 0, batch_id)
        plain, cached, write, _ = charged.per_mtok(batch=batch)
        saved += (shard_read * (plain - cached) - shard_written * (write - plain)) / 1_000_000
        read += shard_read
        written += shard_written
    return {
        "cache_read_tokens": read,
        "cache_write_tokens": written,
        "cache_saved_usd": float(saved),
    }


_TOTALLED = ("items", "succeeded", "input_tokens", "output_tokens", "cost_usd", "retry_cost_usd")


def month_so_far(rows: list[dict[str, Any]], day: dt.date) -> list[dict[str, Any]]:
    """The job cost rows (ledger.job_cost_rows) of the days of `day`'s month up to it."""
    first = day.replace(day=1).isoformat()
    return [r for r in rows if first <= r["date"] <= day.isoformat()]


def _pipeline_totals(rows: list[dict[str, Any]], key: Callable[[str], str]) -> list[dict[str, Any]]:
    """Job cost rows summed per period (`key` of the row's date)."""
    totals: dict[str, dict[str, Any]] = {}
    for row in rows:
        period = key(row["date"])
        total = totals.setdefault(
            period,
            {
                "period": period,
                "items": 0,
                "succeeded": 0,
                "input_tokens": 0,
                "output_tokens": 0,
                "cost_usd": 0.0,
                "retry_cost_usd": 0.0,
            },
        )
        for name in _TOTALLED:
            total[name] += row[name]
    return list(totals.values())


def cost_report(ctx: StepContext) -> CostReport:
    """Tokens and cost per item, shard, job and the pipeline's days and months, the retry
    overhead, the estimate's error, the drift against earlier partitions and the day's
    summary."""
    spec, day, ledger = ctx.spec, ctx.day, ctx.ledger
    counts = ledger.refresh_job(ctx.job().job_id)
    job = ctx.job()
    # The pipeline's jobs up to the day, read once: the day's row and the totals of its month
    # and of every month are taken from them (each read sums the jobs' items).
    history = ledger.job_cost_rows(spec.name, None, day)
    (row,) = [r for r in history if r["job_id"] == job.job_id]
    shards = ledger.shard_report(job.job_id)
    n = counts.succeeded or 1
    price = ctx.price()
    report = CostReport(
        job_id=job.job_id,
        items=counts.total,
        succeeded=counts.succeeded,
        dead_letters=counts.dead_letters,
        open_items=counts.open,
        input_tokens=row["input_tokens"],
        output_tokens=row["output_tokens"],
        cost_usd=counts.cost_usd,
        retry_cost_usd=row["retry_cost_usd"],
        estimated_input_tokens=row["estimated_input_tokens"],
        estimated_cost_usd=row["estimated_cost_usd"],
        estimated_cost_upper_usd=row["estimated_cost_upper_usd"],
        input_token_estimate_error=shards.input_token_estimate_error,
        cost_estimate_error=(counts.cost_usd / row["estimated_cost_usd"] - 1)
        if row["estimated_cost_usd"] and counts.open == 0
        else None,
        input_tokens_per_item=job.input_tokens / n,
        output_tokens_per_item=job.output_tokens / n,
        cost_per_1k_items_usd=counts.cost_usd / n * 1000,
        **cache_savings(ctx, price, shards),
        prices_as_of=str(price.as_of or load_price_table().prices_as_of),
        price_source=price_source(price),
        price=price,
        zero_cost_reason=zero_price_reason(price) if counts.cost_usd == 0 else None,
        computed_at=utcnow(),
        shards=shards.shards,
        pipeline_days=_pipeline_totals(month_so_far(history, day), lambda d: d),
        pipeline_months=_pipeline_totals(history, lambda d: d[:7]),
        drift=cost_drift(ctx, job),
        day_summary=notify.summarize(
            spec,
            day,
            ledger,
            outcome="in progress" if counts.open else "finished",
            run_id=ctx.run_id,
            counts=counts,
            blocked=settled_block(ctx),
        ),
    )
    base = artifact_key("reports", spec.name, day.isoformat(), job.job_id)
    markdown = ctx.storage.write_bytes(f"{base}.cost.md", report.markdown(spec, day).encode())
    report = report.model_copy(update={"markdown_uri": markdown.uri})
    json_uri = ctx.storage.write_bytes(
        f"{base}.cost.json", report.model_dump_json(indent=2).encode()
    ).uri
    if not counts.open:
        ledger.update_job(job.job_id, reported_at=report.computed_at)
    return report.model_copy(update={"uri": json_uri})


def published_frame_failures(ctx: StepContext, uri: str) -> list[dict[str, Any]]:
    """Read the written Parquet back and check it against the frame schema, batch by batch."""
    import pyarrow.parquet as pq

    failures: list[dict[str, Any]] = []
    seen: set[str] = set()
    with ctx.storage.local_copy(uri) as path:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=50_000):
            _, broken = quality.validate_frame(ctx.spec, batch.to_pandas(), seen)
            failures += [f.model_dump() for f in broken]
    return failures


def validated_uri(ctx: StepContext) -> str:
    """Where the day's validated Parquet is (validated_outputs writes it)."""
    return ctx.storage.uri(outputs_key(ctx.spec, ctx.job()))


class PublishResult(BaseModel):
    uri: str
    rows: int
    sha256: str


def publish_outputs(ctx: StepContext) -> PublishResult:
    """The hand-off to consumers: the day's validated Parquet at a stable address."""
    import pyarrow.parquet as pq

    with ctx.storage.local_copy(validated_uri(ctx)) as path:
        rows = pq.ParquetFile(path).metadata.num_rows
        written = ctx.storage.write_file(
            artifact_key("published", ctx.spec.name, f"{ctx.day.isoformat()}.parquet"), path
        )
    return PublishResult(uri=written.uri, rows=rows, sha256=written.sha256)


class SampleResult(BaseModel):
    uri: str
    rows: int
    preview: list[dict[str, Any]]


def qa_sample(ctx: StepContext) -> SampleResult:
    """N validated rows drawn with a seed fixed per partition, for human spot checks."""
    import pyarrow.parquet as pq

    spec, day = ctx.spec, ctx.day
    job = ctx.job()
    with ctx.storage.local_copy(validated_uri(ctx)) as path:
        table = pq.read_table(path)
    rng = random.Random(f"{spec.name}/{day.isoformat()}/{job.job_id}")
    picks = sorted(
        rng.sample(range(table.num_rows), min(spec.quality.qa_sample_size, table.num_rows))
    )
    rows = table.take(picks).to_pylist() if picks else []
    written = ctx.storage.write_lines(
        artifact_key("qa", spec.name, f"{day.isoformat()}.jsonl"),
        (json.dumps(row, ensure_ascii=False, default=str).encode() for row in rows),
    )
    return SampleResult(uri=written.uri, rows=len(rows), preview=rows[:20])
