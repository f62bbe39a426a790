"""'Materialize all' of a day whose batch is still in flight: validation and the steps after it
are skipped with a reason, the batch-status sensor finishes the day, and the day is announced
once: one post to the webhook, whatever runs, failures and sensor ticks came before and after."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from llm_assets import names
from llm_assets.defs.checks import OUTPUTS_COMPLETE, QUALITY_FAILURE_RATE
from llm_assets.defs.factory import SKIPPED as SKIPPED_KEY
from llm_assets.defs.factory import asset_key, build_pipeline_assets, in_flight_reason
from llm_assets.defs.metadata import DAY_SUMMARY_JSON
from tests.day_notices import announce, loopback_webhook
from tests.fakes.openai_server import FakeOpenAI
from tests.harness import DAY, Harness, make_harness, truthful
from tests.test_sensors import tick

pytestmark = [pytest.mark.one_database, pytest.mark.fake_server("openai", responder=truthful)]
SKIPPED = (*names.GATED_ASSETS, *names.REPORT_ASSETS)


@pytest.fixture
def harness(tmp_path: Path, database_url: str, fake: FakeOpenAI) -> Iterator[Harness]:
    yield from make_harness(tmp_path, database_url, fake)


@pytest.fixture
def webhook(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    with loopback_webhook(monkeypatch) as posts:
        yield posts


def materialized(harness: Harness, step: str) -> list[dg.EventLogRecord]:
    return harness.instance.fetch_materializations(
        dg.AssetRecordsFilter(
            asset_key=asset_key(harness.spec, step), asset_partitions=[DAY.isoformat()]
        ),
        limit=10,
    ).records


def test_reports_alone_while_in_flight_are_skipped_with_the_reason(
    harness: Harness, fake: FakeOpenAI
) -> None:
    """dead_letter or cost_report selected alone (the UI allows it) for a day still in
    flight write nothing partial: each is skipped, and its page says why."""
    fake.polls_per_state = 1000
    assert harness.materialize("input_snapshot", "request_shards", "provider_batches").success
    open_items = harness.ledger.counts(harness.job_id()).open
    assert open_items == 24

    for step in names.REPORT_ASSETS:
        result = harness.materialize(step)

        assert result.success, step
        assert materialized(harness, step) == [], step
        [observed] = harness.instance.fetch_observations(
            dg.AssetRecordsFilter(
                asset_key=asset_key(harness.spec, step), asset_partitions=[DAY.isoformat()]
            ),
            limit=10,
        ).records
        assert observed.asset_observation.metadata[SKIPPED_KEY].value == in_flight_reason(24)
    assert not harness.storage.list_uris(f"dead_letters/{harness.spec.name}")
    assert not harness.storage.list_uris(f"reports/{harness.spec.name}")


def test_materialize_all_while_in_flight_skips_validation_and_the_sensor_finishes_the_day(
    harness: Harness, fake: FakeOpenAI, webhook: list[dict[str, Any]]
) -> None:
    fake.polls_per_state = 1000

    result = harness.materialize(*names.ASSETS)

    assert result.success
    assert not [e for e in result.all_events if e.is_step_failure]
    assert not [
        e
        for e in result.get_asset_check_evaluations()
        if not e.passed and e.severity == dg.AssetCheckSeverity.ERROR
    ]
    assert all(materialized(harness, step) == [] for step in SKIPPED)
    skipped = {e.step_key for e in result.all_events if e.is_step_skipped}
    assert skipped == {asset_key(harness.spec, s).to_python_identifier() for s in SKIPPED[1:]}
    open_items = harness.ledger.counts(harness.job_id()).open
    assert open_items == 24
    messages = [entry.user_message for entry in harness.instance.all_logs(result.run_id)]
    validated = asset_key(harness.spec, "validated_outputs")
    assert f"{validated.to_user_string()} skipped: {in_flight_reason(24)}" in messages
    [observed] = harness.instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=validated, asset_partitions=[DAY.isoformat()]), limit=10
    ).records
    assert observed.asset_observation.metadata[SKIPPED_KEY].value == in_flight_reason(24)
    # The run succeeded without writing the cost report: the day is not announced as finished.
    announce(harness, result, names.ASSETS)
    assert webhook == []
    # Publishing by hand before validation fails; the day goes on, so that is not its outcome.
    early = harness.materialize("published_outputs")
    assert not early.success
    announce(harness, early, ["published_outputs"])
    assert webhook == []

    fake.polls_per_state = 0
    runs: list[tuple[dg.ExecuteInProcessResult, list[str]]] = []
    for _ in range(20):
        requests = tick(harness).run_requests
        if not requests and materialized(harness, "cost_report"):
            break
        for request in requests:
            steps = [key.path[1] for key in request.asset_selection or []]
            run = harness.materialize(*steps)
            assert run.success, steps
            runs.append((run, steps))
            announce(harness, run, steps)
            announce(harness, run, steps)  # a tick that evaluates the run again

    counts = harness.ledger.counts(harness.job_id())
    assert counts.open == 0 and counts.succeeded == 24
    assert all(materialized(harness, step) for step in SKIPPED)
    evaluations = {
        e.check_name: e.passed
        for run, _ in runs
        for e in run.get_asset_check_evaluations()
        if e.asset_key == asset_key(harness.spec, "validated_outputs")
    }
    assert evaluations[OUTPUTS_COMPLETE] and evaluations[QUALITY_FAILURE_RATE]
    assert all(evaluations.values())
    # One notification: the finished day, the summary its cost report carries.
    [post] = webhook
    summary = post["llm_assets"]
    assert summary["outcome"] == "finished"
    assert (summary["items"], summary["succeeded"], summary["open_items"]) == (24, 24, 0)
    assert post["text"].startswith(f"{harness.spec.name} {DAY}: finished")
    [report] = materialized(harness, "cost_report")
    metadata = report.asset_materialization.metadata
    assert metadata[DAY_SUMMARY_JSON].value == summary
    assert metadata["outcome"].value == "finished"
    assert metadata["day_summary"].value == post["text"].replace("\n", "\n\n")

    # The CLI reports the same day again: the same day state, not announced twice.
    again = harness.materialize(*names.REPORT_ASSETS)
    assert again.success
    announce(harness, again, names.REPORT_ASSETS)
    assert len(webhook) == 1
    [sent] = harness.ledger.sent_notifications(harness.spec.name, DAY)
    assert sent["run_id"] == summary["run_id"] and sent["delivery_error"] is None

    # The checks alone (the UI's "Execute checks") report without a materialization.
    validated = asset_key(harness.spec, "validated_outputs")
    defs = dg.Definitions(
        assets=build_pipeline_assets(harness.spec, harness.settings),
        jobs=[
            dg.define_asset_job(
                "validated_outputs_checks",
                selection=dg.AssetSelection.checks_for_assets(validated),
            )
        ],
        resources=harness.resources,
    )
    only_checks = defs.resolve_job_def("validated_outputs_checks").execute_in_process(
        instance=harness.instance,
        tags={"dagster/partition": DAY.isoformat()},
        raise_on_error=False,
    )
    assert only_checks.success
    assert only_checks.get_asset_materialization_events() == []
    assert {e.check_name for e in only_checks.get_asset_check_evaluations() if e.passed} >= {
        OUTPUTS_COMPLETE,
        QUALITY_FAILURE_RATE,
    }
