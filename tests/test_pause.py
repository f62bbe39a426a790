"""Pausing a pipeline: nothing new is submitted for it (sensors, schedule, runs started anyway,
`llm-assets run`), what is in flight still finishes, and a resume lets the held work go."""

import json
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from click.testing import CliRunner

from llm_assets import names, steps
from llm_assets.cli.main import main as cli_main
from llm_assets.definitions import build_definitions
from llm_assets.defs.factory import SKIPPED, asset_key, build_pipeline_assets
from llm_assets.defs.new_data_sensor import build_new_data_sensor
from llm_assets.defs.sensors import build_batch_status_sensor
from llm_assets.resources.providers.openai_batch import OpenAIBatchProvider
from tests import cli_process
from tests.fakes.openai_server import FakeOpenAI
from tests.harness import (
    CLI,
    DAY,
    Harness,
    cli_env,
    first_time,
    make_harness,
    review_spec,
    truthful,
    write_reviews,
)
from tests.test_sensors import tick

# One database (PostgreSQL in CI): the ledger tests compare SQLite and PostgreSQL pauses.
pytestmark = [pytest.mark.one_database, pytest.mark.fake_server("openai", responder=truthful)]

REASON = "provider incident"


@pytest.fixture
def harness(tmp_path: Path, database_url: str, fake: FakeOpenAI) -> Iterator[Harness]:
    fake.polls_per_state = 0
    yield from make_harness(tmp_path, database_url, fake)


def pause(harness: Harness) -> None:
    harness.ledger.pause_pipeline(harness.spec.name, paused_by="ops", reason=REASON)


def resume(harness: Harness) -> None:
    assert harness.ledger.resume_pipeline(harness.spec.name, resumed_by="ops") is not None


def execute(harness: Harness, request: dg.RunRequest) -> dg.ExecuteInProcessResult:
    """The run a sensor requested, as the daemon would launch it."""
    return dg.materialize(
        build_pipeline_assets(harness.spec, harness.settings),
        instance=harness.instance,
        resources=harness.resources,
        partition_key=request.partition_key,
        selection=request.asset_selection,
        raise_on_error=False,
    )


def materialized(result: dg.ExecuteInProcessResult) -> set[str]:
    return {
        event.asset_key.path[-1]
        for event in result.get_asset_materialization_events()
        if event.asset_key is not None
    }


def skip_reason(harness: Harness, result: dg.ExecuteInProcessResult, step: str) -> str:
    """Why the run skipped the step (its observation's metadata)."""
    [observation] = [
        event.asset_observation_data.asset_observation
        for event in result.get_asset_observation_events()
        if event.asset_key == asset_key(harness.spec, step)
    ]
    return str(observation.metadata[SKIPPED].value)


def test_the_new_data_sensor_waits_for_the_resume(harness: Harness, fake: FakeOpenAI) -> None:
    pause(harness)
    new_data = build_new_data_sensor(harness.spec, harness.settings)

    held = tick(harness, new_data)

    assert held.run_requests == [] and held.cursor is None  # the cursor stays as it was
    assert held.skip_reason is not None
    why = held.skip_reason.skip_message or ""
    assert why.startswith(f"{harness.spec.name} is paused by ops at ") and REASON in why

    resume(harness)

    [request] = tick(harness, new_data).run_requests
    assert request.partition_key == DAY.isoformat()
    assert execute(harness, request).success
    assert sorted(fake.submitted_custom_ids()) == sorted(harness.rows())


def test_a_run_that_meets_the_pause_submits_nothing_and_loses_no_day(
    harness: Harness, fake: FakeOpenAI
) -> None:
    """A submit run started anyway (a backfill, the schedule, the UI, a sensor's run requested
    just before the pause) succeeds, its submission skipped saying why; after the resume the
    batch-status sensor submits what it held, once."""
    pause(harness)
    status = build_batch_status_sensor(harness.spec)

    run = harness.materialize(*names.SUBMIT_ASSETS)

    assert run.success
    assert materialized(run) == {"input_snapshot", "request_shards"}
    why = skip_reason(harness, run, "provider_batches")
    assert why.startswith("paused by ops at ") and REASON in why
    assert f"llm-assets resume {harness.spec.name}" in why
    assert fake.submitted_custom_ids() == []
    shards = harness.ledger.shards(harness.job_id())
    assert {(s.status, s.raw_status) for s in shards} == {("created", steps.PAUSED)}
    assert tick(harness, status).run_requests == []

    resume(harness)

    [request] = tick(harness, status).run_requests
    assert request.run_key.startswith("held:")
    assert request.asset_selection == [asset_key(harness.spec, "provider_batches")]
    assert execute(harness, request).success
    assert sorted(fake.submitted_custom_ids()) == sorted(harness.rows())
    assert not [r for r in tick(harness, status).run_requests if r.run_key.startswith("held:")]


