"""Automation end to end: `dagster dev` with the real dagster-daemon running the sensors.

Nobody touches anything after a file lands in the inbox: the new-data sensor submits the
days it touches, the batch-status sensor imports, retries and finishes them, and the
notification sensor posts a summary per day to a webhook. A date backfill launched the way
the UI launches it (GraphQL `launchPartitionBackfill`) submits one provider job per day of a
second pipeline whose source is not watched, and skips a day of it that has no source rows.
The provider is the fake OpenAI server, reached only through OPENAI_BASE_URL.
"""

import datetime as dt
import http.server
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
import yaml

from llm_assets import steps
from llm_assets.defs.factory import asset_key
from llm_assets.resources.ledger import LedgerResource, job_table
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec.model import PipelineSpec
from tests.dagster_dev import DagsterDev, dagster_dev
from tests.fakes.openai_server import FakeOpenAI, user_text
from tests.harness import review_spec, truthful, write_reviews

pytestmark = pytest.mark.slow

FILE_DAYS = (dt.date(2026, 11, 3), dt.date(2026, 11, 4))
BACKFILL_DAYS = (dt.date(2026, 11, 10), dt.date(2026, 11, 11))
EMPTY_DAY = dt.date(2026, 11, 12)
"""A day of the backfill with no source rows."""


@dataclass
class Webhook:
    """A Slack-style incoming webhook on loopback that keeps what it is sent."""

    posts: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""


@pytest.fixture(scope="module")
def webhook() -> Iterator[Webhook]:
    hook = Webhook()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            hook.posts.append(json.loads(body))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hook.url = f"http://127.0.0.1:{server.server_port}/hooks/T000/B000"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield hook
    server.shutdown()


@dataclass
class Platform:
    dev: DagsterDev
    spec: PipelineSpec
    table: PipelineSpec
    home: Path
    dagster_home: Path
    ledger: LedgerResource
    storage: ArtifactStorage
    fake: FakeOpenAI


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory, webhook: Webhook) -> Iterator[Platform]:
    root = tmp_path_factory.mktemp("automation")
    home, specs, dagster_home = root / "home", root / "specs", root / "dagster"
    for folder in (home / "inbox", specs, dagster_home):
        folder.mkdir(parents=True)
    # The local instance `make ui` uses, with the daemon's loops tightened for a test.
    (dagster_home / "dagster.yaml").write_text(
        yaml.safe_dump(
            {
                "telemetry": {"enabled": False},
                "sensors": {"use_threads": True, "num_workers": 4},
                "run_coordinator": {
                    "module": "dagster",
                    "class": "QueuedRunCoordinator",
                    "config": {"dequeue_interval_seconds": 1, "dequeue_use_threads": True},
                },
            }
        )
    )
    raw = review_spec(
        "openai",
        "gpt-4o-mini",
        source={"uri": "inbox/*.jsonl"},
        automation={"notify": {"webhook_env": "REVIEWS_WEBHOOK_URL", "max_dead_letter_rate": 0.02}},
    )
    (specs / "reviews.yaml").write_text(yaml.safe_dump(raw))
    table = review_spec(
        "openai",
        "gpt-4o-mini",
        name="reviews_table",
        source={"uri": "table/*.jsonl"},
        automation={"new_data_sensor": False},
    )
    (specs / "reviews_table.yaml").write_text(yaml.safe_dump(table))
    for day in BACKFILL_DAYS:
        write_reviews(home / "table_rows", day, 10)
    (home / "table_rows" / "reviews").rename(home / "table")
    spec = PipelineSpec.model_validate(raw)
    database_url = f"sqlite:///{home / 'ledger.db'}"
    sent: dict[str, int] = {}

    def flaky(custom_id: str, body: dict[str, Any]) -> str | None:
        # Every seventh review fails once with a 5xx: the sensor must plan and send retries.
        sent[custom_id] = sent.get(custom_id, 0) + 1
        return "5xx" if sent[custom_id] == 1 and "Order 1007" in user_text(body) else None

    with FakeOpenAI(root / "fake_openai") as fake:
        fake.responder = truthful
        fake.line_fault = flaky
        env = {
            **os.environ,
            "LLM_ASSETS_HOME": str(home),
            "LLM_ASSETS_PIPELINES": str(specs),
            "LLM_ASSETS_DATABASE_URL": database_url,
            "LLM_ASSETS_SENSOR_INTERVAL_SECONDS": "1",
            "DAGSTER_HOME": str(dagster_home),
            "OPENAI_BASE_URL": fake.base_url,
            "OPENAI_API_KEY": "test-key",
            "REVIEWS_WEBHOOK_URL": webhook.url,
        }
        with dagster_dev(env, root / "dagster_dev.log") as dev:
            yield Platform(
                dev=dev,
                spec=spec,
                table=PipelineSpec.model_validate(table),
                home=home,
                dagster_home=dagster_home,
                ledger=LedgerResource(database_url=database_url),
                storage=ArtifactStorage(base_url=str(home / "artifacts")),
                fake=fake,
            )
        assert fake.server_errors == []


