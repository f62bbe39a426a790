"""What each asset does, as plain functions over the ledger, storage and a provider.

Assets (factory.py), the CLI and the sensors call these; keeping them free of Dagster makes
each step's idempotency easy to see and to test: every step can run again at any point and
converges on the same ledger state.
"""

import datetime as dt
import hashlib
import json
import logging
import os
import random
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from llm_assets import ids, quality
from llm_assets.failpoints import failpoint
from llm_assets.items import PreparedItem, prepare_items
from llm_assets.resources.ledger import (
    DEAD_LETTER,
    PENDING,
    RETRY,
    SUBMITTED,
    SUCCEEDED,
    JobCounts,
    JobRecord,
    LedgerResource,
    ShardRecord,
    UpsertStats,
    utcnow,
)
from llm_assets.resources.pricing import ModelPrice, load_price_table
from llm_assets.resources.providers.base import (
    ENDED_STATES,
    IN_FLIGHT_STATES,
    BatchProvider,
    ItemResult,
    ShardState,
    ShardSubmission,
)
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.sharding import split_shards
from llm_assets.source import SourceRow, rows_for_partition
from llm_assets.spec import PipelineSpec
from llm_assets.validation import parse_output

log = logging.getLogger("llm_assets")


class GateBlocked(Exception):
    """A gate refused to let the step go on; `gate` names it, the message says why."""

    def __init__(self, gate: str, reason: str) -> None:
        self.gate = gate
        self.reason = reason
        super().__init__(f"{gate} gate: {reason}")


class MissingPrerequisite(Exception):
    """An upstream step has not run for this partition yet."""


def price_for(spec: PipelineSpec) -> ModelPrice:
    return load_price_table().get(spec.model.provider, spec.model.name)


def _key(*parts: str) -> str:
    return "/".join(parts)


def snapshot_dir(spec: PipelineSpec, day: dt.date) -> str:
    return _key("snapshots", spec.name, day.isoformat())


class SnapshotResult(BaseModel):
    uri: str
    sha256: str
    rows: int
    unreadable_rows: int
    reused: bool
    files: int


def take_snapshot(
    spec: PipelineSpec, day: dt.date, source_uri: str, storage: ArtifactStorage
) -> SnapshotResult:
    """Freeze the partition's source rows into an immutable, content-addressed JSONL file."""
    keep = {spec.source.id_field, spec.source.date_field, *spec.source.fields}
    rows = 0
    unreadable = 0
    files: set[str] = set()
    digest = hashlib.sha256()
    with tempfile.NamedTemporaryFile("wb", suffix=".jsonl", delete=False) as tmp:
        try:
            for row in rows_for_partition(spec, source_uri, day, storage):
                files.add(row.file)
                if row.record is not None:
                    row = row.model_copy(
                        update={"record": {k: v for k, v in row.record.items() if k in keep}}
                    )
                else:
                    unreadable += 1
                line = row.model_dump_json().encode() + b"\n"
                digest.update(line)
                tmp.write(line)
                rows += 1
            tmp.close()
            sha = digest.hexdigest()
            key = _key(snapshot_dir(spec, day), f"{sha[:20]}.jsonl")
            uri = storage.uri(key)
            reused = storage.exists(uri)
            if not reused:
                storage.write_file(key, Path(tmp.name))
                failpoint("snapshot.after_write")
        finally:
            os.unlink(tmp.name)
    storage.write_bytes(_key(snapshot_dir(spec, day), "CURRENT"), uri.encode())
    return SnapshotResult(
        uri=uri, sha256=sha, rows=rows, unreadable_rows=unreadable, reused=reused, files=len(files)
    )


def current_snapshot_uri(spec: PipelineSpec, day: dt.date, storage: ArtifactStorage) -> str:
    pointer = storage.uri(_key(snapshot_dir(spec, day), "CURRENT"))
    if not storage.exists(pointer):
        raise MissingPrerequisite(
            f"no input snapshot for {spec.name} on {day}; materialize input_snapshot first"
        )
    return storage.read_bytes(pointer).decode()


def read_snapshot(uri: str, storage: ArtifactStorage) -> Iterator[SourceRow]:
    for line in storage.open_lines(uri):
        yield SourceRow.model_validate_json(line)


