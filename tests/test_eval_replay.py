"""Evaluation replay: a seeded sample of three days of reviews run through a baseline on the
fake OpenAI server and variants on the fake OpenAI and Anthropic servers."""

import datetime as dt
import json
import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from llm_assets import names, steps
from llm_assets.defs.eval_jobs import (
    EVAL_PARTITION,
    build_eval_job,
    build_eval_report_asset,
    eval_report_key,
)
from llm_assets.evaluation.metrics import wilson_interval
from llm_assets.evaluation.replay import Replay, eval_pipeline_spec
from llm_assets.evaluation.report import build_report
from llm_assets.evaluation.report_markdown import render_markdown
from llm_assets.evaluation.report_store import EvalRequest, load_report, report_key, save_report
from llm_assets.evaluation.sample import draw_sample
from llm_assets.evaluation.variants import UnknownVariant, resolve_variants
from llm_assets.resources import build_resources
from llm_assets.resources.pricing import load_price_table
from llm_assets.resources.providers import provider_resource_key
from llm_assets.resources.providers.bedrock import BedrockBatchProvider
from llm_assets.spec.model import PIPELINE_NAME, PipelineSpec
from tests.conftest import MotoS3
from tests.eval_harness import EvalWorld, eval_settings, run_command, write_reviews_with
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.bedrock_server import FakeBedrock
from tests.fakes.openai_server import FakeOpenAI, user_text
from tests.harness import CLI, provider_for, review_spec, truthful, write_reviews
from tests.test_bedrock_provider import MODEL as BEDROCK_MODEL
from tests.test_bedrock_provider import ROLE as BEDROCK_ROLE
from tests.test_bedrock_provider import truthful as bedrock_truthful

# One database (PostgreSQL in CI): the replay drives the steps the pipeline tests cover on
# both databases.
pytestmark = [pytest.mark.slow, pytest.mark.one_database]

DAYS = [dt.date(2026, 11, 2), dt.date(2026, 11, 3), dt.date(2026, 11, 4)]
PER_DAY = 12
SAMPLE = 20
TERSE = "Answer tersely."
"""In a variant's system prompt: the fake OpenAI model then answers `mixed`, a label outside
the schema's set, for every third review."""


def sloppy_or_truthful(body: dict[str, Any]) -> str:
    system = next((m["content"] for m in body["messages"] if m.get("role") == "system"), "")
    if TERSE in str(system) and review_number(user_text(body)) % 3 == 0:
        return json.dumps({"label": "mixed", "summary": "hard to say"})
    return truthful(body)


def review_number(text: str) -> int:
    """n of the review "... Order {1000 + n} arrived." (tests.harness.write_reviews)."""
    return int(text.split("Order ")[1].split(" ")[0]) - 1000


HUMAN_LABEL = "human_label"
"""The reference column: the review's true label, except that the human who labelled every
sixth review (n % 6 == 5) disagreed with its words, so no variant scores 100%."""
MIN_SCORE = 0.7


def human_label(n: int, truth: str) -> str:
    flipped = {"positive": "negative", "negative": "positive"}
    return flipped[truth] if n % 6 == 5 else truth


def add_human_labels(home: Path, day: dt.date) -> None:
    """The day's reviews with HUMAN_LABEL, a column the prompt never reads."""
    write_reviews_with(home, day, PER_DAY, lambda n, _, truth: {HUMAN_LABEL: human_label(n, truth)})


def base_spec() -> PipelineSpec:
    spec = review_spec("openai", "gpt-4o-mini", name="reviews")
    spec["eval"] = {
        "reference_field": HUMAN_LABEL,
        "min_score": MIN_SCORE,
        "price_as": ["openai/gpt-4.1-mini", "anthropic/claude-haiku-4-5"],
    }
    return PipelineSpec.model_validate(spec)


