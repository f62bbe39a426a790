"""Batches stuck before they start: created at the provider, never begun (OpenAI's
`validating`, Gemini's `PENDING`, Bedrock's `Scheduled`) far longer than the model's batches
lately took to start. Gemini jobs are known to sit PENDING for a day; a day waiting on one
should say so, with the operator's options, instead of looking merely slow.

A batch counts as stuck once it has waited `STUCK_FACTOR` times the longest start of the
model's recent batches, and never before the provider resource's `stuck_after_seconds`.
The batch-status sensor announces a day's stuck batches once (notification), the
batch_results check `no_stuck_batches` warns, and `llm-assets status` lists them.
"""

import dataclasses
import datetime as dt

from llm_assets.resources.ledger import LedgerResource, ShardRecord, utcnow
from llm_assets.resources.providers.base import ShardState

STUCK_FACTOR = 4.0
"""How many times the longest recent start a batch may wait before it counts as stuck."""


@dataclasses.dataclass(frozen=True)
class StuckBatch:
    shard_id: str
    provider_batch_id: str
    provider_status: str
    waited: dt.timedelta
    usual: dt.timedelta | None
    """The longest start of the model's recent batches, when any started."""


def stuck_after(starts: list[float], floor_seconds: float) -> dt.timedelta:
    """How long a batch may wait to start before it counts as stuck, by recent starts."""
    longest = max(starts, default=0.0)
    return dt.timedelta(seconds=max(floor_seconds, STUCK_FACTOR * longest))


def find_stuck(
    shards: list[ShardRecord],
    starts: list[float],
    floor_seconds: float,
    now: dt.datetime,
) -> list[StuckBatch]:
    """The day's batches created but not started for longer than `stuck_after`."""
    limit = stuck_after(starts, floor_seconds)
    usual = dt.timedelta(seconds=max(starts)) if starts else None
    stuck = []
    for shard in shards:
        if shard.status != ShardState.SUBMITTED or shard.started_at is not None:
            continue
        if shard.provider_batch_id is None or shard.submitted_at is None:
            continue
        waited = now - shard.submitted_at
        if waited > limit:
            stuck.append(
                StuckBatch(
                    shard.shard_id,
                    shard.provider_batch_id,
                    shard.raw_status or "submitted",
                    waited,
                    usual,
                )
            )
    return stuck


def stuck_batches(
    ledger: LedgerResource,
    job_id: str,
    provider: str,
    model: str,
    floor_seconds: float,
    now: dt.datetime | None = None,
) -> list[StuckBatch]:
    """The job's stuck batches, judged by the model's recent batches in the ledger."""
    shards = ledger.shards(job_id, [ShardState.SUBMITTED.value])
    if not shards:
        return []
    starts = [start for start, _ in ledger.batch_history(provider, model)]
    return find_stuck(shards, starts, floor_seconds, now or utcnow())


def _span(delta: dt.timedelta) -> str:
    seconds = delta.total_seconds()
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def stuck_words(pipeline: str, day: dt.date, model: str, stuck: list[StuckBatch]) -> str:
    """What the operator reads: which batches, how long against the usual, and what to do."""
    first = stuck[0]
    usual = (
        f"batches of {model} lately started within {_span(first.usual)}"
        if first.usual is not None
        else f"no batch of {model} has started yet"
    )
    which = ", ".join(
        f"{s.provider_batch_id} ({s.provider_status} for {_span(s.waited)})" for s in stuck[:5]
    )
    more = f" and {len(stuck) - 5} more" if len(stuck) > 5 else ""
    shards = " ".join(f"--shard {s.shard_id}" for s in stuck[:5])
    return (
        f"{len(stuck)} batch{'es' if len(stuck) != 1 else ''} of {pipeline} {day} not started "
        f"far longer than usual: {which}{more}; {usual}. Wait (the provider may still start "
        f"it), or cancel and send the items again: `llm-assets cancel {pipeline} --date {day} "
        f"{shards}`, then `llm-assets requeue {pipeline} --date {day} --class cancelled`"
    )
