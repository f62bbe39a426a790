"""The demo pipeline, materialized through Dagster on a real instance, on both databases."""

import datetime as dt
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa

from llm_assets import names, steps
from llm_assets.defs.factory import asset_key, build_pipeline_assets
from llm_assets.demo.data import generate_demo_data
from llm_assets.resources.ledger import TERMINAL, LedgerResource, result_table
from llm_assets.resources.providers.local import LocalProvider
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec.load import load_specs
from llm_assets.spec.model import PipelineSpec
from llm_assets.util.settings import REPO_ROOT, Settings
from tests.eval_harness import result_rows
from tests.ledger_helpers import set_item_status

pytestmark = pytest.mark.slow

DAY = dt.date(2026, 11, 2)
PARTITION = DAY.isoformat()
EXPECTED_INPUT_DEAD_LETTERS = {
    "empty_body": "empty_field",
    "duplicate_id": "duplicate_id",
    "missing_date": "missing_date",
    "oversized_body": "context_exceeded",
    "missing_id": "missing_id",
}


class Platform:
    def __init__(self, home: Path, database_url: str, instance: dg.DagsterInstance) -> None:
        self.settings = Settings(
            home=home,
            database_url=database_url,
            pipelines_dir=REPO_ROOT / "pipelines",
            storage_url=str(home / "artifacts"),
            dagster_home=home / "dagster",
        )
        self.spec = next(
            s for s in load_specs(self.settings.pipelines_dir) if s.name == "support_tickets"
        )
        self.instance = instance
        self.ledger = LedgerResource(database_url=database_url)
        self.storage = ArtifactStorage(base_url=self.settings.storage_url)
        self.provider = LocalProvider(
            state_dir=str(home / "local_provider"), work_budget_seconds=600.0
        )
        self.generated = generate_demo_data(home / "demo", start=DAY, days=1, tickets_per_day=30)

    @property
    def resources(self) -> dict[str, Any]:
        return {"ledger": self.ledger, "storage": self.storage, "local_provider": self.provider}

    def materialize(
        self,
        step_names: tuple[str, ...] = names.ASSETS,
        spec: PipelineSpec | None = None,
        day: dt.date = DAY,
    ) -> dg.ExecuteInProcessResult:
        spec = spec or self.spec
        result = dg.materialize(
            build_pipeline_assets(spec, self.settings),
            instance=self.instance,
            resources=self.resources,
            partition_key=day.isoformat(),
            selection=[asset_key(spec, s) for s in step_names],
        )
        assert result.success
        return result

    def metadata(self, result: dg.ExecuteInProcessResult, step: str) -> dict[str, Any]:
        for event in result.get_asset_materialization_events():
            materialization = event.step_materialization_data.materialization
            if materialization.asset_key == asset_key(self.spec, step):
                return {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}
        raise AssertionError(f"no materialization of {step}")

    def provider_batches(self) -> list[str]:
        root = Path(self.provider.state_dir) / "batches"
        return sorted(p.name for p in root.iterdir()) if root.exists() else []

    def rows(self, job_id: str) -> list[dict[str, Any]]:
        return result_rows(self.ledger, job_id)


@pytest.fixture
def platform(tmp_path: Path, database_url: str) -> Iterator[Platform]:
    (tmp_path / "dagster").mkdir()
    with dg.DagsterInstance.ephemeral() as instance:
        yield Platform(tmp_path / "home", database_url, instance)


def source_lines(platform: Platform) -> int:
    return len(platform.generated.files[0].read_text().splitlines())