def variant_specs() -> dict[str, PipelineSpec]:
    """The baseline; the same reviews on Claude with prompt v2; and prompt v3 on the same
    OpenAI model, whose answers fail the quality gate for every third review."""
    evaluation = base_spec().eval.model_dump()
    haiku = review_spec("anthropic", "claude-haiku-4-5", name="reviews", prompt={"version": "v2"})
    terse = review_spec(
        "openai",
        "gpt-4o-mini",
        name="reviews",
        prompt={"version": "v3", "system": f"Label the review. {TERSE} Return JSON."},
    )
    return {
        "baseline": base_spec(),
        "haiku": PipelineSpec.model_validate({**haiku, "eval": evaluation}),
        "terse": PipelineSpec.model_validate({**terse, "eval": evaluation}),
    }


@dataclass
class World(EvalWorld):
    anthropic: FakeAnthropic
    spec: PipelineSpec

    @property
    def resources(self) -> dict[str, Any]:
        return {
            **super().resources,
            provider_resource_key("anthropic"): provider_for(self.anthropic),
        }

    def replay(self, variants: dict[str, PipelineSpec], **kwargs: Any) -> Replay:
        """The baseline pipeline's days replayed through `variants`: by default the sample of
        SAMPLE items seeded 7."""
        return self.run_eval(self.spec, variants, DAYS, **{"size": SAMPLE, "seed": 7, **kwargs})


@pytest.fixture
def world(tmp_path: Path, database_url: str) -> Iterator[World]:
    settings = eval_settings(tmp_path, database_url)
    for day in DAYS:
        add_human_labels(settings.home, day)
    with (
        FakeOpenAI(tmp_path / "fake_openai") as openai,
        FakeAnthropic(tmp_path / "fake_anthropic") as anthropic,
    ):
        openai.responder = sloppy_or_truthful
        world = World(settings=settings, openai=openai, anthropic=anthropic, spec=base_spec())
        for day in DAYS:
            world.take_snapshot(world.spec, day)
        yield world
        assert openai.server_errors == [] and anthropic.server_errors == []


def test_the_sample_is_seeded_spread_over_the_days_and_grows_as_a_superset(
    world: World,
) -> None:
    sample = draw_sample(world.spec, DAYS, world.storage, size=SAMPLE, seed=7)
    again = draw_sample(world.spec, list(reversed(DAYS)), world.storage, size=SAMPLE, seed=7)
    larger = draw_sample(world.spec, DAYS, world.storage, size=SAMPLE + 5, seed=7)
    other = draw_sample(world.spec, DAYS, world.storage, size=SAMPLE, seed=8)

    assert sample.items == SAMPLE
    assert again.source_ids == sample.source_ids
    assert again.eval_id == sample.eval_id
    assert sorted(sample.source_ids) == DAYS
    # Twenty of 36 items by a hash: every day is drawn from, none wholly.
    assert all(0 < len(ids_) < PER_DAY for ids_ in sample.source_ids.values())
    for day, source_ids in sample.source_ids.items():
        assert all(s.startswith(f"R-{day:%Y%m%d}-") for s in source_ids)
        assert set(source_ids) <= set(larger.source_ids[day])
    assert larger.items == SAMPLE + 5
    assert other.source_ids != sample.source_ids
    # The sample file holds exactly the sampled records, as the snapshot has them.
    written = [json.loads(line) for line in world.storage.open_lines(sample.uri)]
    assert sorted(r["review_id"] for r in written) == sorted(
        s for ids_ in sample.source_ids.values() for s in ids_
    )
    # The snapshot keeps the reference column for scoring, besides the fields sent.
    assert {"review_id", "created_at", "text", HUMAN_LABEL} == set(written[0])


def test_a_day_without_a_snapshot_is_named(world: World) -> None:
    later = dt.date(2026, 11, 5)
    write_reviews(world.home, later, PER_DAY)

    with pytest.raises(steps.MissingPrerequisite, match="2026-11-05.*input_snapshot"):
        draw_sample(world.spec, [*DAYS, later], world.storage, size=SAMPLE, seed=7)


