"""The anthropic adapter through the official SDK against the fake Message Batches server."""

import datetime as dt
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llm_assets import steps
from llm_assets.resources.ledger import TERMINAL, utcnow
from llm_assets.resources.providers.base import ShardSubmission
from tests.fakes.anthropic_server import FakeAnthropic, LostResponseFault
from tests.fakes.common import ControlFault
from tests.harness import Harness, first_time, open_harness, provider_for, review_spec

# One database (PostgreSQL in CI): these tests exercise the provider and the gate; the ledger
# and pipeline tests compare SQLite and PostgreSQL.
pytestmark = [pytest.mark.one_database, pytest.mark.fake_server("anthropic")]


@pytest.fixture
def harness(tmp_path: Path, database_url: str, fake: FakeAnthropic) -> Iterator[Harness]:
    spec = review_spec("anthropic", "claude-haiku-4-5")
    with open_harness(tmp_path, database_url, spec, provider_for(fake)) as harness:
        yield harness


def test_a_day_completes_with_item_faults_retrying_only_what_failed(
    harness: Harness, fake: FakeAnthropic
) -> None:
    fake.item_fault = first_time(
        {1: "api_error", 2: "overloaded", 3: "expired", 4: "missing", 5: "duplicate", 6: "canceled"}
    )
    never = "invalid_request"
    original = fake.item_fault

    def with_permanent(custom_id: str, params: dict[str, Any]) -> str | None:
        if "Order 1007 " in params["messages"][0]["content"]:
            return never
        return original(custom_id, params)

    fake.item_fault = with_permanent

    outcome = harness.run_day()

    assert outcome.open_items == 0
    rows = harness.rows()
    assert len(rows) == len(harness.truth)
    assert all(r["status"] in TERMINAL for r in rows.values())
    by_source = {r["source_id"]: r for r in rows.values()}
    dead = by_source["R-20261102-0007"]
    assert (dead["status"], dead["error_class"], dead["error_code"]) == (
        "dead_letter",
        "deterministic",
        "invalid_request_error",
    )
    assert dead["attempts"] == 1
    labels = harness.labels()
    assert len(labels) == len(harness.truth) - 1
    assert all(labels[source] == harness.truth[source] for source in labels)
    retried = {f"R-20261102-{n:04d}" for n in (1, 2, 3, 4, 6)}
    assert {s for s, r in by_source.items() if r["attempts"] == 2} == retried
    submitted = Counter(fake.submitted_custom_ids())
    for custom_id, row in rows.items():
        assert submitted[custom_id] == (2 if row["source_id"] in retried else 1), row["source_id"]
    assert all(r["input_tokens"] > 0 for r in rows.values() if r["status"] == "succeeded")


def test_control_plane_429_and_5xx_are_retried_without_a_second_batch(
    harness: Harness, fake: FakeAnthropic
) -> None:
    fake.faults.add(
        ControlFault("POST", "/v1/messages/batches", status=429, times=2, retry_after=0)
    )
    fake.faults.add(ControlFault("GET", "/v1/messages/batches/", status=500, times=2))
    fake.faults.add(ControlFault("GET", "/v1/messages/batches/", status=529, times=1))

    outcome = harness.run_day()

    assert outcome.open_items == 0
    assert outcome.succeeded == len(harness.truth)
    shards = harness.ledger.shards(harness.job_id())
    assert len(fake.batch_ids()) == len(shards) == 3
    statuses = [c["status"] for c in fake.calls.entries() if c["method"] == "POST"]
    assert statuses.count(429) == 2


def test_a_lost_create_response_does_not_create_a_second_batch(
    harness: Harness, fake: FakeAnthropic
) -> None:
    fake.faults.add(LostResponseFault("POST", "/v1/messages/batches", times=1))

    outcome = harness.run_day()

    assert outcome.succeeded == len(harness.truth)
    shards = harness.ledger.shards(harness.job_id())
    assert sorted(fake.batch_ids()) == sorted(s.provider_batch_id for s in shards)
    assert Counter(fake.submitted_custom_ids()) == Counter({cid: 1 for cid in harness.rows()})


