"""`<pipeline>__cancel`: an operator's cancel of a day, or of some of its shards, launched
from the UI's Launchpad with run config (the same as `llm-assets cancel`, without waiting:
the batch-status sensor imports the cancelled batches as they end)."""

import datetime as dt
from collections.abc import Mapping
from typing import Any

import dagster as dg
import pydantic

from llm_assets import names, steps
from llm_assets.resources.providers import provider_resource_key
from llm_assets.spec.model import PipelineSpec


class CancelConfig(dg.Config):
    date: str = pydantic.Field(description="The partition date to cancel, YYYY-MM-DD.")
    shards: list[str] = pydantic.Field(
        default_factory=list,
        description="Shard ids (or their short forms, r00-s00003) to cancel; empty: the whole "
        "day, which also stops its later submissions until a requeue.",
    )
    reason: str = pydantic.Field(default="cancelled from the Dagster UI")


def build_cancel_job(
    spec: PipelineSpec, resources: Mapping[str, Any] | None = None
) -> dg.JobDefinition:
    """The cancel job of a pipeline, with the ledger, the storage and the pipeline's provider.
    Given `resources` (the code location's), the job binds these three, so its Launchpad
    offers only their configuration, not every provider's."""
    provider_key = provider_resource_key(spec.model.provider)
    keys = {"ledger", "storage", provider_key}

    @dg.op(name=names.cancel_op(spec.name), required_resource_keys=keys)
    def cancel_day(context: dg.OpExecutionContext, config: CancelConfig) -> None:
        try:
            day = dt.date.fromisoformat(config.date)
        except ValueError:
            raise dg.Failure(f"date {config.date!r} is not YYYY-MM-DD") from None
        ctx = steps.StepContext(
            spec,
            day,
            context.resources.ledger,
            context.resources.storage,
            getattr(context.resources, provider_key),
            created_by=f"dagster:{context.run_id}",
            run_id=context.run_id,
            log=context.log.info,
        )
        try:
            result = steps.cancel_day(ctx, shard_ids=config.shards or None, reason=config.reason)
        except (ValueError, steps.MissingPrerequisite) as exc:
            raise dg.Failure(description=str(exc), allow_retries=False) from exc
        context.add_output_metadata(
            {
                "job_id": result.job_id,
                "whole_day": result.whole_day,
                "cancelled_batches": len(result.cancelled_batches),
                "closed_shards": len(result.closed_shards),
                "cancelled_items": result.cancelled_items,
                "settling_shards": len(result.settling),
            }
        )

    @dg.job(
        name=names.cancel_job(spec.name),
        description=f"Cancel a day of {spec.name} (or some of its shards): provider batches "
        "in flight are cancelled, unsent shards closed; what the batches answered is kept and "
        "the rest become `cancelled` dead letters that `llm-assets requeue` can send again.",
        tags={names.OPERATOR_TAG: "cancel"},
        resource_defs=None if resources is None else {key: resources[key] for key in keys},
    )
    def cancel_job() -> None:
        cancel_day()

    return cancel_job
