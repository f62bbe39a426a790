"""What each asset does, as plain functions over the ledger, storage and a provider.

Assets (factory.py), the CLI and the sensors call these; keeping them free of Dagster makes
each step's idempotency easy to see and to test: every step can run again at any point and
converges on the same ledger state.
"""

import contextlib
import dataclasses
import datetime as dt
import functools
import hashlib
import json
import logging
import os
import random
import re
import signal
import statistics
import tempfile
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel

from llm_assets import ids, parallel, quality
from llm_assets.failpoints import failpoint
from llm_assets.items import PreparedItem, Preparer, prepare_items
from llm_assets.memory import collector_paused, release_free_memory
from llm_assets.progress import report as report_progress
from llm_assets.resources.ledger import (
    DEAD_LETTER,
    PENDING,
    RESULT_COLUMNS,
    RETRY,
    SUBMITTED,
    SUCCEEDED,
    BackgroundWriter,
    JobCounts,
    JobRecord,
    LedgerResource,
    ShardRecord,
    StagedResults,
    UpsertStats,
    utcnow,
)
from llm_assets.resources.pricing import ModelPrice, load_price_table
from llm_assets.resources.providers.base import (
    ENDED_STATES,
    IN_FLIGHT_STATES,
    ONLINE_BATCH_PREFIX,
    BatchProvider,
    ItemResult,
    ShardState,
    ShardSubmission,
)
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.result_rows import RowMaker, ledger_values, staged_results
from llm_assets.sharding import split_shards
from llm_assets.source import rows_for_partition
from llm_assets.spec import PipelineSpec
from llm_assets.tokens import counter_for
from llm_assets.validation import parse_output

log = logging.getLogger("llm_assets")

RETRY_READ_AT_ONCE = 100_000
"""Items to retry read by one query (PostgreSQL spreads it over parallel workers) before the
rest are streamed: a few percent of a large day's items, a whole day's when a batch expired."""


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
                    row = row._replace(record={k: v for k, v in row.record.items() if k in keep})
                else:
                    unreadable += 1
                line = row.to_json() + b"\n"
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


def _shard_key(spec: PipelineSpec, job: JobRecord, shard_id: str) -> str:
    return _key(
        "shards", spec.name, job.partition_date.isoformat(), job.job_id, f"{shard_id}.jsonl"
    )


def line_offsets(lines: Sequence[tuple[str, bytes]]) -> list[tuple[str, int]]:
    """(custom_id, byte offset of its line) for the lines of a shard file, in its order, as
    ArtifactStorage.write_lines lays them out (each line and a newline)."""
    offsets = []
    at = 0
    for cid, line in lines:
        offsets.append((cid, at))
        at += len(line) + 1
    return offsets


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
    estimate: "ShardEstimate",
    not_before: dt.datetime | None = None,
    writer: BackgroundWriter | None = None,
) -> str:
    """Write a shard's file, then record it (on `writer`'s thread when given: the file is
    always there before the ledger names it)."""
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
        **estimate.model_dump(),
    }

    def record() -> None:
        if items is not None:
            ledger.add_shard_with_items(shard, items)
        else:
            ledger.reassign_items_to_shard(job.job_id, shard, line_offsets(lines))
        failpoint("shards.after_record")

    if writer is not None:
        writer.submit(record)
    else:
        record()
    return written.uri


class ShardEstimate(BaseModel):
    """What a shard is expected to cost, and at most, before it is sent."""

    estimated_input_tokens: int
    estimated_output_tokens: int
    estimated_cost_usd: float
    estimated_cost_upper_usd: float


class Estimate(BaseModel):
    """A day's estimate as `request_shards` shows it."""

    requests: int = 0
    input_tokens: int = 0
    input_tokens_exact: bool = True
    token_counter: str = ""
    expected_output_tokens_per_item: float = 0.0
    output_basis: str = ""
    cost_usd: float = 0.0
    cost_upper_usd: float = 0.0

    def add(self, shard: ShardEstimate, requests: int) -> None:
        self.requests += requests
        self.input_tokens += shard.estimated_input_tokens
        self.cost_usd += shard.estimated_cost_usd
        self.cost_upper_usd += shard.estimated_cost_upper_usd


