"""A day is announced once whichever path finishes it: `llm-assets run --wait` (its runs are
not the code location's, so no notification sensor sees them) posts the finished day, the
summary its cost report carries; the sensor's runs of the same day state post nothing more;
a requeue that finishes the day again posts the new state. A day the quality gate blocks is
one finished post naming the gate, a day the budget gate stops is one failed post, two runs
of one day at once post once, a spec whose webhook variable is unset sends nothing, and the
demo posts each of its days."""

import datetime as dt
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from llm_assets import names, steps
from llm_assets.defs.factory import asset_key
from llm_assets.defs.metadata import DAY_SUMMARY_JSON
from llm_assets.demo.run import DEMO_PIPELINE, DEMO_START
from llm_assets.demo.tour import STRICT_PIPELINE
from llm_assets.resources.ledger import LedgerResource
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.steps import notify
from llm_assets.steps.lifecycle import GATED
from tests import cli_process
from tests.day_notices import announce, loopback_webhook
from tests.demo_run import shared_demo
from tests.eval_harness import run_command
from tests.fakes.openai_server import FakeOpenAI
from tests.harness import CLI, DAY, Harness, first_time, make_harness, truthful
from tests.test_automation_units import inbox_spec
from tests.test_ledger import item_row, shard_row
from tests.test_quality import GARBAGE, garbage_for
from tests.test_sensors import tick

pytestmark = [
    pytest.mark.one_database,
    pytest.mark.fake_server("openai", polls_per_state=0, responder=truthful),
]


@pytest.fixture
def webhook(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    with loopback_webhook(monkeypatch) as posts:
        yield posts


def run_cli(harness: Harness, fake: FakeOpenAI, *args: str) -> subprocess.CompletedProcess[str]:
    """`llm-assets ARGS` on the harness's home, ledger and spec, with the test's environment
    (the webhook variable among it)."""
    return run_command([CLI, *args], harness.cli_env(fake))


def run_wait(harness: Harness, fake: FakeOpenAI) -> subprocess.CompletedProcess[str]:
    """`llm-assets run P --date D --wait`, polling without pause."""
    day = DAY.isoformat()
    return run_cli(
        harness, fake, "run", harness.spec.name, "--date", day, "--wait", "--poll-interval", "0"
    )


def reported(dagster_home: Path, key: dg.AssetKey, day: dt.date) -> dict[str, Any]:
    """The metadata of the day's latest cost report on the Dagster instance at dagster_home."""
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        [record] = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, asset_partitions=[day.isoformat()]),
            limit=1,
        ).records
    metadata = record.asset_materialization.metadata
    return {name: value.value for name, value in metadata.items()}


def report_again(harness: Harness) -> None:
    """The sensor path on a finished day: a tick (which asks for nothing), then a report run
    of the day, as the UI launches it, announced as the daemon does."""
    assert tick(harness).run_requests == []
    run = harness.materialize(*names.REPORT_ASSETS)
    assert run.success
    announce(harness, run, names.REPORT_ASSETS)


