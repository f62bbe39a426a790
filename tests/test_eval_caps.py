"""An eval runs inside the pipeline it evaluates: its variants' days reserve against the
pipeline's daily cap, stop at the pipeline's pause between any two submissions, are polled
by the pipeline's batch-status sensor when nobody waits for them (so they stop counting
against `max_active_batches` once they end), and are cancelled by their eval pipeline's name."""

from typing import Any

import dagster as dg
import pytest
import yaml

from llm_assets import steps
from llm_assets.defs.factory import build_pipeline_assets
from llm_assets.defs.sensors import build_batch_status_sensor
from llm_assets.resources.providers.openai_batch import OpenAIBatchProvider
from llm_assets.spec.model import PipelineSpec
from tests import test_eval_replay as replay_tests
from tests.eval_harness import run_command
from tests.harness import CLI, provider_for, review_spec
from tests.test_eval_replay import DAYS, World
from tests.test_lifecycle_races import run_out_every_batch

pytestmark = pytest.mark.one_database
world = replay_tests.world


def with_budget(spec: PipelineSpec, **budget: float) -> PipelineSpec:
    return spec.model_copy(update={"budget": spec.budget.model_copy(update=budget)})


def created_batches(world: World) -> list[str]:
    return [
        entry["batch_id"]
        for entry in world.openai.calls.entries()
        if entry["method"] == "POST" and entry["path"] == "/v1/batches" and entry["status"] == 200
    ]


def test_an_eval_reserves_against_the_pipelines_daily_cap(world: World) -> None:
    """The pipeline's own day has reserved most of today's cap: the eval's first variant day
    needs more than is left, and is refused as the pipeline's second day would be."""
    provider = provider_for(world.openai)
    ctx = steps.StepContext(world.spec, DAYS[0], world.ledger, world.storage, provider)
    steps.build_shards(ctx)
    upper = world.ledger.committed_cost(ctx.job_id)
    capped = with_budget(world.spec, max_usd_per_day=upper * 1.2)
    steps.submit_shards(steps.StepContext(capped, DAYS[0], world.ledger, world.storage, provider))
    sent = created_batches(world)

    with pytest.raises(steps.GateBlocked) as blocked:
        _replay(world, capped)

    assert blocked.value.gate == "pipeline_budget"
    assert "pipeline reviews " in blocked.value.reason
    assert created_batches(world) == sent, "nothing of the eval was sent"


def _replay(world: World, spec: PipelineSpec, **kwargs: Any) -> Any:
    """The world's replay of `spec`'s baseline, with `spec` as the evaluated pipeline."""
    world.spec = spec
    return world.replay({"baseline": spec}, **kwargs)


def test_a_pause_during_an_eval_stops_its_next_submission(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    submit = OpenAIBatchProvider.submit

    def submit_then_pause(self: OpenAIBatchProvider, *args: Any, **kwargs: Any) -> str:
        batch_id = submit(self, *args, **kwargs)
        world.ledger.pause_pipeline("reviews", paused_by="ops", reason="provider incident")
        return batch_id

    monkeypatch.setattr(OpenAIBatchProvider, "submit", submit_then_pause)

    with pytest.raises(steps.GateBlocked, match="provider incident") as blocked:
        _replay(world, world.spec)

    assert blocked.value.gate == "paused"
    assert len(created_batches(world)) == 1


def status_tick(world: World, spec: PipelineSpec) -> Any:
    """One tick of the pipeline's batch-status sensor."""
    sensor = build_batch_status_sensor(spec)
    resources = world.resources
    defs = dg.Definitions(
        assets=build_pipeline_assets(spec, world.settings), sensors=[sensor], resources=resources
    )
    with dg.DagsterInstance.ephemeral() as instance:
        context = dg.build_sensor_context(
            instance=instance, resources=resources, definitions=defs, sensor_name=sensor.name
        )
        return sensor.evaluate_tick(context)


def test_the_pipelines_sensor_polls_an_abandoned_evals_batches(world: World) -> None:
    """An eval run without waiting leaves its batches in flight; they end at the provider.
    The pipeline's sensor sees them end, so the pipeline's own day is not held back by a
    `max_active_batches` they no longer use."""
    world.openai.polls_per_state = 1000
    _replay(world, world.spec, wait=False)
    in_flight, _ = world.ledger.in_flight_load("openai", "gpt-4o-mini")
    assert in_flight > 0
    run_out_every_batch(world.openai)

    tick = status_tick(world, world.spec)

    assert world.ledger.in_flight_load("openai", "gpt-4o-mini") == (0, 0)
    assert tick.run_requests == []  # the eval's own run imports its days
    quota = world.spec.quota.model_copy(update={"max_active_batches": in_flight})
    limited = world.spec.model_copy(update={"quota": quota})
    ctx = steps.StepContext(
        limited, DAYS[1], world.ledger, world.storage, provider_for(world.openai)
    )
    steps.build_shards(ctx)
    submitted = steps.submit_shards(ctx)
    assert submitted.submitted and submitted.waiting_for_quota == 0


def test_an_evals_day_is_cancelled_by_its_pipeline_name(world: World) -> None:
    world.openai.polls_per_state = 1000
    result = _replay(world, world.spec, wait=False)
    eval_pipeline = result.variants["baseline"].pipeline
    specs = world.settings.pipelines_dir
    specs.mkdir()
    (specs / "reviews.yaml").write_text(
        yaml.safe_dump(review_spec("openai", "gpt-4o-mini", name="reviews"))
    )
    args = [CLI, "cancel", eval_pipeline, "--date", DAYS[0].isoformat(), "--no-wait"]

    done = run_command(args, world.cli_env(), timeout=300)

    assert done.returncode == 0, done.stderr
    [job] = world.ledger.jobs_for_partition(eval_pipeline, DAYS[0])
    assert job.cancelled_at is not None and job.parent_pipeline == "reviews"
    shards = world.ledger.shards(job.job_id)
    assert shards and all(s.cancel_sent_at is not None for s in shards)
    statuses = run_out_every_batch(world.openai)
    assert {statuses[s.provider_batch_id or ""] for s in shards} == {"cancelled"}
    other_day = world.ledger.jobs_for_partition(eval_pipeline, DAYS[1])
    assert all(job.cancelled_at is None for job in other_day)
