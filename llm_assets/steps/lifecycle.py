"""A day's life, decided in one place: what happens next to one pipeline's day.

`decide` is a pure function of the day as the ledger has it (`DayState`: its shards, its open
and retryable items, the operator's cancel and pause, when it was last imported, validated
and reported) and of the clock in that state. It returns the next actions and what the day
waits for (a `Decision`; these values are in steps/day_model.py); the executor
(steps/executor.py) carries them out. Every path asks it: `llm-assets run --wait`, the
batch-status sensor, an eval replay, `cancel`, and the submission step and the online worker
before each send (`may_send`). No other module decides what a day does next.

The rules, shard by shard:

- never sent (`created`): held while a sliced build has not joined its slices (a day
  whose join is `SLICE_JOIN_GRACE` late is built again: that build's join releases them);
  submitted when due (its retry backoff over, a pause lifted, or,
  waiting for quota, a batch of its model ended since, or its quota wait over); a
  first-round shard is left to the run that built it for `FRESH_SHARD_GRACE`, then
  submitted by whoever asks (that run died); while the day's priming shard (prompt cache)
  waits or is in flight, the shards held for it wait. When the day or the shard is cancelled
  the shard is closed unsent, its items `cancelled` dead letters; while paused it waits. A
  shard whose submission began (an intent) but recorded no batch may have a live batch at
  the provider: before it is closed, or while it may not be sent, the batch is looked for
  (`reconcile`) and, if found, recorded, then cancelled or imported like any other.
- in flight: polled on a schedule that backs off as the batch ages and follows how long the
  model's batches lately took (`next_poll_at`); a
  cancelled day's or shard's batch is cancelled at the provider once. A shard sent request
  by request (online) is worked by provider_batches: resumed when no worker holds it, ended
  as cancelled when the day is cancelled.
- ended: imported (its answers kept, the rest retried or dead-lettered); items an import
  left to retry with no round planned yet are planned by the next import.
- Shards another run is submitting or working right now (it holds their lock) are waited for.

When no shard is open and no item either, the day is finished: validated (when it was not
validated since its last import), then reported (dead letters and cost report, when not
reported since its validation); an eval's day ends at its validation, a cancelled day is
reported without validation. A day retention expired is done, whatever is left of it. A
paused pipeline blocks what would be sent; a spend breaker trip is a cancel
(steps/breaker.py).
"""

import dataclasses
import datetime as dt
import hashlib

from llm_assets.resources.ledger import DEAD_LETTER
from llm_assets.resources.providers.base import WAITING_FOR_QUOTA, ShardState
from llm_assets.steps.day_model import CANCELLED, Action, DayState, Decision, ShardView, Step

FRESH_SHARD_GRACE = dt.timedelta(minutes=5)
"""How long a new first-round shard is left to the run that built it (which submits it in
the same run) before any other path submits it."""
POLL_FIRST_SECONDS = 1.0
"""The first status poll of a batch is this long after its submission (or last poll) ..."""
POLL_AGE_SHARE = 0.1
"""... and later polls a tenth of the batch's age apart, up to the path's poll interval."""
OTHER_RUN_RECHECK_SECONDS = 5.0
"""How often a shard another run is submitting is looked at again (at most)."""

PAUSED = "paused"
"""The provider status (raw_status) of a waiting shard a pause held back."""
GATED = "blocked"
"""The provider status (raw_status) of a waiting shard a gate refused (the budget, the
personal-data share, the pipeline's caps): it waits for an operator (an approval)."""
UNJOINED = "unjoined"
"""The provider status (raw_status) of a shard a slice of the day's build recorded: held
until the slices' join releases it (steps/build.py)."""
PRIMING = "priming"
"""The provider status (raw_status) of a waiting shard held until the day's priming shard has
ended (steps/priming.py)."""
SLICE_JOIN_GRACE = dt.timedelta(hours=1)
"""How long a shard waits for the join of the build that sliced it; after that the build
stopped before its join, and the day is built again (its join releases the shard)."""


def next_poll_at(
    shard: ShardView, now: dt.datetime, poll_every: float, expected: float | None = None
) -> dt.datetime:
    """When a batch in flight is asked about next: a second after its last poll while it
    is young, then a tenth of its age apart, never more than `poll_every` seconds. When the
    model's batches lately took `expected` seconds, a batch far from that is polled at half
    the time left (up to `poll_every`), closer and closer as it falls due."""
    if poll_every <= 0 or shard.touched_at is None:
        return now
    age = (now - (shard.submitted_at or shard.touched_at)).total_seconds()
    delay = max(age * POLL_AGE_SHARE, POLL_FIRST_SECONDS)
    if expected is not None and age < expected:
        delay = max(delay, (expected - age) / 2)
    return shard.touched_at + dt.timedelta(seconds=min(delay, poll_every))


