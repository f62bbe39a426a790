"""Priming the provider's prompt cache (`prompt.cache.prime`): the day's first shard is a
small priming shard, submitted alone; the day's other shards are submitted once its batch
has ended, so that they read the cached prefix instead of each writing it (the provider
caches on a best-effort basis within a batch, its requests running at once).

The priming shard is an ordinary shard of kind `prime`: crash-safe and idempotent as any
other, never sent twice. The rest are held, recorded as such in the ledger (raw status
`priming`), while it waits or is in flight; once it has ended, however it ended, they are
sent, and when it answered nothing (failed, expired, cancelled) the submission says they went
without a primed cache.
"""

import itertools
from collections.abc import Iterable, Iterator

from llm_assets.resources.ledger import PRIME_SHARD, ShardRecord
from llm_assets.resources.providers.base import IN_FLIGHT_STATES
from llm_assets.spec.model import PipelineSpec
from llm_assets.steps import day_model, lifecycle
from llm_assets.steps.context import StepContext


def priming_items(spec: PipelineSpec, round_no: int, shard_index: int) -> int:
    """How many items the shard built first at `shard_index` of round `round_no` primes the
    cache with: `prime_items` for the day's first shard of its first round when the spec
    primes, else 0."""
    cache = spec.prompt.cache
    if cache is None or not cache.prime or round_no != 0 or shard_index != 0:
        return 0
    return cache.prime_items


def split_priming(
    lines: Iterable[tuple[str, bytes]], count: int
) -> tuple[list[tuple[str, bytes]], Iterator[tuple[str, bytes]]]:
    """The first `count` request lines (the priming shard's) and the rest."""
    rest = iter(lines)
    return list(itertools.islice(rest, count)), rest


def is_open(shard: ShardRecord) -> bool:
    """Whether a priming shard still holds the others: it waits to be sent or is in flight."""
    return shard.status in day_model.WAITING or shard.status in IN_FLIGHT_STATES


def hold_for_priming(
    ctx: StepContext, job_id: str, waiting: list[ShardRecord]
) -> tuple[list[ShardRecord], str | None]:
    """Of the day's `waiting` shards, those that may be submitted now, and what priming says
    (None when the day has no priming shard). While the priming shard is open only it goes;
    the others are recorded as held for it."""
    primer = next((s for s in ctx.ledger.shards(job_id) if s.kind == PRIME_SHARD), None)
    if primer is None:
        return waiting, None
    if not is_open(primer):
        if primer.completed_requests > 0:
            return waiting, f"priming batch {primer.provider_batch_id} ended"
        return waiting, (
            f"priming batch {primer.provider_batch_id or primer.shard_id} ended "
            f"{primer.status} with no answer; the day's other shards were sent without a "
            "primed cache"
        )
    held = [s for s in waiting if s.shard_id != primer.shard_id]
    for shard in held:
        if shard.raw_status != lifecycle.PRIMING:
            ctx.ledger.update_shard(
                shard.shard_id,
                expect_status=list(day_model.WAITING),
                raw_status=lifecycle.PRIMING,
                message=f"held until the priming shard {primer.shard_id} has ended, so that "
                "it reads the cached prefix",
            )
    note = f"{len(held)} shard(s) held until the priming shard {primer.shard_id} has ended"
    return [s for s in waiting if s.shard_id == primer.shard_id], note
