"""An operator's cancel of a day, or of a shard, on each batch provider's fake: what the
cancelled batches answered is kept and billed once, the rest become `cancelled` dead letters
that a requeue sends again, and nothing submits a cancelled day until then."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llm_assets import names, steps
from llm_assets.defs.cancel_job import build_cancel_job
from llm_assets.resources.ledger import TERMINAL
from llm_assets.resources.providers.base import BatchStatus
from tests import cli_process
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.gemini_server import FakeGemini
from tests.fakes.openai_server import FakeOpenAI
from tests.harness import (
    CLI,
    DAY,
    Harness,
    fake_harness,
    online_shard,
    open_harness,
    review_spec,
    truthful,
)
from tests.test_gemini_provider import truthful as gemini_truthful

pytestmark = pytest.mark.one_database

FAKES = {"openai": FakeOpenAI, "anthropic": FakeAnthropic, "gemini": FakeGemini}
REVIEWS = 30
"""Three shards of ten."""


@pytest.fixture(params=sorted(FAKES))
def provider(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def day(tmp_path: Path, database_url: str, provider: str) -> Iterator[tuple[Harness, Any]]:
    with FAKES[provider](tmp_path / "fake") as fake:
        fake.responder = gemini_truthful if provider == "gemini" else truthful
        fake.polls_per_state = 1000  # batches stay in progress until cancelled
        with fake_harness(tmp_path, database_url, fake, REVIEWS) as harness:
            yield harness, fake


def context(harness: Harness) -> steps.StepContext:
    return harness.context(created_by="test")


def running(status: BatchStatus) -> bool:
    """Whether a batch runs: only then does a cancel leave part of its lines answered
    (OpenAI's and Gemini's start validating or pending)."""
    return status.state == "running"


def settle_and_import(harness: Harness) -> None:
    """Poll the cancelled batches until they end, then import, as the sensor would; the
    import's materialization says the day was cancelled."""
    for _ in range(20):
        shards = harness.ledger.shards(harness.job_id(), ["submitted", "running"])
        if not shards:
            break
        steps.poll_shards(harness.ledger, harness.provider, shards)
    imported = harness.materialize("batch_results")
    assert imported.success
    [results] = imported.asset_materializations_for_node(f"{harness.spec.name}__batch_results")
    assert results.metadata["day_state"].value == "cancelled"


def test_cancel_mid_day_keeps_what_ran_and_requeue_finishes_the_day(
    day: tuple[Harness, Any], provider: str
) -> None:
    harness, fake = day
    shards = harness.submit()
    assert len(shards) == 3 and all(s.provider_batch_id for s in shards)
    harness.hold_batches(fake, shards, running)

    result = steps.cancel_day(context(harness), reason="wrong prompt")

    assert result.whole_day and len(result.cancelled_batches) == 3
    settle_and_import(harness)
    rows = harness.rows()
    assert all(r["status"] in TERMINAL for r in rows.values())
    kept = {cid for cid, r in rows.items() if r["status"] == "succeeded"}
    cancelled = {cid for cid, r in rows.items() if r["error_class"] == "cancelled"}
    assert kept and cancelled and kept | cancelled == set(rows)
    assert {rows[c]["status"] for c in cancelled} == {"dead_letter"}
    assert all(rows[c]["error_message"].startswith("cancelled: ") for c in cancelled)
    assert all(rows[c]["cost_usd"] > 0 for c in kept)
    job = harness.ledger.get_job(harness.job_id())
    assert job is not None and job.status == "cancelled" and job.cancel_reason == "wrong prompt"

    # A cancelled day is not submitted again, whoever asks.
    blocked = harness.materialize("provider_batches")
    assert not blocked.success or not harness.ledger.shards(harness.job_id(), ["created"])

    requeued = steps.requeue_dead_letters(context(harness), classes={"cancelled"})
    assert requeued.requeued == len(cancelled)
    fake.polls_per_state = 1
    outcome = harness.run_day()

    assert outcome.done and outcome.succeeded == REVIEWS
    rows = harness.rows()
    assert {cid for cid, r in rows.items() if r["attempts"] == 2} == cancelled
    assert harness.labels() == harness.truth
    billed = getattr(fake, "billed", None)
    if billed is not None:  # each request ran to an answer once
        assert set(billed.values()) == {1}


