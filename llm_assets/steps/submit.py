"""provider_batches: the residency, pause and budget gates (steps/budget.py), then every
shard not yet sent submitted once (or, for shards the step works itself, sent by the online
worker)."""

import dataclasses
import datetime as dt
import threading
from collections.abc import Callable

from pydantic import BaseModel

from llm_assets.resources.ledger import (
    DEAD_LETTER,
    PENDING,
    JobRecord,
    LostLock,
    ShardMismatch,
    ShardRecord,
    utcnow,
)
from llm_assets.resources.providers.base import (
    IN_FLIGHT_STATES,
    WAITING_FOR_QUOTA,
    ShardState,
    ShardSubmission,
)
from llm_assets.resources.providers.retrying import QuotaRefused
from llm_assets.steps import admission, day_model, lifecycle, quota
from llm_assets.steps.budget import budget_gate, hold_for_gate, reserve_pipeline_budget
from llm_assets.steps.compliance import compliance_gate
from llm_assets.steps.context import GateBlocked, StepContext
from llm_assets.steps.line_ids import request_lines
from llm_assets.steps.online import OnlineInterrupted, run_online_shard, stop_on_sigterm
from llm_assets.steps.pause import refuse_if_paused
from llm_assets.steps.priming import hold_for_priming
from llm_assets.steps.residency import refuse_outside_regions
from llm_assets.steps.shards import ShardRound, line_offsets
from llm_assets.util.failpoints import failpoint

SUBMISSION_LOCK_WAIT_SECONDS = 0.5
"""How long a submission waits for a shard's lock that another run holds for a moment (a
look at whether it is busy) before it counts the shard as another run's."""


def submission_of(ctx: StepContext, shard: ShardRecord) -> ShardSubmission:
    """What the provider is given to submit the shard, or to find the batch a submission of
    it made before (`intent_at`)."""
    provider = ctx.batch_provider
    return ShardSubmission(
        shard_id=shard.shard_id,
        job_id=shard.job_id,
        pipeline=ctx.spec.name,
        input_uri=shard.input_uri,
        item_count=shard.item_count,
        intent_at=shard.submit_intent_at,
        known_batch_ids=ctx.ledger.recent_provider_batch_ids(
            ctx.spec.model.provider, utcnow() - dt.timedelta(days=2)
        ),
        model=ctx.spec.model.name,
        format=provider.request_format(ctx.spec),
    )


class SubmitResult(BaseModel):
    job_id: str
    submitted: dict[str, str]
    being_submitted_elsewhere: int = 0
    in_flight: int
    committed_cost_usd: float
    waiting_for_backoff: int = 0
    waiting_for_quota: int = 0
    quota_reason: str | None = None
    next_submission_at: dt.datetime | None = None
    priming: str | None = None
    """What priming the prompt cache did (steps/priming.py); None when the day primes not."""