class Estimator:
    """Prices shards before submission: input tokens as counted, output as learned from the
    pipeline's earlier partitions (median output tokens per item, at most max_output_tokens);
    the upper bound takes every item at max_output_tokens and approximated input counts plus
    their margin."""

    def __init__(
        self, spec: PipelineSpec, day: dt.date, ledger: LedgerResource, provider: BatchProvider
    ) -> None:
        self.spec = spec
        self.provider = provider
        self.price = price_for(spec)
        self.counter = counter_for(spec)
        self.max_output = spec.model.max_output_tokens
        history = ledger.earlier_jobs(spec.name, day, spec.budget.history_window)
        per_item = list(ledger.output_tokens_per_billed_item([j.job_id for j in history]).values())
        if per_item:
            self.expected_output = min(statistics.median(per_item), float(self.max_output))
            self.basis = f"median of {len(per_item)} earlier partition(s)"
        else:
            self.expected_output = float(self.max_output)
            self.basis = "max_output_tokens (no earlier partitions)"

    def empty(self) -> Estimate:
        return Estimate(
            input_tokens_exact=self.counter.exact,
            token_counter=self.counter.method,
            expected_output_tokens_per_item=self.expected_output,
            output_basis=self.basis,
        )

    def shard(self, input_tokens: int, requests: int) -> ShardEstimate:
        output = round(self.expected_output * requests)
        # A shard sent request by request (Bedrock below its minimum) pays on-demand prices.
        batch = self.provider.priced_as_batch and not self.provider.runs_shard_in_step(
            self.spec, requests, None
        )
        return ShardEstimate(
            estimated_input_tokens=input_tokens,
            estimated_output_tokens=output,
            estimated_cost_usd=self.price.cost_usd(input_tokens, output, batch=batch),
            estimated_cost_upper_usd=self.price.cost_usd(
                self.counter.upper(input_tokens), self.max_output * requests, batch=batch
            ),
        )


class ShardsResult(BaseModel):
    job_id: str
    snapshot_rows: int
    new_items: int
    already_known: int
    input_dead_letters: dict[str, int]
    shards_created: list[str]
    shard_uris: list[str]
    estimate: Estimate


def request_format(spec: PipelineSpec) -> str:
    if spec.model.provider == "bedrock":
        from llm_assets.resources.providers.bedrock import input_format

        return input_format(spec)
    return ""


def min_records(spec: PipelineSpec) -> int:
    """The fewest requests a shard should have (Bedrock refuses smaller jobs)."""
    return spec.bedrock.min_records_per_job if spec.model.provider == "bedrock" else 1


def shards_for(
    spec: PipelineSpec, lines: Iterable[tuple[str, bytes]]
) -> Iterator[list[tuple[str, bytes]]]:
    """Request lines grouped into shards under the spec's caps and the provider's minimum."""
    return split_shards(
        lines,
        max_requests=spec.sharding.max_requests_per_shard,
        max_bytes=spec.sharding.max_bytes_per_shard,
        min_requests=min_records(spec),
    )


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
    estimator = Estimator(spec, day, ledger, provider)
    estimate = estimator.empty()
    known = ledger.known_custom_ids(job.job_id)
    snapshot_rows = 0
    already = 0
    dead_letters: dict[str, int] = defaultdict(int)
    dead_rows: list[dict[str, Any]] = []

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

    preparer = Preparer(spec, day, price.context_window, provider.line_encoder(spec))

    def fresh_requests() -> Iterator[tuple[PreparedItem, bytes]]:
        nonlocal snapshot_rows, already
        for item in prepare_items(preparer, storage.open_lines(snapshot_uri)):
            snapshot_rows += 1
            if item.custom_id in known:
                already += 1
                continue
            encoded = item.line
            if encoded is None:
                dead(item, item.error_code or "input", item.error_message or "")
                continue
            if len(encoded) + 1 > spec.sharding.max_bytes_per_shard:
                limit = spec.sharding.max_bytes_per_shard
                dead(
                    item,
                    "request_too_large",
                    f"the request is {len(encoded)} bytes; a shard takes at most {limit} "
                    "(sharding.max_bytes_per_shard)",
                )
                continue
            yield item, encoded

    round_no = ledger.next_round(job.job_id)
    created: list[str] = []
    uris: list[str] = []
    fresh: dict[str, PreparedItem] = {}

    def lines() -> Iterator[tuple[str, bytes]]:
        for item, line in fresh_requests():
            fresh[item.custom_id] = item
            yield item.custom_id, line

    # The database records shard k while shard k+1 is rendered, counted and written.
    with collector_paused(), BackgroundWriter(depth=1) as writer:
        for index, shard_lines in enumerate(shards_for(spec, lines())):
            shard_id = ids.shard_id(job.job_id, round_no, index)
            items = []
            for cid, offset in line_offsets(shard_lines):
                item = fresh.pop(cid)
                items.append(
                    {
                        "job_id": job.job_id,
                        "custom_id": cid,
                        "source_id": item.source_id,
                        "shard_id": shard_id,
                        "status": PENDING,
                        "model_name": spec.model.name,
                        "estimated_input_tokens": item.input_tokens,
                        "request_offset": offset,
                    }
                )
            shard_estimate = estimator.shard(
                sum(i["estimated_input_tokens"] for i in items), len(items)
            )
            estimate.add(shard_estimate, len(items))
            uris.append(
                _write_shard(
                    spec,
                    job,
                    ledger,
                    storage,
                    shard_id,
                    round_no,
                    index,
                    shard_lines,
                    items,
                    shard_estimate,
                    writer=writer,
                )
            )
            created.append(shard_id)
            release_free_memory()
    ledger.add_items(dead_rows)
    if created:
        ledger.analyze()
    ledger.update_job(job.job_id, snapshot_uri=snapshot_uri)
    ledger.refresh_job(job.job_id)
    return ShardsResult(
        job_id=job.job_id,
        snapshot_rows=snapshot_rows,
        new_items=estimate.requests + sum(dead_letters.values()),
        already_known=already,
        input_dead_letters=dict(dead_letters),
        shards_created=created,
        shard_uris=uris,
        estimate=estimate,
    )


