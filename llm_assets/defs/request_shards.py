"""request_shards: the day's shards built in one step or, with `sharding.slices` above 1, in
slices that run as steps of their own (on any worker, under the Celery executor on any
machine) and are joined before submission: one graph-backed asset whose join runs the
budget and personal-data gates, as the one-step asset does."""

from collections.abc import Iterator

import dagster as dg

from llm_assets import names, steps
from llm_assets.defs import checks
from llm_assets.defs import metadata as asset_metadata
from llm_assets.defs.pipeline import (
    BudgetApproval,
    Pipeline,
    approval_of,
    empty_day,
    empty_results,
    run_step,
)

_DESCRIPTION = (
    "JSONL request shards with stable custom_ids, a token and cost estimate and the budget "
    "gate; bad input is dead-lettered here. A day with no source rows gets no job: this and "
    "every later step materialize it as empty."
)
_Outcome = dg.MaterializeResult | dg.AssetCheckResult


def request_shards_asset(pipe: Pipeline) -> dg.AssetsDefinition:
    """The pipeline's request_shards: one step, or its slices and their join."""
    if pipe.spec.sharding.slices > 1:
        return _sliced(pipe)
    return _whole(pipe)


def _check_specs(pipe: Pipeline) -> list[dg.AssetCheckSpec]:
    key = pipe.key(names.REQUEST_SHARDS)
    return pipe.partitioned([checks.budget_check_spec(key), checks.compliance_check_spec(key)])


def _created_by(context: dg.AssetExecutionContext | dg.OpExecutionContext) -> str:
    return context.run.tags.get(names.CREATED_BY_TAG, "dagster")


def _gated(
    context: dg.AssetExecutionContext | dg.OpExecutionContext,
    pipe: Pipeline,
    ctx: steps.StepContext,
    result: steps.ShardsResult,
    config: BudgetApproval,
) -> dg.MaterializeResult:
    """The built day through the budget and personal-data gates, as request_shards'
    materialization and checks."""
    approve, who = approval_of(context, config)
    gate = steps.budget_gate(ctx, approve=approve, approved_by=who)
    screened = steps.compliance_gate(ctx)
    # A failed gate check skips provider_batches in this run; the shards wait for an
    # operator, and no sensor asks to submit them meanwhile.
    if not gate.passed:
        steps.hold_for_gate(ctx, steps.GateBlocked("budget", gate.reason))
    elif not screened.passed:
        steps.hold_for_gate(ctx, steps.GateBlocked("compliance", screened.reason))
    estimate = result.estimate
    context.log.info(
        f"{result.job_id}: {result.new_items} new items, {len(result.shards_created)} "
        f"shards, {sum(result.input_dead_letters.values())} input dead letters; estimate "
        f"${estimate.cost_usd:.4f}, upper bound ${estimate.cost_upper_usd:.4f}; budget: "
        f"{gate.reason}; personal data: {screened.reason}"
    )
    return dg.MaterializeResult(
        asset_key=pipe.key(names.REQUEST_SHARDS),
        check_results=[
            checks.budget_check(gate),
            checks.compliance_check(screened, result.personal_data),
        ],
        metadata=asset_metadata.shards_metadata(
            pipe.spec,
            result,
            gate,
            ctx.ledger.counts(result.job_id).total,
            ctx.ledger.shards(result.job_id),
        ),
    )


def _whole(pipe: Pipeline) -> dg.AssetsDefinition:
    @pipe.asset(
        names.REQUEST_SHARDS,
        after=[names.INPUT_SNAPSHOT],
        provider=True,
        description=_DESCRIPTION,
        kinds={"jsonl", pipe.spec.model.provider},
        code_version=pipe.spec.prompt_code_version,
        check_specs=_check_specs(pipe),
        output_required=False,
    )
    def request_shards(
        context: dg.AssetExecutionContext, config: BudgetApproval
    ) -> Iterator[_Outcome]:
        ctx = pipe.context(context, provider=True, created_by=_created_by(context))
        if empty_day(context, ctx):
            yield from empty_results(context, pipe, names.REQUEST_SHARDS)
            return
        result: steps.ShardsResult = run_step(lambda: steps.build_shards(ctx))
        yield _gated(context, pipe, ctx, result, config)

    return request_shards


def _slice_op(pipe: Pipeline, number: int) -> dg.OpDefinition:
    slices = pipe.spec.sharding.slices

    @dg.op(
        name=f"{pipe.spec.name}__slice_{number + 1}_of_{slices}",
        description=f"Builds slice {number + 1} of {slices} of the day's snapshot rows into "
        "shards held for the join.",
        ins={"snapshot": dg.In(dg.Nothing)},
        out=dg.Out(dg.Nothing),
        required_resource_keys=pipe.with_provider,
    )
    def build_slice(context: dg.OpExecutionContext) -> None:
        ctx = pipe.context(context, provider=True, created_by=_created_by(context))
        if steps.no_source_rows(pipe.spec, ctx.day, ctx.storage):
            context.log.info(f"{steps.no_source_rows_reason(ctx.day)}: no slice to build")
            return
        result: steps.ShardsResult = run_step(lambda: steps.build_slice(ctx, number))
        context.log.info(
            f"slice {number + 1}/{slices}: {result.snapshot_rows} rows, {result.new_items} "
            f"new items, {result.already_known} known, {len(result.shards_created)} shards"
        )

    return build_slice


def _sliced(pipe: Pipeline) -> dg.AssetsDefinition:
    spec = pipe.spec
    check_specs = _check_specs(pipe)

    @dg.op(
        name=f"{spec.name}__join_slices",
        description="Joins the day's slices (their shards released), then runs the budget "
        "and personal-data gates.",
        ins={"slices": dg.In(dg.Nothing)},
        out=pipe.join_outs(names.REQUEST_SHARDS, check_specs),
        required_resource_keys=pipe.with_provider,
    )
    def join_slices(context: dg.OpExecutionContext, config: BudgetApproval) -> Iterator[_Outcome]:
        ctx = pipe.context(context, provider=True, created_by=_created_by(context))
        if steps.no_source_rows(spec, ctx.day, ctx.storage):
            context.log.info(f"{steps.no_source_rows_reason(ctx.day)}: nothing to join")
            yield from empty_results(context, pipe, names.REQUEST_SHARDS)
            return
        result: steps.ShardsResult = run_step(lambda: steps.join_slices(ctx))
        yield _gated(context, pipe, ctx, result, config)

    return pipe.sliced(
        names.REQUEST_SHARDS,
        after=names.INPUT_SNAPSHOT,
        slice_ops=[_slice_op(pipe, number) for number in range(spec.sharding.slices)],
        join=join_slices,
        check_specs=check_specs,
        description=_DESCRIPTION,
        kinds={"jsonl", spec.model.provider},
        code_version=spec.prompt_code_version,
    )