def test_eval_pipeline_names_fit_the_pattern_and_change_with_the_configuration() -> None:
    spec = base_spec()
    long_name = spec.model_copy(update={"name": "r" * 63})
    named = eval_pipeline_spec(long_name.name, "a-very-long-variant-name-indeed", long_name)
    optioned = spec.model_copy(
        update={"model": spec.model.model_copy(update={"options": {"seed": 1}})}
    )

    assert PIPELINE_NAME.match(named.name) and len(named.name) <= 63
    baseline = eval_pipeline_spec("reviews", "baseline", spec)
    assert baseline.name.startswith("reviews__baseline__")
    assert eval_pipeline_spec("reviews", "baseline", spec).name == baseline.name
    # Options are not in the ledger's job key: a changed option is a new eval pipeline.
    assert eval_pipeline_spec("reviews", "baseline", optioned).name != baseline.name
    assert not baseline.automation.new_data_sensor and baseline.automation.schedule is None
    assert baseline.automation.notify.max_dead_letter_rate is None
    assert (baseline.prompt, baseline.model, baseline.budget) == (
        spec.prompt,
        spec.model,
        spec.budget,
    )


def test_variants_answer_the_same_sample_once_each_and_a_rerun_sends_nothing(
    world: World,
) -> None:
    variants = variant_specs()

    result = world.replay(variants)

    sample = result.sample
    assert list(result.variants) == ["baseline", "haiku", "terse"]
    for name, run in result.variants.items():
        assert [d.day for d in run.days] == DAYS
        for day_run in run.days:
            assert day_run.open_items == 0
            # The variant's job holds exactly the sample's items of the day, and the run
            # names them by their ids there, in the sample's order.
            rows = world.rows(day_run.job_id or "")
            sources = sorted(r["source_id"] for r in rows)
            assert sources == sorted(sample.source_ids[day_run.day]), name
            by_source = {r["source_id"]: r["custom_id"] for r in rows}
            expected = [by_source[s] for s in sample.source_ids[day_run.day]]
            assert day_run.custom_ids == expected
        assert run.items == SAMPLE
    sent_openai = Counter(world.openai.submitted_custom_ids())
    sent_anthropic = Counter(world.anthropic.submitted_custom_ids())

    def custom_ids(variant: str) -> set[str]:
        run = result.variants[variant]
        return {c for d in run.days for c in d.custom_ids}

    assert set(sent_openai) == custom_ids("baseline") | custom_ids("terse")
    assert set(sent_anthropic) == custom_ids("haiku")
    assert set(sent_openai.values()) == {1} and set(sent_anthropic.values()) == {1}
    baseline, haiku = result.variants["baseline"], result.variants["haiku"]
    assert (baseline.succeeded, haiku.succeeded) == (SAMPLE, SAMPLE)
    assert baseline.quality_failure_rate == 0.0
    assert baseline.cost_usd > 0 and haiku.cost_usd > 0
    assert baseline.input_tokens > 0 and haiku.output_tokens > 0
    assert baseline.cost_per_1000_items == pytest.approx(baseline.cost_usd / SAMPLE * 1000)
    assert baseline.seconds_to_last_result is not None

    # The same eval again: nothing is sent, and the ledger says the same.
    again = world.replay(variants)

    assert Counter(world.openai.submitted_custom_ids()) == sent_openai
    assert Counter(world.anthropic.submitted_custom_ids()) == sent_anthropic
    assert again.sample == result.sample
    for name, run in again.variants.items():
        first = result.variants[name]
        assert (run.items, run.succeeded, run.dead_letters_by_class, run.cost_usd) == (
            first.items,
            first.succeeded,
            first.dead_letters_by_class,
            first.cost_usd,
        )