@dataclasses.dataclass
class _Submitter:
    """One submission run over a day's shards: what it submitted, how many shards another run
    held, and the event SIGTERM sets to stop an online worker cleanly."""

    ctx: StepContext
    job: JobRecord
    price_json: str
    progress: Callable[[str], None] | None = None
    stopping: threading.Event = dataclasses.field(default_factory=threading.Event)
    submitted: dict[str, str] = dataclasses.field(default_factory=dict)
    busy: int = 0
    quota: QuotaRefused | None = None
    """The provider's quota refusal this run met; later shards wait without trying."""

    def runs_in_step(self, shard: ShardRecord) -> bool:
        """Whether this step sends the shard's items itself rather than as a batch."""
        return self.ctx.batch_provider.runs_shard_in_step(
            self.ctx.spec, shard.item_count, shard.provider_batch_id
        )

    def submit_or_run(self, shard: ShardRecord) -> None:
        """Submit (or work) one shard under its lock; skipped while another run holds it. A
        batch is created and recorded under the day's lock too, so a cancel or an import of
        the day waits for it, and a run that lost the day cannot record one."""
        ledger = self.ctx.ledger
        with ledger.submission_lock(
            shard.shard_id, holder=self.ctx.created_by, wait_seconds=SUBMISSION_LOCK_WAIT_SECONDS
        ) as mine:
            if not mine:
                self.busy += 1  # another run is submitting it right now
                return
            current = ledger.get_shard(shard.shard_id)
            if current is not None and self.runs_in_step(current):
                if current.status in (*IN_FLIGHT_STATES, *day_model.WAITING):
                    self.submitted[shard.shard_id] = run_online_shard(
                        self.ctx,
                        current,
                        self.price_json,
                        progress=self.progress,
                        stopping=self.stopping,
                    )
                return
            if current is None or current.provider_batch_id is not None:
                return  # submitted by another run since it was listed
            with self.ctx.day_lock():
                self.submit_held(current)

    def submit_held(self, current: ShardRecord) -> None:
        """Submit one shard whose locks this run holds, unless the day or the shard was
        cancelled, or the pipeline paused, since it was listed."""
        ctx = self.ctx
        job = ctx.job()
        current = ctx.ledger.get_shard(current.shard_id) or current  # as it is, under the lock
        stop = lifecycle.may_send(
            cancelled=job.cancelled_at is not None,
            shard_cancelled=current.cancelled_at is not None,
            paused=False,
        )
        if stop is not None:
            if job.cancelled_at is not None:
                raise GateBlocked("cancelled", _cancelled_words(ctx, job))
            return  # the shard alone was cancelled: the lifecycle closes it
        refuse_if_paused(ctx, [current], len(self.submitted))
        pending = _as_pending(ctx, current)
        if pending is None:
            return
        refusal = ctx.batch_provider.below_minimum_reason(
            ctx.spec, pending.shard_id, pending.item_count
        )
        if refusal is not None:
            _dead_letter_unsendable(ctx, pending, refusal)
            return
        if self.quota is None:
            try:
                self.submitted[pending.shard_id] = self.admit(pending)
                return
            except QuotaRefused as refused:
                self.quota = refused
        admission.wait_for_quota(self.ctx, pending, self.quota)

    def admit(self, shard: ShardRecord) -> str:
        """Submit the shard if the provider's quota for its model has room for it, by the
        spec's declared quota and by what the ledger learned (steps/quota.py); otherwise
        raise QuotaRefused. Admissions of one quota are made one at a time, across runs."""
        ctx = self.ctx
        key = admission.quota_key(ctx)
        with ctx.ledger.quota_lock(quota.key_name(key), holder=ctx.created_by) as mine:
            if not mine:
                raise QuotaRefused("another run is admitting shards of this model", 1.0)
            load, amount = admission.room_for(ctx, shard, key)
            try:
                batch_id = self.submit_one(shard)
            except QuotaRefused as refused:
                raise admission.learn_refusal(ctx, key, load, amount, refused) from None
            if not ctx.batch_provider.refuses_after_create:
                ctx.ledger.learn_quota(
                    key, lambda r: quota.after_admission(r, load=load + amount, now=utcnow())
                )
            return batch_id

    def submit_one(self, shard: ShardRecord) -> str:
        """Submit one shard under its submission lock; returns the provider batch id."""
        ctx = self.ctx
        # The first intent is kept: after a crash, the adapter reconciles from that moment.
        # The price in force now is the one the shard's results are charged at.
        if shard.submit_intent_at is None:
            ctx.ledger.record_submit_intent(shard.shard_id, self.price_json)
            shard = shard.model_copy(update={"price_json": self.price_json})
        failpoint("submit.after_intent")
        batch_id = ctx.batch_provider.submit(submission_of(ctx, shard), ctx.storage)
        failpoint("submit.after_create")
        try:
            recorded = ctx.ledger.mark_submitted(shard.shard_id, batch_id, ShardState.SUBMITTED)
        except LostLock:
            self.withdraw(shard, batch_id)
            raise
        if not recorded:
            self.withdraw(shard, batch_id)
        failpoint("submit.after_record")
        return batch_id

    def withdraw(self, shard: ShardRecord, batch_id: str) -> None:
        """A batch this run could not record (it lost its locks while creating it): cancelled
        at the provider when the ledger already holds another batch for the shard. When it
        holds none yet, the run that holds the shard now finds this one from the intent."""
        current = self.ctx.ledger.get_shard(shard.shard_id)
        recorded = current.provider_batch_id if current is not None else None
        if recorded is None or recorded == batch_id:
            return
        self.ctx.batch_provider.cancel(batch_id)
        if self.ctx.log is not None:
            self.ctx.log(
                f"{shard.shard_id}: cancelled batch {batch_id}, created after this run lost "
                f"its hold on the shard; the shard's batch is {recorded}"
            )


