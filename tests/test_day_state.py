"""A day's state as the operator reads it (steps/day_state.py), from days written out by
hand and the lifecycle's own decision on them."""

import pytest

from llm_assets.resources.providers.base import WAITING_FOR_QUOTA
from llm_assets.steps.day_model import DayState
from llm_assets.steps.day_state import DAY_STATES, day_state
from llm_assets.steps.lifecycle import GATED, PAUSED, decide
from tests.test_lifecycle import NOW, day, shard


def state_of(state: DayState) -> tuple[str, str]:
    view = day_state(state, decide(state, poll_every=30.0))
    assert view.state in DAY_STATES
    return view.state, view.description


def test_batches_in_flight_are_running_with_what_comes_next() -> None:
    assert state_of(day(shard(0, "running"), shard(1, "submitted"), open_items=3)) == (
        "running",
        "2 batches in flight; 0 of 3 items ended",
    )
    state, words = state_of(day(shard(0, "completed"), open_items=3))
    assert (state, words) == ("running", "next: import; 0 of 3 items ended")


def test_shards_held_by_the_quota_wait_for_it() -> None:
    waiting = shard(0, "created", raw_status=WAITING_FOR_QUOTA, not_before=NOW.replace(hour=13))
    assert state_of(day(waiting)) == (
        "waiting for quota",
        "1 shards wait for room under the provider's quota; 0 of 3 items ended",
    )
    # With a batch of the day still in flight, the day runs and says what waits.
    state, words = state_of(day(waiting, shard(1, "running")))
    assert state == "running" and "1 shards wait for quota" in words


def test_a_pause_a_gate_and_a_cancel_each_say_so() -> None:
    paused = day(shard(0, raw_status=PAUSED), paused="paused by ops: provider incident")
    assert state_of(paused) == ("paused", "paused by ops: provider incident; 0 of 3 items ended")
    gated = shard(raw_status=GATED, note="budget gate: upper bound $3 over $1")
    assert state_of(day(gated)) == (
        "blocked",
        "budget gate: upper bound $3 over $1; 0 of 3 items ended",
    )
    cancelled = day(shard(0, "cancelled"), open_items=0, cancelled="cancelled by ops")
    assert state_of(cancelled) == ("cancelled", "cancelled by ops; 3 of 3 items ended")


def test_a_finished_day_is_done_and_an_empty_one_empty() -> None:
    finished = day(shard(0, "imported"), open_items=0, validated_at=NOW, reported_at=NOW)
    assert state_of(finished) == ("done", "3 of 3 items ended; validated and reported")
    empty = DayState(now=NOW, has_job=False, no_source_rows="no source rows for 2026-11-03")
    assert state_of(empty) == ("empty", "no source rows for 2026-11-03")


@pytest.mark.parametrize("state", DAY_STATES)
def test_every_state_fits_a_dagster_tag(state: str) -> None:
    tag = state.replace(" ", "_")
    assert tag.replace("_", "").isalnum() and len(tag) <= 63