def test_a_cli_day_is_announced_once_and_the_sensor_path_adds_nothing(
    tmp_path: Path, database_url: str, fake: FakeOpenAI, webhook: list[dict[str, Any]]
) -> None:
    for harness in make_harness(tmp_path, database_url, fake):
        fake.line_fault = first_time({3: "4xx"})  # one deterministic dead letter

        done = run_wait(harness, fake)

        assert done.returncode == 0, done.stderr
        [post] = webhook
        summary = post["llm_assets"]
        assert summary["outcome"] == "finished"
        assert (summary["items"], summary["succeeded"], summary["open_items"]) == (24, 23, 0)
        assert summary["dead_letters_by_class"] == {"deterministic": 1}
        assert post["text"].startswith(f"{harness.spec.name} {DAY}: finished\n24 items")
        # The summary the CLI's cost report carries, word for word.
        report = reported(tmp_path / "dagster-cli", asset_key(harness.spec, "cost_report"), DAY)
        assert report[DAY_SUMMARY_JSON] == summary
        assert report["day_summary"] == post["text"].replace("\n", "\n\n")
        assert "not delivered" not in done.stderr

        report_again(harness)
        assert len(webhook) == 1

        day = DAY.isoformat()
        requeued = run_cli(
            harness, fake, "requeue", harness.spec.name, "--date", day, "--class", "deterministic"
        )
        assert requeued.returncode == 0, requeued.stderr
        again = run_wait(harness, fake)
        assert again.returncode == 0, again.stderr

        # The requeue finished the day again with other counts: one more post, of that state.
        assert len(webhook) == 2
        later = webhook[1]["llm_assets"]
        assert later["outcome"] == "finished"
        assert (later["items"], later["succeeded"], later["dead_letters"]) == (24, 24, 0)
        sent = harness.ledger.sent_notifications(harness.spec.name, DAY)
        assert [s["delivery_error"] for s in sent] == [None, None]
        assert [s["text"] for s in sent] == [p["text"] for p in webhook]


def test_a_day_the_quality_gate_blocks_in_the_cli_is_announced_once_as_finished(
    tmp_path: Path, database_url: str, fake: FakeOpenAI, webhook: list[dict[str, Any]]
) -> None:
    for harness in make_harness(tmp_path, database_url, fake, quality={"max_failure_rate": 0.05}):
        fake.responder = garbage_for(GARBAGE)

        blocked = run_wait(harness, fake)

        assert blocked.returncode == 2, blocked.stderr
        assert "blocked: quality gate: publication blocked by quality_failure_rate" in (
            blocked.stderr
        )
        [post] = webhook
        summary = post["llm_assets"]
        assert summary["outcome"] == "finished"
        gate = "blocked by quality_failure_rate (16.7% > 5.0%)"
        assert summary["blocked"] == gate
        assert summary["dead_letters_by_class"] == {"quality": len(GARBAGE)}
        lines = post["text"].splitlines()
        assert lines[0] == (
            f"ALERT {harness.spec.name} {DAY}: finished, not published (dead-letter rate "
            "16.7% over automation.notify.max_dead_letter_rate 10.0%)"
        )
        assert f"publication {gate}" in lines

        # The same day again: from the CLI (still blocked), then by the sensor path.
        assert run_wait(harness, fake).returncode == 2
        report_again(harness)
        assert len(webhook) == 1


def test_a_day_the_budget_gate_stops_in_the_cli_is_announced_as_failed_once(
    tmp_path: Path, database_url: str, fake: FakeOpenAI, webhook: list[dict[str, Any]]
) -> None:
    """The budget gate waits for an operator: the CLI's failed run is the day's outcome, and
    the same failure met by a run of the code location is the same summary, not sent again."""
    for harness in make_harness(
        tmp_path, database_url, fake, budget={"max_usd_per_partition": 0.000001}
    ):
        stopped = run_wait(harness, fake)

        assert stopped.returncode == 2, stopped.stderr
        assert "blocked: budget gate" in stopped.stderr
        [post] = webhook
        summary = post["llm_assets"]
        assert summary["outcome"] == "failed"
        assert summary["open_items"] == summary["items"] == len(harness.truth)
        assert post["text"].startswith(f"{harness.spec.name} {DAY}: failed")
        assert "request_shards check budget failed" in summary["reason"]
        assert "max_usd_per_partition" in summary["reason"]

        run = harness.materialize(*names.SUBMIT_ASSETS)
        assert not run.success
        announce(harness, run, names.SUBMIT_ASSETS)
        assert len(webhook) == 1


