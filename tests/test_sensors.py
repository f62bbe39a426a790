"""The batch-status sensor: cheap polls, progress observations, one import run per batch set."""

import datetime as dt
from collections.abc import Iterator, Sequence
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from llm_assets import names, steps
from llm_assets.defs import sensors
from llm_assets.defs.factory import asset_key, build_pipeline_assets
from llm_assets.defs.jobs import ASSETS_OF
from llm_assets.defs.sensors import build_batch_status_sensor
from llm_assets.resources.ledger import shard_table
from tests.fakes.anthropic_server import FakeAnthropic
from tests.harness import DAY, Harness, fake_harness, first_time

pytestmark = pytest.mark.fake_server("anthropic")


@pytest.fixture
def harness(tmp_path: Path, database_url: str, fake: FakeAnthropic) -> Iterator[Harness]:
    with fake_harness(tmp_path, database_url, fake) as harness:
        yield harness


def keys(harness: Harness, steps_of_run: Sequence[str]) -> set[dg.AssetKey]:
    return {asset_key(harness.spec, step) for step in steps_of_run}


def tick(
    harness: Harness, sensor: dg.SensorDefinition | None = None, cursor: str | None = None
) -> dg.SensorResult:
    """One evaluation of a sensor of the harness's pipeline (its batch-status sensor unless
    another is given), with the cursor of the tick before (none: as on a first tick)."""
    sensor = sensor or build_batch_status_sensor(harness.spec)
    defs = dg.Definitions(
        assets=build_pipeline_assets(harness.spec, harness.settings),
        sensors=[sensor],
        resources=harness.resources,
    )
    context = dg.build_sensor_context(
        instance=harness.instance,
        resources=harness.resources,
        definitions=defs,
        sensor_name=sensor.name,
        cursor=cursor,
    )
    data = sensor.evaluate_tick(context)
    return dg.SensorResult(
        run_requests=data.run_requests,
        asset_events=data.asset_events,
        skip_reason=data.skip_message,
        cursor=data.cursor,
    )


def test_sensor_records_progress_then_requests_the_import_of_ended_batches(
    harness: Harness, fake: FakeAnthropic
) -> None:
    fake.polls_per_state = 2
    shards = harness.submit()

    first = tick(harness)

    # One observation of the day on provider_batches: its state, and every shard's batch.
    assert first.run_requests == []
    [event] = first.asset_events
    assert isinstance(event, dg.AssetObservation)
    assert event.asset_key == asset_key(harness.spec, "provider_batches")
    assert event.partition == DAY.isoformat()
    assert event.tags[names.DAY_STATE_TAG] == "running"
    assert event.metadata["day_state"].value == "running"
    items = len(harness.truth)
    assert event.description == f"running: 3 batches in flight; 0 of {items} items ended"
    table = event.metadata["provider_batches"].value
    assert all(str(s.provider_batch_id) in table for s in shards)
    assert table.count("| running |") == len(shards) == 3

    # The next tick, with nothing changed at the provider, observes nothing new.
    second = tick(harness, cursor=first.cursor)
    assert second.run_requests == [] and second.asset_events == []

    cursor = second.cursor
    observed: list[dg.AssetObservation] = []
    while not (result := tick(harness, cursor=cursor)).run_requests:
        cursor = result.cursor
        observed += [e for e in result.asset_events if isinstance(e, dg.AssetObservation)]
    observed += [e for e in result.asset_events if isinstance(e, dg.AssetObservation)]

    [request] = result.run_requests
    assert request.partition_key == DAY.isoformat()
    assert request.run_key == ",".join(sorted(s.provider_batch_id for s in shards))
    # The import's run goes on to validate, publish and report the day, as the named job.
    assert request.job_name == f"{harness.spec.name}__import"
    assert set(request.asset_selection) == keys(harness, ASSETS_OF[steps.Step.IMPORT])
    assert set(request.asset_selection) >= keys(harness, names.IMPORT_ASSETS)

    retrieves = [c for c in fake.calls.entries() if c["method"] == "GET"]
    assert all("/results" not in c["path"] for c in retrieves)

    # An import run that ended after the import (stopped, or the UI's materialize of
    # batch_results alone): the validation is asked for, the report in the same run.
    assert harness.materialize("batch_results").success
    [finish] = tick(harness).run_requests
    assert finish.run_key.startswith(f"finish:{harness.job_id()}:3:")
    assert set(finish.asset_selection) == keys(harness, ASSETS_OF[steps.Step.VALIDATE])
    assert finish.job_name == f"{harness.spec.name}__finish"
    assert set(finish.asset_selection) == keys(harness, (*names.GATED_ASSETS, *names.REPORT_ASSETS))
    assert [r.run_key for r in tick(harness).run_requests] == [finish.run_key]
    # A validation without its report (the UI again): the report follows, whatever the
    # checks said; then the day is done and asks for nothing more.
    assert harness.materialize(*names.GATED_ASSETS).success
    [report] = tick(harness).run_requests
    assert report.run_key == finish.run_key.replace("finish:", "report:", 1)
    assert set(report.asset_selection) == keys(harness, names.REPORT_ASSETS)
    assert report.job_name == f"{harness.spec.name}__report"
    assert harness.materialize(*names.REPORT_ASSETS).success
    assert tick(harness).run_requests == []
    # The last observation before the import: every batch ended, every request done.
    table = observed[-1].metadata["provider_batches"].value
    assert all(f"| {s.item_count}/{s.item_count} |" in table for s in shards)
    assert "next: import" in str(observed[-1].description)
    # Once the day is finished, the tick after the one that saw it open says so once.
    done = tick(harness, cursor=result.cursor)
    [last] = done.asset_events
    assert last.tags[names.DAY_STATE_TAG] == "done"
    assert tick(harness, cursor=done.cursor).asset_events == []


