"""Retention: a shard's files at the provider are deleted once its results are imported (each
batch provider against its fake), and the retention job deletes the artifacts of days finished
long enough ago, of the configured kinds only, on local storage and on S3."""

import datetime as dt
import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
import yaml

from llm_assets import names
from llm_assets.definitions import build_definitions
from llm_assets.defs.factory import asset_key, build_pipeline_assets
from llm_assets.defs.retention_jobs import (
    apply_retention,
    build_retention_job,
    build_retention_schedule,
)
from llm_assets.resources.ledger import ShardRecord, result_table, utcnow
from llm_assets.resources.providers.bedrock import BedrockBatchProvider
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec.model import PipelineSpec
from tests.conftest import MotoS3
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.bedrock_server import FakeBedrock
from tests.fakes.common import ControlFault, FaultPlan
from tests.fakes.openai_server import FakeOpenAI
from tests.harness import Harness, fake_harness, open_harness, review_spec, truthful, write_reviews
from tests.test_bedrock_provider import ROLE, bedrock_spec
from tests.test_bedrock_provider import truthful as bedrock_truthful

pytestmark = pytest.mark.one_database

KEEP = {"retention": {"provider_files": "keep"}}
RETENTION_LOGGER = "llm_assets.compliance.retention"


def shards_of(harness: Harness) -> list[ShardRecord]:
    shards = harness.ledger.shards(harness.job_id())
    assert shards and all(s.status == "imported" for s in shards)
    return shards


def assert_deletions_logged(caplog: pytest.LogCaptureFixture, shards: list[ShardRecord]) -> None:
    """One log line per shard naming its batch and why its files went."""
    messages = [r.getMessage() for r in caplog.records if r.name == RETENTION_LOGGER]
    for shard in shards:
        why = f"retention.provider_files: delete_after_import, shard {shard.shard_id} imported"
        assert any(why in m and str(shard.provider_batch_id) in m for m in messages), messages


# Provider files: OpenAI


def openai_files_of(fake: FakeOpenAI, shards: list[ShardRecord]) -> set[str]:
    """The file ids the shards' batches name (input, output, error) that the fake still holds."""
    named = set()
    for shard in shards:
        batch = fake.batch(str(shard.provider_batch_id))
        assert batch is not None
        named |= {batch[k] for k in ("input_file_id", "output_file_id", "error_file_id")}
    held = {f["id"] for f in fake.store.all_files()}
    return named & held


