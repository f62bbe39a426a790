"""What the operator reads in the Dagster UI: one day of reviews (and an eval of it) run
through Dagster in process on the fake OpenAI server, then the materializations' metadata
read back from the instance; the code location's eval assets and operator jobs; `make ui`."""

import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow.parquet as pq
import pytest

from llm_assets import names
from llm_assets.definitions import build_definitions
from llm_assets.defs.eval_jobs import EVAL_PARTITION, build_eval_job, eval_report_key
from llm_assets.defs.factory import asset_key
from llm_assets.evaluation.report_store import load_report
from llm_assets.resources import build_resources
from llm_assets.resources.providers.registry import adapter_class
from llm_assets.spec.model import PipelineSpec
from llm_assets.util.settings import REPO_ROOT, Settings
from tests.fakes.openai_server import FakeOpenAI, user_text
from tests.harness import DAY, Harness, open_harness, provider_for, review_spec, truthful

REVIEWS = 24
GARBAGE = {3: "{not json", 7: json.dumps({"label": "meh", "summary": "fine"})}
"""Reviews n whose answers fail the quality gate: 2 of 24, a rate of 0.08333..."""
SHARD_SIZE = 10
EVAL_SAMPLE = 8


def answers(body: dict[str, Any]) -> str:
    for n, text in GARBAGE.items():
        if f"Order {1000 + n} " in user_text(body):
            return text
    return truthful(body)


def reviews_spec(**overrides: Any) -> dict[str, Any]:
    """The review pipeline on the fake OpenAI server; quality failures do not block it."""
    return review_spec(
        "openai",
        "gpt-4o-mini",
        name="reviews",
        quality={"max_failure_rate": 0.5},
        sharding={"max_requests_per_shard": SHARD_SIZE},
        **overrides,
    )


@dataclass
class Ran:
    """The day after it ran, and the eval of it."""

    harness: Harness
    eval_run: dg.ExecuteInProcessResult

    def metadata(self, step: str) -> list[dict[str, Any]]:
        """The metadata of the step's materializations, newest first."""
        records = self.harness.instance.fetch_materializations(
            asset_key(self.harness.spec, step), limit=100
        ).records
        return [dict(r.asset_materialization.metadata) for r in records]  # type: ignore[union-attr]

    def latest(self, step: str) -> dict[str, Any]:
        return self.metadata(step)[0]

    def check(self, step: str, name: str) -> dg.AssetCheckEvaluation:
        key = dg.AssetCheckKey(asset_key(self.harness.spec, step), name)
        history = self.harness.instance.event_log_storage.get_asset_check_execution_history(
            key, limit=10
        )
        evaluation = history[0].event.asset_check_evaluation  # type: ignore[union-attr]
        assert evaluation is not None
        return evaluation


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ran]:
    """The day's 24 reviews and one with no text (an input dead letter, never sent), two
    answers failing the quality gate; then an eval of the day with a variant, scored against
    the reviews' true labels."""
    tmp_path = tmp_path_factory.mktemp("ui_metadata")
    spec = reviews_spec(
        variants={"terse": {"prompt": {"version": "v2", "system": "Label it. Return JSON."}}},
        eval={"reference_field": "human_label"},
    )
    with FakeOpenAI(tmp_path / "fake_openai") as fake:
        fake.polls_per_state = 0
        fake.responder = answers
        database_url = f"sqlite:///{tmp_path / 'ledger.db'}"
        with open_harness(tmp_path, database_url, spec, provider_for(fake), REVIEWS) as harness:
            source = harness.home / "reviews" / f"reviews-{DAY.isoformat()}.jsonl"
            rows = [json.loads(line) for line in source.read_text().splitlines()]
            rows = [{**row, "human_label": harness.truth[row["review_id"]]} for row in rows]
            rows.append({"review_id": "R-blank", "created_at": f"{DAY}T12:00:00Z", "text": ""})
            source.write_text("".join(json.dumps(row) + "\n" for row in rows))
            outcome = harness.run_day()
            assert outcome.done, outcome
            eval_run = build_eval_job(harness.spec).execute_in_process(
                run_config={
                    "ops": {
                        names.eval_op(harness.spec.name): {
                            "config": {
                                "from": DAY.isoformat(),
                                "to": DAY.isoformat(),
                                "sample": EVAL_SAMPLE,
                                "seed": 1,
                                "poll_interval": 0.0,
                            }
                        }
                    }
                },
                instance=harness.instance,
                # The code location's resources, the harness's pointed at the fake.
                resources={**build_resources(harness.settings), **harness.resources},
            )
            assert eval_run.success
            yield Ran(harness, eval_run)
        assert fake.server_errors == []


