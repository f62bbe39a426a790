"""Status polls of batches in flight: `poll_shards` asks the provider about each shard's batch
(a cheap status call) and records what it says in the ledger, and what it teaches about the
provider's quota (steps/admission.py); `poll_many` polls several at a time and, on a path that
must answer in time (a sensor tick), only until a deadline (`PollLimits`).
"""

import concurrent.futures
import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from llm_assets.resources.ledger import LedgerResource, ShardRecord, utcnow
from llm_assets.resources.providers.base import (
    IN_FLIGHT_STATES,
    ONLINE_BATCH_PREFIX,
    BatchProvider,
    BatchStatus,
    ShardState,
)
from llm_assets.steps import admission

POLL_WORKERS = 8
"""Status calls made at once when several batches are due for a poll."""


def poll_shards(
    ledger: LedgerResource,
    provider: BatchProvider,
    shards: Iterable[ShardRecord],
    *,
    timeout_seconds: float | None = None,
) -> list[ShardRecord]:
    """Ask the provider about in-flight shards (cheap status calls) and record what it says;
    with `timeout_seconds`, each call is one try bounded by it (`poll_briefly`)."""
    updated: list[ShardRecord] = []
    for shard in shards:
        if (
            shard.status not in IN_FLIGHT_STATES
            or shard.provider_batch_id is None
            or shard.provider_batch_id.startswith(ONLINE_BATCH_PREFIX)  # worked in a step
        ):
            updated.append(shard)
            continue
        status = (
            provider.poll(shard.provider_batch_id)
            if timeout_seconds is None
            else provider.poll_briefly(shard.provider_batch_id, timeout_seconds)
        )
        values: dict[str, Any] = {
            "status": status.state.value,
            "raw_status": status.raw_status,
            "completed_requests": status.completed,
            "failed_requests": status.failed,
            "message": status.message,
        }
        refused = status.ended and provider.ended_for_quota(status.raw_status, status.message)
        if status.ended:
            values["ended_at"] = utcnow()
        ended = ledger.update_shard(shard.shard_id, expect_status=IN_FLIGHT_STATES, **values)
        started = (
            shard.started_at is None
            and not refused
            and _started(status)
            and ledger.mark_started(shard.shard_id)
        )
        refreshed = ledger.get_shard(shard.shard_id)
        assert refreshed is not None
        updated.append(refreshed)
        if provider.refuses_after_create and ((ended and refused) or started):
            admission.learn_from_poll(ledger, provider, refreshed, refused=refused, status=status)
    return updated


def _started(status: BatchStatus) -> bool:
    """Whether the provider has begun the batch's requests (or ran some before it ended)."""
    if status.state in (ShardState.RUNNING, ShardState.COMPLETED, ShardState.EXPIRED):
        return True
    return status.ended and status.completed + status.failed > 0


@dataclasses.dataclass(frozen=True)
class PollLimits:
    """How long polling may take on a path that must answer in time (a sensor tick): calls
    start only while they can end before `deadline` (monotonic), each bounded by
    `call_timeout_seconds` and not retried; a failed call is reported and asked again later."""

    deadline: float
    call_timeout_seconds: float
    report: Callable[[str], None]


def poll_many(
    ledger: LedgerResource,
    provider: BatchProvider,
    shards: Sequence[ShardRecord],
    limits: PollLimits | None = None,
) -> list[ShardRecord]:
    """Poll shards, several at a time; with `limits`, only until its deadline (the calls
    still running are not waited for: their answers are recorded when they come)."""
    if limits is None and len(shards) <= 1:
        return poll_shards(ledger, provider, shards)
    timeout = limits.call_timeout_seconds if limits else None

    def poll(shard: ShardRecord) -> ShardRecord | str | None:
        if limits is not None and time.monotonic() + limits.call_timeout_seconds > limits.deadline:
            return None
        try:
            [updated] = poll_shards(ledger, provider, [shard], timeout_seconds=timeout)
        except Exception as exc:
            if limits is None:
                raise
            status = getattr(exc, "status_code", None)
            http = f", HTTP {status}" if status else ""
            return f"{shard.shard_id}: status poll failed ({type(exc).__name__}{http})"
        return updated

    pool = ThreadPoolExecutor(max_workers=POLL_WORKERS)
    futures = [pool.submit(poll, shard) for shard in shards]
    wait = None if limits is None else max(0.0, limits.deadline - time.monotonic())
    done, _ = concurrent.futures.wait(futures, timeout=wait)
    pool.shutdown(wait=False, cancel_futures=True)
    answers = [future.result() for future in futures if future in done]
    if limits is not None:
        for failure in (a for a in answers if isinstance(a, str)):
            limits.report(f"{failure}; polled again next time")
    return [answer for answer in answers if isinstance(answer, ShardRecord)]
