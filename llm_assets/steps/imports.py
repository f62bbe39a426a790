"""batch_results: poll in-flight shards, import ended ones by custom_id, plan retries; and
the requeue of chosen dead letters, which sends items again the same way."""

import dataclasses
import datetime as dt
import functools
import random
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import BaseModel

from llm_assets.compliance.retention import delete_provider_files
from llm_assets.items import ids
from llm_assets.items.prepare import KnownIds, Preparer, prepare_items
from llm_assets.resources.ledger import (
    DEAD_LETTER,
    RETRY,
    SUBMITTED,
    BackgroundWriter,
    JobCounts,
    JobRecord,
    LedgerResource,
    ShardRecord,
    UpsertStats,
    utcnow,
)
from llm_assets.resources.pricing import ModelPrice
from llm_assets.resources.providers.base import (
    ENDED_STATES,
    IN_FLIGHT_STATES,
    ONLINE_BATCH_PREFIX,
    ShardState,
)
from llm_assets.results.rows import ResultStager, RowMaker, StagedResults, staged_results
from llm_assets.spec.model import PipelineSpec
from llm_assets.steps.breaker import trip_if_over
from llm_assets.steps.context import StepContext
from llm_assets.steps.estimate import Estimator
from llm_assets.steps.lifecycle import cancelled_item
from llm_assets.steps.line_ids import request_lines
from llm_assets.steps.polling import poll_shards
from llm_assets.steps.shards import ShardRound, line_offsets, shards_for, write_shard
from llm_assets.util import parallel
from llm_assets.util.failpoints import failpoint

RETRY_READ_AT_ONCE = 100_000
"""Items to retry read by one query (PostgreSQL spreads it over parallel workers) before the
rest are streamed: a few percent of a large day's items, a whole day's when a batch expired."""


class ImportResult(BaseModel):
    job_id: str
    imported_shards: list[str]
    in_flight_shards: int
    lines: UpsertStats
    missing: int
    retry_shards: list[str]
    gave_up: int
    counts: JobCounts
    breaker: str | None = None
    """Why the spend breaker cancelled the day after this import, if it did."""
    provider_files_deleted: int = 0
    """Imported shards whose files at the provider this import deleted (retention)."""
    provider_file_errors: list[str] = []
    """Why deleting some imported shards' provider files failed; tried again later."""


def _about_lines(block: bytes) -> int:
    """A block of result lines weighed as lines by its size (a result line is about a
    kilobyte): counting the newlines of a large block would cost more than parsing it."""
    return len(block) // 1024 + 1


@dataclasses.dataclass
class _ImportTotals:
    lines: UpsertStats = dataclasses.field(default_factory=UpsertStats)
    missing: int = 0
    imported: list[str] = dataclasses.field(default_factory=list)


def _unanswered(shard: ShardRecord, for_quota: bool) -> dict[str, Any]:
    """What a shard's items without a result become: retried, as transient or expired; a
    batch the provider refused for quota after creating it ran none of its requests, so
    theirs is sent again without counting the attempt."""
    why = shard.raw_status or shard.status
    if shard.message:
        why = f"{why}: {shard.message}"
    if shard.cancelled_at is not None:
        return cancelled_item(f"provider batch {shard.provider_batch_id} was cancelled")
    if for_quota:
        return {
            "status": RETRY,
            "error_class": "transient",
            "error_code": "quota",
            "error_message": f"provider batch {shard.provider_batch_id} refused for quota "
            f"({why}); sent again, not counted as an attempt",
        }
    return {
        "status": RETRY,
        "error_class": "expired" if shard.status == ShardState.EXPIRED else "transient",
        "error_code": f"missing_result_{shard.status}",
        "error_message": f"no result in provider batch {shard.provider_batch_id} (batch {why})",
    }


