"""The lifecycle's decision on days written out by hand: one rule per test, no I/O."""

import datetime as dt

from llm_assets.resources.ledger import JobCounts
from llm_assets.steps.day_model import DayState, ShardView, Step
from llm_assets.steps.lifecycle import FRESH_SHARD_GRACE, GATED, PAUSED, decide, next_poll_at

NOW = dt.datetime(2026, 11, 2, 12, 0, tzinfo=dt.UTC)
MINUTE = dt.timedelta(minutes=1)


def shard(n: int = 0, status: str = "created", **fields: object) -> ShardView:
    values: dict[str, object] = {
        "shard_id": f"job-r00-s{n:05d}",
        "status": status,
        "round": 0,
        "provider_batch_id": f"batch-{n}" if status not in ("created", "uploaded") else None,
        "intent": status not in ("created", "uploaded"),
        "not_before": None,
        "raw_status": None,
        "cancelled": False,
        "cancel_sent": False,
        "online": False,
        "busy": False,
        "created_at": NOW - 10 * MINUTE,
        "submitted_at": NOW - 10 * MINUTE,
        "touched_at": NOW - 10 * MINUTE,
        "imported_at": NOW - MINUTE if status == "imported" else None,
    }
    values.update(fields)
    return ShardView(**values)  # type: ignore[arg-type]


def day(*shards: ShardView, open_items: int = 3, **fields: object) -> DayState:
    counts = JobCounts(total=3, by_status={"succeeded": 3 - open_items, "submitted": open_items})
    values: dict[str, object] = {"now": NOW, "has_job": True, "job_id": "job"}
    values.update(fields)
    return DayState(shards=shards, counts=counts, **values)  # type: ignore[arg-type]


def steps_of(state: DayState, poll_every: float = 30.0) -> list[Step]:
    return [action.step for action in decide(state, poll_every=poll_every).actions]


def test_a_day_without_a_job_is_built_unless_paused() -> None:
    assert steps_of(DayState(now=NOW, has_job=False)) == [Step.BUILD]
    paused = decide(DayState(now=NOW, has_job=False, paused="paused by ops"))
    assert (paused.actions, paused.blocked, paused.gate) == ((), "paused by ops", PAUSED)
    assert decide(DayState(now=NOW, has_job=False, no_source_rows="no rows")).done


def test_a_new_first_round_shard_is_left_to_its_run_then_submitted_by_anyone() -> None:
    fresh = shard(created_at=NOW - MINUTE)
    waiting = decide(day(fresh))
    assert waiting.actions == () and waiting.others == (fresh.shard_id,)
    assert waiting.wait_until is not None
    assert waiting.wait_until <= NOW - MINUTE + FRESH_SHARD_GRACE

    stale = shard(created_at=NOW - FRESH_SHARD_GRACE - MINUTE)
    [submit] = decide(day(stale)).actions
    assert (submit.step, submit.key) == (Step.SUBMIT, f"submit:{stale.shard_id}")


def test_a_retry_or_quota_wait_is_submitted_when_it_falls_due() -> None:
    later = shard(round=1, not_before=NOW + MINUTE)
    assert decide(day(later)).wait_until == NOW + MINUTE
    quota = shard(round=1, raw_status="waiting_for_quota", not_before=NOW - MINUTE)
    [submit] = decide(day(quota)).actions
    assert submit.key == f"quota:{quota.shard_id}:{quota.not_before.isoformat()}"


def test_a_gate_holds_its_shards_until_an_operator_acts() -> None:
    held = shard(raw_status=GATED, note="budget gate: upper bound $3 over $1")
    decision = decide(day(held))
    assert decision.actions == ()
    assert (decision.gate, decision.blocked) == ("budget", "budget gate: upper bound $3 over $1")


def test_a_pause_holds_what_would_be_sent_and_lets_batches_come_back() -> None:
    state = day(shard(0, raw_status=PAUSED), shard(1, "completed"), paused="paused by ops")
    decision = decide(state)
    assert [a.step for a in decision.actions] == [Step.IMPORT]
    assert decision.gate == PAUSED
    resumed = decide(day(shard(0, raw_status=PAUSED, note="held back: paused by ops")))
    [submit] = resumed.actions
    assert submit.key.startswith("held:job-r00-s00000:")


