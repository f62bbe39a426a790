"""A day's notifications through the sensors: a day whose quality gate fails is announced
once, as finished with its dead letters, not as failed and then finished; a failure nothing
follows (the budget gate, which waits for an operator) is announced as failed, once."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from llm_assets import names
from llm_assets.defs.factory import asset_key
from tests.day_notices import announce, loopback_webhook
from tests.fakes.openai_server import FakeOpenAI
from tests.harness import DAY, Harness, make_harness
from tests.test_quality import GARBAGE, garbage_for
from tests.test_sensors import tick

pytestmark = [pytest.mark.one_database, pytest.mark.fake_server("openai", polls_per_state=0)]


@pytest.fixture
def harness(tmp_path: Path, database_url: str, fake: FakeOpenAI) -> Iterator[Harness]:
    yield from make_harness(tmp_path, database_url, fake, quality={"max_failure_rate": 0.05})


@pytest.fixture
def webhook(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    with loopback_webhook(monkeypatch) as posts:
        yield posts


def drive(harness: Harness) -> list[dg.ExecuteInProcessResult]:
    """The batch-status sensor's runs until it requests none, each announced as it ends."""
    runs = []
    for _ in range(20):
        requests = tick(harness).run_requests
        if not requests:
            return runs
        for request in requests:
            steps = [key.path[1] for key in request.asset_selection or []]
            run = harness.materialize(*steps)
            announce(harness, run, steps)
            runs.append(run)
    raise AssertionError("the sensor kept requesting runs")


def test_a_day_blocked_by_the_quality_gate_is_announced_once_as_finished(
    harness: Harness, fake: FakeOpenAI, webhook: list[dict[str, Any]]
) -> None:
    fake.responder = garbage_for(GARBAGE)
    submitted = harness.materialize(*names.SUBMIT_ASSETS)
    assert submitted.success
    announce(harness, submitted, names.SUBMIT_ASSETS)

    runs = drive(harness)

    failed_checks = [
        e.check_name for run in runs for e in run.get_asset_check_evaluations() if not e.passed
    ]
    assert failed_checks == ["quality_failure_rate"]  # the gate stopped publication
    [post] = webhook
    summary = post["llm_assets"]
    assert summary["outcome"] == "finished"
    assert summary["dead_letters_by_class"] == {"quality": len(GARBAGE)}
    assert summary["open_items"] == 0
    assert all(run.success for run in runs)  # the gate skips publication, it fails no run
    blocked = "blocked by quality_failure_rate (16.7% > 5.0%)"
    assert summary["blocked"] == blocked
    assert f"publication {blocked}" in post["text"].splitlines()
    assert post["text"].splitlines()[:2] == [
        f"ALERT {harness.spec.name} {DAY}: finished, not published (dead-letter rate 16.7% "
        "over automation.notify.max_dead_letter_rate 10.0%)",
        "24 items: 20 succeeded, 4 dead letters (4 quality)",
    ]
    report = harness.instance.get_latest_materialization_event(
        asset_key(harness.spec, "cost_report")
    )
    assert report is not None
    day_summary = report.asset_materialization.metadata["day_summary"].value
    assert f"publication {blocked}" in day_summary
    assert (
        harness.instance.get_latest_materialization_event(
            asset_key(harness.spec, "published_outputs")
        )
        is None
    )


def test_a_failure_that_waits_for_an_operator_is_announced_as_failed_once(
    tmp_path: Path, database_url: str, fake: FakeOpenAI, webhook: list[dict[str, Any]]
) -> None:
    """The budget gate stops the submission: nothing under way finishes the day, so the
    failure is its outcome, announced with the reason once however often it is run into."""
    for harness in make_harness(
        tmp_path, database_url, fake, budget={"max_usd_per_partition": 0.000001}
    ):
        for _ in range(2):
            run = harness.materialize(*names.SUBMIT_ASSETS)
            assert not run.success
            announce(harness, run, names.SUBMIT_ASSETS)

        [post] = webhook
        summary = post["llm_assets"]
        assert summary["outcome"] == "failed"
        assert summary["open_items"] == summary["items"] == len(harness.truth)
        assert post["text"].startswith(f"{harness.spec.name} {DAY}: failed")
        assert "max_usd_per_partition" in summary["reason"]