@contextlib.contextmanager
def _stop_on_sigterm(stopping: threading.Event, active: bool) -> Iterator[None]:
    """While an online worker runs: SIGTERM asks it to stop cleanly instead of killing it."""
    if not active or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _submit_or_run(
    spec: PipelineSpec,
    job: JobRecord,
    shard: ShardRecord,
    ledger: LedgerResource,
    storage: ArtifactStorage,
    provider: BatchProvider,
    price: str,
    progress: Callable[[str], None] | None,
    stopping: threading.Event,
    submitted: dict[str, str],
) -> int:
    """Submit (or, online, run) one shard under its lock; 1 when another run holds it."""
    with ledger.submission_lock(shard.shard_id) as mine:
        if not mine:
            return 1  # another run is submitting it right now
        current = ledger.get_shard(shard.shard_id)
        if current is not None and runs_in_step(spec, provider, current):
            if current.status in (*IN_FLIGHT_STATES, ShardState.CREATED, ShardState.UPLOADED):
                submitted[shard.shard_id] = run_online_shard(
                    spec, job, current, ledger, storage, provider, price, progress, stopping
                )
            return 0
        if current is None or current.provider_batch_id is not None:
            return 0  # submitted by another run since it was listed
        if current.item_count < min_records(spec):
            _dead_letter_below_minimum(spec, current, ledger)
            return 0
        submitted[shard.shard_id] = _submit_one(
            spec, job, current, ledger, storage, provider, price
        )
        return 0


def runs_in_step(spec: PipelineSpec, provider: BatchProvider, shard: ShardRecord) -> bool:
    """Whether provider_batches sends this shard's items itself rather than as a batch."""
    return provider.runs_shard_in_step(spec, shard.item_count, shard.provider_batch_id)


def _dead_letter_below_minimum(
    spec: PipelineSpec, shard: ShardRecord, ledger: LedgerResource
) -> None:
    """`bedrock.below_minimum: merge`: a shard Bedrock would refuse is never sent; its items
    become dead letters saying why, to be requeued when there are enough of them."""
    minimum = min_records(spec)
    message = (
        f"{shard.shard_id} has {shard.item_count} item(s), below Bedrock's minimum of "
        f"{minimum} records per job, and bedrock.below_minimum is 'merge'; requeue them with "
        "more items, or set bedrock.below_minimum: online to send them at on-demand prices"
    )
    now = utcnow()
    ledger.close_shard(
        shard.shard_id,
        from_status=[PENDING],
        items={
            "status": DEAD_LETTER,
            "error_class": "deterministic",
            "error_code": "below_minimum",
            "error_message": message,
        },
        status=ShardState.IMPORTED.value,
        raw_status="below_minimum",
        message=message,
        ended_at=now,
        imported_at=now,
    )


def _submit_one(
    spec: PipelineSpec,
    job: JobRecord,
    shard: ShardRecord,
    ledger: LedgerResource,
    storage: ArtifactStorage,
    provider: BatchProvider,
    price: str,
) -> str:
    """Submit one shard under its submission lock; returns the provider batch id."""
    # The first intent is kept: after a crash, the adapter reconciles from that moment.
    # The price in force now is the one the shard's results are charged at.
    if shard.submit_intent_at is None:
        ledger.update_shard(shard.shard_id, submit_intent_at=utcnow(), price_json=price)
        shard = shard.model_copy(update={"price_json": price})
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
            model=spec.model.name,
            format=request_format(spec),
        ),
        storage,
    )
    failpoint("submit.after_create")
    ledger.mark_submitted(shard.shard_id, batch_id, ShardState.SUBMITTED)
    failpoint("submit.after_record")
    return batch_id


class OnlineInterrupted(Exception):
    """The online worker was asked to stop; what completed is in the ledger."""


