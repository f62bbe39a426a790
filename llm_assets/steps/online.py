"""The online worker: provider_batches sends a shard's items itself, request by request, for
providers that have no batch API (or a shard a batch API would refuse), checkpointing results
to the ledger as they come."""

import contextlib
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from llm_assets.resources.ledger import (
    RESULT_COLUMNS,
    SUBMITTED,
    ShardRecord,
    utcnow,
)
from llm_assets.resources.pricing import ModelPrice
from llm_assets.resources.providers.base import ONLINE_BATCH_PREFIX, ItemResult, ShardState
from llm_assets.resources.providers.realtime import OnlineWork
from llm_assets.resources.providers.retrying import allow_waits, stop_waits
from llm_assets.results.rows import ledger_values
from llm_assets.steps import lifecycle
from llm_assets.steps.context import StepContext
from llm_assets.steps.pause import PipelinePaused
from llm_assets.util.failpoints import failpoint
from llm_assets.util.progress import report as report_progress

if TYPE_CHECKING:
    from llm_assets.resources.providers.online import OnlineStats

PROGRESS_EVERY_SECONDS = 10.0
"""How often the worker reports to the run's log (the CLI's progress bar hears every report)."""


class OnlineInterrupted(Exception):
    """The online worker was asked to stop; what completed is in the ledger."""


@contextlib.contextmanager
def stop_on_sigterm(stopping: threading.Event, active: bool) -> Iterator[None]:
    """While an online worker runs: SIGTERM asks it to stop cleanly instead of killing it,
    and ends any retry wait of the process at once (`retrying.stop_waits`)."""
    if not active or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop() -> None:
        stopping.set()
        stop_waits()

    # Set from another thread: the handler runs in the main thread, which may be inside the
    # very Event.wait it would wake, holding that event's lock.
    previous = signal.signal(
        signal.SIGTERM, lambda *_: threading.Thread(target=stop, daemon=True).start()
    )
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        allow_waits()


def ledger_row(
    result: ItemResult, price: ModelPrice, model_name: str, *, batch: bool
) -> dict[str, Any]:
    """A normalized result as a ledger row: its custom_id and RESULT_COLUMNS."""
    values = ledger_values(result, price.cost_calculator(batch=batch), model_name)
    return dict(zip(("custom_id", *RESULT_COLUMNS), values, strict=True))


def _claim(ctx: StepContext, shard: ShardRecord, batch_id: str, price_json: str) -> ShardRecord:
    """Mark the shard as worked in the step (`batch_id` says so), or, when a worker died
    with its items open, count the new attempt: some may have been sent."""
    ledger = ctx.ledger
    if shard.provider_batch_id is None:
        if shard.submit_intent_at is None:
            ledger.update_shard(shard.shard_id, submit_intent_at=utcnow(), price_json=price_json)
        ledger.mark_submitted(shard.shard_id, batch_id, ShardState.RUNNING)
    else:
        ledger.count_new_attempt(shard.shard_id)
    return ledger.get_shard(shard.shard_id) or shard


def _open_items(ctx: StepContext, shard: ShardRecord) -> dict[str, int]:
    """custom_id → estimated input tokens of the shard's items without a result."""
    return {
        row["custom_id"]: row["estimated_input_tokens"]
        for row in ctx.ledger.iter_items(
            ctx.job_id,
            [SUBMITTED],
            shard_id=shard.shard_id,
            columns=["custom_id", "estimated_input_tokens"],
        )
    }


def _requests(
    ctx: StepContext, shard: ShardRecord, open_items: dict[str, int]
) -> Iterator[tuple[str, dict[str, Any], int]]:
    """(custom_id, request body, tokens it may use) of the shard's open items, in file order."""
    provider = ctx.batch_provider
    max_output = ctx.spec.model.max_output_tokens
    for line in ctx.storage.open_lines(shard.input_uri):
        custom_id, body = provider.realtime_request(json.loads(line))
        tokens = open_items.get(custom_id)
        if tokens is not None:
            yield custom_id, body, tokens + max_output


class _Reporter:
    """The worker's progress: to the run's log now and then, to the CLI's bar every time."""

    def __init__(self, shard_id: str, total: int, progress: Callable[[str], None] | None) -> None:
        self.shard_id = shard_id
        self.total = total
        self.progress = progress
        self.last = 0.0

    def __call__(self, stats: "OnlineStats") -> None:
        done = stats.succeeded + stats.failed
        now = utcnow().timestamp()
        if self.progress is not None and (
            now - self.last >= PROGRESS_EVERY_SECONDS or done == self.total
        ):
            self.last = now
            self.progress(
                f"{self.shard_id}: {done}/{self.total} answered, {stats.rate_limited} "
                f"rate-limited, {stats.retried} retried"
            )
        report_progress("online", done, self.total)


