"""The automation pieces one by one: the new-data sensor's cursor and fan-out, the schedule's
partition, and the notification summary, alerts and webhook delivery."""

import datetime as dt
import http.server
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from llm_assets import names, steps
from llm_assets.defs.factory import asset_key, build_pipeline_assets
from llm_assets.defs.jobs import build_lifecycle_jobs
from llm_assets.defs.new_data_sensor import build_new_data_sensor
from llm_assets.defs.schedules import build_schedule
from llm_assets.resources import build_resources
from llm_assets.resources.ledger import LedgerResource
from llm_assets.resources.providers import provider_resource_key
from llm_assets.spec.model import PipelineSpec
from llm_assets.steps import notify
from llm_assets.util.settings import Settings
from tests import cli_process
from tests.harness import CLI, review_spec


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings.from_env({"LLM_ASSETS_HOME": str(tmp_path / "home")})


@pytest.fixture
def inbox(settings: Settings) -> Path:
    """The folder inbox_spec's source reads."""
    folder = settings.home / "inbox"
    folder.mkdir(parents=True)
    return folder


def inbox_spec(**overrides: Any) -> PipelineSpec:
    return PipelineSpec.model_validate(
        review_spec("local", "all-MiniLM-L6-v2", source={"uri": "inbox/*.jsonl"}, **overrides)
    )


def tick(
    spec: PipelineSpec, settings: Settings, instance: dg.DagsterInstance, cursor: str | None
) -> dg.SensorResult:
    sensor = build_new_data_sensor(spec, settings)
    resources = build_resources(settings)
    defs = dg.Definitions(
        assets=build_pipeline_assets(spec, settings), sensors=[sensor], resources=resources
    )
    context = dg.build_sensor_context(
        instance=instance,
        resources=resources,
        definitions=defs,
        sensor_name=sensor.name,
        cursor=cursor,
    )
    data = sensor.evaluate_tick(context)
    return dg.SensorResult(run_requests=data.run_requests, cursor=data.cursor)


def review(n: int, stamp: str) -> str:
    return json.dumps({"review_id": f"R{n}", "created_at": stamp, "text": f"review {n}"})


def test_the_new_data_sensor_fans_out_each_new_file_version_by_day(
    settings: Settings, inbox: Path
) -> None:
    spec = inbox_spec()
    two_days = inbox / "drop-a.jsonl"
    two_days.write_text(
        "\n".join(
            [
                review(1, "2026-11-03T09:00:00Z"),
                review(2, "2026-11-04T23:30:00Z"),
                "not json",  # undated: it belongs to the file's earliest day
                review(3, "2026-10-01T00:00:00Z"),  # before the partitions start
            ]
        )
        + "\n"
    )
    with dg.DagsterInstance.ephemeral() as instance:
        first = tick(spec, settings, instance, None)
        requests = sorted(first.run_requests, key=lambda r: r.partition_key or "")
        assert [r.partition_key for r in requests] == ["2026-11-03", "2026-11-04"]
        for request in requests:
            assert set(request.asset_selection) == {asset_key(spec, s) for s in names.SUBMIT_ASSETS}
            assert request.run_key.startswith(f"{two_days}@")
            assert request.run_key.endswith(f":{request.partition_key}")

        # Nothing new: nothing requested.
        assert tick(spec, settings, instance, first.cursor).run_requests == []

        # A second file, and the first one changed: only they are requested, per day.
        (inbox / "drop-b.jsonl").write_text(review(4, "2026-11-05T10:00:00Z") + "\n")
        with two_days.open("a") as handle:
            handle.write(review(5, "2026-11-03T12:00:00Z") + "\n")
        again = tick(spec, settings, instance, first.cursor)
        keys = {(r.partition_key, r.run_key.split("@")[0]) for r in again.run_requests}
        assert keys == {
            ("2026-11-05", str(inbox / "drop-b.jsonl")),
            ("2026-11-03", str(two_days)),
            ("2026-11-04", str(two_days)),
        }
        assert not {r.run_key for r in again.run_requests} & {r.run_key for r in requests}

        # A removed file leaves the cursor.
        (inbox / "drop-b.jsonl").unlink()
        cursor = json.loads(tick(spec, settings, instance, again.cursor).cursor or "{}")
        assert set(cursor) == {str(two_days)}