def _value(entry: Any) -> Any:
    return getattr(entry, "value", entry)


# 1. Each shard's provider batch, with a link to it in the provider's console.


def test_shards_name_their_provider_batch_with_a_link_to_its_console_page(ran: Ran) -> None:
    harness = ran.harness
    job_id = harness.job_id()
    batches = {s.shard_id: s.provider_batch_id for s in harness.ledger.shards(job_id)}
    assert len(batches) == 3 and all(batches.values())
    short = {shard: shard.removeprefix(f"{job_id}-") for shard in batches}
    submitted = [m for m in ran.metadata("provider_batches") if _value(m["submitted_shards"])]
    imported = [m for m in ran.metadata("batch_results") if _value(m["imported_shards"])]
    assert submitted and imported

    for metadata in (submitted[0], imported[0]):
        table = metadata["provider_batches"].value
        for shard, batch in batches.items():
            assert f"| {short[shard]} | {batch} |" in table
            link = metadata[f"console_url/{short[shard]}"]
            assert isinstance(link, dg.UrlMetadataValue)
            assert link.value == f"https://platform.openai.com/batches/{batch}"


def test_the_console_url_pattern_is_the_adapters() -> None:
    def url(provider: str, batch: str) -> str | None:
        return adapter_class(provider).model_construct().console_url(batch)

    assert url("openai", "batch_abc") == "https://platform.openai.com/batches/batch_abc"
    assert (
        url("anthropic", "msgbatch_01")
        == "https://console.anthropic.com/workspaces/default/batches/msgbatch_01"
    )
    # No console page: the embedded provider, a shard sent request by request, and the
    # providers whose consoles have no stable per-batch address.
    assert url("local", "local-batch-1") is None
    assert url("openai", "online-reviews-r00-s00000") is None
    assert url("bedrock", "arn:aws:bedrock:us-east-1:1:model-invocation-job/x") is None
    assert url("gemini", "batches/123") is None


# 2. The Parquet outputs' columns.


def test_parquet_outputs_carry_their_column_schema(ran: Ran) -> None:
    for step in (names.VALIDATED_OUTPUTS, names.PUBLISHED_OUTPUTS):
        metadata = ran.latest(step)
        schema = metadata["dagster/column_schema"].value
        assert isinstance(schema, dg.TableSchema)
        written = pq.read_schema(metadata["uri"].value)
        assert [(c.name, c.type) for c in schema.columns] == [
            (field.name, str(field.type)) for field in written
        ]
        assert {"custom_id", "source_id", "label", "summary"} <= {c.name for c in schema.columns}


# 3. Rates and dollars rounded.


def _decimals(value: float) -> int:
    """The decimals a float shows: 4 for 0.0833, 6 for 1.2e-05."""
    exponent = Decimal(repr(float(value))).normalize().as_tuple().exponent
    assert isinstance(exponent, int)
    return max(0, -exponent)


