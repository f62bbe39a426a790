"""The one executor of a day's lifecycle: it reads the day from the ledger (`load_state`), asks
`lifecycle.decide` what is next and carries it out.

Cheap actions are calls this module makes itself: status polls (steps/polling.py), cancels at
the provider, reconciling a create that was never recorded, closing shards that were never
sent. The heavy ones are steps (building shards, submitting, importing, validating,
reporting), and each path runs them its own way through `StepRuns`: the CLI as Dagster runs,
the batch-status sensor as run requests, an eval in this process. `drive` is the one loop that
advances days and waits between rounds until what they wait for falls due; nothing else sleeps
for a day's sake.
"""

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from llm_assets.resources.ledger import (
    PENDING,
    JobCounts,
    JobRecord,
    LedgerResource,
    ShardRecord,
    utcnow,
)
from llm_assets.resources.providers.base import (
    IN_FLIGHT_STATES,
    ONLINE_BATCH_PREFIX,
    BatchProvider,
    BatchStatus,
    ShardState,
)
from llm_assets.spec.model import PipelineSpec
from llm_assets.steps import admission, day_model, lifecycle
from llm_assets.steps.context import StepContext
from llm_assets.steps.day_model import Action, DayState, Decision, ShardView, Step
from llm_assets.steps.pause import pause_reason
from llm_assets.steps.polling import PollLimits, poll_many
from llm_assets.steps.snapshot import no_source_rows, no_source_rows_reason
from llm_assets.steps.submit import submission_of


class StepRuns(Protocol):
    """How a path runs a day's heavy steps (day_model.HEAVY)."""

    def run(self, day: "DayDriver", action: Action) -> None: ...


class TooManyRounds(RuntimeError):
    """A day went through more import rounds than a path allows without finishing."""


def load_state(ctx: StepContext) -> DayState:
    """The day as the ledger has it now; a shard's lock is looked at (not taken) to see
    whether another run is sending it."""
    ledger, spec = ctx.ledger, ctx.spec
    now = utcnow()
    flags: dict[str, Any] = {
        "is_eval": spec.parent is not None,
        "polls_do_work": ctx.provider is not None and ctx.provider.ends_when_polled,
    }
    paused = pause_reason(ledger, spec.governing_pipeline)
    job = ledger.get_job(ctx.job_id)
    if job is None:
        if no_source_rows(spec, ctx.day, ctx.storage):
            flags["no_source_rows"] = no_source_rows_reason(ctx.day)
        return DayState.of(None, (), JobCounts(), now=now, paused=paused, **flags)
    shards = ledger.shards(job.job_id)
    held = ledger.submissions_held(s.shard_id for s in shards if _sending(s))
    views = tuple(
        ShardView.of(shard, online=_online(shard), busy=shard.shard_id in held) for shard in shards
    )
    flags["quota_freed_at"] = admission.quota_freed_at(ctx, shards)
    if any(s.status in IN_FLIGHT_STATES for s in shards):
        took = [total for _, total in ledger.batch_history(job.provider, job.model_name)]
        flags["batch_seconds"] = statistics.median_low(took) if took else None
    return DayState.of(job, views, ledger.counts(job.job_id), now=now, paused=paused, **flags)


def job_spec(spec: PipelineSpec, job: JobRecord) -> PipelineSpec:
    """The spec one of a pipeline's jobs ran under: the pipeline's own, or, for a job of one
    of its evals, the eval pipeline's as far as the job's row tells it (its name, provider,
    model and prompt version: enough to find, poll and cancel its shards)."""
    if job.pipeline == spec.name:
        return spec
    return spec.model_copy(
        update={
            "name": job.pipeline,
            "parent": spec.name,
            "model": spec.model.model_copy(
                update={"provider": job.provider, "name": job.model_name}
            ),
            "prompt": spec.prompt.model_copy(update={"version": job.prompt_version}),
        }
    )


def _online(shard: ShardRecord) -> bool:
    return (shard.provider_batch_id or "").startswith(ONLINE_BATCH_PREFIX)


def _sending(shard: ShardRecord) -> bool:
    """Whether a run may be sending the shard now (its submission lock says whether one is)."""
    return shard.status in day_model.WAITING or (
        _online(shard) and shard.status in IN_FLIGHT_STATES
    )