def job_for(
    spec: PipelineSpec, day: dt.date, ledger: LedgerResource, created_by: str = "dagster"
) -> JobRecord:
    """The job of (pipeline, date, prompt version, model); created on first use."""
    return ledger.get_or_create_job(
        job_id=ids.job_id(
            spec.name, day, spec.prompt.version, spec.model.provider, spec.model.name
        ),
        pipeline=spec.name,
        partition_date=day,
        task_type=spec.output.format,
        provider=spec.model.provider,
        model_name=spec.model.name,
        prompt_version=spec.prompt.version,
        code_version=spec.prompt_code_version,
        created_by=created_by,
    )


def existing_job(spec: PipelineSpec, day: dt.date, ledger: LedgerResource) -> JobRecord:
    job = ledger.get_job(
        ids.job_id(spec.name, day, spec.prompt.version, spec.model.provider, spec.model.name)
    )
    if job is None:
        raise MissingPrerequisite(
            f"no job for {spec.name} on {day} with prompt {spec.prompt.version} and "
            f"{spec.model.provider}/{spec.model.name}; materialize request_shards first"
        )
    return job


class ShardsResult(BaseModel):
    job_id: str
    snapshot_rows: int
    new_items: int
    already_known: int
    input_dead_letters: dict[str, int]
    shards_created: list[str]
    shard_uris: list[str]
    estimated_input_tokens: int
    estimated_cost_usd: float
    estimated_cost_upper_usd: float


def _shard_key(spec: PipelineSpec, job: JobRecord, shard_id: str) -> str:
    return _key(
        "shards", spec.name, job.partition_date.isoformat(), job.job_id, f"{shard_id}.jsonl"
    )


def _write_shard(
    spec: PipelineSpec,
    job: JobRecord,
    ledger: LedgerResource,
    storage: ArtifactStorage,
    shard_id: str,
    round_no: int,
    index: int,
    lines: list[tuple[str, bytes]],
    items: list[dict[str, Any]] | None,
    not_before: dt.datetime | None = None,
) -> str:
    written = storage.write_lines(_shard_key(spec, job, shard_id), (line for _, line in lines))
    failpoint("retry.after_file" if items is None else "shards.after_file")
    shard = {
        "shard_id": shard_id,
        "job_id": job.job_id,
        "round": round_no,
        "shard_index": index,
        "input_uri": written.uri,
        "item_count": len(lines),
        "size_bytes": written.size_bytes,
        "content_sha256": written.sha256,
        "provider": spec.model.provider,
        "not_before": not_before,
    }
    if items is not None:
        ledger.add_shard_with_items(shard, items)
    else:
        ledger.reassign_items_to_shard(job.job_id, shard, [cid for cid, _ in lines])
    failpoint("shards.after_record")
    return written.uri