def test_rates_and_dollars_are_rounded_in_metadata(ran: Ran) -> None:
    validated = ran.latest(names.VALIDATED_OUTPUTS)
    rate = validated["quality_failure_rate"].value
    exact = len(GARBAGE) / REVIEWS
    assert rate == round(exact, 4) and _decimals(rate) <= 4
    assert all(_decimals(v) <= 4 for v in validated["label_distribution"].value.values())
    check = ran.check(names.VALIDATED_OUTPUTS, "quality_failure_rate")
    assert check.metadata["failure_rate"].value == round(exact, 4)

    report = ran.latest(names.COST_REPORT)
    spent = ran.harness.ledger.counts(ran.harness.job_id()).cost_usd
    assert spent > 0
    assert report["cost_usd"].value == pytest.approx(spent, abs=5e-7)
    for step in (names.REQUEST_SHARDS, names.BATCH_RESULTS, names.COST_REPORT):
        for key, entry in ran.latest(step).items():
            if key.endswith("_usd"):
                assert _decimals(entry.value) <= 6, (step, key, entry.value)
            if key.endswith(("_rate", "_error")):
                assert _decimals(entry.value) <= 4, (step, key, entry.value)


# 4. Nothing shows as None or as an empty cell.


def test_missing_values_read_as_a_dash_and_an_empty_drift_is_left_out(ran: Ran) -> None:
    preview = ran.latest(names.DEAD_LETTER)["preview"].value
    rows = [line for line in preview.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == len(GARBAGE) + 1  # the blank review, never sent, has no batch
    cells = [cell.strip() for row in rows for cell in row.strip("|").split("|")]
    assert "None" not in cells and "" not in cells
    assert "–" in cells

    drift = ran.check(names.COST_REPORT, "cost_drift")
    assert drift.passed  # the first day: nothing to compare with, nothing drifted
    assert "drifted" not in drift.metadata
    comparison = drift.metadata["comparison"].value
    assert "|  |" not in comparison and "| |" not in comparison


# 5. and 6. The eval: variants side by side, one id.


def _eval_metadata(ran: Ran) -> tuple[str, dict[str, Any]]:
    partition = ran.eval_run.output_for_node(names.eval_op(ran.harness.spec.name), EVAL_PARTITION)
    event = ran.harness.instance.get_latest_materialization_event(eval_report_key(ran.harness.spec))
    assert event is not None and event.asset_materialization is not None
    assert event.asset_materialization.partition == partition
    return partition, dict(event.asset_materialization.metadata)


def test_the_eval_report_shows_its_variants_side_by_side(ran: Ran) -> None:
    _, metadata = _eval_metadata(ran)
    table = metadata["variants"]
    assert isinstance(table, dg.TableMetadataValue)
    rows = {record.data["variant"]: record.data for record in table.records}
    assert set(rows) == {"baseline", "terse"}
    assert rows["baseline"]["model"] == "openai/gpt-4o-mini (v1)"
    assert {c.name for c in table.schema.columns} >= {"score", "failure_rate"}
    # The Plots tab draws one chart per numeric key, sorted by name: a metric's variants are
    # next to each other, and only the metrics worth a chart are plotted.
    plotted = {k for k, v in metadata.items() if isinstance(v, dg.FloatMetadataValue)}
    assert plotted == {
        f"{metric}/{variant}"
        for metric in ("score", "failure_rate", "cost_per_1k_items_usd")
        for variant in ("baseline", "terse")
    }
    for variant, row in rows.items():
        assert metadata[f"score/{variant}"].value == row["score"]
        assert metadata[f"failure_rate/{variant}"].value == row["failure_rate"]


def test_an_eval_has_one_id_its_partition(ran: Ran) -> None:
    partition, metadata = _eval_metadata(ran)
    [output] = [e for e in ran.eval_run.all_events if e.is_successful_output]
    assert output.step_output_data.metadata["eval_id"].value == partition
    assert metadata["eval_id"].value == partition
    assert f"eval {partition}" in metadata["report"].value
    report, _ = load_report(ran.harness.spec.name, partition, ran.harness.storage)
    assert report.eval_id == partition


# 7. and 8. The code location: eval assets only where there are variants; operator jobs
# with only the resources they use.


def _definitions(tmp_path: Path, *specs: dict[str, Any]) -> dg.Definitions:
    settings = Settings.from_env({"LLM_ASSETS_HOME": str(tmp_path)})
    return build_definitions(settings, [PipelineSpec.model_validate(s) for s in specs])


def test_pipelines_without_variants_get_no_eval_report_nor_eval_job(tmp_path: Path) -> None:
    plain = review_spec("openai", "gpt-4o-mini", name="plain")
    varied = review_spec(
        "openai", "gpt-4o-mini", name="varied", variants={"v2": {"prompt": {"version": "v2"}}}
    )
    defs = _definitions(tmp_path, plain, varied)

    graph = defs.resolve_asset_graph()
    keys = graph.get_all_asset_keys()
    groups = {graph.get(key).group_name for key in keys}
    assert dg.AssetKey(["plain", names.EVAL_REPORT]) not in keys
    assert names.evals("plain") not in groups
    assert dg.AssetKey(["varied", names.EVAL_REPORT]) in keys
    assert names.evals("varied") in groups
    jobs = {job.name for job in defs.resolve_all_job_defs()}
    assert names.eval_job("varied") in jobs and names.eval_job("plain") not in jobs
    assert names.cancel_job("plain") in jobs


def _launchpad_resources(job: dg.JobDefinition) -> set[str]:
    """The resources whose configuration the job's Launchpad offers."""
    fields = job.run_config_schema.config_type.fields  # type: ignore[attr-defined]
    return set(fields["resources"].config_type.fields)


def test_pause_resume_and_retention_jobs_offer_only_their_resources(tmp_path: Path) -> None:
    spec = review_spec("openai", "gpt-4o-mini", name="reviews", retention={"artifacts_days": 14})
    defs = _definitions(tmp_path, spec)

    for job, wanted in (
        (names.pause_job("reviews"), {"ledger"}),
        (names.resume_job("reviews"), {"ledger"}),
        (names.retention_job("reviews"), {"ledger", "storage", "openai_provider"}),
    ):
        assert _launchpad_resources(defs.resolve_job_def(job)) - {"io_manager"} == wanted, job


def test_eval_and_cancel_jobs_carry_only_their_providers_resources(tmp_path: Path) -> None:
    spec = review_spec(
        "openai",
        "gpt-4o-mini",
        name="reviews",
        variants={"haiku": {"model": {"provider": "anthropic", "name": "claude-haiku-4-5"}}},
    )
    defs = _definitions(tmp_path, spec)

    cancel = defs.resolve_job_def(names.cancel_job("reviews"))
    evaluate = defs.resolve_job_def(names.eval_job("reviews"))
    assert set(cancel.resource_defs) - {"io_manager"} == {"ledger", "storage", "openai_provider"}
    assert set(evaluate.resource_defs) - {"io_manager"} == {
        "ledger",
        "storage",
        "openai_provider",
        "anthropic_provider",
    }
    assert _launchpad_resources(cancel) - {"io_manager"} == {
        "ledger",
        "storage",
        "openai_provider",
    }
    assert "gemini_provider" not in _launchpad_resources(evaluate)
    report = defs.resolve_assets_def(dg.AssetKey(["reviews", names.EVAL_REPORT]))
    assert report.required_resource_keys - {"io_manager"} == {
        "ledger",
        "storage",
        "openai_provider",
        "anthropic_provider",
    }


# 9. make ui's port.


@pytest.mark.parametrize(
    ("variables", "port"),
    [({"PORT": "3999"}, "3999"), ({"DAGSTER_PORT": "3998"}, "3998"), ({}, "3000")],
)
def test_make_ui_passes_the_port_to_dagster_dev(variables: dict[str, str], port: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PORT", "DAGSTER_PORT")}
    args = [f"{name}={value}" for name, value in variables.items()]
    shown = subprocess.run(
        ["make", "-n", "ui", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    [dev] = [line for line in shown.stdout.splitlines() if "dagster dev" in line]
    assert re.search(rf"--port {port}(\s|$)", dev), dev


def test_make_ui_takes_the_port_from_the_environment() -> None:
    env = {**os.environ, "PORT": "3997"}
    env.pop("DAGSTER_PORT", None)
    shown = subprocess.run(
        ["make", "-n", "ui"], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    assert "--port 3997" in shown.stdout
