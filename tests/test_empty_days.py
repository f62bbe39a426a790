"""A day with no source rows: input_snapshot says so and every later step materializes the
day as empty, with nothing to check."""

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from llm_assets import names, steps
from llm_assets.defs import checks
from llm_assets.defs.factory import build_pipeline_assets
from llm_assets.resources.ledger import job_table
from tests.test_cli import Env
from tests.test_pipeline import DAY, Platform

EMPTY = dt.date(2026, 11, 8)


@pytest.fixture
def platform(tmp_path: Path, database_url: str) -> Iterator[Platform]:
    (tmp_path / "dagster").mkdir()
    with dg.DagsterInstance.ephemeral() as instance:
        yield Platform(tmp_path / "home", database_url, instance)


def materialized(result: dg.ExecuteInProcessResult) -> set[str]:
    return {e.asset_key.path[-1] for e in result.get_asset_materialization_events()}


def test_an_empty_day_is_materialized_as_empty_and_a_day_with_rows_runs(
    platform: Platform,
) -> None:
    spec = platform.spec
    empty = platform.materialize(day=EMPTY)

    # Every step materializes the empty day (the UI shows it run), each saying why it had
    # nothing to do, and every check has an outcome: only source_rows fails (a warning).
    assert empty.success
    assert materialized(empty) == set(names.ASSETS)
    assert not [e for e in empty.all_events if e.event_type_value == "STEP_SKIPPED"]
    assert not [e for e in empty.all_events if e.is_step_failure]
    reason = f"no source rows for {EMPTY}"
    for step in names.ASSETS[1:]:
        [later] = empty.asset_materializations_for_node(f"{spec.name}__{step}")
        assert later.metadata["no_source_rows"].value == reason, step
        assert later.metadata["day_state"].value == "empty", step
    evaluations = empty.get_asset_check_evaluations()
    planned = {
        (spec_.asset_key.path[-1], spec_.name)
        for asset in build_pipeline_assets(spec, platform.settings)
        for spec_ in asset.check_specs
    }
    assert {(e.asset_key.path[-1], e.check_name) for e in evaluations} == planned
    assert [e.check_name for e in evaluations if not e.passed] == [checks.SOURCE_ROWS]
    assert all(
        e.description == f"{reason}: nothing to check"
        for e in evaluations
        if e.check_name != checks.SOURCE_ROWS
    )
    [snapshot] = empty.asset_materializations_for_node(f"{spec.name}__input_snapshot")
    assert snapshot.metadata["no_source_rows"].value == "no source rows for 2026-11-08"
    assert snapshot.metadata["dagster/row_count"].value == 0
    [rows_check] = [
        e for e in empty.get_asset_check_evaluations() if e.check_name == checks.SOURCE_ROWS
    ]
    assert not rows_check.passed
    assert rows_check.severity == dg.AssetCheckSeverity.WARN
    assert rows_check.description == "no source rows for 2026-11-08"
    assert platform.ledger.get_job(steps.job_id_of(spec, EMPTY)) is None
    artifacts = Path(platform.settings.storage_url)
    assert not (artifacts / "published" / spec.name / f"{EMPTY}.parquet").exists()
    assert platform.provider_batches() == []
    assert steps.no_source_rows(spec, EMPTY, platform.storage)

    full = platform.materialize()

    assert full.success
    assert materialized(full) == set(names.ASSETS)
    [snapshot] = full.asset_materializations_for_node(f"{spec.name}__input_snapshot")
    assert "no_source_rows" not in snapshot.metadata
    [rows_check] = [
        e for e in full.get_asset_check_evaluations() if e.check_name == checks.SOURCE_ROWS
    ]
    assert rows_check.passed
    assert (artifacts / "published" / spec.name / f"{DAY}.parquet").exists()
    with platform.ledger.engine.connect() as conn:
        jobs = conn.execute(sa.select(job_table.c.partition_date)).scalars().all()
    assert [str(d)[:10] for d in jobs] == [DAY.isoformat()]


def test_rows_that_arrive_later_run_the_once_empty_day(platform: Platform) -> None:
    spec = platform.spec
    assert platform.materialize(day=EMPTY).success
    source = platform.generated.files[0]
    later = source.with_name(source.name.replace(DAY.isoformat(), EMPTY.isoformat()))
    later.write_text(source.read_text().replace(DAY.isoformat(), EMPTY.isoformat()))

    result = platform.materialize(day=EMPTY)

    assert result.success
    assert materialized(result) == set(names.ASSETS)
    assert not steps.no_source_rows(spec, EMPTY, platform.storage)
    assert platform.ledger.get_job(steps.job_id_of(spec, EMPTY)) is not None


@pytest.mark.one_database
def test_run_wait_on_an_empty_day_exits_0_and_status_and_costs_say_no_data(
    tmp_path: Path, database_url: str
) -> None:
    env = Env(tmp_path, database_url)
    day = EMPTY.isoformat()

    done = env.run("run", "support_tickets", "--date", day, "--wait", "--json")

    assert done.returncode == 0, done.stderr
    [outcome] = json.loads(done.stdout)
    assert outcome["no_data"] == f"no source rows for {day}"
    assert outcome["job_id"] is None
    assert outcome["done"]
    table = env.run("run", "support_tickets", "--date", day, "--wait")
    assert table.returncode == 0, table.stderr
    assert "no data" in table.stdout
    status = env.run("status", "support_tickets", "--date", day)
    assert f"no data (no source rows for {day})" in status.stdout
    as_json = json.loads(env.run("status", "support_tickets", "--date", day, "--json").stdout)
    assert as_json["no_data"] == f"no source rows for {day}"
    assert as_json["jobs"] == []
    costs = env.run("costs", "support_tickets", "--from", day, "--to", day)
    assert f"{day}: no data" in costs.stdout
    costs_json = json.loads(
        env.run("costs", "support_tickets", "--from", day, "--to", day, "--json").stdout
    )
    assert costs_json["rows"] == []
    assert costs_json["no_data"] == [day]