def build_shards(
    spec: PipelineSpec,
    day: dt.date,
    ledger: LedgerResource,
    storage: ArtifactStorage,
    provider: BatchProvider,
    created_by: str = "dagster",
) -> ShardsResult:
    """Turn snapshot rows the ledger has not seen into request shards and input dead letters."""
    snapshot_uri = current_snapshot_uri(spec, day, storage)
    job = job_for(spec, day, ledger, created_by)
    price = price_for(spec)
    known = ledger.known_custom_ids(job.job_id)
    snapshot_rows = 0
    already = 0
    dead_letters: dict[str, int] = defaultdict(int)
    dead_rows: list[dict[str, Any]] = []
    input_tokens = 0
    new_requests = 0

    def dead(item: PreparedItem, code: str, message: str) -> None:
        dead_letters[code] += 1
        dead_rows.append(
            {
                "job_id": job.job_id,
                "custom_id": item.custom_id,
                "source_id": item.source_id,
                "status": DEAD_LETTER,
                "error_class": "input",
                "error_code": code,
                "error_message": message,
                "model_name": spec.model.name,
            }
        )

    def fresh_requests() -> Iterator[tuple[PreparedItem, bytes]]:
        nonlocal snapshot_rows, already, input_tokens, new_requests
        rows = read_snapshot(snapshot_uri, storage)
        for item in prepare_items(spec, day, rows, price.context_window):
            snapshot_rows += 1
            if item.custom_id in known:
                already += 1
                continue
            if item.request is None:
                dead(item, item.error_code or "input", item.error_message or "")
                continue
            line = json.dumps(provider.request_line(spec, item.request), ensure_ascii=False)
            encoded = line.encode()
            if len(encoded) + 1 > spec.sharding.max_bytes_per_shard:
                limit = spec.sharding.max_bytes_per_shard
                dead(
                    item,
                    "request_too_large",
                    f"the request is {len(encoded)} bytes; a shard takes at most {limit} "
                    "(sharding.max_bytes_per_shard)",
                )
                continue
            input_tokens += item.input_tokens
            new_requests += 1
            yield item, encoded

    round_no = ledger.next_round(job.job_id)
    created: list[str] = []
    uris: list[str] = []
    source_ids: dict[str, str | None] = {}

    def lines() -> Iterator[tuple[str, bytes]]:
        for item, line in fresh_requests():
            source_ids[item.custom_id] = item.source_id
            yield item.custom_id, line

    for index, shard_lines in enumerate(
        split_shards(
            lines(),
            max_requests=spec.sharding.max_requests_per_shard,
            max_bytes=spec.sharding.max_bytes_per_shard,
        )
    ):
        shard_id = ids.shard_id(job.job_id, round_no, index)
        items = [
            {
                "job_id": job.job_id,
                "custom_id": cid,
                "source_id": source_ids.pop(cid),
                "shard_id": shard_id,
                "status": PENDING,
                "model_name": spec.model.name,
            }
            for cid, _ in shard_lines
        ]
        uris.append(
            _write_shard(spec, job, ledger, storage, shard_id, round_no, index, shard_lines, items)
        )
        created.append(shard_id)
    ledger.add_items(dead_rows)
    estimate = price.cost_usd(input_tokens, 0, batch=True)
    upper = price.cost_usd(input_tokens, new_requests * spec.model.max_output_tokens, batch=True)
    ledger.update_job(
        job.job_id,
        snapshot_uri=snapshot_uri,
        estimated_cost_usd=(job.estimated_cost_usd or 0.0) + upper,
    )
    ledger.refresh_job(job.job_id)
    return ShardsResult(
        job_id=job.job_id,
        snapshot_rows=snapshot_rows,
        new_items=new_requests + sum(dead_letters.values()),
        already_known=already,
        input_dead_letters=dict(dead_letters),
        shards_created=created,
        shard_uris=uris,
        estimated_input_tokens=input_tokens,
        estimated_cost_usd=estimate,
        estimated_cost_upper_usd=upper,
    )


class SubmitResult(BaseModel):
    job_id: str
    submitted: dict[str, str]
    in_flight: int
    estimated_cost_upper_usd: float
    waiting_for_backoff: int = 0
    next_submission_at: dt.datetime | None = None


def submit_shards(
    spec: PipelineSpec,
    day: dt.date,
    ledger: LedgerResource,
    storage: ArtifactStorage,
    provider: BatchProvider,
    *,
    approve_budget: bool = False,
) -> SubmitResult:
    """Submit every shard not yet submitted; a shard never gets a second live batch."""
    job = existing_job(spec, day, ledger)
    to_submit = ledger.shards(job.job_id, [ShardState.CREATED, ShardState.UPLOADED])
    limit = spec.budget.max_usd_per_partition
    upper = job.estimated_cost_usd or 0.0
    if to_submit and limit is not None and upper > limit and not approve_budget:
        raise GateBlocked(
            "budget",
            f"{spec.name} {day}: estimated upper bound ${upper:.4f} is over "
            f"budget.max_usd_per_partition ${limit:.4f}; nothing was submitted. Approve with "
            "`llm-assets run ... --approve-budget` or the run tag llm_assets/approve_budget=true",
        )
    now = utcnow()
    waiting = [s for s in to_submit if s.not_before is not None and s.not_before > now]
    to_submit = [s for s in to_submit if s not in waiting]
    submitted: dict[str, str] = {}
    for shard in to_submit:
        # The first intent is kept: after a crash, the adapter reconciles from that moment.
        if shard.submit_intent_at is None:
            ledger.update_shard(shard.shard_id, submit_intent_at=utcnow())
        failpoint("submit.after_intent")
        batch_id = provider.submit(
            ShardSubmission(
                shard_id=shard.shard_id,
                job_id=job.job_id,
                pipeline=spec.name,
                input_uri=shard.input_uri,
                item_count=shard.item_count,
                intent_at=shard.submit_intent_at,
                known_batch_ids=ledger.recent_provider_batch_ids(
                    spec.model.provider, utcnow() - dt.timedelta(days=2)
                ),
            ),
            storage,
        )
        failpoint("submit.after_create")
        ledger.mark_submitted(shard.shard_id, batch_id, ShardState.SUBMITTED)
        failpoint("submit.after_record")
        submitted[shard.shard_id] = batch_id
    ledger.refresh_job(job.job_id)
    in_flight = len(ledger.shards(job.job_id, IN_FLIGHT_STATES))
    return SubmitResult(
        job_id=job.job_id,
        submitted=submitted,
        in_flight=in_flight,
        estimated_cost_upper_usd=upper,
        waiting_for_backoff=len(waiting),
        next_submission_at=min((s.not_before for s in waiting if s.not_before), default=None),
    )