def _cancelled_words(ctx: StepContext, job: JobRecord) -> str:
    assert job.cancelled_at is not None
    return (
        f"{ctx.spec.name} {ctx.day} was cancelled by {job.cancelled_by or 'an operator'} at "
        f"{job.cancelled_at:%Y-%m-%d %H:%M} UTC ({job.cancel_reason}); nothing more was "
        f"submitted. `llm-assets requeue {ctx.spec.name} --date {ctx.day} --class "
        "cancelled` sends its cancelled items again"
    )


def _as_pending(ctx: StepContext, shard: ShardRecord) -> ShardRecord | None:
    """The shard as it may be sent: its request lines are exactly its items pending in the
    ledger. Items that took a result since the shard was built (a late answer to an earlier
    attempt) are left out of a narrowed copy of its file; a shard left with none is closed
    unsent (None). A shard that would send items the ledger gives elsewhere is never sent."""
    pending = ctx.ledger.count_pending(shard.shard_id)
    if pending == shard.item_count:
        return shard
    if pending > shard.item_count or shard.submit_intent_at is not None:
        raise ShardMismatch(
            f"shard {shard.shard_id} lists {shard.item_count} requests but {pending} of its "
            "items are pending in the ledger; it was not sent"
            + (" (a submission of it was begun before)" if shard.submit_intent_at else "")
        )
    now = utcnow()
    offsets = ctx.ledger.pending_offsets(shard.shard_id)
    if not offsets:
        ctx.ledger.update_shard(
            shard.shard_id,
            expect_status=list(day_model.WAITING),
            status=ShardState.IMPORTED.value,
            raw_status="nothing_pending",
            message="every item took a result before the shard was sent",
            ended_at=now,
            imported_at=now,
        )
        return None
    lines = request_lines(
        ctx.storage, shard.input_uri, offsets, id_field=ctx.batch_provider.line_id_field
    )
    key = shard.input_uri.rsplit("/", 1)[-1].removesuffix(".jsonl")
    written = ShardRound(ctx, ctx.job(), shard.round).write_file(
        shard.shard_index, lines, name=f"{key}.pending-{len(lines)}"
    )
    ctx.ledger.narrow_shard(
        shard.shard_id,
        line_offsets(lines),
        input_uri=written.uri,
        size_bytes=written.size_bytes,
        content_sha256=written.sha256,
        item_count=len(lines),
    )
    return ctx.ledger.get_shard(shard.shard_id)


def _dead_letter_unsendable(ctx: StepContext, shard: ShardRecord, reason: str) -> None:
    """A shard the provider would refuse (below its minimum) is never sent: its items become
    dead letters saying why, to be requeued when there are enough of them."""
    now = utcnow()
    ctx.ledger.close_shard(
        shard.shard_id,
        from_status=[PENDING],
        items={
            "status": DEAD_LETTER,
            "error_class": "deterministic",
            "error_code": "below_minimum",
            "error_message": reason,
        },
        status=ShardState.IMPORTED.value,
        raw_status="below_minimum",
        message=reason,
        ended_at=now,
        imported_at=now,
    )