def test_the_new_data_sensor_starts_from_what_the_ledger_planned(
    settings: Settings, inbox: Path
) -> None:
    """With no cursor the days whose jobs were planned from the files' current versions are
    not requested again; a changed file, a new file of a planned day and a new day are."""
    spec = inbox_spec()
    files: dict[str, Path] = {}
    for day in ("2026-11-03", "2026-11-04"):
        files[day] = inbox / f"drop-{day}.jsonl"
        files[day].write_text(review(int(day[-2:]), f"{day}T09:00:00Z") + "\n")
    resources = build_resources(settings)
    ledger: LedgerResource = resources["ledger"]
    for day in files:
        ctx = steps.StepContext(
            spec=spec,
            day=dt.date.fromisoformat(day),
            ledger=ledger,
            storage=resources["storage"],
            provider=resources[provider_resource_key(spec.model.provider)],
        )
        steps.take_snapshot(ctx, settings.resolve_source_uri(spec.source.uri))
        steps.build_shards(ctx)
        job = ctx.job()
        assert job.snapshot_uri is not None
        assert steps.snapshot_sources(resources["storage"], job.snapshot_uri) == {
            str(files[day]): resources["storage"].version(str(files[day]))
        }

    with dg.DagsterInstance.ephemeral() as instance:
        # First tick, and again after a reset: the planned versions enter the cursor, no run.
        first = tick(spec, settings, instance, None)
        assert first.run_requests == []
        assert set(json.loads(first.cursor or "{}")) == {str(f) for f in files.values()}
        assert tick(spec, settings, instance, None).run_requests == []

        # A changed file of a planned day, a new file of a planned day and a file of a new day.
        with files["2026-11-03"].open("a") as handle:
            handle.write(review(5, "2026-11-03T12:00:00Z") + "\n")
        (inbox / "late.jsonl").write_text(review(6, "2026-11-04T18:00:00Z") + "\n")
        (inbox / "next.jsonl").write_text(review(7, "2026-11-05T10:00:00Z") + "\n")
        expected = {
            ("2026-11-03", str(files["2026-11-03"])),
            ("2026-11-04", str(inbox / "late.jsonl")),
            ("2026-11-05", str(inbox / "next.jsonl")),
        }
        for cursor in (first.cursor, None):
            requests = tick(spec, settings, instance, cursor).run_requests
            assert {(r.partition_key, r.run_key.split("@")[0]) for r in requests} == expected


def test_the_schedule_submits_the_latest_complete_day(settings: Settings) -> None:
    spec = inbox_spec(automation={"schedule": "30 6 * * *"})
    job = build_lifecycle_jobs(spec)[steps.Step.BUILD]
    schedule = build_schedule(spec, job)
    assert schedule is not None and schedule.cron_schedule == "30 6 * * *"
    defs = dg.Definitions(
        assets=build_pipeline_assets(spec, settings),
        jobs=[job],
        schedules=[schedule],
        resources=build_resources(settings),
    )
    resolved = defs.get_schedule_def(schedule.name)
    moment = dt.datetime(2026, 11, 20, 6, 30, tzinfo=dt.UTC)
    with dg.DagsterInstance.ephemeral() as instance:
        context = dg.build_schedule_context(
            instance=instance,
            scheduled_execution_time=moment,
            repository_def=defs.get_repository_def(),
        )
        result = resolved.evaluate_tick(context)
    (request,) = result.run_requests or []
    assert request.partition_key == "2026-11-19"
    assert build_schedule(inbox_spec(), job) is None
    assert "schedule" in PipelineSpec.model_fields["automation"].annotation.model_fields