@pytest.mark.fake_server("openai", responder=truthful)
def test_openai_files_are_deleted_after_import(
    tmp_path: Path, database_url: str, fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    fake.line_fault = lambda custom_id, body: "4xx" if "Order 1003 " in json.dumps(body) else None
    caplog.set_level(logging.INFO, logger=RETENTION_LOGGER)
    with fake_harness(tmp_path, database_url, fake) as harness:
        assert harness.run_day().open_items == 0
        shards = shards_of(harness)

        assert len(shards) == 3
        assert all(s.provider_files_deleted_at is not None for s in shards)
        assert fake.store.all_files() == []  # inputs, outputs and the error file all gone
        assert any(fake.batch(str(s.provider_batch_id))["error_file_id"] for s in shards)
        assert_deletions_logged(caplog, shards)
        # The ledger keeps what it needs: every result, and our shard files.
        assert len(harness.labels()) == len(harness.truth) - 1
        assert all(Path(s.input_uri).is_file() for s in shards)


@pytest.mark.fake_server("openai", responder=truthful)
def test_a_failed_deletion_leaves_the_import_and_is_retried_later(
    tmp_path: Path, database_url: str, fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    fake.faults.add(ControlFault("DELETE", "/v1/files/", status=403, times=1000))
    caplog.set_level(logging.INFO, logger=RETENTION_LOGGER)
    with fake_harness(tmp_path, database_url, fake) as harness:
        outcome = harness.run_day()

        assert outcome.done and outcome.succeeded == len(harness.truth)
        shards = shards_of(harness)
        assert all(s.provider_files_deleted_at is None for s in shards)
        assert len(openai_files_of(fake, shards)) == 2 * len(shards)
        warnings = [
            r.getMessage()
            for r in caplog.records
            if r.name == RETENTION_LOGGER and r.levelno == logging.WARNING
        ]
        assert any("could not delete" in w and shards[0].shard_id in w for w in warnings)

        # The day's next import tries again; while the provider still refuses, nothing changes.
        assert harness.materialize("batch_results").success
        assert all(
            s.provider_files_deleted_at is None for s in harness.ledger.shards(harness.job_id())
        )

        fake.faults = FaultPlan()
        assert harness.materialize("batch_results").success

        assert all(s.provider_files_deleted_at for s in harness.ledger.shards(harness.job_id()))
        assert openai_files_of(fake, shards) == set()


@pytest.mark.fake_server("openai", responder=truthful)
def test_the_retention_job_retries_pending_provider_deletions(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    fake.faults.add(ControlFault("DELETE", "/v1/files/", status=500, times=1000))
    with fake_harness(tmp_path, database_url, fake, retention={"artifacts_days": 30}) as harness:
        assert harness.run_day().done
        shards = shards_of(harness)
        assert all(s.provider_files_deleted_at is None for s in shards)
        fake.faults = FaultPlan()

        result = build_retention_job(harness.spec).execute_in_process(
            resources=harness.resources, instance=harness.instance
        )

        assert result.success
        assert all(s.provider_files_deleted_at for s in harness.ledger.shards(harness.job_id()))
        assert openai_files_of(fake, shards) == set()
        # The day finished just now: its artifacts all stay.
        assert harness.storage.list_uris(f"snapshots/{harness.spec.name}")


# Provider files: Anthropic, Bedrock (each adapter's deletion: the provider contract suite)


@pytest.mark.fake_server("anthropic")
def test_an_anthropic_batch_still_processing_is_not_deleted(
    tmp_path: Path, database_url: str, fake: FakeAnthropic
) -> None:
    fake.polls_per_state = 1000
    with fake_harness(tmp_path, database_url, fake) as harness:
        [shard, *_] = harness.submit()
        files = shard_files(shard)

        with pytest.raises(RuntimeError, match="not ended"):
            harness.provider.delete_files(files)

        assert str(shard.provider_batch_id) in fake.held_batch_ids()


def shard_files(shard: ShardRecord) -> Any:
    from llm_assets.resources.providers.base import ShardFiles

    return ShardFiles(
        shard_id=shard.shard_id,
        provider_batch_id=str(shard.provider_batch_id),
        input_uri=shard.input_uri,
    )


def s3_keys(moto_s3: MotoS3, prefix: str) -> list[str]:
    pages = (
        moto_s3.client()
        .get_paginator("list_objects_v2")
        .paginate(Bucket=moto_s3.bucket, Prefix=prefix)
    )
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


@pytest.mark.fake_server("bedrock", min_records=50, responder=bedrock_truthful)
def test_bedrock_input_copies_are_deleted_after_import_and_our_shard_files_stay(
    tmp_path: Path,
    database_url: str,
    moto_s3: MotoS3,
    fake: FakeBedrock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Artifacts on local disk: each job read a copy of its shard file in the S3 staging
    folder, which goes with the job's outputs. (With artifacts on S3 the job reads our shard
    file in place, which stays: the provider contract suite runs that case.)"""
    run = f"run-{uuid.uuid4().hex[:8]}"
    provider = BedrockBatchProvider(
        role_arn=ROLE,
        endpoint_url=fake.endpoint_url,
        retry_base_seconds=0.01,
        staging_uri=f"s3://{moto_s3.bucket}/{run}/staging",
    )
    caplog.set_level(logging.INFO, logger=RETENTION_LOGGER)
    with open_harness(tmp_path, database_url, bedrock_spec(), provider, reviews=120) as harness:
        assert harness.run_day().open_items == 0

        shards = shards_of(harness)
        assert all(s.provider_files_deleted_at is not None for s in shards)
        jobs = fake.jobs()
        assert len(jobs) == len(shards) == 2
        for job in jobs:
            output = job["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"]
            assert s3_keys(moto_s3, output.split("/", 3)[3]) == []  # outputs and manifest gone
        assert s3_keys(moto_s3, f"{run}/staging/") == []  # the input copies too
        assert all(Path(s.input_uri).is_file() for s in shards)
        assert_deletions_logged(caplog, shards)


# Artifacts


OLD, RECENT, OPEN = dt.date(2026, 11, 2), dt.date(2026, 11, 3), dt.date(2026, 11, 4)
DELETED_KINDS = ("snapshots", "shards", "qa")


def artifact_kinds(storage: ArtifactStorage, spec: PipelineSpec, day: dt.date) -> dict[str, int]:
    """Artifacts of a pipeline's day, counted by kind."""
    found: dict[str, int] = {}
    root = storage.uri("snapshots").removesuffix("snapshots")
    for uri in storage.list_uris(""):
        kind, pipeline, rest = uri[len(root) :].split("/", 2)
        if pipeline == spec.name and rest.split("/")[0].split(".")[0] == day.isoformat():
            found[kind] = found.get(kind, 0) + 1
    return found


def age_day(harness: Harness, day: dt.date, days: int) -> None:
    """Make the day's items look as if they became terminal `days` ago."""
    job = [j for j in harness.ledger.jobs_for_partition(harness.spec.name, day)][0]
    with harness.ledger.begin() as conn:
        conn.execute(
            sa.update(result_table)
            .where(result_table.c.job_id == job.job_id)
            .values(updated_at=utcnow() - dt.timedelta(days=days))
        )


@pytest.fixture(params=["local", "s3"])
def three_days(
    request: pytest.FixtureRequest, tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> Iterator[Harness]:
    """An OpenAI pipeline keeping 7 days of artifacts, with an old finished day, a recent
    finished day and an old day with open work, on local storage or on S3."""
    retention = {"artifacts_days": 7}
    with fake_harness(tmp_path, database_url, fake, 12, retention=retention) as harness:
        if request.param == "s3":
            moto_s3: MotoS3 = request.getfixturevalue("moto_s3")
            base = f"s3://{moto_s3.bucket}/run-{uuid.uuid4().hex[:8]}"
            harness.storage = ArtifactStorage(base_url=base)
        for day in (RECENT, OPEN):
            write_reviews(harness.home, day, 12)
        assert harness.runner().run_day(OLD, wait=True).done
        assert harness.runner().run_day(RECENT, wait=True).done
        fake.polls_per_state = 1000  # OPEN's batch never ends
        submitted = dg.materialize(
            build_pipeline_assets(harness.spec, harness.settings),
            instance=harness.instance,
            resources=harness.resources,
            partition_key=OPEN.isoformat(),
            selection=[asset_key(harness.spec, s) for s in names.SUBMIT_ASSETS],
        )
        assert submitted.success
        age_day(harness, OLD, 30)
        age_day(harness, OPEN, 30)
        age_day(harness, RECENT, 2)
        yield harness


@pytest.mark.fake_server("openai", responder=truthful)
def test_the_retention_job_deletes_old_days_snapshots_shards_and_qa_only(
    three_days: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    harness, spec, storage = three_days, three_days.spec, three_days.storage
    before = {day: artifact_kinds(storage, spec, day) for day in (OLD, RECENT, OPEN)}
    assert set(DELETED_KINDS) <= set(before[OLD]) and set(DELETED_KINDS) <= set(before[RECENT])
    assert {"outputs", "dead_letters", "reports"} <= set(before[OLD])
    assert {"snapshots", "shards"} <= set(before[OPEN])
    caplog.set_level(logging.INFO, logger=RETENTION_LOGGER)

    dry = cli(harness, "retention", spec.name, "--dry-run")
    assert dry.exit_code == 0, dry.output
    would = [line for line in dry.output.splitlines() if line.startswith("would delete ")]
    assert len(would) == sum(before[OLD][k] for k in DELETED_KINDS)
    assert all(f"{spec.name} {OLD} finished" in line for line in would)
    assert f"{spec.name} {OPEN}: kept (open work: 12 open item(s)" in dry.output
    assert {day: artifact_kinds(storage, spec, day) for day in before} == before

    result = build_retention_job(spec).execute_in_process(
        resources=harness.resources, instance=harness.instance
    )

    assert result.success
    after = {day: artifact_kinds(storage, spec, day) for day in before}
    assert after[OLD] == {k: n for k, n in before[OLD].items() if k not in DELETED_KINDS}
    assert after[RECENT] == before[RECENT]
    assert after[OPEN] == before[OPEN]
    if not storage.is_s3:  # no empty day folders are left behind
        assert not Path(storage.uri(f"snapshots/{spec.name}/{OLD}")).exists()
        assert not Path(storage.uri(f"shards/{spec.name}/{OLD}")).exists()
        assert Path(storage.uri(f"shards/{spec.name}/{RECENT}")).is_dir()
    deleted = [r.getMessage() for r in caplog.records if r.getMessage().startswith("deleted ")]
    assert len(deleted) == sum(before[OLD][k] for k in DELETED_KINDS)
    assert all("retention.artifacts_days: 7" in m and str(OLD) in m for m in deleted)
    # Run again: nothing left to delete, the other days still kept for their reasons.
    again = apply_retention(spec, harness.ledger, storage, harness.provider)
    assert again.expiry.expired == []
    assert "open work" in again.expiry.day(spec.name, OPEN).why
    assert "within 7 day(s)" in again.expiry.day(spec.name, RECENT).why


def cli(harness: Harness, *args: str) -> Any:
    """`llm-assets *args` in process, on the harness's ledger, storage and spec."""
    from click.testing import CliRunner

    from llm_assets.cli.main import main

    folder = harness.settings.pipelines_dir
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{harness.spec.name}.yaml").write_text(
        yaml.safe_dump(harness.spec.model_dump(mode="json", by_alias=True, exclude_unset=True))
    )
    env = {
        "LLM_ASSETS_HOME": str(harness.home),
        "LLM_ASSETS_DATABASE_URL": harness.settings.database_url,
        "LLM_ASSETS_PIPELINES": str(folder),
        "LLM_ASSETS_STORAGE_URL": harness.storage.base_url,
    }
    return CliRunner().invoke(main, list(args), env=env)


def test_the_retention_schedule_exists_only_when_artifacts_days_is_set(tmp_path: Path) -> None:
    def spec(**overrides: Any) -> PipelineSpec:
        return PipelineSpec.model_validate(review_spec("openai", "gpt-4o-mini", **overrides))

    assert build_retention_schedule(spec()) is None
    schedule = build_retention_schedule(spec(retention={"artifacts_days": 14}))
    assert schedule is not None
    assert schedule.job_name == names.retention_job(spec().name) == "reviews_openai__retention"
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING

    from llm_assets.util.settings import Settings

    settings = Settings(
        home=tmp_path,
        database_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        pipelines_dir=tmp_path,
        storage_url=str(tmp_path / "artifacts"),
        dagster_home=tmp_path,
    )
    repository = build_definitions(
        settings, [spec(retention={"artifacts_days": 14})]
    ).get_repository_def()
    scheduled = repository.get_schedule_def("reviews_openai__retention_schedule")
    assert scheduled.job_name == "reviews_openai__retention"
    assert repository.has_job("reviews_openai__retention")
    assert (
        not build_definitions(settings, [spec()])
        .get_repository_def()
        .has_job("reviews_openai__retention")
    )
