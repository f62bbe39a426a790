"""`<pipeline>__eval`: an evaluation replay launched from the UI's Launchpad, with the run
config of `llm-assets eval` (from, to, sample, seed, variants). It draws the seeded sample
from the days' input snapshots and runs it through the baseline and each variant (see
evaluation/replay.py); nothing of it is published."""

import datetime as dt

import dagster as dg
import pydantic

from llm_assets import steps
from llm_assets.evaluation.replay import Replay, replay
from llm_assets.evaluation.variants import UnknownVariant, resolve_variants
from llm_assets.factory import APPROVE_BUDGET_TAG, started_by
from llm_assets.resources.providers import provider_resource_key
from llm_assets.resources.providers.registry import ADAPTERS
from llm_assets.spec import PipelineSpec
from llm_assets.words import class_words, duration_words


class EvalConfig(dg.Config):
    """Run config of an eval job."""

    from_: str = pydantic.Field(alias="from", description="First day, YYYY-MM-DD.")
    to: str = pydantic.Field(description="Last day (inclusive), YYYY-MM-DD.")
    sample: int | None = pydantic.Field(
        default=None, ge=1, description="Items sampled; default the spec's eval.sample."
    )
    seed: int | None = pydantic.Field(
        default=None, description="The same seed samples the same items; default eval.seed."
    )
    variants: list[str] = pydantic.Field(
        default_factory=list, description="Variants to run besides the baseline."
    )
    approve_budget: bool = pydantic.Field(
        default=False, description="Submit even where a variant's budget gate would refuse."
    )
    wait: bool = pydantic.Field(
        default=True,
        description="Wait for every answer; false submits and imports what has ended, and "
        "launching the same config again carries on without sending anything twice.",
    )
    poll_interval: float = pydantic.Field(default=30.0, ge=0.0)


def eval_job_name(spec: PipelineSpec) -> str:
    return f"{spec.name}__eval"


def eval_days(spec: PipelineSpec, start: str, end: str) -> list[dt.date]:
    """The days from `start` to `end`, or ValueError saying what is wrong with them."""
    try:
        first, last = dt.date.fromisoformat(start), dt.date.fromisoformat(end)
    except ValueError:
        raise ValueError(f"from {start!r} and to {end!r} must be dates like 2026-11-01") from None
    if last < first:
        raise ValueError(f"to {last} is before from {first}")
    if first < spec.partitions.start_date:
        raise ValueError(
            f"{first} is before {spec.name}'s first partition {spec.partitions.start_date}"
        )
    return [first + dt.timedelta(days=n) for n in range((last - first).days + 1)]


def variant_table(result: Replay) -> str:
    """The variants side by side, as markdown."""
    lines = [
        "| variant | model | items | succeeded | dead letters | quality failure rate "
        "| tokens in/out | cost | per 1,000 items | to last result |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for run in result.variants.values():
        lines.append(
            f"| {run.variant} | {run.provider}/{run.model} ({run.prompt_version}) | "
            f"{run.items} | {run.succeeded} | {class_words(run.dead_letters_by_class) or 0} | "
            f"{run.quality_failure_rate:.1%} | {run.input_tokens:,}/{run.output_tokens:,} | "
            f"${run.cost_usd:.4f} | ${run.cost_per_1000_items:.4f} | "
            f"{duration_words(run.seconds_to_last_result)} |"
        )
    return "\n".join(lines)


def build_eval_job(spec: PipelineSpec) -> dg.JobDefinition:
    """The pipeline's eval job: one op driving the replay. It needs every provider's
    resource, since the variants may use any of them."""
    provider_keys = {provider_resource_key(name) for name in ADAPTERS}

    @dg.op(
        name=f"{spec.name}__eval_replay",
        required_resource_keys={"ledger", "storage", *provider_keys},
        description=f"Replay a seeded sample of {spec.name}'s days through its variants.",
    )
    def eval_replay(context: dg.OpExecutionContext, config: EvalConfig) -> dg.Output[None]:
        try:
            days = eval_days(spec, config.from_, config.to)
            variants = resolve_variants(spec, config.variants)
        except (ValueError, UnknownVariant) as exc:
            raise dg.Failure(description=str(exc), allow_retries=False) from exc
        resources = {
            key: getattr(context.resources, key) for key in ("ledger", "storage", *provider_keys)
        }
        tagged = context.run.tags.get(APPROVE_BUDGET_TAG, "").lower() in ("1", "true", "yes")
        try:
            result = replay(
                resources,
                spec,
                variants,
                days,
                size=spec.eval.sample if config.sample is None else config.sample,
                seed=spec.eval.seed if config.seed is None else config.seed,
                created_by=started_by(context),
                approve_budget=config.approve_budget or tagged,
                wait=config.wait,
                poll_interval=config.poll_interval,
            )
        except steps.GateBlocked as exc:
            raise dg.Failure(
                description=str(exc), metadata={"gate": exc.gate}, allow_retries=False
            ) from exc
        except (steps.MissingPrerequisite, ValueError) as exc:
            raise dg.Failure(description=str(exc), allow_retries=False) from exc
        open_items = sum(run.open_items for run in result.variants.values())
        return dg.Output(
            None,
            metadata={
                "eval_id": result.sample.eval_id,
                "sample_uri": dg.MetadataValue.path(result.sample.uri),
                "sampled_items": result.sample.items,
                "open_items": open_items,
                "variants": dg.MetadataValue.md(variant_table(result)),
                "eval_pipelines": dg.MetadataValue.json(
                    {name: run.pipeline for name, run in result.variants.items()}
                ),
            },
        )

    @dg.job(
        name=eval_job_name(spec),
        description=f"Evaluate {spec.name}: a seeded sample of its days' input snapshots, the "
        "same items for the baseline and every variant named, each run through the normal "
        "steps as its own eval pipeline. Nothing is published. Run config: from, to, sample, "
        "seed, variants.",
        tags={"llm_assets/operator": "eval"},
    )
    def eval_job() -> None:
        eval_replay()

    return eval_job