def run_online_shard(
    spec: PipelineSpec,
    job: JobRecord,
    shard: ShardRecord,
    ledger: LedgerResource,
    storage: ArtifactStorage,
    provider: BatchProvider,
    price_json: str,
    progress: Callable[[str], None] | None = None,
    stopping: threading.Event | None = None,
) -> str:
    """Send a shard's open items to an online endpoint, checkpointing results to the ledger
    every `online.checkpoint_every` items; a restart sends only items without a result.

    SIGTERM stops new sends; requests in flight finish and are checkpointed, then
    OnlineInterrupted is raised so the run shows as stopped. Runs under the shard's
    submission lock, so two runs never work on the same shard.
    """
    from llm_assets.resources.providers.online import OnlineStats

    batch_id = shard.provider_batch_id or f"{ONLINE_BATCH_PREFIX}{shard.shard_id}"
    if shard.provider_batch_id is None:
        if shard.submit_intent_at is None:
            ledger.update_shard(shard.shard_id, submit_intent_at=utcnow(), price_json=price_json)
        ledger.mark_submitted(shard.shard_id, batch_id, ShardState.RUNNING)
    else:
        # A worker died with these items open; some may have been sent: a new attempt.
        ledger.count_new_attempt(shard.shard_id)
    shard = ledger.get_shard(shard.shard_id) or shard
    price = ModelPrice.model_validate_json(shard.price_json or price_json)
    open_items = {
        row["custom_id"]: row["estimated_input_tokens"]
        for row in ledger.iter_items(
            job.job_id,
            [SUBMITTED],
            shard_id=shard.shard_id,
            columns=["custom_id", "estimated_input_tokens"],
        )
    }
    total = len(open_items)

    def requests() -> Iterator[tuple[str, dict[str, Any], int]]:
        for line in storage.open_lines(shard.input_uri):
            custom_id, body = provider.realtime_request(json.loads(line))
            tokens = open_items.get(custom_id)
            if tokens is not None:
                yield custom_id, body, tokens + spec.model.max_output_tokens

    def deliver(results: list[ItemResult]) -> None:
        rows = (_ledger_row(r, price, spec.model.name, batch=False) for r in results)
        ledger.upsert_results(job.job_id, rows)
        failpoint("online.after_checkpoint")

    last_report = [0.0]

    def report(stats: OnlineStats) -> None:
        done = stats.succeeded + stats.failed
        now = utcnow().timestamp()
        if progress is not None and (now - last_report[0] >= 10 or done == total):
            last_report[0] = now
            progress(
                f"{shard.shard_id}: {done}/{total} answered, {stats.rate_limited} rate-limited, "
                f"{stats.retried} retried"
            )
        report_progress("online", done, total)

    stopping = stopping or threading.Event()
    stats = provider.run(
        spec,
        requests(),
        deliver,
        checkpoint_every=spec.online.checkpoint_every,
        stop=stopping.is_set,
        progress=report,
    )
    if stats.interrupted:
        raise OnlineInterrupted(
            f"{shard.shard_id}: stopped by SIGTERM after {stats.succeeded + stats.failed} of "
            f"{total} items; their results are in the ledger, the rest are sent when "
            "provider_batches runs again"
        )
    ledger.update_shard(
        shard.shard_id,
        status=ShardState.COMPLETED.value,
        raw_status="completed",
        ended_at=utcnow(),
        completed_requests=stats.succeeded,
        failed_requests=stats.failed,
        message=f"{stats.sent} sends, {stats.rate_limited} rate-limited, "
        f"{stats.paused_seconds:.1f}s paused, {stats.elapsed_seconds:.1f}s",
    )
    return batch_id


class BudgetGate(BaseModel):
    """The partition budget gate: what the day has spent or may still spend, against the limit."""

    limit_usd: float | None
    committed_usd: float
    approved_usd: float | None = None
    approved_by: str | None = None
    passed: bool
    reason: str


def budget_gate(
    spec: PipelineSpec,
    day: dt.date,
    ledger: LedgerResource,
    *,
    approve: bool = False,
    approved_by: str = "",
) -> BudgetGate:
    """Compare the day's committed cost (billed plus the upper bound of unbilled shards) with
    `budget.max_usd_per_partition`. Approving records the amount approved on the job, so later
    runs of the same day (retries) pass until the bound grows past what was approved."""
    job = existing_job(spec, day, ledger)
    limit = spec.budget.max_usd_per_partition
    committed = ledger.committed_cost(job.job_id)
    approved = job.budget_approved_usd
    gate = BudgetGate(
        limit_usd=limit,
        committed_usd=committed,
        approved_usd=approved,
        approved_by=job.budget_approved_by,
        passed=True,
        reason="",
    )
    if limit is None:
        return gate.model_copy(update={"reason": "no budget.max_usd_per_partition"})
    if not ledger.shards(job.job_id, [ShardState.CREATED, ShardState.UPLOADED]):
        return gate.model_copy(update={"reason": "nothing is waiting to be submitted"})
    if committed <= limit:
        return gate.model_copy(
            update={"reason": f"upper bound ${committed:.4f} within ${limit:.4f}"}
        )
    if approve:
        ledger.update_job(
            job.job_id,
            budget_approved_usd=committed,
            budget_approved_by=approved_by or "unknown",
            budget_approved_at=utcnow(),
        )
        return gate.model_copy(
            update={
                "approved_usd": committed,
                "approved_by": approved_by or "unknown",
                "reason": f"upper bound ${committed:.4f} over ${limit:.4f}, approved",
            }
        )
    if approved is not None and committed <= approved * (1 + 1e-9):
        return gate.model_copy(
            update={
                "reason": f"upper bound ${committed:.4f} over ${limit:.4f}, approved up to "
                f"${approved:.4f} by {job.budget_approved_by}"
            }
        )
    return gate.model_copy(
        update={
            "passed": False,
            "reason": f"{spec.name} {day}: estimated upper bound ${committed:.4f} is over "
            f"budget.max_usd_per_partition ${limit:.4f}"
            + (f" and the ${approved:.4f} approved earlier" if approved is not None else "")
            + "; nothing was submitted. Approve with `llm-assets run ... --approve-budget`, the "
            "run tag llm_assets/approve_budget=true or the request_shards config "
            "approve_budget: true",
        }
    )