def test_an_unrecorded_create_is_reconciled_before_a_cancel_or_pause_closes_it() -> None:
    unrecorded = shard(intent=True)
    assert steps_of(day(unrecorded, cancelled="stop")) == [Step.RECONCILE]
    assert steps_of(day(unrecorded, paused="p")) == [Step.RECONCILE]
    assert steps_of(day(shard(), cancelled="stop")) == [Step.CLOSE]
    assert steps_of(day(shard(cancelled=True))) == [Step.CLOSE]
    # Another run is submitting it: it sees the cancel itself; nobody reconciles under it.
    busy = decide(day(shard(intent=True, busy=True), cancelled="stop"))
    assert busy.actions == () and busy.others


def test_a_cancelled_batch_is_cancelled_once_then_polled() -> None:
    assert steps_of(day(shard(0, "running"), cancelled="stop")) == [Step.CANCEL]
    assert steps_of(day(shard(0, "running", cancel_sent=True), cancelled="stop")) == [Step.POLL]
    assert steps_of(day(shard(0, "running", cancelled=True))) == [Step.CANCEL]


def test_an_online_shard_is_resumed_held_or_ended_by_the_day_not_polled() -> None:
    online = shard(0, "running", online=True, provider_batch_id="online-job-r00-s00000")
    assert steps_of(day(online)) == [Step.SUBMIT]
    assert decide(day(online, paused="p")).gate == PAUSED
    assert steps_of(day(online, cancelled="stop")) == [Step.CANCEL]
    working = shard(0, "running", online=True, busy=True)
    assert decide(day(working, cancelled="stop")).others == (working.shard_id,)


def test_batches_are_polled_less_often_as_they_age() -> None:
    young = shard(0, "running", submitted_at=NOW - 5 * MINUTE / 60, touched_at=NOW)
    old = shard(0, "running", submitted_at=NOW - 200 * MINUTE, touched_at=NOW)
    assert next_poll_at(young, NOW, 30.0) == NOW + dt.timedelta(seconds=1)
    assert next_poll_at(old, NOW, 30.0) == NOW + dt.timedelta(seconds=30)
    assert next_poll_at(old, NOW, 0.0) == NOW
    decision = decide(day(old))
    assert decision.actions == () and decision.wait_until == NOW + dt.timedelta(seconds=30)
    assert steps_of(day(old), poll_every=0.0) == [Step.POLL]
    assert steps_of(day(old, polls_do_work=True)) == [Step.POLL]


def test_ended_batches_are_imported_and_left_retries_planned() -> None:
    [action] = decide(day(shard(0, "expired"), shard(1, "imported"))).actions
    assert (action.step, action.key) == (Step.IMPORT, "batch-0")
    planned = decide(
        DayState(
            now=NOW,
            has_job=True,
            job_id="job",
            shards=(shard(0, "imported"),),
            counts=JobCounts(total=2, by_status={"retry": 1, "succeeded": 1}),
        )
    )
    [plan] = planned.actions
    assert (plan.step, plan.key) == (Step.IMPORT, "plan:job:1")


def finished(**fields: object) -> DayState:
    return day(shard(0, "imported"), open_items=0, **fields)


def test_a_finished_day_is_validated_then_reported_then_done() -> None:
    [validate] = decide(finished()).actions
    assert validate.step == Step.VALIDATE and validate.key.startswith("finish:job:1:")
    [report] = decide(finished(validated_at=NOW)).actions
    assert report.step == Step.REPORT and report.key.startswith("report:job:1:")
    assert decide(finished(validated_at=NOW, reported_at=NOW)).done
    # A later import (a requeue) finishes it again.
    assert steps_of(finished(validated_at=NOW - 2 * MINUTE, reported_at=NOW)) == [Step.VALIDATE]


def test_an_eval_ends_at_its_validation_and_a_cancelled_day_at_its_report() -> None:
    assert decide(finished(is_eval=True, validated_at=NOW)).done
    assert steps_of(finished(cancelled="stop")) == [Step.REPORT]
    assert decide(finished(cancelled="stop", reported_at=NOW)).done


def test_items_open_in_no_open_shard_block_the_day_with_a_reason() -> None:
    lost = decide(day(shard(0, "imported"), open_items=2))
    assert lost.blocked is not None and "open but in no shard" in lost.blocked
