"""validated_outputs: the day's succeeded results through the quality gate, in one step or,
with `sharding.slices` above 1, in slices that run as steps of their own (on any worker under
the Celery executor) and a join that writes the day's outputs and runs the checks. While the
day has open items it materializes nothing, so its checks and the steps after it in the same
run are skipped, not failed; the batch-status sensor validates the day once every item is
terminal."""

from collections.abc import Iterator

import dagster as dg

from llm_assets import names, steps
from llm_assets.defs import checks
from llm_assets.defs import metadata as asset_metadata
from llm_assets.defs.pipeline import (
    Pipeline,
    empty_day,
    empty_results,
    run_step,
    selected_results,
    skipped,
    still_in_flight,
)

_DESCRIPTION = (
    "Results that pass the pydantic and pandera gate, as Parquet with lineage; skipped while "
    "items are still in flight."
)
_Outcome = dg.MaterializeResult | dg.AssetCheckResult | dg.AssetObservation


def validated_outputs_asset(pipe: Pipeline) -> dg.AssetsDefinition:
    """The pipeline's validated_outputs: one step, or its slices and their join."""
    if pipe.spec.sharding.slices > 1:
        return _sliced(pipe)
    return _whole(pipe)


def _check_specs(pipe: Pipeline) -> list[dg.AssetCheckSpec]:
    return checks.validated_outputs_check_specs(pipe.spec, pipe.key(names.VALIDATED_OUTPUTS))


def _whole(pipe: Pipeline) -> dg.AssetsDefinition:
    @pipe.skippable(
        names.VALIDATED_OUTPUTS,
        after=[names.BATCH_RESULTS],
        description=_DESCRIPTION,
        kinds={"parquet", "pandera"},
        check_specs=_check_specs(pipe),
    )
    def validated_outputs(context: dg.AssetExecutionContext) -> Iterator[_Outcome]:
        ctx = pipe.context(context)
        if empty_day(context, ctx):
            yield from empty_results(context, pipe, names.VALIDATED_OUTPUTS)
            return
        reason = still_in_flight(ctx)
        if reason:
            yield skipped(context, pipe.key(names.VALIDATED_OUTPUTS), reason)
            return

        def validate() -> tuple[steps.ValidateResult, list[dg.AssetCheckResult]]:
            # The day is held from the first gate record to the last, so that another run
            # reading the gate meanwhile waits for this verdict (steps.settled_block).
            with ctx.day_lock():
                steps.record_gate(ctx, ctx.job().job_id, [steps.UNFINISHED])
                result = steps.validate_outputs(ctx)
                schema_failures = steps.published_frame_failures(ctx, result.uri)
                evaluated = checks.validated_outputs_checks(pipe.spec, result, schema_failures)
                steps.record_gate(ctx, result.job_id, checks.publication_blockers(evaluated))
                return result, evaluated

        result, evaluated = run_step(validate)
        yield from selected_results(
            context,
            pipe.key(names.VALIDATED_OUTPUTS),
            evaluated,
            asset_metadata.validated_metadata(ctx, result),
        )

    return validated_outputs


def _slice_op(pipe: Pipeline, number: int) -> dg.OpDefinition:
    slices = pipe.spec.sharding.slices

    @dg.op(
        name=f"{pipe.spec.name}__validate_slice_{number + 1}_of_{slices}",
        description=f"Judges slice {number + 1} of {slices} of the day's succeeded results.",
        ins={"results": dg.In(dg.Nothing)},
        out=dg.Out(dg.Nothing),
        required_resource_keys={"ledger", "storage"},
    )
    def validate_slice(context: dg.OpExecutionContext) -> None:
        ctx = pipe.context(context)
        if steps.no_source_rows(pipe.spec, ctx.day, ctx.storage):
            context.log.info(f"{steps.no_source_rows_reason(ctx.day)}: no slice to validate")
            return
        reason = still_in_flight(ctx)
        if reason:
            context.log.info(f"slice {number + 1}/{slices} not validated: {reason}")
            run_step(lambda: steps.forget_slice(ctx, number))
            return
        judged = run_step(lambda: steps.validate_slice(ctx, number))
        context.log.info(
            f"slice {number + 1}/{slices}: {judged.judged} results judged, "
            f"{judged.tally.valid} valid, {len(judged.failed_rows)} quality failures"
        )

    return validate_slice


def _sliced(pipe: Pipeline) -> dg.AssetsDefinition:
    spec = pipe.spec
    key = pipe.key(names.VALIDATED_OUTPUTS)
    check_specs = pipe.partitioned(_check_specs(pipe))

    @dg.op(
        name=f"{spec.name}__join_validation",
        description="Joins the day's validation slices into its outputs, then runs the checks.",
        ins={"slices": dg.In(dg.Nothing)},
        out=pipe.join_outs(names.VALIDATED_OUTPUTS, check_specs),
        required_resource_keys={"ledger", "storage"},
    )
    def join_validation(context: dg.OpExecutionContext) -> Iterator[_Outcome]:
        ctx = pipe.context(context)
        if steps.no_source_rows(spec, ctx.day, ctx.storage):
            yield from empty_results(context, pipe, names.VALIDATED_OUTPUTS)
            return
        reason = still_in_flight(ctx)
        if reason:
            yield skipped(context, key, reason)
            return

        def validate() -> tuple[steps.ValidateResult, list[dg.AssetCheckResult]]:
            with ctx.day_lock():  # as in one step: the gate's records around the verdict
                steps.record_gate(ctx, ctx.job().job_id, [steps.UNFINISHED])
                joined = steps.join_validation(ctx)
                evaluated = checks.validated_outputs_checks(
                    spec, joined.result, joined.read_back_failures
                )
                steps.record_gate(ctx, joined.result.job_id, checks.publication_blockers(evaluated))
                return joined.result, evaluated

        result, evaluated = run_step(validate)
        yield from selected_results(
            context, key, evaluated, asset_metadata.validated_metadata(ctx, result)
        )

    return pipe.sliced(
        names.VALIDATED_OUTPUTS,
        after=names.BATCH_RESULTS,
        slice_ops=[_slice_op(pipe, number) for number in range(spec.sharding.slices)],
        join=join_validation,
        check_specs=check_specs,
        description=_DESCRIPTION,
        kinds={"parquet", "pandera"},
    )