class SubmitResult(BaseModel):
    job_id: str
    submitted: dict[str, str]
    being_submitted_elsewhere: int = 0
    in_flight: int
    committed_cost_usd: float
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
    approved_by: str = "",
    progress: Callable[[str], None] | None = None,
) -> SubmitResult:
    """Submit every shard not yet submitted; a shard never gets a second live batch.

    Two budget gates come first: the day's upper bound against the partition budget, then
    the shards' upper bounds reserved, all or none, against the pipeline's daily and monthly
    caps.
    """
    job = existing_job(spec, day, ledger)
    to_submit = ledger.shards(job.job_id, [ShardState.CREATED, ShardState.UPLOADED])
    if to_submit:
        gate = budget_gate(spec, day, ledger, approve=approve_budget, approved_by=approved_by)
        if not gate.passed:
            raise GateBlocked("budget", gate.reason)
    now = utcnow()
    waiting = [s for s in to_submit if s.not_before is not None and s.not_before > now]
    to_submit = [s for s in to_submit if s not in waiting]
    submitted: dict[str, str] = {}
    price = price_for(spec).model_dump_json()
    capped = spec.budget.max_usd_per_day is not None or spec.budget.max_usd_per_month is not None
    if capped and to_submit:
        refused = ledger.reserve_budget(
            pipeline=spec.name,
            job_id=job.job_id,
            shards={s.shard_id: s.estimated_cost_upper_usd for s in to_submit},
            max_per_day=spec.budget.max_usd_per_day,
            max_per_month=spec.budget.max_usd_per_month,
        )
        if refused is not None:
            raise GateBlocked(
                "pipeline_budget",
                f"{refused}; nothing was submitted. It can go once settled costs leave room "
                "(or raise budget.max_usd_per_day / max_usd_per_month)",
            )
    busy = 0
    # Online shards: this step is the worker. Shards a dead worker left running resume here.
    to_submit += [
        s for s in ledger.shards(job.job_id, IN_FLIGHT_STATES) if runs_in_step(spec, provider, s)
    ]
    stopping = threading.Event()
    with _stop_on_sigterm(stopping, any(runs_in_step(spec, provider, s) for s in to_submit)):
        for shard in to_submit:
            if stopping.is_set():
                raise OnlineInterrupted(
                    f"stopped by SIGTERM before {shard.shard_id}; its items are sent when "
                    "provider_batches runs again"
                )
            busy += _submit_or_run(
                spec, job, shard, ledger, storage, provider, price, progress, stopping, submitted
            )
    ledger.refresh_job(job.job_id)
    in_flight = len(ledger.shards(job.job_id, IN_FLIGHT_STATES))
    return SubmitResult(
        job_id=job.job_id,
        submitted=submitted,
        being_submitted_elsewhere=busy,
        in_flight=in_flight,
        committed_cost_usd=ledger.committed_cost(job.job_id),
        waiting_for_backoff=len(waiting),
        next_submission_at=min((s.not_before for s in waiting if s.not_before), default=None),
    )


def poll_shards(
    ledger: LedgerResource, provider: BatchProvider, shards: Iterable[ShardRecord]
) -> list[ShardRecord]:
    """Ask the provider about in-flight shards (cheap status calls) and record what it says."""
    updated: list[ShardRecord] = []
    for shard in shards:
        if (
            shard.status not in IN_FLIGHT_STATES
            or shard.provider_batch_id is None
            or shard.provider_batch_id.startswith(ONLINE_BATCH_PREFIX)  # worked in a step
        ):
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


def _ledger_row(
    result: ItemResult, price: ModelPrice, model_name: str, *, batch: bool
) -> dict[str, Any]:
    """A normalized result as a ledger row: its custom_id and RESULT_COLUMNS."""
    values = ledger_values(result, price.cost_calculator(batch=batch), model_name)
    return dict(zip(("custom_id", *RESULT_COLUMNS), values, strict=True))


def _about_lines(block: bytes) -> int:
    """A block of result lines weighed as lines, by its size: a result line is about a
    kilobyte, and counting the newlines of a million took a second."""
    return len(block) // 1024 + 1


@dataclasses.dataclass
class _ImportTotals:
    lines: UpsertStats = dataclasses.field(default_factory=UpsertStats)
    missing: int = 0
    imported: list[str] = dataclasses.field(default_factory=list)