def test_a_variant_failing_the_quality_gate_shows_its_dead_letters_and_rate(
    world: World,
) -> None:
    result = world.replay(variant_specs())

    terse = result.variants["terse"]
    sampled = [s for ids_ in result.sample.source_ids.values() for s in ids_]
    failing = {s for s in sampled if int(s.rsplit("-", 1)[1]) % 3 == 0}
    assert failing, "the sample holds reviews the terse variant mislabels"
    assert terse.dead_letters_by_class == {"quality": len(failing)}
    assert terse.succeeded == SAMPLE - len(failing)
    assert terse.quality_failure_rate == pytest.approx(len(failing) / SAMPLE)
    dead = {
        r["source_id"]: r
        for d in terse.days
        for r in world.rows(d.job_id or "")
        if r["status"] == "dead_letter"
    }
    assert set(dead) == failing
    assert all(
        r["error_class"] == "quality" and "mixed" in r["error_message"] for r in dead.values()
    )
    assert result.variants["haiku"].dead_letters_by_class == {}


def review_n(source_id: str) -> int:
    return int(source_id.rsplit("-", 1)[1])


def test_the_report_scores_every_variant_against_the_human_labels_and_recommends(
    world: World, tmp_path: Path
) -> None:
    result = world.replay(variant_specs())

    report = build_report(world.spec, result, world.ledger, world.storage)

    sampled = [review_n(s) for day in DAYS for s in result.sample.source_ids[day]]
    disagreed = [n for n in sampled if n % 6 == 5]  # the human label is not the words' label
    refused = [n for n in sampled if n % 3 == 0]  # terse answers `mixed`: quality dead letters
    assert disagreed and refused
    assert report.scoring.model_dump() == {
        "field": "label",
        "kind": "label",
        "against": HUMAN_LABEL,
        "metric": "accuracy",
        "span": None,
    }
    baseline, haiku, terse = (report.variant(n) for n in ("baseline", "haiku", "terse"))
    assert baseline.n == terse.n == SAMPLE
    correct = SAMPLE - len(disagreed)
    assert baseline.score == pytest.approx(correct / SAMPLE)
    assert baseline.interval == wilson_interval(correct, SAMPLE)
    assert haiku.score == baseline.score  # the same answers on another provider
    assert terse.score == pytest.approx((SAMPLE - len(disagreed) - len(refused)) / SAMPLE)
    assert terse.failure_rate == pytest.approx(len(refused) / SAMPLE)
    assert terse.categorical is not None and terse.categorical.missing == len(refused)
    # The confusion matrix: rows are the human labels, columns the answers.
    assert baseline.categorical is not None
    confusion = baseline.categorical.confusion
    assert sum(confusion[g][p] for g in confusion for p in confusion[g] if g != p) == len(disagreed)
    assert confusion["positive"][None] == confusion["negative"][None] == 0
    # Costs as billed (batch prices) and what the same tokens cost realtime.
    assert haiku.cost_per_1k_items_usd > baseline.cost_per_1k_items_usd > 0
    assert baseline.realtime_cost_per_1k_items_usd == pytest.approx(
        2 * baseline.cost_per_1k_items_usd, rel=0.01
    )
    assert baseline.seconds_to_last_result is not None

    # What-if prices: the baseline's prompts counted exactly for gpt-4.1-mini (the same
    # tokenizer as gpt-4o-mini, at higher prices); haiku's own model keeps what was billed.
    as_mini = {p.price_as: p for p in baseline.what_if}["openai/gpt-4.1-mini"]
    assert as_mini.counted == "exact (o200k_base)"
    assert as_mini.batch_cost_per_1k_items_usd > baseline.cost_per_1k_items_usd
    assert as_mini.realtime_cost_per_1k_items_usd == pytest.approx(
        2 * as_mini.batch_cost_per_1k_items_usd
    )
    haiku_as_haiku = {p.price_as: p for p in haiku.what_if}["anthropic/claude-haiku-4-5"]
    assert haiku_as_haiku.counted == "as measured"
    assert (haiku_as_haiku.input_tokens, haiku_as_haiku.output_tokens) == (
        haiku.input_tokens,
        haiku.output_tokens,
    )
    assert haiku_as_haiku.batch_cost_usd == pytest.approx(haiku.cost_usd)
    terse_counted = {p.price_as: p.counted for p in terse.what_if}
    assert terse_counted["anthropic/claude-haiku-4-5"].startswith("estimated (cl100k_base")

    recommendation = report.recommendation
    assert recommendation is not None and recommendation.chosen is not None
    assert recommendation.chosen.name == "baseline"
    verdicts = {v.name: v.verdict for v in recommendation.verdicts}
    assert verdicts == {
        "baseline": "passes",
        "haiku": "passes",
        "terse": "fails score and failure rate",
    }
    assert recommendation.indistinguishable_from == ("haiku",)
    markdown = render_markdown(report)
    assert "| baseline | openai/gpt-4o-mini (v1) |" in markdown
    assert "passes **recommended** |" in markdown
    assert "Not distinguishable at this sample size from: haiku" in markdown
    assert "### Confusion matrices" in markdown
    assert "| haiku | anthropic/claude-haiku-4-5 |" in markdown
    # Saved and read back (the CLI prints what it reads), the report is the same.
    request = EvalRequest(days=DAYS, sample=SAMPLE, seed=7, variants=["haiku", "terse"])
    key = report_key(result)
    save_report(report, request, key, world.storage)
    loaded, _ = load_report(world.spec.name, key, world.storage)
    assert loaded == report and render_markdown(loaded) == markdown
    # The reference column reached no provider.
    received = [p for p in tmp_path.glob("fake_*/**/*") if p.is_file()]
    assert received and not any(HUMAN_LABEL.encode() in p.read_bytes() for p in received)