def finished(platform: Platform, day: dt.date) -> steps.CostReport | None:
    """The day's cost report once its validated outputs are written, else None."""
    try:
        job = steps.existing_job(platform.spec, day, platform.ledger)
    except steps.MissingPrerequisite:
        return None
    base = f"reports/{platform.spec.name}/{day.isoformat()}/{job.job_id}.cost.json"
    report_uri = platform.storage.uri(base)
    validated = steps.validated_uri(
        steps.StepContext(platform.spec, day, platform.ledger, platform.storage)
    )
    if not (platform.storage.exists(report_uri) and platform.storage.exists(validated)):
        return None
    report = steps.CostReport.model_validate_json(platform.storage.read_bytes(report_uri))
    return report if report.open_items == 0 else None


def test_a_dropped_file_ends_in_validated_outputs_and_cost_reports(
    platform: Platform, webhook: Webhook
) -> None:
    # One file, two days: it fans out into one submission per day.
    rows = []
    for day in FILE_DAYS:
        write_reviews(platform.home / "staging", day, 14)
        rows += (
            (platform.home / "staging" / "reviews" / f"reviews-{day}.jsonl")
            .read_text()
            .splitlines()
        )
    staged = platform.home / "staging" / "drop.jsonl"
    staged.write_text("\n".join(rows) + "\n")
    staged.rename(platform.home / "inbox" / "reviews-batch.jsonl")  # appears whole

    reports = {
        day: platform.dev.wait_for(f"{day} to finish", lambda d=day: finished(platform, d))
        for day in FILE_DAYS
    }

    for day, report in reports.items():
        assert (report.items, report.succeeded, report.dead_letters) == (14, 14, 0)
        assert report.retry_cost_usd > 0  # the 5xx items were retried by the sensor's runs
        published = platform.storage.uri(f"published/{platform.spec.name}/{day}.parquet")
        assert platform.storage.exists(published)
    with platform.ledger.engine.connect() as conn:
        days = set(conn.execute(sa.select(job_table.c.partition_date)).scalars())
    assert set(FILE_DAYS) <= days

    def summaries() -> dict[str, dict[str, Any]] | None:
        found = {
            p["llm_assets"]["date"]: p["llm_assets"]
            for p in webhook.posts
            if p["llm_assets"]["outcome"] == "finished"
        }
        return found if {d.isoformat() for d in FILE_DAYS} <= set(found) else None

    name = platform.spec.name
    posted = platform.dev.wait_for("the finished notifications", summaries)
    for day in FILE_DAYS:
        summary = posted[day.isoformat()]
        assert (summary["items"], summary["succeeded"], summary["dead_letters"]) == (14, 14, 0)
        assert summary["cost_usd"] == pytest.approx(reports[day].cost_usd)
        assert summary["alerts"] == []
    assert all("text" in p and p["text"].startswith(platform.spec.name) for p in webhook.posts)
    # One notification per day: no failed one before it, no second one.
    days = [p["llm_assets"]["date"] for p in webhook.posts if p["llm_assets"]["pipeline"] == name]
    assert sorted(days) == [day.isoformat() for day in FILE_DAYS]

    # The console shows each summary once: the sensor logs it, after posting it.
    heads = [f"{name} {day}: finished" for day in FILE_DAYS]

    def logged() -> list[str] | None:
        lines = platform.dev.log.read_text(errors="replace").splitlines()
        return lines if all(any(h in line for line in lines) for h in heads) else None

    lines = platform.dev.wait_for("the summaries in the sensor's log", logged)
    assert [sum(head in line for line in lines) for head in heads] == [1, 1]