@dataclasses.dataclass
class DayDriver:
    """One day on one path: its context, how the path runs heavy steps, how often it polls."""

    ctx: StepContext
    runs: StepRuns | None = None
    poll_every: float = 30.0
    """The longest a batch in flight goes without a status poll."""
    poll_limits: PollLimits | None = None
    imports: int = 0
    last: Decision | None = None
    last_state: DayState | None = None
    _carried: frozenset[tuple[Step, str]] = frozenset()

    @property
    def ledger(self) -> LedgerResource:
        return self.ctx.ledger

    @property
    def counts(self) -> JobCounts:
        """The day's items as last read."""
        return self.last_state.counts if self.last_state is not None else JobCounts()

    def state(self) -> DayState:
        self.last_state = load_state(self.ctx)
        return self.last_state

    def decide(self) -> Decision:
        self.last = lifecycle.decide(self.state(), poll_every=self.poll_every)
        return self.last

    def advance(self, *, only: frozenset[Step] | None = None) -> Decision:
        """One round: decide and carry the actions out (with `only`, those steps alone).
        A heavy action asked again right after it ran, unchanged, is not run twice in a row:
        the day waits a moment for what that run left behind instead."""
        decision = self.decide()
        carried: set[tuple[Step, str]] = set()
        for action in decision.actions:
            if only is not None and action.step not in only:
                continue
            signature = (action.step, action.key or ",".join(action.shard_ids))
            if action.step in day_model.HEAVY and signature in self._carried:
                continue
            if self.carry_out(action):
                carried.add(signature)
        self._carried = frozenset(carried)
        return decision

    @property
    def acted(self) -> bool:
        """Whether the last round carried out any action."""
        return bool(self._carried)

    def carry_out(self, action: Action) -> bool:
        """Carry out one action; False for a heavy one on a path that runs no steps."""
        if action.step == Step.POLL:
            self.poll(action.shard_ids)
        elif action.step == Step.RECONCILE:
            reconcile(self.ctx, action.shard_ids)
        elif action.step == Step.CANCEL:
            cancel_batches(self.ctx, action.shard_ids)
        elif action.step == Step.CLOSE:
            close_unsent(self.ctx, action.shard_ids)
        elif self.runs is None:
            return False
        else:
            if action.step == Step.IMPORT:
                self.imports += 1
            self.runs.run(self, action)
        return True

    def poll(self, shard_ids: Sequence[str]) -> list[ShardRecord]:
        wanted = set(shard_ids)
        shards = [s for s in self.ledger.shards(self.ctx.job_id) if s.shard_id in wanted]
        return poll_many(self.ledger, self.ctx.batch_provider, shards, self.poll_limits)


def _finished(decision: Decision) -> bool:
    """Done, or blocked with nothing else under way."""
    return decision.done or (
        decision.blocked is not None
        and not decision.actions
        and not decision.others
        and decision.wait_until is None
    )