@pytest.mark.fake_server("bedrock", min_records=1, responder=bedrock_truthful)
def test_a_bedrock_variant_is_scored_and_billed_at_its_batch_price_beside_the_baseline(
    world: World, moto_s3: MotoS3, fake: FakeBedrock
) -> None:
    bedrock = review_spec(
        "bedrock",
        BEDROCK_MODEL,
        name="reviews",
        prompt={"version": "v4"},
        bedrock={"min_records_per_job": 1},
    )
    variants = {
        "baseline": base_spec(),
        "bedrock": PipelineSpec.model_validate({**bedrock, "eval": base_spec().eval.model_dump()}),
    }
    provider = BedrockBatchProvider(
        role_arn=BEDROCK_ROLE,
        endpoint_url=fake.endpoint_url,
        retry_base_seconds=0.01,
        staging_uri=f"s3://{moto_s3.bucket}/eval-{uuid.uuid4().hex[:8]}/staging",
    )
    resources = {**world.resources, provider_resource_key("bedrock"): provider}

    result = world.run_eval(world.spec, variants, DAYS, size=SAMPLE, seed=7, resources=resources)
    report = build_report(world.spec, result, world.ledger, world.storage)

    baseline, on_bedrock = report.variant("baseline"), report.variant("bedrock")
    assert len(fake.jobs()) == len(DAYS)  # a batch inference job per day, not on-demand calls
    assert on_bedrock.n == SAMPLE and on_bedrock.score == baseline.score
    # Billed at Bedrock's batch price: half what the same tokens cost on demand, and more per
    # item than gpt-4o-mini's batch price.
    price = load_price_table().get("bedrock", BEDROCK_MODEL)
    expected = price.cost_usd(on_bedrock.input_tokens, on_bedrock.output_tokens, batch=True)
    assert on_bedrock.cost_usd == pytest.approx(expected)
    assert on_bedrock.realtime_cost_per_1k_items_usd == pytest.approx(
        2 * on_bedrock.cost_per_1k_items_usd
    )
    assert on_bedrock.cost_per_1k_items_usd > baseline.cost_per_1k_items_usd
    assert report.recommendation is not None
    assert report.recommendation.chosen is not None
    assert report.recommendation.chosen.name == "baseline"