def poll_shards(
    ledger: LedgerResource, provider: BatchProvider, shards: Iterable[ShardRecord]
) -> list[ShardRecord]:
    """Ask the provider about in-flight shards (cheap status calls) and record what it says."""
    updated: list[ShardRecord] = []
    for shard in shards:
        if shard.status not in IN_FLIGHT_STATES or shard.provider_batch_id is None:
            updated.append(shard)
            continue
        status = provider.poll(shard.provider_batch_id)
        values: dict[str, Any] = {
            "status": status.state.value,
            "raw_status": status.raw_status,
            "completed_requests": status.completed,
            "failed_requests": status.failed,
            "message": status.message,
        }
        if status.ended:
            values["ended_at"] = utcnow()
        ledger.update_shard(shard.shard_id, expect_status=IN_FLIGHT_STATES, **values)
        refreshed = ledger.get_shard(shard.shard_id)
        assert refreshed is not None
        updated.append(refreshed)
    return updated


class ImportResult(BaseModel):
    job_id: str
    imported_shards: list[str]
    in_flight_shards: int
    lines: UpsertStats
    missing: int
    retry_shards: list[str]
    gave_up: int
    counts: JobCounts


def _ledger_row(result: ItemResult, price: ModelPrice, model_name: str) -> dict[str, Any]:
    if result.succeeded:
        status, error_class = SUCCEEDED, None
    elif result.error_class in ("transient", "expired"):
        status, error_class = RETRY, result.error_class
    else:
        status, error_class = DEAD_LETTER, result.error_class or "deterministic"
    cost = (
        price.cost_usd(result.input_tokens, result.output_tokens, batch=True)
        if result.succeeded
        else 0.0
    )
    return {
        "custom_id": result.custom_id,
        "status": status,
        "error_class": error_class,
        "error_code": result.error_code,
        "error_message": result.error_message,
        "model_name": model_name,
        "input_tokens": result.input_tokens,
        "output_tokens": result.output_tokens,
        "cost_usd": cost,
        "finish_reason": result.finish_reason,
        "result_json": result.output_text,
    }


def import_results(
    spec: PipelineSpec,
    day: dt.date,
    ledger: LedgerResource,
    storage: ArtifactStorage,
    provider: BatchProvider,
) -> ImportResult:
    """Import every ended shard by custom_id, then plan retries for what is still open."""
    job = existing_job(spec, day, ledger)
    price = price_for(spec)
    shards = poll_shards(ledger, provider, ledger.shards(job.job_id, IN_FLIGHT_STATES))
    in_flight = sum(1 for s in shards if s.status in IN_FLIGHT_STATES)
    stats = UpsertStats()
    missing = 0
    imported: list[str] = []
    for shard in ledger.shards(job.job_id, ENDED_STATES):
        assert shard.provider_batch_id is not None
        rows = (
            _ledger_row(r, price, spec.model.name)
            for r in provider.results(shard.provider_batch_id)
        )
        shard_stats = ledger.upsert_results(job.job_id, rows)
        failpoint("import.after_upsert")
        for field in ("received", "applied", "duplicates", "unknown", "already_terminal"):
            setattr(stats, field, getattr(stats, field) + getattr(shard_stats, field))
        stats.duplicate_ids = (stats.duplicate_ids + shard_stats.duplicate_ids)[:100]
        why = shard.raw_status or shard.status
        if shard.message:
            why = f"{why}: {shard.message}"
        missing += ledger.set_shard_items(
            shard.shard_id,
            from_status=[SUBMITTED],
            status=RETRY,
            error_class="expired" if shard.status == ShardState.EXPIRED else "transient",
            error_code=f"missing_result_{shard.status}",
            error_message=(f"no result in provider batch {shard.provider_batch_id} (batch {why})"),
        )
        failpoint("import.after_missing")
        ledger.update_shard(
            shard.shard_id,
            expect_status=ENDED_STATES,
            status=ShardState.IMPORTED.value,
            imported_at=utcnow(),
        )
        failpoint("import.after_shard")
        imported.append(shard.shard_id)
    retry_shards, gave_up = plan_retries(spec, job, ledger, storage)
    counts = ledger.refresh_job(job.job_id)
    return ImportResult(
        job_id=job.job_id,
        imported_shards=imported,
        in_flight_shards=in_flight,
        lines=stats,
        missing=missing,
        retry_shards=retry_shards,
        gave_up=gave_up,
        counts=counts,
    )