def drive(
    days: Sequence[DayDriver],
    *,
    wait: bool = True,
    until: Callable[[Decision], bool] = _finished,
    progress: Callable[[DayDriver, Decision], None] | None = None,
    max_imports: int = 50,
    timeout_seconds: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[int, Decision]:
    """Advance the days round by round until each one is finished (`until`; by default done,
    or blocked with nothing under way), carrying out their actions; between rounds in which
    nothing was done, sleep until the first thing a day waits for falls due. Without `wait`
    one round is made. Returns each day's last decision by its index in `days`."""
    deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
    last: dict[int, Decision] = {}
    while True:
        acted = False
        for index, day in enumerate(days):
            if index in last and until(last[index]):
                continue
            decision = day.advance()
            last[index] = decision
            acted = acted or day.acted
            if progress is not None:
                progress(day, decision)
            if day.imports > max_imports:
                raise TooManyRounds(
                    f"{day.ctx.spec.name} {day.ctx.day}: items still open after {max_imports} "
                    "rounds of import; see `llm-assets status`"
                )
        open_days = [i for i, decision in last.items() if not until(decision)]
        if not open_days or not wait:
            return last
        if deadline is not None and time.monotonic() >= deadline:
            return last
        if acted:
            continue
        due = [when for i in open_days if (when := last[i].wait_until) is not None]
        pause = (
            (min(due) - utcnow()).total_seconds() if due else lifecycle.OTHER_RUN_RECHECK_SECONDS
        )
        if deadline is not None:
            pause = min(pause, deadline - time.monotonic())
        if pause > 0:
            sleep(pause)


def reconcile(ctx: StepContext, shard_ids: Sequence[str]) -> list[str]:
    """Shards whose submission began but recorded no batch: look for the batch at the
    provider (the same lookup a submission does before it creates one) and record it when
    found; when none is found, the shard is a plain unsent one again. Returns the batches
    found. Under the day's and each shard's lock, so no run sends it meanwhile."""
    ledger, provider = ctx.ledger, ctx.batch_provider
    found: list[str] = []
    with ctx.day_lock():
        for shard_id in shard_ids:
            with ledger.submission_lock(shard_id, holder=ctx.created_by) as mine:
                shard = ledger.get_shard(shard_id)
                if not mine or shard is None or shard.provider_batch_id is not None:
                    continue
                if shard.submit_intent_at is None or shard.status not in day_model.WAITING:
                    continue
                batch_id = provider.find_submitted(submission_of(ctx, shard))
                if batch_id is None:
                    ledger.update_shard(
                        shard_id,
                        expect_status=day_model.WAITING,
                        submit_intent_at=None,
                        message="no batch was found at the provider for its unfinished "
                        "submission: it was never sent",
                    )
                    continue
                ledger.mark_submitted(shard_id, batch_id, ShardState.SUBMITTED)
                found.append(batch_id)
                _log(
                    ctx,
                    f"{shard_id}: found batch {batch_id}, which a submission created "
                    "but did not record; recorded now",
                )
    return found


def cancel_batches(ctx: StepContext, shard_ids: Sequence[str]) -> list[str]:
    """Cancel the shards' batches at the provider, once each; an online shard no worker
    holds is ended as cancelled (its worker, when one holds it, stops at its next send).
    Returns the batches cancelled."""
    ledger = ctx.ledger
    cancelled: list[str] = []
    with ctx.day_lock():
        for shard_id in shard_ids:
            shard = ledger.get_shard(shard_id)
            if shard is None or shard.status not in IN_FLIGHT_STATES or shard.cancel_sent_at:
                continue
            batch_id = shard.provider_batch_id
            assert batch_id is not None
            now = utcnow()
            values: dict[str, Any] = {
                "cancel_sent_at": now,
                "cancelled_at": shard.cancelled_at or now,
            }
            if batch_id.startswith(ONLINE_BATCH_PREFIX):
                with ledger.submission_lock(shard_id, holder=ctx.created_by) as free:
                    if not free:
                        continue
                    values |= {"status": ShardState.CANCELLED.value, "ended_at": now}
                    ledger.update_shard(
                        shard_id,
                        expect_status=IN_FLIGHT_STATES,
                        raw_status=day_model.CANCELLED,
                        **values,
                    )
                continue
            status, accepted = _cancel_at_provider(ctx.batch_provider, batch_id)
            values |= {"status": status.state.value, "raw_status": status.raw_status}
            values["message"] = status.message
            if status.ended:
                values["ended_at"] = utcnow()
            ledger.update_shard(shard_id, expect_status=IN_FLIGHT_STATES, **values)
            if accepted:
                cancelled.append(batch_id)
    return cancelled


def _cancel_at_provider(provider: BatchProvider, batch_id: str) -> tuple[BatchStatus, bool]:
    """Cancel a batch: its status, and whether the provider took the cancel. One that ended
    before the cancel reached it (the provider refuses to cancel it) is taken as it ended,
    to be imported like any other."""
    try:
        return provider.cancel(batch_id), True
    except Exception:
        status = provider.poll(batch_id)
        if not status.ended:
            raise
        return status, False


def close_unsent(ctx: StepContext, shard_ids: Sequence[str]) -> tuple[list[str], int]:
    """Close shards never sent of a cancelled day (or cancelled themselves): their items
    become cancelled dead letters. Returns the shards closed and how many items."""
    ledger = ctx.ledger
    closed: list[str] = []
    items = 0
    with ctx.day_lock():
        job = ctx.job()
        for shard_id in shard_ids:
            with ledger.submission_lock(shard_id, holder=ctx.created_by) as mine:
                shard = ledger.get_shard(shard_id)
                if not mine or shard is None or shard.status not in day_model.WAITING:
                    continue
                if shard.provider_batch_id is not None or shard.submit_intent_at is not None:
                    continue  # may have a batch: reconciled first
                reason = job.cancel_reason or "its shard was cancelled"
                now = utcnow()
                moved, _ = ledger.close_shard(
                    shard_id,
                    from_status=[PENDING],
                    items=lifecycle.cancelled_item(reason),
                    status=ShardState.IMPORTED.value,
                    raw_status=day_model.CANCELLED,
                    message=f"cancelled before it was sent: {reason}",
                    cancelled_at=shard.cancelled_at or now,
                    ended_at=now,
                    imported_at=now,
                )
                closed.append(shard_id)
                items += moved
        ledger.refresh_job(job.job_id)
    return closed, items


def _log(ctx: StepContext, message: str) -> None:
    if ctx.log is not None:
        ctx.log(f"{ctx.spec.name} {ctx.day}: {message}")