def _close_imported_shard(
    ledger: LedgerResource,
    shard: ShardRecord,
    shard_stats: UpsertStats,
    totals: _ImportTotals,
    for_quota: bool = False,
) -> None:
    """After a shard's results are in: what it did not answer is retried, its cost settled,
    and it is marked imported."""
    failpoint("import.after_upsert")
    stats = totals.lines
    for field in ("received", "applied", "duplicates", "unknown", "already_terminal"):
        setattr(stats, field, getattr(stats, field) + getattr(shard_stats, field))
    stats.duplicate_ids = (stats.duplicate_ids + shard_stats.duplicate_ids)[:100]
    # One transaction: the writer thread waits for the GIL again after every statement.
    missing, _ = ledger.close_shard(
        shard.shard_id,
        from_status=[SUBMITTED],
        items=_unanswered(shard, for_quota),
        uncount_attempt=for_quota,
        expect_status=ENDED_STATES,
        status=ShardState.IMPORTED.value,
        imported_at=utcnow(),
    )
    totals.missing += missing
    failpoint("import.after_shard")
    totals.imported.append(shard.shard_id)


def _staged(
    ctx: StepContext,
    shard: ShardRecord,
    price: ModelPrice,
    workers: parallel.Workers,
    stage: ResultStager,
) -> Iterable[StagedResults]:
    """A shard's results as staged ledger rows, charged at the price of its submission."""
    assert shard.provider_batch_id is not None
    provider = ctx.batch_provider
    charged = ModelPrice.model_validate_json(shard.price_json) if shard.price_json else price
    to_row = RowMaker(charged.cost_calculator(batch=provider.priced_as_batch), ctx.spec.model.name)
    if shard.provider_batch_id.startswith(ONLINE_BATCH_PREFIX):
        # A shard worked in the step wrote its results as they came: nothing to fetch.
        return ()
    if (blocks := provider.result_blocks(shard.provider_batch_id)) is not None:
        # A large day's lines are parsed, and made into ledger rows, in worker processes;
        # they go there in the blocks they were read in, not split and pickled line by line.
        raw, parse = blocks
        return workers.map(staged_results, (parse, to_row, stage), raw, weight=_about_lines)
    return map(stage, parallel.chunked(map(to_row, provider.results(shard.provider_batch_id))))


def import_results(ctx: StepContext) -> ImportResult:
    """Import every ended shard by custom_id, then plan retries for what is still open.

    Holds the day, so two imports never plan the same items into two retry shards.
    """
    with ctx.day_lock():
        result = _import_results(ctx)
    result = _delete_imported_files(ctx, result)
    tripped = trip_if_over(ctx, result.counts)
    if tripped is None:
        return result
    return result.model_copy(
        update={"breaker": tripped, "counts": ctx.ledger.refresh_job(result.job_id)}
    )


def _delete_imported_files(ctx: StepContext, result: ImportResult) -> ImportResult:
    """`retention.provider_files: delete_after_import`: the provider's files of the day's
    imported shards, this import's and any an earlier deletion left, once they are recorded
    imported. Outside the day's lock (an imported shard changes no more); a failure is a
    warning, never the import's."""
    if ctx.spec.retention.provider_files != "delete_after_import":
        return result
    done = delete_provider_files(
        ctx.spec,
        ctx.ledger,
        ctx.batch_provider,
        ctx.ledger.provider_files_to_delete(job_id=result.job_id),
        info=ctx.log,
    )
    return result.model_copy(
        update={
            "provider_files_deleted": done.shards,
            "provider_file_errors": list(done.failed.values()),
        }
    )


def _import_results(ctx: StepContext) -> ImportResult:
    ledger = ctx.ledger
    job = ctx.job()
    price = ctx.price()
    shards = poll_shards(ledger, ctx.batch_provider, ledger.shards(job.job_id, IN_FLIGHT_STATES))
    in_flight = sum(1 for s in shards if s.status in IN_FLIGHT_STATES)
    totals = _ImportTotals()
    stage = ledger.result_stager()
    # The ledger writes of one shard (its results, then closing it) run on the writer thread
    # while the next shard's lines are read and parsed; they run in order, so a shard is
    # closed only after its results are in, and a failure stops everything queued after it.
    with BackgroundWriter() as writer, parallel.Workers() as workers:
        for shard in ledger.shards(job.job_id, ENDED_STATES):
            staged = _staged(ctx, shard, price, workers, stage)
            shard_stats = ledger.upsert_staged(
                job.job_id, staged, writer=writer, shard_id=shard.shard_id
            )
            for_quota = ctx.batch_provider.ended_for_quota(shard.raw_status, shard.message)
            writer.submit(
                functools.partial(
                    _close_imported_shard, ledger, shard, shard_stats, totals, for_quota
                )
            )
    retry_shards, gave_up = plan_retries(ctx, job)
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