def may_send(*, cancelled: bool, shard_cancelled: bool, paused: bool) -> str | None:
    """Why nothing more of a shard may be sent now (cancelled, paused), or None: what the
    submission step asks under the day's lock before each create, and the online worker
    before each request."""
    if cancelled or shard_cancelled:
        return CANCELLED
    if paused:
        return PAUSED
    return None


def cancelled_item(reason: str) -> dict[str, str]:
    """What an item the operator (or the spend breaker) cancelled becomes."""
    return {
        "status": DEAD_LETTER,
        "error_class": CANCELLED,
        "error_code": CANCELLED,
        "error_message": f"cancelled: {reason}; `llm-assets requeue` sends it again",
    }


def _fresh(shard: ShardView, now: dt.datetime) -> dt.datetime | None:
    """Until when a first-round shard nobody tried yet is left to the run that built it."""
    if shard.round != 0 or shard.intent or shard.raw_status is not None:
        return None
    if shard.created_at is None or shard.created_at + FRESH_SHARD_GRACE <= now:
        return None
    return shard.created_at + FRESH_SHARD_GRACE


def _submit_key(shard: ShardView) -> str:
    """What one submission of a shard is, for a run key: a round's first send, the send
    after a quota wait (by its end), after a pause (by the pause), or an online shard's
    resume (by its last change)."""
    if shard.in_flight:
        return f"resume:{shard.shard_id}:{shard.touched_at.isoformat() if shard.touched_at else ''}"
    if shard.raw_status == PAUSED:
        held = hashlib.sha256((shard.note or "").encode()).hexdigest()[:12]
        return f"held:{shard.shard_id}:{held}"
    if shard.raw_status == PRIMING:
        return f"primed:{shard.shard_id}"
    if shard.raw_status is not None and shard.not_before is not None:
        return f"quota:{shard.shard_id}:{shard.not_before.isoformat()}"
    return f"submit:{shard.shard_id}"


@dataclasses.dataclass
class _Sorted:
    """The day's open shards sorted by what they need."""

    submit: list[ShardView] = dataclasses.field(default_factory=list)
    poll: list[ShardView] = dataclasses.field(default_factory=list)
    ended: list[ShardView] = dataclasses.field(default_factory=list)
    reconcile: list[ShardView] = dataclasses.field(default_factory=list)
    cancel: list[ShardView] = dataclasses.field(default_factory=list)
    close: list[ShardView] = dataclasses.field(default_factory=list)
    others: list[ShardView] = dataclasses.field(default_factory=list)
    held: list[ShardView] = dataclasses.field(default_factory=list)
    gated: list[ShardView] = dataclasses.field(default_factory=list)
    unjoined: list[ShardView] = dataclasses.field(default_factory=list)
    """Held for a join that is late: the day is built again."""
    wake: list[dt.datetime] = dataclasses.field(default_factory=list)


def room_freed(
    raw_status: str | None, waiting_since: dt.datetime | None, freed_at: dt.datetime | None
) -> bool:
    """Whether room freed under the quota (a batch of the model ended or started) since a
    shard began to wait for it: it is tried again, its timed wait over or not."""
    return (
        raw_status == WAITING_FOR_QUOTA
        and freed_at is not None
        and waiting_since is not None
        and freed_at > waiting_since
    )


def _room_freed(s: ShardView, state: DayState) -> bool:
    return room_freed(s.raw_status, s.touched_at, state.quota_freed_at)


def _sort_waiting(
    s: ShardView, state: DayState, stop: bool, into: _Sorted, priming: bool = False
) -> None:
    if stop or state.paused:
        if s.intent:
            into.reconcile.append(s)  # a batch may be live: found and recorded first
        elif stop:
            into.close.append(s)
        else:
            into.held.append(s)
        return
    if s.raw_status == GATED:
        into.gated.append(s)
        return
    if s.raw_status == PRIMING and priming:
        return  # the priming shard's polls wake the day
    if s.raw_status == UNJOINED:
        join_by = (s.created_at or state.now) + SLICE_JOIN_GRACE
        if join_by > state.now:
            into.others.append(s)  # the build that sliced the day joins them
            into.wake.append(join_by)
        else:
            into.unjoined.append(s)
        return
    if s.not_before is not None and s.not_before > state.now and not _room_freed(s, state):
        into.wake.append(s.not_before)  # a retry backoff or a quota wait
        return
    fresh_until = _fresh(s, state.now)
    if fresh_until is not None:
        into.others.append(s)
        into.wake.append(fresh_until)
        return
    into.submit.append(s)