class StopWatch:
    """Whether the worker must stop sending (the day or the shard cancelled, the pipeline
    paused: `lifecycle.may_send`), read from the ledger at most once a second (the worker
    asks before every send). `seen` is why it stopped, once it has."""

    def __init__(self, ctx: StepContext, shard_id: str, every: float = 1.0) -> None:
        self.ctx, self.shard_id, self.every = ctx, shard_id, every
        self.seen: str | None = None
        self._next = 0.0

    def __call__(self) -> bool:
        now = time.monotonic()
        if self.seen is None and now >= self._next:
            self._next = now + self.every
            ledger = self.ctx.ledger
            shard, job = ledger.get_shard(self.shard_id), ledger.get_job(self.ctx.job_id)
            self.seen = lifecycle.may_send(
                cancelled=job is not None and job.cancelled_at is not None,
                shard_cancelled=shard is not None and shard.cancelled_at is not None,
                paused=ledger.pipeline_pause(self.ctx.spec.governing_pipeline) is not None,
            )
        return self.seen is not None


def run_online_shard(
    ctx: StepContext,
    shard: ShardRecord,
    price_json: str,
    *,
    progress: Callable[[str], None] | None = None,
    stopping: threading.Event | None = None,
) -> str:
    """Send a shard's open items to an online endpoint, checkpointing results to the ledger
    every `online.checkpoint_every` items; a restart sends only items without a result.

    SIGTERM stops new sends; requests in flight finish and are checkpointed, then
    OnlineInterrupted is raised so the run shows as stopped. Runs under the shard's
    submission lock, so two runs never work on the same shard.
    """
    spec, ledger = ctx.spec, ctx.ledger
    batch_id = shard.provider_batch_id or f"{ONLINE_BATCH_PREFIX}{shard.shard_id}"
    with ctx.day_lock():
        shard = _claim(ctx, shard, batch_id, price_json)
    price = ModelPrice.model_validate_json(shard.price_json or price_json)
    open_items = _open_items(ctx, shard)

    def deliver(results: list[ItemResult]) -> None:
        rows = (ledger_row(r, price, spec.model.name, batch=False) for r in results)
        ledger.upsert_results(ctx.job_id, rows, shard_id=shard.shard_id)
        failpoint("online.after_checkpoint")

    told = StopWatch(ctx, shard.shard_id)
    stop_event = stopping or threading.Event()
    work = OnlineWork(
        requests=_requests(ctx, shard, open_items),
        deliver=deliver,
        checkpoint_every=spec.online.checkpoint_every,
        stop=lambda: stop_event.is_set() or told(),
        progress=_Reporter(shard.shard_id, len(open_items), progress),
    )
    stats = ctx.batch_provider.run(spec, work)
    answered = stats.succeeded + stats.failed
    if stats.interrupted and told.seen == lifecycle.PAUSED:
        # Left in flight, its answers in the ledger: provider_batches resumes it once the
        # pipeline is resumed.
        pause = ledger.pipeline_pause(spec.governing_pipeline)
        if pause is not None:
            raise PipelinePaused(pause, submitted=0)
    if stats.interrupted and told.seen is None:
        raise OnlineInterrupted(
            f"{shard.shard_id}: stopped by SIGTERM after {answered} of "
            f"{len(open_items)} items; their results are in the ledger, the rest are sent when "
            "provider_batches runs again"
        )
    # Ended: all sent, or cancelled by an operator (what was answered is in; the import makes
    # the rest cancelled dead letters).
    state = ShardState.CANCELLED if stats.interrupted else ShardState.COMPLETED
    cut = f"; cancelled after {answered} items" if stats.interrupted else ""
    now = utcnow()
    cancel_sent: dict[str, Any] = {"cancel_sent_at": now} if stats.interrupted else {}
    ledger.update_shard(
        shard.shard_id,
        status=state.value,
        raw_status=state.value,
        ended_at=now,
        completed_requests=stats.succeeded,
        failed_requests=stats.failed,
        message=f"{stats.sent} sends, {stats.rate_limited} rate-limited, "
        f"{stats.paused_seconds:.1f}s paused, {stats.elapsed_seconds:.1f}s{cut}",
        **cancel_sent,
    )
    return batch_id