@pytest.mark.parametrize("provider", ["openai"])
def test_a_cancel_from_a_dagster_run_closes_unsent_shards_and_sensors_leave_the_day(
    day: tuple[Harness, Any],
) -> None:
    from tests.test_automation_units import tick as new_data_tick
    from tests.test_sensors import tick as status_tick

    harness, fake = day
    assert harness.materialize("input_snapshot", "request_shards").success
    job = build_cancel_job(harness.spec)
    config = {"date": DAY.isoformat(), "reason": "source file is wrong"}

    ran = job.execute_in_process(
        run_config={"ops": {f"{harness.spec.name}__cancel_day": {"config": config}}},
        resources=harness.resources,
        instance=harness.instance,
    )

    assert ran.success
    rows = harness.rows()
    assert {(r["status"], r["error_class"]) for r in rows.values()} == {
        ("dead_letter", "cancelled")
    }
    assert {r["attempts"] for r in rows.values()} == {0}
    shards = harness.ledger.shards(harness.job_id())
    assert {(s.status, s.raw_status) for s in shards} == {("imported", "cancelled")}
    assert not [c for c in fake.calls.entries() if c["method"] == "POST"], "nothing was sent"
    # The sensors leave the day alone: a changed source file requests no run for it, and
    # the cancelled day is reported (its dead letters and what it cost), never validated or
    # published.
    source = next((harness.home / "reviews").glob("*.jsonl"))
    source.write_text(source.read_text() + source.read_text().splitlines()[0] + "\n")
    requests = new_data_tick(harness.spec, harness.settings, harness.instance, None).run_requests
    assert DAY.isoformat() not in {r.partition_key for r in requests}
    [report] = status_tick(harness).run_requests
    assert {key.path[-1] for key in report.asset_selection or []} == set(names.REPORT_ASSETS)
    reported = harness.materialize(*names.REPORT_ASSETS)
    assert reported.success
    assert status_tick(harness).run_requests == []
    # The day's report says it was cancelled, by whom and why, and how to send it again.
    [cost] = reported.asset_materializations_for_node(f"{harness.spec.name}__cost_report")
    assert cost.metadata["day_state"].value == "cancelled"
    said = cost.metadata["cancelled"].value
    assert "(source file is wrong)" in said and "--class cancelled" in said

    requeued = steps.requeue_dead_letters(context(harness), classes={"cancelled"})
    assert requeued.requeued == REVIEWS
    fake.polls_per_state = 1
    outcome = harness.run_day()
    assert outcome.done and outcome.succeeded == REVIEWS