def _sort_in_flight(s: ShardView, state: DayState, stop: bool, poll_every: float, into: _Sorted):
    if s.online:
        if stop:
            into.cancel.append(s)
        elif state.paused:
            into.held.append(s)
        else:
            into.submit.append(s)  # no worker holds it: provider_batches resumes it
        return
    if stop and not s.cancel_sent:
        into.cancel.append(s)
        return
    due = (
        state.now
        if state.polls_do_work
        else next_poll_at(s, state.now, poll_every, state.batch_seconds)
    )
    if due <= state.now:
        into.poll.append(s)
    else:
        into.wake.append(due)


def _sort(state: DayState, poll_every: float) -> _Sorted:
    into = _Sorted()
    priming = any(s.primes and (s.waiting or s.in_flight) for s in state.shards)
    for s in state.shards:
        stop = state.cancelled is not None or s.cancelled
        if s.status == ShardState.IMPORTED:
            continue
        if s.busy and (s.waiting or s.online):
            into.others.append(s)  # another run is sending it; it stops itself if it must
        elif s.waiting:
            _sort_waiting(s, state, stop, into, priming)
        elif s.in_flight:
            _sort_in_flight(s, state, stop, poll_every, into)
        elif s.ended:
            into.ended.append(s)
    return into


def _finish(state: DayState) -> Decision:
    """A day with nothing open: validate, report, or done."""
    last = state.last_import_at
    imports = f"{state.job_id}:{len(state.shards)}:{last.isoformat() if last else ''}"
    finished: dt.datetime | None
    if state.cancelled is None:
        if state.validated_at is None or (last and state.validated_at < last):
            return Decision(actions=(Action(Step.VALIDATE, key=f"finish:{imports}"),))
        finished = state.validated_at
    else:
        finished = last
    if state.is_eval:
        return Decision(done=True)
    if state.reported_at is None or (finished and state.reported_at < finished):
        return Decision(actions=(Action(Step.REPORT, key=f"report:{imports}"),))
    return Decision(done=True)


def decide(state: DayState, *, poll_every: float = 30.0) -> Decision:
    """The day's next actions (see the module docstring for the rules). `poll_every` is the
    longest a batch in flight goes without a status poll on this path."""
    if state.no_source_rows or state.expired:
        return Decision(done=True)
    if not state.has_job:
        if state.paused:
            return Decision(blocked=state.paused, gate=PAUSED)
        return Decision(actions=(Action(Step.BUILD),))
    into = _sort(state, poll_every)
    actions: list[Action] = []
    if into.reconcile:
        actions.append(Action(Step.RECONCILE, _ids(into.reconcile)))
    if into.cancel:
        actions.append(Action(Step.CANCEL, _ids(into.cancel)))
    if into.close:
        actions.append(Action(Step.CLOSE, _ids(into.close)))
    if into.poll:
        actions.append(Action(Step.POLL, _ids(into.poll)))
    if into.ended or state.retry_items:
        batches = sorted(s.provider_batch_id or s.shard_id for s in into.ended)
        key = ",".join(batches) or f"plan:{state.job_id}:{state.retry_items}"
        actions.append(Action(Step.IMPORT, _ids(into.ended), key=key))
    if into.submit:
        key = ",".join(sorted(_submit_key(s) for s in into.submit))
        actions.append(Action(Step.SUBMIT, _ids(into.submit), key=key))
    if into.unjoined:
        key = f"join:{state.job_id}:{','.join(_ids(into.unjoined))}"
        actions.append(Action(Step.BUILD, _ids(into.unjoined), key=key))
    open_shards = any(s.status != ShardState.IMPORTED for s in state.shards)
    blocked, gate = (state.paused, PAUSED) if into.held else (None, None)
    if blocked is None and into.gated:
        blocked = into.gated[0].note or "a gate refused to submit its shards"
        gate = blocked.split(" gate: ", 1)[0] if " gate: " in blocked else "budget"
    if actions or open_shards or blocked:
        others = tuple(s.shard_id for s in into.others)
        if into.others:
            into.wake.append(state.now + dt.timedelta(seconds=_recheck(poll_every)))
        return Decision(
            actions=tuple(actions),
            wait_until=min(into.wake) if into.wake and not actions else None,
            others=others,
            blocked=blocked,
            gate=gate,
        )
    if state.counts.open:
        # Open items with no shard to carry them: the ledger lost track of them.
        return Decision(
            blocked=f"{state.counts.open} items are open but in no shard that is open; "
            "`llm-assets status` shows them, `llm-assets requeue` sends them again"
        )
    return _finish(state)


def _ids(shards: list[ShardView]) -> tuple[str, ...]:
    return tuple(s.shard_id for s in shards)


def _recheck(poll_every: float) -> float:
    return min(max(poll_every, 0.05), OTHER_RUN_RECHECK_SECONDS)