def test_a_crash_between_create_and_record_is_reconciled(
    harness: Harness, fake: FakeAnthropic
) -> None:
    assert harness.materialize("input_snapshot", "request_shards").success
    job_id = harness.job_id()
    first = harness.ledger.shards(job_id)[0]
    # What a crash leaves behind: the intent is recorded, the batch exists, its id is not.
    harness.ledger.update_shard(first.shard_id, submit_intent_at=utcnow())
    shard = harness.ledger.get_shard(first.shard_id)
    assert shard is not None
    created = harness.provider.submit(
        ShardSubmission(
            shard_id=shard.shard_id,
            job_id=job_id,
            pipeline=harness.spec.name,
            input_uri=shard.input_uri,
            item_count=shard.item_count,
        ),
        harness.storage,
    )

    outcome = harness.run_day()

    assert outcome.succeeded == len(harness.truth)
    assert harness.ledger.get_shard(first.shard_id).provider_batch_id == created
    assert Counter(fake.submitted_custom_ids()) == Counter({cid: 1 for cid in harness.rows()})


def test_an_ambiguous_reconciliation_stops_without_submitting(
    harness: Harness, fake: FakeAnthropic
) -> None:
    assert harness.materialize("input_snapshot", "request_shards").success
    first = harness.ledger.shards(harness.job_id())[0]
    harness.ledger.update_shard(first.shard_id, submit_intent_at=utcnow() - dt.timedelta(seconds=1))
    client = harness.provider.client
    created = []
    for batch in range(2):
        created.append(
            client.messages.batches.create(
                requests=[
                    {
                        "custom_id": f"other-{batch}-{n}",
                        "params": {
                            "model": "claude-haiku-4-5",
                            "max_tokens": 10,
                            "messages": [{"role": "user", "content": "hi"}],
                        },
                    }
                    for n in range(first.item_count)
                ]
            )
        )
    before = fake.batch_ids()

    result = harness.materialize("provider_batches")

    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    description = failure.step_failure_data.user_failure_data.description
    assert "stopped to avoid paying twice" in description
    assert first.shard_id in description
    assert fake.batch_ids() == before
    assert harness.ledger.get_shard(first.shard_id).provider_batch_id is None

    # What the message asks for: cancel the batch that is not this shard's. The other one is
    # then adopted; only the day's other shards get new batches.
    client.messages.batches.cancel(created[0].id)
    assert harness.materialize("provider_batches").success
    shards = harness.ledger.shards(harness.job_id())
    assert harness.ledger.get_shard(first.shard_id).provider_batch_id == created[1].id
    assert len(fake.batch_ids()) == len(before) + len(shards) - 1


def test_a_server_restart_mid_batch_loses_nothing(harness: Harness, fake: FakeAnthropic) -> None:
    fake.polls_per_state = 3
    assert harness.materialize("input_snapshot", "request_shards", "provider_batches").success
    job_id = harness.job_id()
    steps.poll_shards(harness.ledger, harness.provider, harness.ledger.shards(job_id))
    fake.restart()

    outcome = harness.run_day()

    assert outcome.succeeded == len(harness.truth)
    assert len(fake.batch_ids()) == len(harness.ledger.shards(job_id))


def test_an_expired_batch_resubmits_only_its_expired_requests(
    harness: Harness, fake: FakeAnthropic
) -> None:
    expired_once: set[str] = set()

    def outcome_of(batch: dict[str, Any]) -> str:
        if not expired_once:
            expired_once.add(batch["id"])
            return "expired"
        return "ended"

    fake.batch_outcome = outcome_of

    outcome = harness.run_day()

    assert outcome.succeeded == len(harness.truth)
    submitted = Counter(fake.submitted_custom_ids())
    twice = {cid for cid, n in submitted.items() if n == 2}
    rows = harness.rows()
    assert twice and all(rows[cid]["attempts"] == 2 for cid in twice)
    assert all(n <= 2 for n in submitted.values())
    shards = harness.ledger.shards(harness.job_id())
    assert [s.round for s in shards].count(1) == 1
    assert shards[-1].item_count == len(twice)


def test_cancel_ends_the_batch_and_retries_its_canceled_requests(
    harness: Harness, fake: FakeAnthropic
) -> None:
    fake.polls_per_state = 2
    assert harness.materialize("input_snapshot", "request_shards", "provider_batches").success
    first = harness.ledger.shards(harness.job_id())[0]
    assert first.provider_batch_id is not None

    status = harness.provider.cancel(first.provider_batch_id)
    assert status.raw_status == "canceling"

    outcome = harness.run_day()

    assert outcome.succeeded == len(harness.truth)
    submitted = Counter(fake.submitted_custom_ids())
    assert sorted(submitted.values()).count(2) == first.item_count - first.item_count // 2