def plan_retries(
    spec: PipelineSpec, job: JobRecord, ledger: LedgerResource, storage: ArtifactStorage
) -> tuple[list[str], int]:
    """Dead-letter retryable items out of attempts; put the rest into a new round of shards."""
    retry_by_shard: dict[str, set[str]] = defaultdict(set)
    exhausted: list[dict[str, Any]] = []
    for item in ledger.iter_items(
        job.job_id,
        [RETRY],
        columns=["custom_id", "shard_id", "attempts", "error_message"],
    ):
        if item["attempts"] >= spec.retry.max_attempts:
            exhausted.append(
                {
                    "custom_id": item["custom_id"],
                    "status": DEAD_LETTER,
                    "error_message": f"gave up after {item['attempts']} attempts: "
                    f"{item['error_message']}",
                }
            )
        else:
            retry_by_shard[item["shard_id"]].add(item["custom_id"])
    gave_up = ledger.set_item_errors(job.job_id, exhausted, from_status=[RETRY])
    if not retry_by_shard:
        return [], gave_up
    round_no = ledger.next_round(job.job_id)

    def retry_lines() -> Iterator[tuple[str, bytes]]:
        for old_shard_id in sorted(retry_by_shard):
            wanted = retry_by_shard[old_shard_id]
            old = ledger.get_shard(old_shard_id)
            assert old is not None
            for line in storage.open_lines(old.input_uri):
                cid = json.loads(line)["custom_id"]
                if cid in wanted:
                    yield cid, line

    created: list[str] = []
    not_before = utcnow() + dt.timedelta(seconds=retry_backoff(spec, round_no))
    for index, shard_lines in enumerate(
        split_shards(
            retry_lines(),
            max_requests=spec.sharding.max_requests_per_shard,
            max_bytes=spec.sharding.max_bytes_per_shard,
        )
    ):
        shard_id = ids.shard_id(job.job_id, round_no, index)
        _write_shard(
            spec, job, ledger, storage, shard_id, round_no, index, shard_lines, None, not_before
        )
        created.append(shard_id)
    return created, gave_up


class RequeueResult(BaseModel):
    job_id: str
    requeued: int
    still_invalid: dict[str, str]
    shards: list[str]