def test_sensor_requests_submission_of_planned_retry_shards(
    harness: Harness, fake: FakeAnthropic
) -> None:
    fake.polls_per_state = 0
    fake.item_fault = first_time({2: "api_error"})
    assert harness.materialize(
        "input_snapshot", "request_shards", "provider_batches", "batch_results"
    ).success
    [retry] = harness.ledger.shards(harness.job_id(), ["created"])

    result = tick(harness)

    [request] = result.run_requests
    assert request.run_key == f"submit:{retry.shard_id}"
    assert request.asset_selection == [asset_key(harness.spec, "provider_batches")]
    assert tick(harness).run_requests == [request]  # the same run, which Dagster starts once


def test_sensor_stops_polling_at_its_deadline_and_resumes_next_tick(
    harness: Harness, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.polls_per_state = 5
    harness.submit()
    monkeypatch.setattr(sensors, "POLL_DEADLINE_SECONDS", -1.0)

    def polls() -> int:
        return sum(1 for c in fake.calls.entries() if c["method"] == "GET")

    tick(harness)
    assert polls() == 0

    monkeypatch.setattr(sensors, "POLL_DEADLINE_SECONDS", 30.0)
    tick(harness)
    assert polls() == 3


def test_a_tick_polls_only_the_batches_that_are_due(
    harness: Harness, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sensor ticks every few seconds so a day's next run follows the last one at once,
    but an old batch just polled waits its turn (at most POLL_EVERY_SECONDS) before the
    provider is asked about it again."""
    monkeypatch.setattr(sensors, "POLL_EVERY_SECONDS", 60.0)  # as deployed
    fake.polls_per_state = 1000
    shards = harness.submit()
    an_hour_ago = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    with harness.ledger.engine.begin() as conn:
        conn.execute(
            sa.update(shard_table)
            .where(shard_table.c.job_id == harness.job_id())
            .values(submitted_at=an_hour_ago, updated_at=an_hour_ago)
        )

    def polls() -> int:
        return sum(1 for c in fake.calls.entries() if c["method"] == "GET")

    first = tick(harness)
    asked = polls()
    assert asked == len(shards) == 3
    # Nothing polled, nothing changed: no observation either.
    assert tick(harness, cursor=first.cursor).asset_events == []
    assert polls() == asked
    assert build_batch_status_sensor(harness.spec).minimum_interval_seconds == sensors.TICK_SECONDS
    assert sensors.TICK_SECONDS <= 15