@pytest.mark.parametrize("provider", ["openai"])
def test_the_cli_cancels_one_shard_and_the_rest_of_the_day_goes_on(
    day: tuple[Harness, Any],
) -> None:
    harness, fake = day
    shards = harness.submit()
    harness.hold_batches(fake, shards, running)
    target = shards[1]
    short = target.shard_id[len(target.job_id) + 1 :]
    env = harness.cli_env(fake)
    args = [CLI, "cancel", harness.spec.name, "--date", DAY.isoformat(), "--shard", short]

    done = cli_process.run(
        [*args, "--poll-interval", "0.05", "--reason", "bad shard"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert done.returncode == 0, done.stderr
    assert "--class cancelled" in done.stdout
    rows = harness.rows()
    mine = {cid: r for cid, r in rows.items() if r["shard_id"] == target.shard_id}
    assert {r["status"] for r in mine.values()} == {"succeeded", "dead_letter"}
    assert {r["error_class"] for r in mine.values() if r["status"] == "dead_letter"} == {
        "cancelled"
    }
    others = [s for s in harness.ledger.shards(harness.job_id()) if s.shard_id != target.shard_id]
    assert {s.status for s in others} == {"running"}  # not cancelled, still at the provider
    job = harness.ledger.get_job(harness.job_id())
    assert job is not None and job.cancelled_at is None
    status = cli_process.run(
        [CLI, "status", harness.spec.name, "--date", DAY.isoformat(), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    [listed] = json.loads(status.stdout)["jobs"]
    assert {s["shard_id"] for s in listed["shards"] if s["cancelled"]} == {target.shard_id}
    assert listed["cancelled"] is None

    fake.polls_per_state = 1
    outcome = harness.run_day()
    # The other shards finish; the cancelled items stay cancelled until requeued.
    assert outcome.done
    assert outcome.dead_letters_by_class == {"cancelled": len(mine) - len(mine) // 2}
    assert outcome.succeeded == REVIEWS - outcome.dead_letters


@pytest.mark.fake_server("bedrock", min_records=10)
def test_a_bedrock_day_is_cancelled_with_stop_model_invocation_job(
    tmp_path: Path, database_url: str, moto_s3: Any, fake: Any
) -> None:
    import uuid

    from llm_assets.resources.providers.bedrock import BedrockBatchProvider
    from llm_assets.resources.storage import ArtifactStorage
    from tests.test_bedrock_provider import ROLE, bedrock_spec
    from tests.test_bedrock_provider import truthful as bedrock_truthful

    fake.responder = bedrock_truthful
    provider = BedrockBatchProvider(
        role_arn=ROLE, endpoint_url=fake.endpoint_url, retry_base_seconds=0.01
    )
    spec = bedrock_spec() | {"bedrock": {"min_records_per_job": 10}}
    spec["sharding"] = {"max_requests_per_shard": 10}
    with open_harness(tmp_path, database_url, spec, provider, REVIEWS) as harness:
        harness.storage = ArtifactStorage(base_url=f"s3://{moto_s3.bucket}/{uuid.uuid4().hex}")
        shards = harness.submit()
        harness.hold_batches(fake, shards, lambda status: status.raw_status == "InProgress")

        result = steps.cancel_day(context(harness), reason="stop")

        assert len(result.cancelled_batches) == 3
        stops = [c for c in fake.calls.entries() if c.get("operation") == "StopModelInvocationJob"]
        assert len(stops) == 3
        fake.polls_per_state = 1
        settle_and_import(harness)
        rows = harness.rows()
        kept = [r for r in rows.values() if r["status"] == "succeeded"]
        cancelled = [r for r in rows.values() if r["error_class"] == "cancelled"]
        assert kept and cancelled and len(kept) + len(cancelled) == REVIEWS
        assert {r["attempts"] for r in rows.values()} == {1}


def test_a_local_provider_day_is_cancelled(tmp_path: Path, database_url: str) -> None:
    from llm_assets.resources.providers.local import LocalProvider

    provider = LocalProvider(
        state_dir=str(tmp_path / "local_provider"), work_budget_seconds=0.0, chunk_size=4
    )
    spec = review_spec("local", "all-MiniLM-L6-v2", sharding={"max_requests_per_shard": 30})
    spec["output"] = {
        "format": "json",
        "schema": {"label": {"type": "str", "isin": ["positive", "negative"]}},
    }
    with open_harness(tmp_path, database_url, spec, provider, REVIEWS) as harness:
        [shard] = harness.submit()
        harness.provider.poll(shard.provider_batch_id)  # one chunk of four runs

        result = steps.cancel_day(context(harness), reason="stop")

        assert result.cancelled_batches == [shard.provider_batch_id]
        settle_and_import(harness)
        rows = harness.rows()
        kept = [r for r in rows.values() if r["status"] == "succeeded"]
        cancelled = [r for r in rows.values() if r["error_class"] == "cancelled"]
        assert len(kept) == 4 and len(cancelled) == REVIEWS - 4


@pytest.mark.fake_server("online")
def test_the_online_worker_stops_when_its_shard_is_cancelled(
    tmp_path: Path, database_url: str, fake: Any
) -> None:
    with online_shard(tmp_path, database_url, fake) as harness:
        # Cancel once the worker has checkpointed some answers.
        harness.stop_while_sending(
            lambda: steps.cancel_day(context(harness), reason="stop sending")
        )

        [shard] = harness.ledger.shards(harness.job_id())
        assert (shard.status, shard.raw_status) == ("cancelled", "cancelled")
        sent = len(fake.calls())
        assert sent < 60, "the worker stopped sending"
        assert harness.materialize("batch_results").success
        rows = harness.rows()
        kept = [r for r in rows.values() if r["status"] == "succeeded"]
        cancelled = [r for r in rows.values() if r["error_class"] == "cancelled"]
        assert len(kept) >= 4 and len(kept) + len(cancelled) == 60
        assert len(fake.calls()) == sent  # nothing more was sent after it stopped