def test_without_a_reference_labels_score_their_agreement_with_the_baseline(
    world: World,
) -> None:
    spec = base_spec().model_copy(
        update={
            "eval": base_spec().eval.model_copy(update={"reference_field": None, "min_score": 0.5})
        }
    )
    result = world.replay(variant_specs())

    report = build_report(spec, result, world.ledger, world.storage)

    assert (report.scoring.against, report.scoring.metric) == ("baseline", "kappa")
    baseline, terse = report.variant("baseline"), report.variant("terse")
    assert baseline.score == 1.0
    assert terse.kappa is not None
    # Terse answers `mixed` on the refused reviews: a category of its own, never agreeing.
    refused = sum(1 for d in DAYS for s in result.sample.source_ids[d] if review_n(s) % 3 == 0)
    assert terse.kappa.observed_agreement == pytest.approx((SAMPLE - refused) / SAMPLE)
    assert terse.score is not None and terse.score < 1.0


def test_an_eval_leaves_the_pipeline_itself_untouched(world: World) -> None:
    pointers = {day: steps.current_snapshot_uri(world.spec, day, world.storage) for day in DAYS}

    result = world.replay(variant_specs())

    for day in DAYS:
        # No job of the pipeline's own, its snapshots as they were, nothing validated or
        # published under its name.
        assert world.ledger.jobs_for_partition(world.spec.name, day) == []
        assert steps.current_snapshot_uri(world.spec, day, world.storage) == pointers[day]
        assert steps.gate_record(world.spec, day, world.storage) is None
    root = Path(world.settings.storage_url)
    written = {p.relative_to(root).parts[:2] for p in root.rglob("*") if p.is_file()}
    # Under the pipeline's own name: its snapshots (taken before the eval) and the eval's
    # sample; no outputs, reports, gate record or published file.
    assert {folder for folder, name in written if name == world.spec.name} == {
        "snapshots",
        "eval",
    }
    eval_pipelines = {run.pipeline for run in result.variants.values()}
    jobs = {
        job.pipeline
        for name in eval_pipelines
        for day in DAYS
        for job in world.ledger.jobs_for_partition(name, day)
    }
    assert jobs == eval_pipelines


def test_unknown_variants_are_named_with_the_known_ones() -> None:
    with pytest.raises(UnknownVariant, match="'cheap'.*known: baseline"):
        resolve_variants(base_spec(), ["cheap"])
    assert list(resolve_variants(base_spec(), [])) == ["baseline"]


def test_the_eval_job_runs_the_replay_and_records_the_report_as_a_partition(
    world: World, tmp_path: Path
) -> None:
    resources = {**build_resources(world.settings), **world.resources}
    job = build_eval_job(world.spec)
    report_asset = build_eval_report_asset(world.spec)
    key = eval_report_key(world.spec)
    (tmp_path / "dagster").mkdir()

    with dg.DagsterInstance.ephemeral() as instance:
        run = job.execute_in_process(
            run_config={
                "ops": {
                    f"{world.spec.name}__eval_replay": {
                        "config": {
                            "from": DAYS[0].isoformat(),
                            "to": DAYS[-1].isoformat(),
                            "sample": 9,
                            "seed": 3,
                            "poll_interval": 0.0,
                        }
                    }
                }
            },
            instance=instance,
            resources=resources,
        )
        assert run.success
        [partition] = instance.get_dynamic_partitions(f"{world.spec.name}__evals")
        recorded = instance.get_latest_materialization_event(key)
        sent = len(world.openai.submitted_custom_ids())
        # The partition materialized again from the asset: the same eval, nothing sent.
        again = dg.materialize(
            [report_asset], partition_key=partition, instance=instance, resources=resources
        )
        refreshed = instance.get_latest_materialization_event(key)

    [output] = [e.step_output_data.metadata for e in run.all_events if e.is_successful_output]
    assert run.output_for_node(names.eval_op(world.spec.name), EVAL_PARTITION) == partition
    sample = draw_sample(world.spec, DAYS, world.storage, size=9, seed=3)
    assert output["eval_id"].value == partition
    assert sample.eval_id in output["sample_uri"].value
    assert output["sampled_items"].value == 9
    assert output["open_items"].value == 0
    assert "| baseline | openai/gpt-4o-mini (v1) | 9 | 9 |" in output["variants"].value
    assert sent == 9
    assert partition.startswith(f"{DAYS[0]}_{DAYS[-1]}_n9_s3_")
    assert recorded is not None
    assert recorded.asset_materialization.partition == partition  # type: ignore[union-attr]
    metadata = recorded.asset_materialization.metadata  # type: ignore[union-attr]
    assert metadata["recommended"].value == "baseline"
    assert 0 < metadata["score/baseline"].value <= 1
    assert metadata["cost_per_1k_items_usd/baseline"].value > 0
    assert "| baseline | openai/gpt-4o-mini (v1) |" in metadata["report"].value
    assert again.success and len(world.openai.submitted_custom_ids()) == sent
    assert refreshed is not None and refreshed.run_id == again.run_id
    refreshed_metadata = refreshed.asset_materialization.metadata  # type: ignore[union-attr]
    assert refreshed_metadata["score/baseline"] == metadata["score/baseline"]