def _close_imported_shard(
    ledger: LedgerResource, shard: ShardRecord, shard_stats: UpsertStats, totals: _ImportTotals
) -> None:
    """After a shard's results are in: what it did not answer is retried, its cost settled,
    and it is marked imported."""
    failpoint("import.after_upsert")
    stats = totals.lines
    for field in ("received", "applied", "duplicates", "unknown", "already_terminal"):
        setattr(stats, field, getattr(stats, field) + getattr(shard_stats, field))
    stats.duplicate_ids = (stats.duplicate_ids + shard_stats.duplicate_ids)[:100]
    why = shard.raw_status or shard.status
    if shard.message:
        why = f"{why}: {shard.message}"
    # One transaction: the writer thread waits for the GIL again after every statement.
    missing, _ = ledger.close_shard(
        shard.shard_id,
        from_status=[SUBMITTED],
        items={
            "status": RETRY,
            "error_class": "expired" if shard.status == ShardState.EXPIRED else "transient",
            "error_code": f"missing_result_{shard.status}",
            "error_message": f"no result in provider batch {shard.provider_batch_id} (batch {why})",
        },
        expect_status=ENDED_STATES,
        status=ShardState.IMPORTED.value,
        imported_at=utcnow(),
    )
    totals.missing += missing
    failpoint("import.after_shard")
    totals.imported.append(shard.shard_id)


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
    totals = _ImportTotals()
    stage = ledger.result_stager()
    # The ledger writes of one shard (its results, then closing it) run on the writer thread
    # while the next shard's lines are read and parsed; they run in order, so a shard is
    # closed only after its results are in, and a failure stops everything queued after it.
    with BackgroundWriter() as writer, parallel.Workers() as workers:
        for shard in ledger.shards(job.job_id, ENDED_STATES):
            assert shard.provider_batch_id is not None
            charged = (
                ModelPrice.model_validate_json(shard.price_json) if shard.price_json else price
            )
            to_row = RowMaker(
                charged.cost_calculator(batch=provider.priced_as_batch), spec.model.name
            )
            staged: Iterable[StagedResults]
            if shard.provider_batch_id.startswith(ONLINE_BATCH_PREFIX):
                # A shard worked in the step wrote its results as they came: nothing to fetch.
                staged = ()
            elif (blocks := provider.result_blocks(shard.provider_batch_id)) is not None:
                # Lines are parsed, and made into ledger rows, in worker processes when the
                # day is large; they go there in the blocks they were read in (splitting and
                # pickling each line here took a third of this process's time).
                raw, parse = blocks
                staged = workers.map(
                    staged_results, (parse, to_row, stage), raw, weight=_about_lines
                )
            else:
                staged = map(
                    stage,
                    parallel.chunked(map(to_row, provider.results(shard.provider_batch_id))),
                )
            shard_stats = ledger.upsert_staged(
                job.job_id, staged, writer=writer, shard_id=shard.shard_id
            )
            writer.submit(
                functools.partial(_close_imported_shard, ledger, shard, shard_stats, totals)
            )
    retry_shards, gave_up = plan_retries(spec, job, ledger, storage, provider)
    counts = ledger.refresh_job(job.job_id)
    return ImportResult(
        job_id=job.job_id,
        imported_shards=totals.imported,
        in_flight_shards=in_flight,
        lines=totals.lines,
        missing=totals.missing,
        retry_shards=retry_shards,
        gave_up=gave_up,
        counts=counts,
    )


def plan_retries(
    spec: PipelineSpec,
    job: JobRecord,
    ledger: LedgerResource,
    storage: ArtifactStorage,
    provider: BatchProvider,
) -> tuple[list[str], int]:
    """Dead-letter retryable items out of attempts; put the rest into a new round of shards."""
    retry_by_shard: dict[str, dict[str, int | None]] = defaultdict(dict)
    tokens: dict[str, int] = {}
    exhausted: list[dict[str, Any]] = []
    for item in ledger.iter_items(
        job.job_id,
        [RETRY],
        columns=[
            "custom_id",
            "shard_id",
            "attempts",
            "error_message",
            "estimated_input_tokens",
            "request_offset",
        ],
        few=RETRY_READ_AT_ONCE,
    ):
        tokens[item["custom_id"]] = item["estimated_input_tokens"]
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
            retry_by_shard[item["shard_id"]][item["custom_id"]] = item["request_offset"]
    gave_up = ledger.set_item_errors(job.job_id, exhausted, from_status=[RETRY])
    if not retry_by_shard:
        return [], gave_up
    round_no = ledger.next_round(job.job_id)

    def retry_lines() -> Iterator[tuple[str, bytes]]:
        for old_shard_id in sorted(retry_by_shard):
            wanted = retry_by_shard[old_shard_id]
            old = ledger.get_shard(old_shard_id)
            assert old is not None
            yield from request_lines(storage, old.input_uri, wanted)

    created: list[str] = []
    not_before = utcnow() + dt.timedelta(seconds=retry_backoff(spec, round_no))
    estimator = Estimator(spec, job.partition_date, ledger, provider)
    for index, shard_lines in enumerate(shards_for(spec, retry_lines())):
        shard_id = ids.shard_id(job.job_id, round_no, index)
        estimate = estimator.shard(sum(tokens[cid] for cid, _ in shard_lines), len(shard_lines))
        _write_shard(
            spec,
            job,
            ledger,
            storage,
            shard_id,
            round_no,
            index,
            shard_lines,
            None,
            estimate,
            not_before,
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
    estimator = Estimator(spec, day, ledger, provider)
    tokens: dict[str, int] = {}

    def lines() -> Iterator[tuple[str, bytes]]:
        preparer = Preparer(spec, day, price.context_window, provider.line_encoder(spec))
        snapshot = storage.open_lines(current_snapshot_uri(spec, day, storage))
        for item in prepare_items(preparer, snapshot):
            if item.custom_id not in chosen:
                continue
            if item.line is None:
                still_invalid[item.custom_id] = item.error_message or item.error_code or "input"
                continue
            tokens[item.custom_id] = item.input_tokens
            yield item.custom_id, item.line

    round_no = ledger.next_round(job.job_id)
    shards: list[str] = []
    requeued = 0
    for index, shard_lines in enumerate(shards_for(spec, lines())):
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
                **estimator.shard(
                    sum(tokens[cid] for cid, _ in shard_lines), len(shard_lines)
                ).model_dump(),
            },
            line_offsets(shard_lines),
        )
        shards.append(shard_id)
    ledger.refresh_job(job.job_id)
    return RequeueResult(
        job_id=job.job_id, requeued=requeued, still_invalid=still_invalid, shards=shards
    )


