"""An operator's cancel of a day, or of some of its shards.

Batches in flight are cancelled at the provider and marked; shards not sent yet are closed at
once, their items `cancelled` dead letters. A cancelled batch ends on the provider's time:
the import of it keeps whatever it answered and makes the rest `cancelled` dead letters
instead of retrying them (imports.py). A requeue sends them again and lifts a day's cancel.
Nothing here waits for the provider: the CLI waits, or the batch-status sensor imports the
cancelled batches as they end.
"""

from pydantic import BaseModel

from llm_assets.resources.ledger import DEAD_LETTER, PENDING, RETRY, ShardRecord, utcnow
from llm_assets.resources.providers.base import (
    ENDED_STATES,
    IN_FLIGHT_STATES,
    ONLINE_BATCH_PREFIX,
    ShardState,
)
from llm_assets.steps.context import StepContext

CANCELLED = "cancelled"
"""The error class and code of an item an operator cancelled."""


class CancelResult(BaseModel):
    job_id: str
    whole_day: bool
    cancelled_batches: list[str]
    closed_shards: list[str]
    """Shards never sent (or whose batch had already ended): closed now."""
    cancelled_items: int
    """Items that became cancelled dead letters now (those of shards never sent)."""
    settling: list[str]
    """Shards whose batch the provider is still winding down; imported when it ends."""


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


def cancelled_item(reason: str) -> dict[str, str]:
    """What an item the operator cancelled becomes."""
    return {
        "status": DEAD_LETTER,
        "error_class": CANCELLED,
        "error_code": CANCELLED,
        "error_message": f"cancelled: {reason}; `llm-assets requeue` sends it again",
    }


def cancel_day(
    ctx: StepContext, *, shard_ids: list[str] | None = None, reason: str = "by an operator"
) -> CancelResult:
    """Cancel the day (`shard_ids` None) or the chosen shards. Holds the day, so no import
    plans a retry of what is being cancelled; a cancel of the whole day also stops every
    later submission of it until a requeue."""
    ledger = ctx.ledger
    with ctx.day_lock():
        job = ctx.job()
        shards = ledger.shards(job.job_id)
        if shard_ids is not None:
            chosen = resolve_shard_ids(shards, shard_ids)
            shards = [s for s in shards if s.shard_id in chosen]
        now = utcnow()
        if shard_ids is None:
            ledger.update_job(
                job.job_id, cancelled_at=now, cancelled_by=ctx.created_by, cancel_reason=reason
            )
        result = CancelResult(
            job_id=job.job_id,
            whole_day=shard_ids is None,
            cancelled_batches=[],
            closed_shards=[],
            cancelled_items=0,
            settling=[],
        )
        for shard in shards:
            _cancel_shard(ctx, shard, reason, result)
        # Items a finished import left to retry (their round not planned yet) stop here too.
        if shard_ids is None:
            waiting = [
                {"custom_id": item["custom_id"], **cancelled_item(reason)}
                for item in ledger.iter_items(job.job_id, [RETRY], columns=["custom_id"])
            ]
            result.cancelled_items += ledger.set_item_errors(
                job.job_id, waiting, from_status=[RETRY]
            )
        ledger.refresh_job(job.job_id)
    if ctx.log is not None:
        ctx.log(
            f"{ctx.spec.name} {ctx.day}: cancelled {len(result.cancelled_batches)} provider "
            f"batch(es), closed {len(result.closed_shards)} unsent shard(s) "
            f"({result.cancelled_items} items); {len(result.settling)} batch(es) settling"
        )
    return result


def _cancel_shard(ctx: StepContext, shard: ShardRecord, reason: str, result: CancelResult) -> None:
    ledger, now = ctx.ledger, utcnow()
    if shard.status == ShardState.IMPORTED:
        return
    if shard.provider_batch_id is None:
        # Never sent: under its submission lock, so no run sends it meanwhile.
        with ledger.submission_lock(shard.shard_id) as mine:
            current = ledger.get_shard(shard.shard_id)
            if not mine or current is None or current.provider_batch_id is not None:
                result.settling.append(shard.shard_id)  # sent meanwhile: its import ends it
                ledger.update_shard(shard.shard_id, cancelled_at=now)
                return
            moved, _ = ledger.close_shard(
                shard.shard_id,
                from_status=[PENDING],
                items=cancelled_item(reason),
                status=ShardState.IMPORTED.value,
                raw_status=CANCELLED,
                message=f"cancelled before it was sent: {reason}",
                cancelled_at=now,
                ended_at=now,
                imported_at=now,
            )
        result.closed_shards.append(shard.shard_id)
        result.cancelled_items += moved
        return
    ledger.update_shard(shard.shard_id, cancelled_at=now)
    if shard.status in ENDED_STATES:
        result.settling.append(shard.shard_id)  # ended already: its import makes the rest cancelled
        return
    if shard.status in IN_FLIGHT_STATES and shard.provider_batch_id.startswith(ONLINE_BATCH_PREFIX):
        # Sent request by request: its worker stops at its next send. A shard no worker holds
        # (its run died) ends now; its import makes the unanswered items cancelled.
        with ledger.submission_lock(shard.shard_id) as free:
            if free:
                ledger.update_shard(
                    shard.shard_id,
                    expect_status=IN_FLIGHT_STATES,
                    status=ShardState.CANCELLED.value,
                    raw_status=CANCELLED,
                    ended_at=now,
                )
    elif shard.status in IN_FLIGHT_STATES:
        status = ctx.batch_provider.cancel(shard.provider_batch_id)
        values = {
            "status": status.state.value,
            "raw_status": status.raw_status,
            "message": status.message,
        }
        if status.ended:
            values["ended_at"] = utcnow()
        ledger.update_shard(shard.shard_id, expect_status=IN_FLIGHT_STATES, **values)
        result.cancelled_batches.append(shard.provider_batch_id)
    result.settling.append(shard.shard_id)