def requeue_dead_letters(
    spec: PipelineSpec,
    day: dt.date,
    ledger: LedgerResource,
    storage: ArtifactStorage,
    provider: BatchProvider,
    *,
    classes: set[str] | None = None,
    chosen_ids: set[str] | None = None,
) -> RequeueResult:
    """Send chosen dead letters (by class and/or custom_id or source id) back, rendered again
    from the current snapshot and spec, so a fixed prompt or fixed source row is what gets
    sent; each send is a new attempt."""
    job = existing_job(spec, day, ledger)
    chosen = {
        row["custom_id"]
        for row in ledger.iter_dead_letters(job.job_id)
        if (classes is None or row["error_class"] in classes)
        and (chosen_ids is None or row["custom_id"] in chosen_ids or row["source_id"] in chosen_ids)
    }
    still_invalid: dict[str, str] = {}
    price = price_for(spec)

    def lines() -> Iterator[tuple[str, bytes]]:
        rows = read_snapshot(current_snapshot_uri(spec, day, storage), storage)
        for item in prepare_items(spec, day, rows, price.context_window):
            if item.custom_id not in chosen:
                continue
            if item.request is None:
                still_invalid[item.custom_id] = item.error_message or item.error_code or "input"
                continue
            line = json.dumps(provider.request_line(spec, item.request), ensure_ascii=False)
            yield item.custom_id, line.encode()

    round_no = ledger.next_round(job.job_id)
    shards: list[str] = []
    requeued = 0
    for index, shard_lines in enumerate(
        split_shards(
            lines(),
            max_requests=spec.sharding.max_requests_per_shard,
            max_bytes=spec.sharding.max_bytes_per_shard,
        )
    ):
        shard_id = ids.shard_id(job.job_id, round_no, index)
        written = storage.write_lines(
            _shard_key(spec, job, shard_id), (line for _, line in shard_lines)
        )
        requeued += ledger.requeue_into_shard(
            job.job_id,
            {
                "shard_id": shard_id,
                "job_id": job.job_id,
                "round": round_no,
                "shard_index": index,
                "input_uri": written.uri,
                "item_count": len(shard_lines),
                "size_bytes": written.size_bytes,
                "content_sha256": written.sha256,
                "provider": spec.model.provider,
            },
            [cid for cid, _ in shard_lines],
        )
        shards.append(shard_id)
    ledger.refresh_job(job.job_id)
    return RequeueResult(
        job_id=job.job_id, requeued=requeued, still_invalid=still_invalid, shards=shards
    )


def retry_backoff(spec: PipelineSpec, round_no: int) -> float:
    """Seconds before retry round `round_no` may be submitted: exponential, jittered."""
    if spec.retry.backoff_seconds <= 0:
        return 0.0
    ceiling = min(spec.retry.max_backoff_seconds, spec.retry.backoff_seconds * 2 ** (round_no - 1))
    return random.uniform(ceiling / 2, ceiling)


class ValidateResult(BaseModel):
    job_id: str
    uri: str
    valid_rows: int
    quality_failures: dict[str, int]
    quality_dead_letters: int
    failure_rate: float
    failure_cases: list[dict[str, Any]]
    open_items: int
    missing_results: list[str]
    preview: list[dict[str, Any]]
    low_confidence_rows: int | None = None
    label_distribution: dict[str, float] = {}
    baseline_distribution: dict[str, float] = {}
    label_shift: float | None = None


def _arrow_schema(spec: PipelineSpec) -> Any:
    import pyarrow as pa

    types = {
        "str": pa.string(),
        "int": pa.int64(),
        "float": pa.float64(),
        "bool": pa.bool_(),
        "list[str]": pa.list_(pa.string()),
        "list[float]": pa.list_(pa.float32()),
    }
    lineage = [pa.field(name, pa.string()) for name in quality.LINEAGE]
    if spec.output.format == "text":
        return pa.schema([*lineage, pa.field("text", pa.string())])
    fields = [pa.field(n, types[f.type]) for n, f in spec.output.output_schema.items()]
    return pa.schema([*lineage, *fields])