def test_a_day_end_to_end_leaves_one_terminal_row_per_snapshot_item(platform: Platform) -> None:
    result = platform.materialize()

    snapshot = platform.metadata(result, "input_snapshot")
    assert snapshot["dagster/row_count"] == source_lines(platform)
    job = steps.existing_job(platform.spec, DAY, platform.ledger)
    rows = platform.rows(job.job_id)
    assert len(rows) == snapshot["dagster/row_count"]
    assert len({r["custom_id"] for r in rows}) == len(rows)
    assert all(r["status"] in TERMINAL for r in rows)

    counts = platform.ledger.counts(job.job_id)
    imported = platform.metadata(result, "batch_results")
    assert imported["succeeded"] + imported["dead_letters"] == counts.total
    assert imported["open_items"] == 0
    validated = platform.metadata(result, "validated_outputs")
    report = platform.metadata(result, "cost_report")
    dead = platform.metadata(result, "dead_letter")
    assert validated["dagster/row_count"] == counts.succeeded == report["succeeded"]
    assert dead["dagster/row_count"] == counts.dead_letters == report["dead_letters"]
    assert report["items"] == counts.total
    assert report["input_tokens"] == counts.input_tokens > 0
    assert report["output_tokens"] == counts.output_tokens > 0
    for step in names.ASSETS:
        metadata = platform.metadata(result, step)
        assert metadata["prompt_version"] == "v1"
        assert metadata["model"] == "all-MiniLM-L6-v2"
        assert metadata["provider"] == "local"

    succeeded = [r for r in rows if r["status"] == "succeeded"]
    assert len(succeeded) >= 28
    for row in succeeded:
        output = json.loads(row["result_json"])
        assert output["category"] in platform.spec.output.output_schema["category"].isin
        assert 0 <= output["confidence"] <= 1
        assert row["source_id"]
        assert row["attempts"] == 1