def test_an_eval_report_partition_never_run_fails_with_how_to_run_it(
    world: World, tmp_path: Path
) -> None:
    resources = {**build_resources(world.settings), **world.resources}
    (tmp_path / "dagster").mkdir()
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(f"{world.spec.name}__evals", ["made-up"])
        result = dg.materialize(
            [build_eval_report_asset(world.spec)],
            partition_key="made-up",
            instance=instance,
            resources=resources,
            raise_on_error=False,
        )
    assert not result.success
    [failure] = [e for e in result.all_events if e.is_step_failure]
    assert "no eval 'made-up' of reviews was run" in str(failure.step_failure_data.error)
    assert "reviews__eval" in str(failure.step_failure_data.error)


def test_cli_eval_prints_each_variant_and_exits_2_when_a_budget_blocks(
    world: World, tmp_path: Path
) -> None:
    specs = world.settings.pipelines_dir
    specs.mkdir()
    spec = review_spec("openai", "gpt-4o-mini", name="reviews")
    spec["eval"] = {"sample": 6, "seed": 0}
    (specs / "reviews.yaml").write_text(yaml.safe_dump(spec))
    env = world.cli_env()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        days = ["--from", str(DAYS[0]), "--to", str(DAYS[-1])]
        return run_command([CLI, "eval", "reviews", *days, *args], env)

    done = cli("--sample", "6", "--poll-interval", "0.05")
    as_json = cli("--json")  # the sample size and seed of the spec's eval section
    unknown = cli("--variants", "cheap")

    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.split())  # sentences wrap at the console's width
    assert "sample: 6 items, seed 0" in said
    assert "baseline: openai/gpt-4o-mini prompt v1" in said
    assert "6 items: 6 succeeded, 0 dead letters" in said
    assert "failure rate 0.0%" in said
    assert "per 1,000 items" in said
    # The report, rendered: no reference column, so labels are scored as agreement with the
    # baseline.
    assert "scored against baseline as kappa" in said
    assert "Recommendation: baseline is the cheapest variant" in said
    assert as_json.returncode == 0, as_json.stderr
    printed = json.loads(as_json.stdout)
    [baseline] = printed["report"]["variants"]
    assert (baseline["name"], baseline["succeeded"], baseline["score"]) == ("baseline", 6, 1.0)
    assert printed["report"]["recommendation"]["chosen"]["name"] == "baseline"
    assert json.loads(Path(printed["json"]).read_text()) == printed["report"]
    # Both runs are runs of the eval job in the Dagster instance, recording the report as
    # the eval's partition of eval_report (the same one: the same sample and variants).
    with dg.DagsterInstance.from_config(str(tmp_path / "dagster")) as instance:
        assert instance.get_dynamic_partitions("reviews__evals") == [
            printed["eval_report_partition"]
        ]
        records = instance.fetch_materializations(eval_report_key(base_spec()), limit=10)
        assert len(records.records) == 2
        assert f"Dagster: eval_report partition {printed['eval_report_partition']}" in said
    assert len(world.openai.submitted_custom_ids()) == 6  # the second run sent nothing
    assert unknown.returncode == 1 and "no variant 'cheap'" in unknown.stderr

    budget = {**spec, "budget": {"max_usd_per_partition": 0.0000001}}
    (specs / "reviews.yaml").write_text(yaml.safe_dump(budget))
    blocked = cli("--sample", "9", "--seed", "1")

    assert blocked.returncode == 2, blocked.stderr
    assert "budget" in blocked.stderr
    # What was blocked, and the same eval again with the approval, on stdout.
    told = " ".join(blocked.stdout.split())
    span = f"reviews {DAYS[0]} to {DAYS[-1]}"
    assert f"eval of {span}: blocked by the budget gate" in told, told
    again = f"llm-assets eval reviews --from {DAYS[0]} --to {DAYS[-1]} --sample 9 --seed 1"
    assert f"to go on: `{again} --approve-budget`" in told, told