_LEADING_ID = re.compile(rb'^\{"(?:custom_id|recordId)": "([A-Za-z0-9_.:-]+)"')


_ID_STARTS = (b'{"custom_id": "', b'{"recordId": "')


def request_lines(
    storage: ArtifactStorage, uri: str, wanted: dict[str, int | None]
) -> list[tuple[str, bytes]]:
    """(custom_id, line) of wanted items' lines in a shard file, in file order. Each line is
    read where the ledger says it starts (`wanted`: custom_id → request_offset), so a retry
    round reads a few lines of each file, not every line. A file with items of no recorded
    offset (written before ledger version 5), or with a line there that is not the item's,
    is read whole instead."""
    if None not in wanted.values():
        by_offset = sorted((offset, cid) for cid, offset in wanted.items() if offset is not None)
        found: list[tuple[str, bytes]] = []
        for (_, cid), line in zip(
            by_offset, storage.lines_at(uri, [offset for offset, _ in by_offset]), strict=True
        ):
            try:
                if line_custom_id(line) != cid:
                    break
            except (ValueError, KeyError, AttributeError):
                break
            found.append((cid, line))
        else:
            return found
        log.warning("request lines of %s are not where the ledger says; reading it whole", uri)
    return list(lines_with_ids(storage.open_line_blocks(uri), set(wanted)))


def lines_with_ids(blocks: Iterable[bytes], wanted: set[str]) -> Iterator[tuple[str, bytes]]:
    """(custom_id, line) of the shard lines whose custom_id is wanted, in file order, from
    blocks of whole lines (`ArtifactStorage.open_line_blocks`).

    A retry round wants a few percent of every shard's lines: each line's id is read in
    place from the block, and only wanted lines become objects. A line that does not start
    with a plain id (an escape in it, another layout) is read by `line_custom_id`, so the
    result is that of reading every line with it."""
    wanted_bytes = {cid.encode() for cid in wanted}
    for block in blocks:
        find, starts, size = block.find, block.startswith, len(block)
        start = 0
        while start < size:
            end = find(b"\n", start)
            if end < 0:
                end = size
            cid: bytes | str | None = None
            for prefix in _ID_STARTS:
                if starts(prefix, start):
                    first = start + len(prefix)
                    close = find(b'"', first, end)
                    candidate = block[first:close]
                    if close > first and b"\\" not in candidate:
                        cid = candidate
                    break
            if cid is not None:
                if cid in wanted_bytes:
                    yield cid.decode(), block[start:end]
            else:
                line = block[start:end]
                if (text := line_custom_id(line)) in wanted:
                    yield text, line
            start = end + 1