def test_bad_rows_end_as_input_dead_letters_with_their_reason(platform: Platform) -> None:
    platform.materialize()
    job = steps.existing_job(platform.spec, DAY, platform.ledger)
    dead = {
        r["error_code"]: r
        for r in platform.rows(job.job_id)
        if r["status"] == "dead_letter" and r["error_class"] == "input"
    }
    assert set(dead) == set(EXPECTED_INPUT_DEAD_LETTERS.values())
    bad = platform.generated.bad_rows
    assert dead["duplicate_id"]["source_id"] == bad["duplicate_id"][0]
    assert "already seen at" in dead["duplicate_id"]["error_message"]
    assert dead["missing_id"]["source_id"] is None
    assert "ticket_id" in dead["missing_id"]["error_message"]
    assert dead["empty_field"]["source_id"] == bad["empty_body"][0]
    assert "body" in dead["empty_field"]["error_message"]
    assert dead["missing_date"]["source_id"] == bad["missing_date"][0]
    assert "context window" in dead["context_exceeded"]["error_message"]
    for row in dead.values():
        assert row["attempts"] == 0
        assert row["shard_id"] is None
        assert platform.generated.files[0].name in row["error_message"]

    exported = platform.storage.open_lines(
        platform.storage.uri(f"dead_letters/support_tickets/{PARTITION}/{job.job_id}.jsonl")
    )
    exported_codes = {json.loads(line)["error_code"] for line in exported}
    assert set(EXPECTED_INPUT_DEAD_LETTERS.values()) <= exported_codes


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_each_submit_intent_is_synced_to_disk_before_its_batch_is_created(
    platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch created after a write the machine loses would be created again by the next
    run (a second paid batch): on SQLite, whose other writes run with synchronous=NORMAL,
    each shard's intent is written with synchronous=FULL (2) before the provider's create
    call."""
    events: list[tuple[str, Any]] = []

    def level(conn: sa.Connection, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE") and "submit_intent_at" in statement:
            raw = conn.connection.driver_connection
            events.append(("intent", raw.execute("PRAGMA synchronous").fetchone()[0]))

    submit = LocalProvider.submit

    def create(self: LocalProvider, submission: Any, storage: Any) -> str:
        events.append(("create", submission.shard_id))
        return submit(self, submission, storage)

    monkeypatch.setattr(LocalProvider, "submit", create)
    engine = platform.ledger.engine
    sa.event.listen(engine, "before_cursor_execute", level)
    try:
        platform.materialize(("input_snapshot", "request_shards", "provider_batches"))
    finally:
        sa.event.remove(engine, "before_cursor_execute", level)

    job = steps.existing_job(platform.spec, DAY, platform.ledger)
    shards = platform.ledger.shards(job.job_id)
    assert shards and all(s.provider_batch_id for s in shards)
    assert [kind for kind, _ in events] == ["intent", "create"] * len(shards)
    assert {value for kind, value in events if kind == "intent"} == {2}
    assert [value for kind, value in events if kind == "create"] == [s.shard_id for s in shards]


@pytest.mark.one_database
@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640)])
def test_every_file_a_day_writes_is_as_readable_as_the_umask_lets_it_be(
    platform: Platform, umask: int, mode: int
) -> None:
    """Snapshots, shard files, validated and published outputs and reports are read by the
    group that consumes them: 0o666 less the umask, not readable by their writer alone."""
    before = os.umask(umask)
    try:
        platform.materialize()
    finally:
        os.umask(before)

    artifacts = Path(platform.settings.storage_url)
    written = {path: path.stat().st_mode & 0o777 for path in artifacts.rglob("*") if path.is_file()}
    assert any(path.parts[-3:-1] == ("published", "support_tickets") for path in written)
    assert written and set(written.values()) == {mode}, written


def test_rematerializing_any_step_changes_nothing(platform: Platform) -> None:
    first = platform.materialize()
    planned = platform.metadata(first, "request_shards")
    sent = platform.metadata(first, "provider_batches")
    job = steps.existing_job(platform.spec, DAY, platform.ledger)
    before = sorted((r["custom_id"], r["status"], r["attempts"]) for r in platform.rows(job.job_id))
    batches = platform.provider_batches()
    shards = platform.ledger.shards(job.job_id)

    for step in names.ASSETS:
        result = platform.materialize((step,))

        after = sorted(
            (r["custom_id"], r["status"], r["attempts"]) for r in platform.rows(job.job_id)
        )
        assert after == before, step
        assert platform.provider_batches() == batches, step
        assert platform.ledger.shards(job.job_id) == shards, step
        # A re-run that finds nothing to do says so and keeps the day's figures.
        if step == "request_shards":
            again = platform.metadata(result, step)
            assert (again["new_items"], again["shards_created"]) == (0, 0)
            day_figures = ["items", "shards", "estimated_input_tokens", "estimated_cost_usd"]
            assert [again[k] for k in day_figures] == [planned[k] for k in day_figures]
            assert planned["items"] == len(before) and planned["shards"] == len(shards)
            assert planned["estimated_input_tokens"] > 0
            assert again["outcome"] == (
                f"nothing to do: the day's {len(before)} items are in {len(shards)} shards an "
                "earlier run built"
            )
            assert "outcome" not in planned
        if step == "provider_batches":
            again = platform.metadata(result, step)
            assert again["submitted_shards"] == 0
            assert again["provider_batches"] == sent["provider_batches"]
            assert all(str(s.provider_batch_id) in again["provider_batches"] for s in shards)
            assert again["outcome"].startswith("nothing to do: the day's ")
        if step == "input_snapshot":
            assert platform.metadata(result, step)["reused_existing_snapshot"] is True


def test_a_new_prompt_version_is_a_new_job_and_keeps_the_old_results(platform: Platform) -> None:
    platform.materialize()
    old_job = steps.existing_job(platform.spec, DAY, platform.ledger)
    old_rows = platform.rows(old_job.job_id)

    v2 = platform.spec.model_copy(
        update={"prompt": platform.spec.prompt.model_copy(update={"version": "v2"})}
    )
    assert v2.prompt_code_version != platform.spec.prompt_code_version
    platform.materialize(spec=v2)

    new_job = steps.existing_job(v2, DAY, platform.ledger)
    assert new_job.job_id != old_job.job_id
    assert platform.rows(old_job.job_id) == old_rows
    new_rows = platform.rows(new_job.job_id)
    assert {r["custom_id"] for r in new_rows} == {r["custom_id"] for r in old_rows}
    assert all(r["status"] in TERMINAL for r in new_rows)
    assert [
        j.prompt_version for j in platform.ledger.jobs_for_partition("support_tickets", DAY)
    ] == [
        "v1",
        "v2",
    ]


def test_prompt_changes_show_as_a_new_code_version(platform: Platform) -> None:
    def code_version(spec: PipelineSpec) -> str | None:
        assets = build_pipeline_assets(spec, platform.settings)
        shards = next(a for a in assets if a.key == asset_key(spec, "request_shards"))
        return shards.code_versions_by_key[shards.key]

    changed = platform.spec.model_copy(
        update={"prompt": platform.spec.prompt.model_copy(update={"template": "{body}"})}
    )
    assert code_version(platform.spec) == platform.spec.prompt_code_version
    assert code_version(changed) != code_version(platform.spec)


def test_downstream_steps_explain_a_missing_upstream(platform: Platform) -> None:
    result = dg.materialize(
        build_pipeline_assets(platform.spec, platform.settings),
        instance=platform.instance,
        resources=platform.resources,
        partition_key=PARTITION,
        selection=[asset_key(platform.spec, "batch_results")],
        raise_on_error=False,
    )
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert (
        "materialize request_shards first"
        in failure.step_failure_data.user_failure_data.description
    )


def test_a_cancelled_batch_is_retried_for_its_missing_items_only(platform: Platform) -> None:
    state_dir = platform.provider.state_dir
    platform.provider = LocalProvider(state_dir=state_dir, work_budget_seconds=0.0, chunk_size=4)
    platform.spec = platform.spec.model_copy(
        update={"retry": platform.spec.retry.model_copy(update={"backoff_seconds": 0.0})}
    )
    platform.materialize(("input_snapshot", "request_shards", "provider_batches"))
    job = steps.existing_job(platform.spec, DAY, platform.ledger)
    [first] = platform.ledger.shards(job.job_id)
    assert first.provider_batch_id is not None
    platform.provider.poll(first.provider_batch_id)
    platform.provider.poll(first.provider_batch_id)
    platform.provider.cancel(first.provider_batch_id)
    answered = {r.custom_id for r in platform.provider.results(first.provider_batch_id)}
    assert 0 < len(answered) < first.item_count

    platform.provider = LocalProvider(state_dir=state_dir, work_budget_seconds=600.0)
    imported = platform.metadata(platform.materialize(("batch_results",)), "batch_results")
    assert imported["missing_results"] == first.item_count - len(answered)
    assert imported["retry_shards_planned"] == 1
    [retry] = platform.ledger.shards(job.job_id, ["created"])
    resent = {
        json.loads(line)["custom_id"] for line in platform.storage.open_lines(retry.input_uri)
    }
    assert resent.isdisjoint(answered)
    assert len(resent) == first.item_count - len(answered)

    platform.materialize(
        ("provider_batches", "batch_results", "validated_outputs", "dead_letter", "cost_report")
    )
    rows = {r["custom_id"]: r for r in platform.rows(job.job_id)}
    assert all(r["status"] in TERMINAL for r in rows.values())
    assert all(rows[c]["attempts"] == 1 and rows[c]["shard_id"] == first.shard_id for c in answered)
    assert all(rows[c]["attempts"] == 2 and rows[c]["shard_id"] == retry.shard_id for c in resent)
    assert all(rows[c]["status"] == "succeeded" for c in answered | resent)
    assert len(platform.provider_batches()) == 2


def assert_lines_are_where_the_ledger_says(platform: Platform, job_id: str) -> int:
    """Every item in a shard has the offset of its request line in that shard's file."""
    checked = 0
    for shard in platform.ledger.shards(job_id):
        rows = [r for r in platform.rows(job_id) if r["shard_id"] == shard.shard_id]
        rows.sort(key=lambda r: r["request_offset"])
        lines = platform.storage.lines_at(shard.input_uri, [r["request_offset"] for r in rows])
        for row, line in zip(rows, lines, strict=True):
            assert steps.line_custom_id(line) == row["custom_id"]
            checked += 1
    return checked


def test_a_retry_round_reads_request_lines_where_the_ledger_says(
    platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each item records where its request line starts in its shard file; a retry round (and
    a requeue) reads just those lines, records where they are in the new file, and reads a
    whole file only for items with no offset (an older ledger) or a wrong one."""
    platform.materialize(("input_snapshot", "request_shards"))
    spec, ledger, storage = platform.spec, platform.ledger, platform.storage
    job = steps.existing_job(spec, DAY, ledger)
    [first] = ledger.shards(job.job_id)
    assert assert_lines_are_where_the_ledger_says(platform, job.job_id) == first.item_count
    all_lines = list(storage.open_lines(first.input_uri))
    chosen = all_lines[1::3]
    chosen_ids = [steps.line_custom_id(line) for line in chosen]
    by_offset = {r["custom_id"]: r["request_offset"] for r in platform.rows(job.job_id)}

    # Where the ledger says, and nowhere else: the file is not scanned.
    wanted = {cid: by_offset[cid] for cid in chosen_ids}
    with monkeypatch.context() as patched:
        patched.setattr(steps.line_ids, "lines_with_ids", None)
        assert steps.request_lines(storage, first.input_uri, wanted) == list(
            zip(chosen_ids, chosen, strict=True)
        )
    # No offset (rows of an older ledger), or one that points elsewhere: the file is read.
    for broken in (None, 1):
        wrong = {**wanted, chosen_ids[-1]: broken}
        assert steps.request_lines(storage, first.input_uri, wrong) == list(
            zip(chosen_ids, chosen, strict=True)
        )

    set_item_status(ledger, job.job_id, chosen_ids, from_status=["pending"], status="retry")
    ctx = steps.StepContext(spec, DAY, ledger, storage, platform.provider)
    retry_shards, gave_up = steps.plan_retries(ctx, job)
    assert gave_up == 0
    [retry_shard] = [ledger.get_shard(s) for s in retry_shards]
    assert retry_shard is not None
    assert list(storage.open_lines(retry_shard.input_uri)) == chosen
    assert assert_lines_are_where_the_ledger_says(platform, job.job_id) == first.item_count

    requeued_ids = chosen_ids[:2] + [steps.line_custom_id(all_lines[0])]
    set_item_status(ledger, job.job_id, requeued_ids, from_status=["pending"], status="dead_letter")
    requeued = steps.requeue_dead_letters(ctx, chosen_ids=set(requeued_ids))
    assert requeued.requeued == 3
    assert assert_lines_are_where_the_ledger_says(platform, job.job_id) == first.item_count


def test_results_that_break_the_output_schema_become_quality_dead_letters(
    platform: Platform,
) -> None:
    import pandas as pd

    platform.spec = platform.spec.model_copy(
        update={"quality": platform.spec.quality.model_copy(update={"max_failure_rate": 0.5})}
    )
    platform.materialize(("input_snapshot", "request_shards", "provider_batches", "batch_results"))
    job = steps.existing_job(platform.spec, DAY, platform.ledger)
    succeeded = sorted(
        r["custom_id"] for r in platform.rows(job.job_id) if r["status"] == "succeeded"
    )
    garbage = {
        succeeded[0]: "not json at all",
        succeeded[1]: json.dumps({"category": "weather", "confidence": 0.9, "summary": "x" * 20}),
        succeeded[2]: json.dumps({"category": "billing", "confidence": 1.5, "summary": "y" * 20}),
    }
    with platform.ledger.engine.begin() as conn:
        for custom_id, text in garbage.items():
            conn.execute(
                sa.update(result_table)
                .where(result_table.c.job_id == job.job_id, result_table.c.custom_id == custom_id)
                .values(result_json=text)
            )

    result = platform.materialize(("validated_outputs", "dead_letter"))

    rows = {r["custom_id"]: r for r in platform.rows(job.job_id)}
    rules = {c: (rows[c]["status"], rows[c]["error_class"], rows[c]["error_code"]) for c in garbage}
    assert rules == {
        succeeded[0]: ("dead_letter", "quality", "invalid_json"),
        succeeded[1]: ("dead_letter", "quality", "category.literal_error"),
        succeeded[2]: ("dead_letter", "quality", "confidence.less_than_equal"),
    }
    assert "weather" in rows[succeeded[1]]["error_message"]
    validated = platform.metadata(result, "validated_outputs")
    assert validated["quality_dead_letters"] == 3
    assert validated["dagster/row_count"] == len(succeeded) - 3
    uri = platform.storage.uri(f"outputs/support_tickets/{PARTITION}/{job.job_id}.parquet")
    with platform.storage.local_copy(uri) as path:
        frame = pd.read_parquet(path)
    assert len(frame) == len(succeeded) - 3
    assert set(frame["custom_id"]).isdisjoint(garbage)
    assert set(frame.columns) >= {"job_id", "custom_id", "source_id", "prompt_version", "model"}
    assert platform.metadata(result, "dead_letter")["by_class"]["quality"] == 3


def test_a_day_runs_with_source_and_artifacts_on_s3(
    tmp_path: Path, moto_s3: Any, database_url: str
) -> None:
    (tmp_path / "dagster").mkdir()
    with dg.DagsterInstance.ephemeral() as instance:
        platform = Platform(tmp_path / "home", database_url, instance)
        prefix = f"s3://{moto_s3.bucket}/{tmp_path.name}"
        client = moto_s3.client()
        for path in platform.generated.files:
            client.upload_file(str(path), moto_s3.bucket, f"{tmp_path.name}/inbox/{path.name}")
        platform.spec = platform.spec.model_copy(
            update={
                "source": platform.spec.source.model_copy(
                    update={"uri": f"{prefix}/inbox/tickets-*.jsonl"}
                )
            }
        )
        platform.settings = platform.settings.model_copy(
            update={"storage_url": f"{prefix}/artifacts"}
        )
        platform.storage = ArtifactStorage(base_url=f"{prefix}/artifacts")

        result = platform.materialize()

        job = steps.existing_job(platform.spec, DAY, platform.ledger)
        rows = platform.rows(job.job_id)
        assert len(rows) == source_lines(platform)
        assert all(r["status"] in TERMINAL for r in rows)
        stored = platform.storage.list_uris("")
        for folder in ("snapshots", "shards", "outputs", "dead_letters", "reports"):
            assert any(uri.startswith(f"{prefix}/artifacts/{folder}/") for uri in stored), folder
        assert str(platform.metadata(result, "validated_outputs")["uri"]).startswith("s3://")


def test_a_first_local_day_says_what_it_cannot_show_instead_of_magic_numbers(
    platform: Platform,
) -> None:
    result = platform.materialize()

    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    for evaluation in evaluations.values():
        values = [getattr(v, "value", v) for v in evaluation.metadata.values()]
        assert -1 not in values and -1.0 not in values, evaluation
    assert "custom_ids" not in evaluations["no_missing_results"].metadata
    assert "custom_ids" not in evaluations["no_duplicate_results"].metadata
    assert "next_submission_at" not in platform.metadata(result, "provider_batches")
    budget = evaluations["budget"].metadata
    assert "approved_usd" not in budget and "approved_by" not in budget
    assert budget["reason"].value.startswith("upper bound $0.0000 within")
    shift = evaluations["label_distribution_shift"]
    assert shift.passed
    assert isinstance(shift.metadata["total_variation"], dg.NullMetadataValue)
    assert shift.metadata["not_compared"].value.startswith("no earlier days to compare with")
    assert "baseline" not in shift.metadata and "has_baseline" not in shift.metadata
    drift = evaluations["cost_drift"].metadata
    assert drift["not_compared"].value.startswith("no earlier days to compare with")

    report = platform.metadata(result, "cost_report")
    assert report["cost_usd"] == 0.0
    why = "local/all-MiniLM-L6-v2 is priced at $0 per token in prices.yaml"
    assert report["zero_cost_reason"].startswith(why)
    assert f"Why $0: {why}" in report["report"]
    as_of = dt.datetime.fromtimestamp(report["pipeline_totals_as_of"], dt.UTC)
    label = f"as of {as_of:%Y-%m-%d %H:%M} UTC"
    assert f"## support_tickets per month, up to {DAY} ({label})" in report["report"]
    assert f"## support_tickets per day, {DAY:%Y-%m} up to {DAY} ({label})" in report["report"]