def _sort_retries(
    ctx: StepContext, job: JobRecord, tokens: dict[str, int]
) -> tuple[dict[str, dict[str, int | None]], int]:
    """Items to retry by their shard (custom_id → where its line starts), after the ones out
    of attempts become dead letters (their count is returned too); `tokens` gets every
    item's estimated input tokens."""
    retry_by_shard: dict[str, dict[str, int | None]] = defaultdict(dict)
    exhausted: list[dict[str, Any]] = []
    cancelled: list[dict[str, Any]] = []
    stopped = _cancelled_shards(ctx, job)
    for item in ctx.ledger.iter_items(
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
        if job.cancelled_at is not None or item["shard_id"] in stopped:
            # An operator cancelled it: what its batch answered as retryable stops here.
            why = "the day was cancelled" if job.cancelled_at else "its shard was cancelled"
            cancelled.append({"custom_id": item["custom_id"], **cancelled_item(why)})
        elif item["attempts"] >= ctx.spec.retry.max_attempts:
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
    gave_up = ctx.ledger.set_item_errors(job.job_id, exhausted, from_status=[RETRY])
    ctx.ledger.set_item_errors(job.job_id, cancelled, from_status=[RETRY])
    return retry_by_shard, gave_up


def _cancelled_shards(ctx: StepContext, job: JobRecord) -> set[str]:
    """The day's shards an operator cancelled."""
    return {s.shard_id for s in ctx.ledger.shards(job.job_id) if s.cancelled_at is not None}


def plan_retries(ctx: StepContext, job: JobRecord) -> tuple[list[str], int]:
    """Dead-letter retryable items out of attempts; put the rest into a new round of shards,
    submitted after a backoff (none for items of batches refused for quota). Returns the
    new shards and how many items were given up."""
    ledger = ctx.ledger
    tokens: dict[str, int] = {}
    retry_by_shard, gave_up = _sort_retries(ctx, job, tokens)
    if not retry_by_shard:
        return [], gave_up
    round_no = ledger.next_round(job.job_id)
    id_field = ctx.batch_provider.line_id_field

    def retry_lines() -> Iterator[tuple[str, bytes]]:
        for old_shard_id in sorted(retry_by_shard):
            old = ledger.get_shard(old_shard_id)
            assert old is not None
            yield from request_lines(
                ctx.storage, old.input_uri, retry_by_shard[old_shard_id], id_field=id_field
            )

    # Items of batches the provider refused for quota ran nothing and failed nothing: they
    # go again without a backoff, as soon as the quota admits them (steps/quota.py).
    olds = [ledger.get_shard(shard_id) for shard_id in retry_by_shard]
    for_quota = all(
        old is not None and ctx.batch_provider.ended_for_quota(old.raw_status, old.message)
        for old in olds
    )
    backoff = None if for_quota else retry_backoff(ctx.spec, round_no)
    not_before = None if backoff is None else utcnow() + dt.timedelta(seconds=backoff)
    round_ = ShardRound(ctx, job, round_no, not_before=not_before)
    estimator = Estimator(ctx)
    created: list[str] = []
    for index, shard_lines in enumerate(shards_for(ctx, retry_lines())):
        estimate = estimator.shard(sum(tokens[cid] for cid, _ in shard_lines), len(shard_lines))
        write_shard(round_, index, shard_lines, None, estimate)
        created.append(round_.shard_id(index))
    return created, gave_up


def retry_backoff(spec: PipelineSpec, round_no: int) -> float:
    """Seconds before retry round `round_no` may be submitted: exponential, jittered."""
    if spec.retry.backoff_seconds <= 0:
        return 0.0
    ceiling = min(spec.retry.max_backoff_seconds, spec.retry.backoff_seconds * 2 ** (round_no - 1))
    return random.uniform(ceiling / 2, ceiling)


class RequeueResult(BaseModel):
    job_id: str
    requeued: int
    still_invalid: dict[str, str]
    shards: list[str]


def _ids_of(dead_letters: Iterable[dict[str, Any]]) -> KnownIds:
    """The custom_ids of dead letters as the ledger holds them, so they are rendered again
    under the ids they have whatever the id key is now."""
    by_source: dict[str, str] = {}
    unsent: set[str] = set()
    for row in dead_letters:
        if row["source_id"] is None or row["error_code"] == ids.DUPLICATE_ID:
            unsent.add(row["custom_id"])
        else:
            by_source[row["source_id"]] = row["custom_id"]
    return KnownIds(by_source, frozenset(unsent))


def requeue_dead_letters(
    ctx: StepContext, *, classes: set[str] | None = None, chosen_ids: set[str] | None = None
) -> RequeueResult:
    """Send chosen dead letters (by class and/or custom_id or source id) back, rendered again
    from the current snapshot and spec, so a fixed prompt or fixed source row is what gets
    sent; each send is a new attempt.

    Holds the day, so an item is requeued into one shard however many runs ask.
    """
    with ctx.day_lock():
        return _requeue_dead_letters(ctx, classes=classes, chosen_ids=chosen_ids)


def _requeue_dead_letters(
    ctx: StepContext, *, classes: set[str] | None = None, chosen_ids: set[str] | None = None
) -> RequeueResult:
    spec, ledger = ctx.spec, ctx.ledger
    job = ctx.job()
    if job.cancelled_at is not None:
        # Sending items again is the operator taking the day back up: the cancel is lifted.
        ledger.update_job(job.job_id, cancelled_at=None, cancelled_by=None, cancel_reason=None)
        job = ctx.job()
    rows = [
        row
        for row in ledger.iter_dead_letters(job.job_id)
        if (classes is None or row["error_class"] in classes)
        and (chosen_ids is None or row["custom_id"] in chosen_ids or row["source_id"] in chosen_ids)
    ]
    chosen = {row["custom_id"] for row in rows}
    still_invalid: dict[str, str] = {}
    estimator = Estimator(ctx)
    tokens: dict[str, int] = {}
    pseudonyms: dict[str, dict[str, str]] = {}

    def lines() -> Iterator[tuple[str, bytes]]:
        encoder = ctx.batch_provider.line_encoder(spec)
        preparer = Preparer(
            spec, ctx.day, ctx.price().context_window, encoder, ledger.item_id_key(), _ids_of(rows)
        )
        for item in prepare_items(preparer, ctx.storage.open_lines(ctx.snapshot_uri())):
            if item.custom_id not in chosen:
                continue
            if item.line is None:
                still_invalid[item.custom_id] = item.error_message or item.error_code or "input"
                continue
            tokens[item.custom_id] = item.input_tokens
            if item.pseudonyms:
                pseudonyms[item.custom_id] = dict(item.pseudonyms)
            yield item.custom_id, item.line

    round_ = ShardRound(ctx, job, ledger.next_round(job.job_id))
    shards: list[str] = []
    requeued = 0
    for index, shard_lines in enumerate(shards_for(ctx, lines())):
        written = round_.write_file(index, shard_lines)
        estimate = estimator.shard(sum(tokens[cid] for cid, _ in shard_lines), len(shard_lines))
        # The lines are rendered anew (the row may have changed): their mappings replace the
        # items' earlier ones as the items move to them.
        requeued += ledger.requeue_into_shard(
            job.job_id,
            round_.shard_row(index, written, len(shard_lines), estimate),
            line_offsets(shard_lines),
            {cid: pseudonyms[cid] for cid, _ in shard_lines if cid in pseudonyms},
        )
        shards.append(round_.shard_id(index))
    ledger.refresh_job(job.job_id)
    return RequeueResult(
        job_id=job.job_id, requeued=requeued, still_invalid=still_invalid, shards=shards
    )