def validate_outputs(
    spec: PipelineSpec, day: dt.date, ledger: LedgerResource, storage: ArtifactStorage
) -> ValidateResult:
    """Parse succeeded results with pydantic, then check them as a frame with pandera; every
    failure becomes a quality dead letter naming the rule and the offending value."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    job = existing_job(spec, day, ledger)
    schema = _arrow_schema(spec)
    failures: dict[str, int] = defaultdict(int)
    failed_rows: list[dict[str, Any]] = []
    preview: list[dict[str, Any]] = []
    seen_sources: set[str] = set()
    labels: dict[str, int] = defaultdict(int)
    label_name = quality.label_field(spec)
    confidence_name = quality.confidence_field(spec)
    low_confidence = 0
    valid = 0

    def fail(custom_id: str, rule: str, message: str) -> None:
        failures[rule] += 1
        failed_rows.append(
            {
                "custom_id": custom_id,
                "status": DEAD_LETTER,
                "error_class": "quality",
                "error_code": rule,
                "error_message": message,
            }
        )

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "outputs.parquet"
        outputs_path = Path(tmp) / "outputs.jsonl"
        with pq.ParquetWriter(path, schema) as writer, outputs_path.open("w") as outputs:

            def flush(batch: list[dict[str, Any]]) -> None:
                nonlocal valid, low_confidence
                frame = pd.DataFrame(batch, columns=schema.names)
                passed, broken = quality.validate_frame(spec, frame, seen_sources)
                for failure in broken:
                    fail(failure.custom_id, failure.rule, f"{failure.rule}: got {failure.value!r}")
                rows = passed.to_dict(orient="records")
                if rows:
                    writer.write_table(pa.Table.from_pylist(rows, schema=schema))
                for row in rows:
                    valid += 1
                    if len(preview) < 10:
                        preview.append(row)
                    if label_name:
                        labels[str(row[label_name])] += 1
                    if (
                        confidence_name
                        and spec.quality.min_confidence is not None
                        and row[confidence_name] < spec.quality.min_confidence
                    ):
                        low_confidence += 1
                    value = {k: row[k] for k in schema.names if k not in quality.LINEAGE}
                    outputs.write(
                        json.dumps(
                            {
                                "custom_id": row["custom_id"],
                                "source_id": row["source_id"],
                                "prompt_version": job.prompt_version,
                                "model_name": job.model_name,
                                "output_json": json.dumps(value, ensure_ascii=False),
                            },
                            ensure_ascii=False,
                        )
                        + "\n"
                    )

            batch: list[dict[str, Any]] = []
            for item in ledger.iter_items(job.job_id, [SUCCEEDED]):
                parsed = parse_output(spec, item["result_json"], item["finish_reason"])
                if not parsed.ok:
                    fail(item["custom_id"], parsed.rule or "unknown", parsed.message or "")
                    continue
                batch.append(
                    {
                        "job_id": job.job_id,
                        "custom_id": item["custom_id"],
                        "source_id": item["source_id"],
                        "prompt_version": job.prompt_version,
                        "model": job.model_name,
                        **(parsed.value or {}),
                    }
                )
                if len(batch) >= 10_000:
                    flush(batch)
                    batch = []
            if batch:
                flush(batch)
        key = _key("outputs", spec.name, day.isoformat(), f"{job.job_id}.parquet")
        uri = storage.write_file(key, path).uri
        failpoint("validate.after_write")
        ledger.set_item_errors(job.job_id, failed_rows, from_status=[SUCCEEDED])

        def stored_outputs() -> Iterator[dict[str, Any]]:
            with outputs_path.open() as handle:
                for line in handle:
                    yield json.loads(line)

        ledger.replace_outputs(job.job_id, stored_outputs())
    counts = ledger.refresh_job(job.job_id)
    quality_dead = counts.dead_letters_by_class.get("quality", 0)
    judged = counts.succeeded + quality_dead
    cases = [
        {k: row[k] for k in ("custom_id", "source_id", "error_code", "error_message")}
        for row in ledger.iter_dead_letters(job.job_id)
        if row["error_class"] == "quality"
    ][:20]
    baseline: dict[str, float] = {}
    shift = None
    if label_name:
        past = (
            json.loads(row["output_json"]).get(label_name)
            for row in ledger.recent_outputs(spec.name, day, spec.quality.shift_window)
        )
        baseline = quality.distribution(past)
        current = {k: v / valid for k, v in labels.items()} if valid else {}
        shift = quality.total_variation(current, baseline) if baseline and current else None
    return ValidateResult(
        job_id=job.job_id,
        uri=uri,
        valid_rows=valid,
        quality_failures=dict(failures),
        quality_dead_letters=quality_dead,
        failure_rate=quality_dead / judged if judged else 0.0,
        failure_cases=cases,
        open_items=counts.open,
        missing_results=ledger.missing_results(job.job_id) if counts.open == 0 else [],
        preview=preview,
        low_confidence_rows=low_confidence if confidence_name else None,
        label_distribution={k: v / valid for k, v in sorted(labels.items())} if valid else {},
        baseline_distribution=baseline,
        label_shift=shift,
    )


class DeadLetterResult(BaseModel):
    job_id: str
    uri: str
    rows: int
    by_class: dict[str, int]
    preview: list[dict[str, Any]]


def export_dead_letters(
    spec: PipelineSpec, day: dt.date, ledger: LedgerResource, storage: ArtifactStorage
) -> DeadLetterResult:
    job = existing_job(spec, day, ledger)
    by_class: dict[str, int] = defaultdict(int)
    preview: list[dict[str, Any]] = []

    def lines() -> Iterator[bytes]:
        for item in ledger.iter_dead_letters(job.job_id):
            by_class[item["error_class"] or "unknown"] += 1
            if len(preview) < 20:
                preview.append(item)
            yield json.dumps(item, ensure_ascii=False).encode()

    key = _key("dead_letters", spec.name, day.isoformat(), f"{job.job_id}.jsonl")
    written = storage.write_lines(key, lines())
    return DeadLetterResult(
        job_id=job.job_id,
        uri=written.uri,
        rows=written.line_count,
        by_class=dict(by_class),
        preview=preview,
    )


class CostReport(BaseModel):
    job_id: str
    uri: str
    items: int
    succeeded: int
    dead_letters: int
    open_items: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    estimated_cost_upper_usd: float | None
    price: ModelPrice
    shards: list[dict[str, Any]]


def cost_report(
    spec: PipelineSpec, day: dt.date, ledger: LedgerResource, storage: ArtifactStorage
) -> CostReport:
    job = existing_job(spec, day, ledger)
    counts = ledger.refresh_job(job.job_id)
    shard_costs = ledger.shard_totals(job.job_id)
    report = CostReport(
        job_id=job.job_id,
        uri="",
        items=counts.total,
        succeeded=counts.succeeded,
        dead_letters=counts.dead_letters,
        open_items=counts.open,
        input_tokens=counts.input_tokens,
        output_tokens=counts.output_tokens,
        cost_usd=counts.cost_usd,
        estimated_cost_upper_usd=job.estimated_cost_usd,
        price=price_for(spec),
        shards=shard_costs,
    )
    key = _key("reports", spec.name, day.isoformat(), f"{job.job_id}.cost.json")
    uri = storage.write_bytes(key, report.model_dump_json(indent=2).encode()).uri
    return report.model_copy(update={"uri": uri})


def published_frame_failures(
    spec: PipelineSpec, uri: str, storage: ArtifactStorage
) -> list[dict[str, Any]]:
    """Read the written Parquet back and check it against the frame schema, batch by batch."""
    import pyarrow.parquet as pq

    failures: list[dict[str, Any]] = []
    seen: set[str] = set()
    with storage.local_copy(uri) as path:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=50_000):
            _, broken = quality.validate_frame(spec, batch.to_pandas(), seen)
            failures += [f.model_dump() for f in broken]
    return failures


def validated_uri(
    spec: PipelineSpec, day: dt.date, ledger: LedgerResource, storage: ArtifactStorage
) -> str:
    job = existing_job(spec, day, ledger)
    return storage.uri(_key("outputs", spec.name, day.isoformat(), f"{job.job_id}.parquet"))


class PublishResult(BaseModel):
    uri: str
    rows: int
    sha256: str


def publish_outputs(
    spec: PipelineSpec, day: dt.date, ledger: LedgerResource, storage: ArtifactStorage
) -> PublishResult:
    """The hand-off to consumers: the day's validated Parquet at a stable address."""
    import pyarrow.parquet as pq

    source = validated_uri(spec, day, ledger, storage)
    with storage.local_copy(source) as path:
        rows = pq.ParquetFile(path).metadata.num_rows
        written = storage.write_file(
            _key("published", spec.name, f"{day.isoformat()}.parquet"), path
        )
    return PublishResult(uri=written.uri, rows=rows, sha256=written.sha256)


class SampleResult(BaseModel):
    uri: str
    rows: int
    preview: list[dict[str, Any]]


def qa_sample(
    spec: PipelineSpec, day: dt.date, ledger: LedgerResource, storage: ArtifactStorage
) -> SampleResult:
    """N validated rows drawn with a seed fixed per partition, for human spot checks."""
    import pyarrow.parquet as pq

    job = existing_job(spec, day, ledger)
    with storage.local_copy(validated_uri(spec, day, ledger, storage)) as path:
        table = pq.read_table(path)
    rng = random.Random(f"{spec.name}/{day.isoformat()}/{job.job_id}")
    picks = sorted(
        rng.sample(range(table.num_rows), min(spec.quality.qa_sample_size, table.num_rows))
    )
    rows = table.take(picks).to_pylist() if picks else []
    written = storage.write_lines(
        _key("qa", spec.name, f"{day.isoformat()}.jsonl"),
        (json.dumps(row, ensure_ascii=False, default=str).encode() for row in rows),
    )
    return SampleResult(uri=written.uri, rows=len(rows), preview=rows[:20])