def test_a_paused_pipeline_is_not_evaluated(world: World) -> None:
    world.ledger.pause_pipeline(world.spec.name, paused_by="ops", reason="provider incident")

    with pytest.raises(steps.GateBlocked, match="provider incident") as blocked:
        world.replay(variant_specs())

    assert blocked.value.gate == "paused"
    assert world.openai.submitted_custom_ids() == []
    assert world.anthropic.submitted_custom_ids() == []


def test_only_rows_the_pipeline_would_send_are_sampled_and_a_duplicate_once(
    world: World,
) -> None:
    day = DAYS[0]
    stamp = f"{day.isoformat()}T08:00:00Z"
    odd = [
        {"review_id": "R-blank", "created_at": stamp, "text": "  "},
        {"review_id": "", "created_at": stamp, "text": "no id"},
        {"review_id": "R-undated", "created_at": "someday", "text": "no date"},
        {"review_id": "R-zero", "created_at": stamp, "text": 0},
        {"review_id": "R-twice", "created_at": stamp, "text": "first"},
        {"review_id": "R-twice", "created_at": stamp, "text": "second"},
    ]
    lines = "\n".join(json.dumps(r) for r in odd) + "\nnot json\n"
    (world.home / "reviews" / f"odd-{day.isoformat()}.jsonl").write_text(lines)
    world.take_snapshot(world.spec, day)

    everything = draw_sample(world.spec, [day], world.storage, size=100, seed=7)

    assert sorted(everything.source_ids[day]) == sorted(
        [f"R-{day:%Y%m%d}-{n:04d}" for n in range(PER_DAY)] + ["R-twice", "R-zero"]
    )
    records = [json.loads(line) for line in world.storage.open_lines(everything.uri)]
    assert [r["text"] for r in records if r["review_id"] == "R-twice"] == ["first"]


def test_the_spec_s_variants_are_resolved_to_their_merged_specs() -> None:
    spec = PipelineSpec.model_validate(
        {
            **review_spec("openai", "gpt-4o-mini"),
            "variants": {
                "haiku": {"model": {"provider": "anthropic", "name": "claude-haiku-4-5"}},
                "terse": {"prompt": {"version": "v2", "system": "One word: positive or negative."}},
            },
        }
    )
    every = resolve_variants(spec, [])
    assert list(every) == ["baseline", "haiku", "terse"]
    assert (every["haiku"].model.provider, every["haiku"].model.name) == (
        "anthropic",
        "claude-haiku-4-5",
    )
    assert every["terse"].prompt.version == "v2" and every["terse"].model == spec.model
    assert list(resolve_variants(spec, ["terse"])) == ["baseline", "terse"]
    with pytest.raises(UnknownVariant, match="known: baseline, haiku, terse"):
        resolve_variants(spec, ["cheap"])
