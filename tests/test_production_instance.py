"""The shipped `dagster.yaml`, proven: real runs on the Dagster instance it configures.

Each test copies the repo's dagster.yaml into a fresh DAGSTER_HOME and points its
DAGSTER_PG_* variables at a new PostgreSQL database (created on the server of
LLM_ASSETS_TEST_DATABASE_URL and dropped afterwards, so Dagster's schema never meets another
test's). Skipped without that variable; under CI=true the suite requires it (conftest.py).
"""

import os
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
import yaml
from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage

from llm_assets import names
from llm_assets.defs.factory import asset_key
from llm_assets.resources.ledger import shard_table
from llm_assets.resources.providers.local import LocalProvider
from llm_assets.resources.providers.local_engine import MODEL_NAME
from llm_assets.util.settings import REPO_ROOT
from tests import cli_process
from tests.conftest import PG_URL
from tests.fakes.openai_server import FakeOpenAI
from tests.harness import CLI, DAY, Harness, provider_for, review_spec, truthful

PARTITION = DAY.isoformat()


@pytest.fixture
def production_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """DAGSTER_HOME holding the shipped dagster.yaml, its env vars aimed at a new database."""
    if PG_URL is None:
        pytest.skip(
            "LLM_ASSETS_TEST_DATABASE_URL is not set; the production dagster.yaml needs PostgreSQL"
        )
    url = sa.engine.make_url(PG_URL)
    if (url.port or 5432) != 5432:
        pytest.skip(f"dagster.yaml connects on port 5432; the test server is on {url.port}")
    database = f"dagster_prod_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{database}"'))
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("DAGSTER_PG_HOST", url.host or "127.0.0.1")
    monkeypatch.setenv("DAGSTER_PG_USER", url.username or "postgres")
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", url.password or "")
    monkeypatch.setenv("DAGSTER_PG_DB", database)
    monkeypatch.delenv("LLM_ASSETS_FAILPOINT", raising=False)
    try:
        yield home
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def instance(production_home: Path) -> Iterator[dg.DagsterInstance]:
    with dg.DagsterInstance.get() as instance:
        yield instance


def reread(home: Path) -> dg.DagsterInstance:
    """A second instance on the same config: what it sees is in PostgreSQL, not in memory."""
    return dg.DagsterInstance.from_config(str(home))


def local_day(
    tmp_path: Path, instance: dg.DagsterInstance, reviews: int, **options: float
) -> Harness:
    """`reviews` reviews for the local provider (`options` as LocalProvider takes them), run on
    `instance`, with the ledger in a SQLite file: the instance is what these tests prove."""
    return Harness(
        tmp_path,
        f"sqlite:///{tmp_path / 'ledger.db'}",
        instance,
        review_spec("local", MODEL_NAME),
        LocalProvider(state_dir=str(tmp_path / "local_provider"), **options),
        reviews=reviews,
    )


def metadata_of(instance: dg.DagsterInstance, key: dg.AssetKey, run_id: str) -> dict[str, object]:
    [record] = [
        r for r in instance.fetch_materializations(key, limit=10).records if r.run_id == run_id
    ]
    materialization = record.asset_materialization
    assert materialization is not None
    assert materialization.partition == PARTITION
    return {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}


def test_a_day_materializes_on_the_shipped_production_instance(
    tmp_path: Path, production_home: Path, instance: dg.DagsterInstance
) -> None:
    harness = local_day(tmp_path, instance, 12, work_budget_seconds=120.0)

    result = harness.materialize(*names.SUBMIT_ASSETS, "batch_results")

    assert result.success
    with reread(production_home) as stored:
        assert isinstance(stored.run_storage, PostgresRunStorage)
        assert isinstance(stored.event_log_storage, PostgresEventLogStorage)
        [record] = stored.get_run_records()
        assert record.dagster_run.run_id == result.run_id
        assert record.dagster_run.status == dg.DagsterRunStatus.SUCCESS
        assert record.dagster_run.tags["dagster/partition"] == PARTITION
        for step in (*names.SUBMIT_ASSETS, "batch_results"):
            key = asset_key(harness.spec, step)
            assert stored.get_materialized_partitions(key) == {PARTITION}, step
        submitted = metadata_of(stored, asset_key(harness.spec, "provider_batches"), result.run_id)
        assert submitted["submitted_shards"] == 2
        imported = metadata_of(stored, asset_key(harness.spec, "batch_results"), result.run_id)
        assert (imported["succeeded"], imported["open_items"]) == (12, 0)

        # provider_batches ran in its provider's pool, which took the limit from dagster.yaml
        # and gave its slot back when the step ended.
        shipped = yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text())
        limit = shipped["concurrency"]["pools"]["default_limit"]
        assert stored.get_concurrency_config().pool_config.default_pool_limit == limit
        pools = {
            p.name: (p.limit, p.from_default) for p in stored.event_log_storage.get_pool_limits()
        }
        assert pools == {"llm_provider_local": (limit, True)}
        slots = stored.event_log_storage.get_concurrency_info("llm_provider_local")
        assert slots.claimed_slots == []

        # Run monitoring frees the slots of runs that died holding them; run retries re-run
        # crashed runs only, never a step that failed (a gate, bad input).
        assert stored.run_monitoring_enabled
        assert stored.run_monitoring_settings["free_slots_after_run_end_seconds"] > 0
        assert stored.run_monitoring_max_runtime_seconds > 0
        assert stored.run_retries_enabled
        assert stored.run_retries_max_retries >= 1
        assert not stored.run_retries_retry_on_asset_or_op_failure