def line_custom_id(line: bytes) -> str:
    """The custom_id of a shard line in any provider's format (Bedrock calls it recordId).
    Our lines start with it, so it is read without parsing the whole request."""
    leading = _LEADING_ID.match(line)
    if leading is not None:
        return leading.group(1).decode()
    request = json.loads(line)
    return str(request.get("custom_id") or request["recordId"])


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

    # The outputs replace the job's earlier ones once the day's failures are recorded.
    with tempfile.TemporaryDirectory() as tmp, ledger.replacing_outputs(job.job_id) as keep:
        path = Path(tmp) / "outputs.parquet"
        with pq.ParquetWriter(path, schema) as writer:
            value_names = [k for k in schema.names if k not in quality.LINEAGE]

            def flush(batch: list[dict[str, Any]]) -> None:
                nonlocal valid, low_confidence
                names = list(schema.names)
                frame = pd.DataFrame({name: [row.get(name) for row in batch] for name in names})
                passed, broken = quality.validate_frame(spec, frame, seen_sources)
                for failure in broken:
                    fail(failure.custom_id, failure.rule, f"{failure.rule}: got {failure.value!r}")
                if passed.empty:
                    return
                # Columns to Python lists at C speed; rows only where rows are needed.
                columns = {name: passed[name].tolist() for name in names}
                writer.write_table(pa.Table.from_pydict(columns, schema=schema))
                count = len(columns["custom_id"])
                valid += count
                for values in zip(*columns.values(), strict=True):
                    if len(preview) >= 10:
                        break
                    preview.append(dict(zip(names, values, strict=True)))
                if label_name:
                    for label in columns[label_name]:
                        labels[str(label)] += 1
                floor = spec.quality.min_confidence
                if confidence_name and floor is not None:
                    low_confidence += sum(1 for c in columns[confidence_name] if c < floor)
                outputs = (
                    orjson.dumps(dict(zip(value_names, values, strict=True))).decode()
                    for values in zip(*(columns[k] for k in value_names), strict=True)
                )
                keep(
                    [
                        (custom_id, source_id, job.prompt_version, job.model_name, output)
                        for custom_id, source_id, output in zip(
                            columns["custom_id"], columns["source_id"], outputs, strict=True
                        )
                    ]
                )

            batch: list[dict[str, Any]] = []
            wanted = ["custom_id", "source_id", "result_json", "finish_reason"]
            # Parsed here: handing the texts to a worker process and the values back costs
            # more than parsing them (measured: bench/README.md).
            for item in ledger.iter_items(job.job_id, [SUCCEEDED], columns=wanted):
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


def cost_drift(spec: PipelineSpec, job: JobRecord, ledger: LedgerResource) -> Drift:
    window, factor = spec.budget.history_window, spec.budget.drift_factor
    history = [
        j for j in ledger.earlier_jobs(spec.name, job.partition_date, window) if j.succeeded_items
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
    prices_as_of: str
    price: ModelPrice
    shards: list[dict[str, Any]]
    pipeline_days: list[dict[str, Any]]
    pipeline_months: list[dict[str, Any]]
    drift: Drift

    def markdown(self, spec: PipelineSpec, day: dt.date) -> str:
        from llm_assets.checks import case_table

        summary = [
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
        return "\n\n".join(
            [
                f"# Cost of {spec.name} on {day} ({self.price.provider}/{self.price.name}, "
                f"prices as of {self.prices_as_of})",
                case_table(summary),
                "## Shards",
                case_table(self.shards, limit=200),
                f"## {spec.name} per day",
                case_table(self.pipeline_days, limit=62),
                f"## {spec.name} per month",
                case_table(self.pipeline_months, limit=24),
            ]
        )


def _pipeline_totals(rows: list[dict[str, Any]], key: Callable[[str], str]) -> list[dict[str, Any]]:
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
        for name in (
            "items",
            "succeeded",
            "input_tokens",
            "output_tokens",
            "cost_usd",
            "retry_cost_usd",
        ):
            total[name] += row[name]
    return list(totals.values())


def cost_report(
    spec: PipelineSpec, day: dt.date, ledger: LedgerResource, storage: ArtifactStorage
) -> CostReport:
    """Tokens and cost per item, shard, job and the pipeline's days and months, the retry
    overhead, the estimate's error and the drift against earlier partitions."""
    job = existing_job(spec, day, ledger)
    counts = ledger.refresh_job(job.job_id)
    job = existing_job(spec, day, ledger)
    (row,) = [r for r in ledger.job_cost_rows(spec.name, day, day) if r["job_id"] == job.job_id]
    accuracy = ledger.estimate_accuracy(job.job_id)
    month = day.replace(day=1)
    days = ledger.job_cost_rows(spec.name, month, day)
    everything = ledger.job_cost_rows(spec.name, None, day)
    n = counts.succeeded or 1
    table = load_price_table()
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
        input_token_estimate_error=accuracy,
        cost_estimate_error=(counts.cost_usd / row["estimated_cost_usd"] - 1)
        if row["estimated_cost_usd"] and counts.open == 0
        else None,
        input_tokens_per_item=job.input_tokens / n,
        output_tokens_per_item=job.output_tokens / n,
        cost_per_1k_items_usd=counts.cost_usd / n * 1000,
        prices_as_of=table.prices_as_of,
        price=price_for(spec),
        shards=ledger.shard_totals(job.job_id),
        pipeline_days=_pipeline_totals(days, lambda d: d),
        pipeline_months=_pipeline_totals(everything, lambda d: d[:7]),
        drift=cost_drift(spec, job, ledger),
    )
    base = _key("reports", spec.name, day.isoformat(), job.job_id)
    markdown = storage.write_bytes(f"{base}.cost.md", report.markdown(spec, day).encode())
    report = report.model_copy(update={"markdown_uri": markdown.uri})
    uri = storage.write_bytes(f"{base}.cost.json", report.model_dump_json(indent=2).encode()).uri
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