def test_a_day_in_flight_when_paused_is_imported_and_finished(
    harness: Harness, fake: FakeOpenAI
) -> None:
    assert harness.materialize(*names.SUBMIT_ASSETS).success
    sent = fake.submitted_custom_ids()
    assert len(sent) == len(harness.truth)
    pause(harness)
    status = build_batch_status_sensor(harness.spec)

    # One run imports, validates, publishes and reports the day: no tick between them.
    [request] = tick(harness, status).run_requests
    assert {key.path[-1] for key in request.asset_selection or []} == {
        *names.IMPORT_ASSETS,
        *names.GATED_ASSETS,
        *names.REPORT_ASSETS,
    }
    run = execute(harness, request)
    assert run.success
    assert materialized(run) == set(names.ASSETS) - set(names.SUBMIT_ASSETS)

    assert tick(harness, status).run_requests == []
    assert harness.labels() == harness.truth
    assert harness.ledger.counts(harness.job_id()).open == 0
    assert fake.submitted_custom_ids() == sent


def test_retries_wait_for_the_resume(harness: Harness, fake: FakeOpenAI) -> None:
    fake.line_fault = first_time({3: "5xx"})
    assert harness.materialize(*names.SUBMIT_ASSETS, *names.IMPORT_ASSETS).success
    [retry] = harness.ledger.shards(harness.job_id(), ["created"])
    pause(harness)
    status = build_batch_status_sensor(harness.spec)

    held = tick(harness, status)
    assert held.run_requests == []
    # The sensor's page says why it asks for nothing (its latest tick's skip reason).
    assert held.skip_reason is not None
    assert held.skip_reason.skip_message.startswith(f"{harness.spec.name} is paused by ops")
    assert REASON in held.skip_reason.skip_message
    run = harness.materialize("provider_batches")
    assert run.success and materialized(run) == set()
    assert len(fake.submitted_custom_ids()) == len(harness.truth)

    resume(harness)

    [request] = tick(harness, status).run_requests
    assert request.run_key.startswith(f"held:{retry.shard_id}:")
    assert execute(harness, request).success
    assert len(fake.submitted_custom_ids()) == len(harness.truth) + 1


def test_a_pause_between_shards_stops_the_rest(
    harness: Harness, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pause that comes while a run submits: the shards after it wait for the resume."""
    submit = OpenAIBatchProvider.submit

    def submit_then_pause(self: OpenAIBatchProvider, *args: object, **kwargs: object) -> str:
        batch_id = submit(self, *args, **kwargs)
        pause(harness)
        return batch_id

    monkeypatch.setattr(OpenAIBatchProvider, "submit", submit_then_pause)
    run = harness.materialize(*names.SUBMIT_ASSETS)

    assert run.success
    assert "(1 shard submitted before the pause)" in skip_reason(harness, run, "provider_batches")
    shards = harness.ledger.shards(harness.job_id())
    assert sorted(s.status for s in shards) == ["created", "created", "submitted"]
    assert len(fake.submitted_custom_ids()) == 10


def test_the_pause_and_resume_jobs_of_the_definitions(harness: Harness) -> None:
    """What an operator launches from the UI's Launchpad, with the reason as run config."""
    defs = build_definitions(harness.settings, [harness.spec])
    name = harness.spec.name
    pause_job = defs.resolve_job_def(f"{name}__pause")
    resume_job = defs.resolve_job_def(f"{name}__resume")

    for by, reason in (("ana", REASON), ("", "another")):  # a second pause changes nothing
        config = {"ops": {f"pause_{name}": {"config": {"reason": reason, "by": by}}}}
        assert pause_job.execute_in_process(run_config=config, instance=harness.instance).success
        paused = harness.ledger.pipeline_pause(name)
        assert paused is not None and (paused.paused_by, paused.reason) == ("ana", REASON)

    for _ in range(2):
        assert resume_job.execute_in_process(instance=harness.instance).success
        assert harness.ledger.pipeline_pause(name) is None


def test_run_wait_on_a_paused_pipeline_is_blocked_and_sends_nothing(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    """pause, status and resume in process; `run --wait` as scripts run it."""
    spec = review_spec("openai", "gpt-4o-mini")
    name, day = spec["name"], DAY.isoformat()
    write_reviews(tmp_path / "home", DAY, 10)
    env = cli_env(tmp_path, database_url, spec, fake)

    def cli(*args: str) -> str:
        """What the command printed, on one line (the console wraps at 80 columns)."""
        result = CliRunner().invoke(cli_main, list(args), env=env, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return " ".join(result.stdout.split())

    paused = cli("pause", name, "--reason", REASON)
    assert paused.startswith(f"{name} is paused by cli:") and REASON in paused
    again = cli("pause", name, "--reason", "another")
    assert again.startswith(f"{name} was already paused by cli:")
    assert REASON in again and "another" not in again

    run = cli_process.run(
        [CLI, "run", name, "--date", day, "--wait", "--poll-interval", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("blocked: paused by cli:") and REASON in run.stderr
    assert f"`llm-assets resume {name}`" in run.stderr
    assert fake.submitted_custom_ids() == []

    report = json.loads(cli("status", name, "--date", day, "--json"))
    assert report["paused"]["reason"] == REASON
    assert report["paused"]["paused_by"].startswith("cli:")
    assert report["paused"]["text"].startswith("paused by cli:")
    assert cli("status", name, "--date", day).startswith(f"{name} is paused by cli:")

    assert cli("resume", name).startswith(f"{name} is resumed (paused by cli:")
    assert cli("resume", name) == f"{name} is not paused; nothing changed"
    assert json.loads(cli("status", name, "--date", day, "--json"))["paused"] is None
