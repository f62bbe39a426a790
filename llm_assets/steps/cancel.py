"""An operator's cancel of a day, or of some of its shards.

The cancel is recorded on the day (or on the chosen shards) at once, then the day's lifecycle
carries it out (steps/lifecycle.py, steps/executor.py): a shard whose submission began
without recording a batch is looked up at the provider first, and a live batch found is
recorded; batches in flight are cancelled at the provider; shards never sent are closed,
their items `cancelled` dead letters. A submission checks for a cancel under the day's lock
before each create, so a run submitting the day stops at its next shard; a create already on
the wire records its batch, which the lifecycle then cancels (the cancel waits for that run's
hold on the day). A cancelled batch ends on the provider's time: the import of it keeps
whatever it answered and makes the rest `cancelled` dead letters instead of retrying them
(imports.py). A shard another run holds at that moment is closed or cancelled by whoever next
asks the lifecycle (the CLI's wait, the batch-status sensor). A requeue sends the cancelled
items again and lifts a day's cancel. Nothing here waits for the provider: the CLI waits, or
the sensor imports the cancelled batches as they end.
"""

from pydantic import BaseModel

from llm_assets.resources.ledger import RETRY, ShardRecord, utcnow
from llm_assets.resources.providers.base import ShardState
from llm_assets.steps import executor
from llm_assets.steps.context import StepContext
from llm_assets.steps.day_model import CANCELLED, Step
from llm_assets.steps.lifecycle import cancelled_item

__all__ = ["CANCELLED", "CancelResult", "cancel_day", "cancelled_item", "resolve_shard_ids"]


class CancelResult(BaseModel):
    job_id: str
    whole_day: bool
    cancelled_batches: list[str]
    closed_shards: list[str]
    """Shards never sent: closed now."""
    cancelled_items: int
    """Items that became cancelled dead letters now (those of shards never sent, and those
    an import had left to retry)."""
    found_batches: list[str] = []
    """Batches a submission created without recording them, found at the provider now."""
    settling: list[str]
    """Shards whose batch the provider is still winding down (imported when it ends), or
    that another run is submitting right now."""


def resolve_shard_ids(shards: list[ShardRecord], given: list[str]) -> set[str]:
    """Shard ids as an operator gives them: whole, or the short form `status` prints
    (`r00-s00003`, an ending of exactly one shard id of the day)."""
    found: set[str] = set()
    for name in given:
        matches = [s.shard_id for s in shards if s.shard_id == name]
        matches = matches or [s.shard_id for s in shards if s.shard_id.endswith(f"-{name}")]
        if len(matches) != 1:
            problem = "is no shard" if not matches else f"names {len(matches)} shards"
            some = ", ".join(s.shard_id[len(s.job_id) + 1 :] for s in shards[:4])
            raise ValueError(f"{name!r} {problem} of the day (its shards: {some}, ...)")
        found.add(matches[0])
    return found


def _record(
    ctx: StepContext, shard_ids: list[str] | None, reason: str
) -> tuple[str, set[str] | None, int]:
    """Record the cancel on the day (`shard_ids` None) or on the shards; a cancelled day's
    items an import left to retry stop now. Returns the job id, the shards chosen (None: the
    day) and how many items stopped."""
    ledger = ctx.ledger
    job = ctx.job()
    shards = ledger.shards(job.job_id)
    now = utcnow()
    # Recorded before the day's lock is taken: a submission holding the day sees the cancel
    # before its next create, rather than after every shard it could send meanwhile.
    if shard_ids is not None:
        chosen = resolve_shard_ids(shards, shard_ids)
        for shard in shards:
            if shard.shard_id in chosen and shard.status != ShardState.IMPORTED:
                ledger.update_shard(shard.shard_id, cancelled_at=shard.cancelled_at or now)
        return job.job_id, chosen, 0
    ledger.update_job(
        job.job_id, cancelled_at=now, cancelled_by=ctx.created_by, cancel_reason=reason
    )
    with ctx.day_lock():
        waiting = [
            {"custom_id": item["custom_id"], **cancelled_item(reason)}
            for item in ledger.iter_items(job.job_id, [RETRY], columns=["custom_id"])
        ]
        stopped = ledger.set_item_errors(job.job_id, waiting, from_status=[RETRY])
        ledger.refresh_job(job.job_id)
        return job.job_id, None, stopped


def cancel_day(
    ctx: StepContext, *, shard_ids: list[str] | None = None, reason: str = "by an operator"
) -> CancelResult:
    """Cancel the day (`shard_ids` None) or the chosen shards; a cancel of the whole day also
    stops every later submission of it until a requeue. Carries out at once what the
    lifecycle then asks for: reconciling, cancelling at the provider, closing unsent shards."""
    job_id, chosen, stopped = _record(ctx, shard_ids, reason)
    result = CancelResult(
        job_id=job_id,
        whole_day=shard_ids is None,
        cancelled_batches=[],
        closed_shards=[],
        cancelled_items=stopped,
        settling=[],
    )
    day = executor.DayDriver(ctx)
    for _ in range(3):  # reconcile, then cancel what was found, then close what was not
        decision = day.decide()
        for action in decision.actions:
            if action.step == Step.RECONCILE:
                result.found_batches += executor.reconcile(ctx, action.shard_ids)
            elif action.step == Step.CANCEL:
                result.cancelled_batches += executor.cancel_batches(ctx, action.shard_ids)
            elif action.step == Step.CLOSE:
                closed, items = executor.close_unsent(ctx, action.shard_ids)
                result.closed_shards += closed
                result.cancelled_items += items
        if not decision.has(Step.RECONCILE):
            break
    result.settling = [
        s.shard_id
        for s in ctx.ledger.shards(job_id)
        if s.status != ShardState.IMPORTED and (chosen is None or s.shard_id in chosen)
    ]
    if ctx.log is not None:
        ctx.log(
            f"{ctx.spec.name} {ctx.day}: cancelled {len(result.cancelled_batches)} provider "
            f"batch(es), closed {len(result.closed_shards)} unsent shard(s) "
            f"({result.cancelled_items} items); {len(result.settling)} shard(s) settling"
        )
    return result
