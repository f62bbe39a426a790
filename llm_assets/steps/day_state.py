"""A day's state in one word and one sentence, for the operator: what the UI shows on the
day's partition (the batch-status sensor's observation of provider_batches) and what a
status line says.

The word is one of DAY_STATES, read from what the lifecycle decided (steps/lifecycle.py):
cancelled, paused, blocked (a gate waits for an operator), waiting for quota, running
(batches in flight, retries waiting, imports or the finish due) or done.
"""

import dataclasses

from llm_assets.resources.providers.base import WAITING_FOR_QUOTA, ShardState
from llm_assets.steps import day_model, lifecycle

CANCELLED = "cancelled"
PAUSED = "paused"
BLOCKED = "blocked"
WAITING_FOR_QUOTA_STATE = "waiting for quota"
RUNNING = "running"
DONE = "done"
EMPTY = "empty"
DAY_STATES = (EMPTY, RUNNING, WAITING_FOR_QUOTA_STATE, PAUSED, CANCELLED, BLOCKED, DONE)
"""Every word a day's state can be; `empty` is a day with no source rows (it has no job, so
the sensor never sees it; its snapshot says so)."""


@dataclasses.dataclass(frozen=True)
class DayStateView:
    state: str
    """One of DAY_STATES."""
    description: str
    """What the day is doing or waiting for, in one sentence."""


def day_state(state: day_model.DayState, decision: day_model.Decision) -> DayStateView:
    """The day's state as the operator reads it, from the lifecycle's view and decision."""
    counts = state.counts
    answered = f"{counts.total - counts.open} of {counts.total} items ended"
    if state.no_source_rows:
        return DayStateView(EMPTY, state.no_source_rows)
    if state.cancelled is not None:
        open_ = f"; {counts.open} still closing" if counts.open else ""
        return DayStateView(CANCELLED, f"{state.cancelled}; {answered}{open_}")
    if decision.done:
        return DayStateView(DONE, f"{answered}; validated and reported")
    if decision.blocked is not None:
        kind = PAUSED if decision.gate == lifecycle.PAUSED else BLOCKED
        return DayStateView(kind, f"{decision.blocked}; {answered}")
    in_flight = sum(1 for s in state.shards if s.in_flight)
    quota = [
        s
        for s in state.shards
        if s.raw_status == WAITING_FOR_QUOTA and s.status != ShardState.IMPORTED
    ]
    if quota and not in_flight:
        return DayStateView(
            WAITING_FOR_QUOTA_STATE,
            f"{len(quota)} shards wait for room under the provider's quota; {answered}",
        )
    parts = [f"{in_flight} batches in flight"] if in_flight else []
    if quota:
        parts.append(f"{len(quota)} shards wait for quota")
    steps_due = sorted({a.step.value for a in decision.actions if a.step in day_model.HEAVY})
    if steps_due:
        parts.append(f"next: {', '.join(steps_due)}")
    return DayStateView(RUNNING, "; ".join([*parts, answered]))