@pytest.fixture
def hook() -> Iterator[tuple[str, list[dict[str, Any]], list[int]]]:
    posts: list[dict[str, Any]] = []
    answers = [500, 200]  # the first post fails with a 5xx and is tried once more

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            posts.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(answers.pop(0) if answers else 200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hook", posts, answers
    server.shutdown()


def test_a_summary_alerts_over_its_thresholds_and_reaches_the_webhook(
    tmp_path: Path,
    hook: tuple[str, list[dict[str, Any]], list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.test_ledger import item_row

    url, posts, _ = hook
    ledger = LedgerResource(database_url=f"sqlite:///{tmp_path / 'ledger.db'}")
    spec = inbox_spec(automation={"notify": {"max_dead_letter_rate": 0.1, "max_cost_usd": 3.0}})
    day = dt.date(2026, 11, 3)
    job = steps.job_for(spec, day, ledger)
    ledger.add_items(
        [item_row(f"c{n}", status="succeeded", cost_usd=0.5, job_id=job.job_id) for n in range(8)]
    )
    ledger.add_items(
        item_row(f"c{n}", status="dead_letter", error_class=kind, job_id=job.job_id)
        for n, kind in ((8, "deterministic"), (9, "quality"))
    )
    summary = notify.summarize(spec, day, ledger, outcome="finished", run_id="r1")
    assert summary.job_id == job.job_id
    assert (summary.items, summary.succeeded, summary.dead_letters) == (10, 8, 2)
    assert summary.dead_letters_by_class == {"deterministic": 1, "quality": 1}
    assert summary.cost_usd == pytest.approx(4.0)
    assert summary.alerts == [
        "dead-letter rate 20.0% over automation.notify.max_dead_letter_rate 10.0%",
        "cost $4.00 over automation.notify.max_cost_usd $3.00",
    ]
    assert summary.text().startswith(f"ALERT {spec.name} {day}: finished")

    monkeypatch.setenv("LLM_ASSETS_WEBHOOK_URL", url)
    assert notify.deliver(spec, summary) is None
    assert len(posts) == 2  # the 5xx, then the delivery
    assert posts[-1]["text"] == summary.text()
    assert posts[-1]["llm_assets"]["alerts"] == summary.alerts

    monkeypatch.setenv("LLM_ASSETS_WEBHOOK_URL", "http://127.0.0.1:9/closed")
    assert notify.deliver(spec, summary) == "webhook unreachable: URLError, ConnectionRefusedError"


def test_a_day_state_is_announced_once_and_again_when_it_changes(
    tmp_path: Path,
    hook: tuple[str, list[dict[str, Any]], list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two report runs of the same day state send one summary; when the day changes (a
    requeued item finishes it with other counts) its new summary is sent."""
    from tests.test_ledger import item_row

    url, posts, answers = hook
    answers.clear()
    monkeypatch.setenv("LLM_ASSETS_WEBHOOK_URL", url)
    ledger = LedgerResource(database_url=f"sqlite:///{tmp_path / 'ledger.db'}")
    spec = inbox_spec()
    day = dt.date(2026, 11, 3)
    job = steps.job_for(spec, day, ledger)
    ledger.add_items(
        [item_row(f"c{n}", status="succeeded", cost_usd=0.01, job_id=job.job_id) for n in range(3)]
    )

    first = notify.summarize(spec, day, ledger, outcome="finished", run_id="cli-run")
    again = notify.summarize(spec, day, ledger, outcome="finished", run_id="sensor-run")
    assert first.text() != again.text()  # another run, another duration
    assert first.fingerprint() == again.fingerprint()
    assert notify.announce(spec, first, ledger) == notify.Announcement(first=True)
    assert notify.announce(spec, again, ledger) == notify.Announcement(first=False)
    assert [p["text"] for p in posts] == [first.text()]

    ledger.add_items([item_row("c3", status="succeeded", cost_usd=0.01, job_id=job.job_id)])
    changed = notify.summarize(spec, day, ledger, outcome="finished", run_id="requeue-run")
    assert changed.items == 4
    assert notify.announce(spec, changed, ledger).first
    failed = changed.model_copy(update={"outcome": "failed", "reason": "cost_report: disk full"})
    assert failed.fingerprint() != changed.fingerprint()

    assert [p["llm_assets"]["run_id"] for p in posts] == ["cli-run", "requeue-run"]
    sent = ledger.sent_notifications(spec.name, day)
    assert [row["run_id"] for row in sent] == ["cli-run", "requeue-run"]
    assert all(row["delivered_at"] and row["delivery_error"] is None for row in sent)


def test_a_blocked_publication_is_a_line_of_the_summary() -> None:
    summary = notify.PartitionSummary(
        pipeline="reviews",
        date=dt.date(2026, 11, 3),
        outcome="finished",
        blocked="blocked by quality_failure_rate (25.8% > 5.0%)",
    )
    assert "publication blocked by quality_failure_rate (25.8% > 5.0%)" in summary.text().split(
        "\n"
    )
    assert summary.fingerprint() != summary.model_copy(update={"blocked": None}).fingerprint()


def test_an_unknown_executor_is_refused_by_name(tmp_path: Path) -> None:
    environ = {"LLM_ASSETS_HOME": str(tmp_path), "LLM_ASSETS_EXECUTOR": "dask"}
    with pytest.raises(
        ValueError, match="LLM_ASSETS_EXECUTOR='dask': choose one of in_process, celery"
    ):
        Settings.from_env(environ)
    assert Settings.from_env({**environ, "LLM_ASSETS_EXECUTOR": ""}).executor == "in_process"
    assert Settings.from_env({**environ, "LLM_ASSETS_EXECUTOR": "celery"}).executor == "celery"

    said = cli_process.run(
        [CLI, "status", "support_tickets", "--date", "2026-11-02"],
        env={**os.environ, **environ},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert said.returncode == 1, said
    assert "LLM_ASSETS_EXECUTOR='dask': choose one of in_process, celery" in said.stderr
    assert "Traceback" not in said.stderr
