"""The residency gate: a day of a pipeline with `compliance.allowed_regions` writes and sends
nothing while a place its data would go or rest is outside them.

input_snapshot asks before it writes the snapshot (the artifact storage, and what the spec
alone decides about the provider), request_shards and provider_batches before they write
shards or send anything (the storage and the provider as configured). Each ask costs a few
lookups per step, never per item: the S3 bucket's region is asked once per process.
"""

from llm_assets.compliance.residency import Place, provider_places, refusal, storage_places
from llm_assets.steps.context import GateBlocked, StepContext

RESIDENCY = "residency"
"""The gate's name in a Failure's metadata and the CLI's `blocked` line."""


def residency_places(ctx: StepContext) -> list[Place]:
    """Where the step's data goes and rests: the provider (only what the spec decides when the
    step has no provider resource) and the artifact storage."""
    return [*provider_places(ctx.spec, ctx.provider), *storage_places(ctx.storage)]


def refuse_outside_regions(ctx: StepContext) -> None:
    """GateBlocked naming every place outside the spec's allowed regions; nothing is asked
    when the spec allows any region."""
    if ctx.spec.compliance.allowed_regions is None:
        return
    refused = refusal(ctx.spec, residency_places(ctx))
    if refused is not None:
        raise GateBlocked(
            RESIDENCY,
            f"{ctx.spec.name} {ctx.day}: {refused}; this step wrote and sent nothing. Change the "
            "provider, endpoint, region or bucket, or compliance.allowed_regions",
        )