def test_a_failed_step_is_not_retried(
    tmp_path: Path, production_home: Path, instance: dg.DagsterInstance
) -> None:
    harness = local_day(tmp_path, instance, 4)

    # Submitting before request_shards ran is a step failure ("materialize request_shards
    # first"): the instance marks the run as one the retry daemon must leave alone.
    result = harness.materialize("provider_batches")

    assert not result.success
    with reread(production_home) as stored:
        run = stored.get_run_by_id(result.run_id)
        assert run is not None
        assert run.status == dg.DagsterRunStatus.FAILURE
        assert run.tags["dagster/failure_reason"] == "STEP_FAILURE"
        assert run.tags[names.WILL_RETRY_TAG] == "false"


def test_a_run_killed_after_paying_for_a_batch_is_retried_without_paying_again(
    tmp_path: Path, production_home: Path, instance: dg.DagsterInstance
) -> None:
    with FakeOpenAI(tmp_path / "fake_openai") as fake:
        fake.responder = truthful
        ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
        harness = Harness(
            tmp_path,
            ledger_url,
            instance,
            review_spec("openai", "gpt-4o-mini"),
            provider_for(fake),
            reviews=20,
        )
        specs = tmp_path / "specs"
        specs.mkdir()
        (specs / "reviews.yaml").write_text(yaml.safe_dump(review_spec("openai", "gpt-4o-mini")))
        env = {
            **os.environ,
            "LLM_ASSETS_HOME": str(harness.home),
            "LLM_ASSETS_DATABASE_URL": ledger_url,
            "LLM_ASSETS_PIPELINES": str(specs),
            "OPENAI_BASE_URL": fake.base_url,
            "OPENAI_API_KEY": "test-key",
            # The run worker dies after OpenAI created the first shard's batch and before the
            # ledger recorded it: the one moment a naive retry would pay twice.
            "LLM_ASSETS_FAILPOINT": "submit.after_create",
        }
        killed = cli_process.run(
            [CLI, "run", harness.spec.name, "--date", PARTITION],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert killed.returncode == -signal.SIGKILL, killed.stderr

        [crashed] = instance.get_runs()
        assert crashed.status == dg.DagsterRunStatus.STARTED
        # The dead run still holds its provider_batches slot: run monitoring frees it
        # free_slots_after_run_end_seconds after the run is marked as ended.
        slots = instance.event_log_storage.get_concurrency_info("llm_provider_openai")
        assert [s.run_id for s in slots.claimed_slots] == [crashed.run_id]
        [paid] = fake.store.all_batches()

        # Run monitoring marks a run whose worker is gone as failed (a launched worker at its
        # next health check, a killed CLI process at max_runtime_seconds), and the instance
        # marks it as one to retry, unlike a step failure.
        instance.report_run_failed(crashed, "run worker exited unexpectedly")
        failed = instance.get_run_by_id(crashed.run_id)
        assert failed is not None
        assert failed.status == dg.DagsterRunStatus.FAILURE
        assert failed.tags[names.WILL_RETRY_TAG] == "true"
        # Run monitoring then gives the dead run's pool slot back (free_slots_after_run_end_
        # seconds later); with one slot per provider the retry waits for exactly that.
        instance.event_log_storage.free_concurrency_slots_for_run(crashed.run_id)
        assert (
            instance.event_log_storage.get_concurrency_info("llm_provider_openai").claimed_slots
            == []
        )
        # The retry daemon re-executes a run launched from the code location (UI, sensor,
        # backfill) from its failed step; a CLI run is retried by running the command again.
        # Either way, what runs again is provider_batches for this partition.
        retry = harness.materialize("provider_batches")

        assert retry.success
        batches = fake.store.all_batches()
        with harness.ledger.engine.connect() as conn:
            recorded = {
                r.shard_id: r.provider_batch_id
                for r in conn.execute(
                    sa.select(shard_table.c.shard_id, shard_table.c.provider_batch_id)
                )
            }
        assert len(recorded) == 2
        assert sorted(recorded.values()) == sorted(b["id"] for b in batches)
        assert recorded[paid["metadata"]["shard_id"]] == paid["id"]
        retried = metadata_of(instance, asset_key(harness.spec, "provider_batches"), retry.run_id)
        assert retried["submitted_shards"] == 2  # one adopted, one created

        # Running the step once more (a manual re-execution) submits nothing.
        again = harness.materialize("provider_batches")
        assert again.success
        assert len(fake.store.all_batches()) == 2
        again_meta = metadata_of(
            instance, asset_key(harness.spec, "provider_batches"), again.run_id
        )
        assert again_meta["submitted_shards"] == 0