def test_two_cli_runs_of_one_day_at_once_announce_it_once(
    tmp_path: Path, database_url: str, fake: FakeOpenAI, webhook: list[dict[str, Any]]
) -> None:
    for harness in make_harness(tmp_path, database_url, fake):
        command = [CLI, "run", harness.spec.name, "--date", DAY.isoformat(), "--wait"]
        env = harness.cli_env(fake)
        runs = [
            cli_process.Popen(
                [*command, "--poll-interval", "0"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        said = [run.communicate(timeout=600) for run in runs]

        assert [run.returncode for run in runs] == [0, 0], [err for _, err in said]
        [post] = webhook
        assert post["llm_assets"]["outcome"] == "finished"
        assert post["llm_assets"]["succeeded"] == 24
        assert len(harness.ledger.sent_notifications(harness.spec.name, DAY)) == 1


def test_a_spec_whose_webhook_variable_is_unset_sends_nothing(
    tmp_path: Path, database_url: str, fake: FakeOpenAI, webhook: list[dict[str, Any]]
) -> None:
    """The default variable holds the loopback webhook, but the spec names another, unset:
    the day is claimed in the ledger and sent nowhere, and the run ends well."""
    automation = {"notify": {"webhook_env": "REVIEWS_WEBHOOK_URL"}}
    for harness in make_harness(tmp_path, database_url, fake, automation=automation):
        assert "REVIEWS_WEBHOOK_URL" not in os.environ

        done = run_wait(harness, fake)

        assert done.returncode == 0, done.stderr
        assert "not delivered" not in done.stderr
        assert webhook == []
        [claimed] = harness.ledger.sent_notifications(harness.spec.name, DAY)
        assert claimed["outcome"] == "finished"
        assert claimed["delivery_error"] is None


def test_a_retry_round_a_gate_holds_is_not_on_its_way(tmp_path: Path, database_url: str) -> None:
    """A failed run of a day whose retry shard waits for its backoff is not the day's outcome
    (the batch-status sensor sends the shard later); once a gate holds the shard for an
    operator, nothing finishes the day, and the failure is its outcome, on every path."""
    ledger = LedgerResource(database_url=database_url)
    spec = inbox_spec()
    job = steps.job_for(spec, DAY, ledger)
    retry = shard_row(1, item_count=1, job_id=job.job_id)
    ledger.add_shard_with_items(retry, [item_row("c0", shard=retry["shard_id"], job_id=job.job_id)])
    assert notify.under_way(spec, DAY, ledger) == (
        "items are still on their way; the batch-status sensor finishes the day"
    )

    refused = steps.GateBlocked("pipeline_budget", "over max_usd_per_day")
    storage = ArtifactStorage(base_url=str(tmp_path / "artifacts"))
    steps.hold_for_gate(steps.StepContext(spec, DAY, ledger, storage), refused)

    [held] = ledger.shards(job.job_id)
    assert held.raw_status == GATED
    assert notify.under_way(spec, DAY, ledger) is None


def test_the_demo_announces_each_of_its_days_once(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    demo = shared_demo(tmp_path_factory)
    # Each day is announced once, when it finished: the cancelled day once its requeued items
    # had; the empty day has nothing to announce; the strict pipeline's blocked day is
    # announced as finished and not published.
    days = [(DEMO_PIPELINE, dt.date.fromisoformat(d["date"])) for d in demo.made["days"]]
    days = [(pipeline, day) for pipeline, day in days if day.isoformat() != demo.made["empty_day"]]
    days.append((STRICT_PIPELINE, DEMO_START))
    webhook = demo.posts
    assert [(p["llm_assets"]["pipeline"], p["llm_assets"]["date"]) for p in webhook] == [
        (pipeline, day.isoformat()) for pipeline, day in days
    ]
    for post, (pipeline, day) in zip(webhook, days, strict=True):
        summary = post["llm_assets"]
        assert summary["outcome"] == "finished" and summary["open_items"] == 0
        assert (summary.get("blocked") is not None) == (pipeline == STRICT_PIPELINE), summary
        key = dg.AssetKey([pipeline, "cost_report"])
        assert reported(demo.dagster_home, key, day)[DAY_SUMMARY_JSON] == summary
