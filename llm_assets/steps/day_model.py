"""A day as the lifecycle reads it and what it decides, as plain values: a day of one pipeline
and its shards as the ledger has them (`DayState`, `ShardView`), the steps an action takes
(`Step`; `HEAVY`, those a path runs as steps) and the decision (`Decision`, its `Action`s).
The rules that decide are in steps/lifecycle.py.
"""

import dataclasses
import datetime as dt
from enum import StrEnum

from llm_assets.resources.ledger import PRIME_SHARD, JobCounts, JobRecord, ShardRecord
from llm_assets.resources.providers.base import ENDED_STATES, IN_FLIGHT_STATES, ShardState
from llm_assets.results.rows import RETRY

CANCELLED = "cancelled"
"""The error class and code of an item an operator (or the spend breaker) cancelled."""
WAITING = frozenset({ShardState.CREATED, ShardState.UPLOADED})


class Step(StrEnum):
    """What an action does."""

    BUILD = "build"
    """Snapshot the day and build its shards (then submit them: the same run)."""
    SUBMIT = "submit"
    """Submit the shards named (or resume their online worker)."""
    POLL = "poll"
    """Ask the provider about the batches of the shards named (cheap status calls)."""
    IMPORT = "import"
    """Import the ended shards named, then plan retries (with none named: only plan)."""
    RECONCILE = "reconcile"
    """Look for the batch an unrecorded create may have made, and record it if found."""
    CANCEL = "cancel"
    """Cancel the shards' batches at the provider (an online shard: end it)."""
    CLOSE = "close"
    """Close shards never sent: their items become cancelled dead letters."""
    VALIDATE = "validate"
    REPORT = "report"


HEAVY = frozenset({Step.BUILD, Step.SUBMIT, Step.IMPORT, Step.VALIDATE, Step.REPORT})
"""Actions a path runs as steps (in process, as Dagster runs, as run requests); the others
are cheap calls the executor makes itself."""


@dataclasses.dataclass(frozen=True)
class Action:
    step: Step
    shard_ids: tuple[str, ...] = ()
    key: str = ""
    """What distinguishes this action from the same step asked for before (for run keys):
    the batches an import takes, the shards and the state they are submitted in, the import
    a validation follows."""


@dataclasses.dataclass(frozen=True)
class ShardView:
    """What the decision reads of one shard."""

    shard_id: str
    status: str
    round: int
    provider_batch_id: str | None
    intent: bool
    """A submission of it began: a batch may exist although none is recorded."""
    not_before: dt.datetime | None
    raw_status: str | None
    cancelled: bool
    cancel_sent: bool
    online: bool
    """Sent request by request by provider_batches, not as a batch."""
    busy: bool
    """Another run holds its submission lock now (submitting it, or working it online)."""
    created_at: dt.datetime | None
    submitted_at: dt.datetime | None
    touched_at: dt.datetime | None
    """When its row last changed: for a batch in flight, its last poll."""
    imported_at: dt.datetime | None = None
    note: str | None = None
    """What the ledger last said about it (why a gate held it back)."""
    primes: bool = False
    """The day's priming shard: the shards held for it wait while it is open."""

    @classmethod
    def of(cls, shard: ShardRecord, *, online: bool, busy: bool) -> "ShardView":
        return cls(
            shard_id=shard.shard_id,
            status=shard.status,
            round=shard.round,
            provider_batch_id=shard.provider_batch_id,
            intent=shard.submit_intent_at is not None,
            not_before=shard.not_before,
            raw_status=shard.raw_status,
            cancelled=shard.cancelled_at is not None,
            cancel_sent=shard.cancel_sent_at is not None,
            online=online,
            busy=busy,
            created_at=shard.created_at,
            submitted_at=shard.submitted_at,
            touched_at=shard.updated_at,
            imported_at=shard.imported_at,
            note=shard.message,
            primes=shard.kind == PRIME_SHARD,
        )

    @property
    def waiting(self) -> bool:
        return self.status in WAITING

    @property
    def in_flight(self) -> bool:
        return self.status in IN_FLIGHT_STATES

    @property
    def ended(self) -> bool:
        return self.status in ENDED_STATES