def submit_shards(
    ctx: StepContext,
    *,
    approve_budget: bool = False,
    approved_by: str = "",
    progress: Callable[[str], None] | None = None,
) -> SubmitResult:
    """Submit every shard not yet submitted; a shard never gets a second live batch.

    A paused pipeline submits nothing (PipelinePaused, asked again before each shard). Two
    budget gates come first: the day's upper bound against the partition budget, then
    the shards' upper bounds reserved, all or none, against the pipeline's daily and monthly
    caps. Before any of them, the residency gate: nothing is sent to, or staged in, a place
    outside the spec's `compliance.allowed_regions`.
    """
    ledger = ctx.ledger
    job = ctx.job()
    refuse_outside_regions(ctx)
    to_submit = ledger.shards(job.job_id, list(day_model.WAITING))
    if job.cancelled_at is not None and to_submit:
        raise GateBlocked("cancelled", _cancelled_words(ctx, job))
    if to_submit:
        refuse_if_paused(ctx, to_submit)
        gate = budget_gate(ctx, approve=approve_budget, approved_by=approved_by)
        if not gate.passed:
            raise hold_for_gate(ctx, GateBlocked("budget", gate.reason), to_submit)
        screened = compliance_gate(ctx)
        if not screened.passed:
            raise hold_for_gate(ctx, GateBlocked("compliance", screened.reason), to_submit)
    now = utcnow()
    freed = admission.quota_freed_at(ctx, to_submit)
    waiting = [
        s
        for s in to_submit
        if s.not_before is not None
        and s.not_before > now
        and not lifecycle.room_freed(s.raw_status, s.updated_at, freed)
    ]
    to_submit = [s for s in to_submit if s not in waiting]
    to_submit, priming = hold_for_priming(ctx, job.job_id, to_submit)
    if priming and ctx.log is not None:
        ctx.log(f"{ctx.spec.name} {ctx.day}: {priming}")
    run = _Submitter(ctx, job, ctx.price().model_dump_json(), progress)
    try:
        reserve_pipeline_budget(ctx, job, to_submit)
    except GateBlocked as refused:
        raise hold_for_gate(ctx, refused, to_submit) from None
    # Online shards: this step is the worker. Shards a dead worker left running resume here.
    to_submit += [s for s in ledger.shards(job.job_id, IN_FLIGHT_STATES) if run.runs_in_step(s)]
    with stop_on_sigterm(run.stopping, any(run.runs_in_step(s) for s in to_submit)):
        for n, shard in enumerate(to_submit):
            if run.stopping.is_set():
                raise OnlineInterrupted(
                    f"stopped by SIGTERM before {shard.shard_id}; its items are sent when "
                    "provider_batches runs again"
                )
            refuse_if_paused(ctx, to_submit[n:], len(run.submitted))
            run.submit_or_run(shard)
    ledger.refresh_job(job.job_id)
    still_waiting = ledger.shards(job.job_id, list(day_model.WAITING))
    for_quota = [s for s in still_waiting if s.raw_status == WAITING_FOR_QUOTA]
    due = [s.not_before for s in still_waiting if s.not_before and s.not_before > utcnow()]
    return SubmitResult(
        job_id=job.job_id,
        submitted=run.submitted,
        being_submitted_elsewhere=run.busy,
        in_flight=len(ledger.shards(job.job_id, IN_FLIGHT_STATES)),
        committed_cost_usd=ledger.committed_cost(job.job_id),
        waiting_for_backoff=len([s for s in waiting if s.raw_status != WAITING_FOR_QUOTA]),
        waiting_for_quota=len(for_quota),
        quota_reason=for_quota[0].message if for_quota else None,
        next_submission_at=min(due, default=None),
        priming=priming,
    )