def test_a_date_backfill_submits_one_provider_job_per_day_and_skips_an_empty_day(
    platform: Platform,
) -> None:
    spec = platform.table
    submit = ("input_snapshot", "request_shards", "provider_batches")
    backfill_id = platform.dev.launch_asset_backfill(
        [d.isoformat() for d in (*BACKFILL_DAYS, EMPTY_DAY)],
        [[spec.name, step] for step in submit],
    )

    backfill = platform.dev.wait_for_backfill(backfill_id)
    # Every run succeeds, and so does the backfill: the empty day is materialized as empty.
    assert {run["status"] for run in backfill["runs"]} == {"SUCCESS"}, backfill["runs"]
    assert backfill["status"] == "COMPLETED_SUCCESS"
    assert platform.dev.backfill_asset_counts(backfill_id) == {
        "input_snapshot": (3, 0),
        "request_shards": (3, 0),
        "provider_batches": (3, 0),
    }
    # The empty day says why in its snapshot and its WARN check; no job, nothing published.
    assert platform.ledger.jobs_for_partition(spec.name, EMPTY_DAY) == []
    published = platform.storage.uri(f"published/{spec.name}/{EMPTY_DAY.isoformat()}.parquet")
    assert not platform.storage.exists(published)
    reason = f"no source rows for {EMPTY_DAY.isoformat()}"
    instance = dg.DagsterInstance.from_config(str(platform.dagster_home))
    try:
        [snapshot] = instance.fetch_materializations(
            dg.AssetRecordsFilter(
                asset_key=asset_key(spec, "input_snapshot"),
                asset_partitions=[EMPTY_DAY.isoformat()],
            ),
            limit=10,
        ).records
        metadata = snapshot.asset_materialization.metadata
        assert metadata["no_source_rows"].value == reason
        [check] = [
            record.event.asset_check_evaluation
            for record in instance.event_log_storage.get_asset_check_execution_history(
                dg.AssetCheckKey(asset_key(spec, "input_snapshot"), "source_rows"), limit=10
            )
            if record.event
            and record.event.asset_check_evaluation.partition == EMPTY_DAY.isoformat()
        ]
        assert (check.passed, check.severity, check.description) == (
            False,
            dg.AssetCheckSeverity.WARN,
            reason,
        )
        for step in submit[1:]:
            [empty] = instance.fetch_materializations(
                dg.AssetRecordsFilter(
                    asset_key=asset_key(spec, step), asset_partitions=[EMPTY_DAY.isoformat()]
                ),
                limit=2,
            ).records
            assert empty.asset_materialization is not None
            assert empty.asset_materialization.metadata["no_source_rows"].value == reason
    finally:
        instance.dispose()
    for day in BACKFILL_DAYS:
        (job,) = platform.ledger.jobs_for_partition(spec.name, day)
        shards = platform.ledger.shards(job.job_id)
        assert sum(s.item_count for s in shards if s.kind == "first") == 10
        # Every shard sent so far (the sensor may have planned and sent a retry shard by now)
        # went out once, as its own provider batch.
        creates = [
            c
            for c in platform.fake.calls.entries()
            if c["method"] == "POST" and c["path"] == "/v1/batches"
        ]
        shards = [s for s in platform.ledger.shards(job.job_id) if s.provider_batch_id]
        mine = [c for c in creates if c["metadata"]["job_id"] == job.job_id]
        assert sorted(c["metadata"]["shard_id"] for c in mine) == sorted(s.shard_id for s in shards)
        assert {s.provider_batch_id for s in shards} == {c["batch_id"] for c in mine}