@dataclasses.dataclass(frozen=True)
class DayState:
    """One day of one pipeline (or of one eval variant) as the ledger has it, at `now`."""

    now: dt.datetime
    has_job: bool
    shards: tuple[ShardView, ...] = ()
    counts: JobCounts = dataclasses.field(default_factory=JobCounts)
    cancelled: str | None = None
    """Why the whole day was cancelled (by an operator or the spend breaker), if it was."""
    paused: str | None = None
    """Why the pipeline (the parent pipeline of an eval) is paused, if it is."""
    no_source_rows: str | None = None
    """Set on a day with no source rows: nothing to do."""
    expired: bool = False
    """Retention expired the day: nothing is done with it again (steps.DayExpired)."""
    is_eval: bool = False
    polls_do_work: bool = False
    """The provider works on a batch when it is polled (the local provider): poll at once."""
    job_id: str = ""
    validated_at: dt.datetime | None = None
    reported_at: dt.datetime | None = None
    quota_freed_at: dt.datetime | None = None
    """When a batch of the day's model last ended, any pipeline's (or, at a provider that
    admits batches after creating them, was seen started): room freed under the provider's
    quota, so shards waiting for it are sent again at once."""
    batch_seconds: float | None = None
    """How long the model's batches took from submission to end lately (the median), when
    known: polls are spaced by it."""

    @classmethod
    def of(
        cls,
        job: JobRecord | None,
        shards: tuple[ShardView, ...],
        counts: JobCounts,
        *,
        now: dt.datetime,
        paused: str | None,
        **flags: bool | str | float | dt.datetime | None,
    ) -> "DayState":
        if job is None:
            return cls(now=now, has_job=False, paused=paused, **flags)  # type: ignore[arg-type]
        return cls(
            now=now,
            has_job=True,
            shards=shards,
            counts=counts,
            cancelled=job.cancel_reason or CANCELLED if job.cancelled_at is not None else None,
            paused=paused,
            job_id=job.job_id,
            validated_at=job.validated_at,
            reported_at=job.reported_at,
            expired=job.retention_expired_at is not None,
            **flags,  # type: ignore[arg-type]
        )

    @property
    def retry_items(self) -> int:
        """Items an import left to retry whose retry round is not planned yet."""
        return self.counts.by_status.get(RETRY, 0)

    @property
    def last_import_at(self) -> dt.datetime | None:
        return max((s.imported_at for s in self.shards if s.imported_at), default=None)


@dataclasses.dataclass(frozen=True)
class Decision:
    """What the day does next, and otherwise what it waits for."""

    actions: tuple[Action, ...] = ()
    wait_until: dt.datetime | None = None
    """The earliest moment something falls due (a poll, a backoff, a quota wait, another
    run's submission to look at again) when there is nothing to do before."""
    others: tuple[str, ...] = ()
    """Shards another run is submitting or working now."""
    blocked: str | None = None
    """Why part of the day cannot go on until an operator acts (a pause, a gate)."""
    gate: str | None = None
    """What blocks it: `paused`, or the name of the gate that refused its shards."""
    done: bool = False
    """Every item is terminal and the day is validated and reported (or has no data)."""

    def has(self, step: Step) -> bool:
        return any(action.step == step for action in self.actions)

    @property
    def settled(self) -> bool:
        """Nothing is left in flight, to submit, to import or to reconcile: only the finish
        steps (validate, report) may remain, or a block."""
        busy = {Step.SUBMIT, Step.POLL, Step.IMPORT, Step.RECONCILE, Step.CANCEL, Step.CLOSE}
        return (
            not self.others
            and self.wait_until is None
            and not any(action.step in busy for action in self.actions)
        )
