"""The asset factory: one Dagster group of daily-partitioned assets per pipeline spec.

Each asset is built by a function of its own below; its body calls one step (steps/) with
the partition's StepContext and reports a MaterializeResult with row counts, a preview and
the lineage every materialization carries.
"""

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import dagster as dg

from llm_assets import names, steps
from llm_assets.defs import checks
from llm_assets.defs import metadata as asset_metadata
from llm_assets.defs.pipeline import (
    SKIPPED,
    BudgetApproval,
    Pipeline,
    approval_of,
    asset_key,
    empty_day,
    empty_results,
    in_flight_reason,
    partitions_for,
    run_step,
    selected_results,
    skipped,
    started_by,
    still_in_flight,
)
from llm_assets.defs.request_shards import request_shards_asset
from llm_assets.defs.validated_outputs import validated_outputs_asset
from llm_assets.spec.model import PipelineSpec
from llm_assets.steps import stuck
from llm_assets.util.settings import Settings

__all__ = [
    "SKIPPED",
    "BudgetApproval",
    "asset_key",
    "build_pipeline_assets",
    "in_flight_reason",
    "partitions_for",
    "started_by",
]

_R = TypeVar("_R")


def _input_snapshot(pipe: Pipeline) -> dg.AssetsDefinition:
    @pipe.asset(
        names.INPUT_SNAPSHOT,
        description=f"Immutable, content-hashed snapshot of {pipe.spec.name}'s source rows "
        "for the day.",
        kinds={"jsonl"},
        check_specs=pipe.partitioned(
            [checks.source_rows_check_spec(pipe.key(names.INPUT_SNAPSHOT))]
        ),
    )
    def input_snapshot(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        ctx = pipe.context(context)
        result = run_step(lambda: steps.take_snapshot(ctx, pipe.source_uri))
        if result.empty:
            context.log.warning(
                f"{steps.no_source_rows_reason(ctx.day)}: the later steps have nothing to do"
            )
        return dg.MaterializeResult(
            check_results=[
                checks.source_rows_check(result.rows, steps.no_source_rows_reason(ctx.day))
            ],
            metadata=asset_metadata.snapshot_metadata(pipe.spec, result, ctx.day),
            data_version=dg.DataVersion(result.sha256[:20]),
        )

    return input_snapshot


def _provider_batches(pipe: Pipeline) -> dg.AssetsDefinition:
    @pipe.asset(
        names.PROVIDER_BATCHES,
        after=[names.REQUEST_SHARDS],
        provider=True,
        description="Submits shards to the provider (never twice, never over budget); returns "
        "without waiting. Skipped, with who paused it and why, while the pipeline is paused.",
        kinds={pipe.spec.model.provider},
        pool=f"llm_provider_{pipe.spec.model.provider}",
        output_required=False,
    )
    def provider_batches(
        context: dg.AssetExecutionContext, config: BudgetApproval
    ) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult | dg.AssetObservation]:
        ctx = pipe.context(context, provider=True)
        if empty_day(context, ctx):
            yield from empty_results(context, pipe, names.PROVIDER_BATCHES)
            return
        approve, who = approval_of(context, config)
        try:
            result: steps.SubmitResult = run_step(
                lambda: steps.submit_shards(
                    ctx, approve_budget=approve, approved_by=who, progress=context.log.info
                )
            )
        except steps.PipelinePaused as paused:
            # An operator's choice, not an error: the day is not submitted (nor are the later
            # steps of this run); what is in flight is still imported by the sensor.
            yield skipped(context, pipe.key(names.PROVIDER_BATCHES), str(paused))
            return
        yield dg.MaterializeResult(
            metadata=asset_metadata.submit_metadata(
                pipe.spec, result, ctx.batch_provider, ctx.ledger.shards(result.job_id)
            )
        )

    return provider_batches


def _stuck_check(ctx: steps.StepContext) -> dg.AssetCheckResult:
    """The day's batches stuck before they started, as batch_results' WARN check."""
    spec = ctx.spec
    floor = ctx.batch_provider.stuck_after_seconds
    found = stuck.stuck_batches(ctx.ledger, ctx.job_id, spec.model.provider, spec.model.name, floor)
    words = stuck.stuck_words(spec.name, ctx.day, spec.model.name, found) if found else None
    return checks.stuck_check(len(found), words)


def _batch_results(pipe: Pipeline) -> dg.AssetsDefinition:
    @pipe.asset(
        names.BATCH_RESULTS,
        after=[names.PROVIDER_BATCHES],
        provider=True,
        description="Imports ended batches by custom_id and plans retries of what is still open.",
        kinds={pipe.spec.model.provider},
        check_specs=pipe.partitioned(
            [
                *checks.batch_results_check_specs(pipe.key(names.BATCH_RESULTS)),
                checks.stuck_check_spec(pipe.key(names.BATCH_RESULTS)),
            ]
        ),
    )
    def batch_results(
        context: dg.AssetExecutionContext,
    ) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult]:
        ctx = pipe.context(context, provider=True)
        if empty_day(context, ctx):
            yield from empty_results(context, pipe, names.BATCH_RESULTS)
            return
        result: steps.ImportResult = run_step(lambda: steps.import_results(ctx))
        for problem in result.provider_file_errors:
            context.log.warning(problem)
        counts = result.counts
        missing = ctx.ledger.missing_results(result.job_id) if counts.open == 0 else []
        imported = set(result.imported_shards)
        batches = {
            s.shard_id: s.provider_batch_id
            for s in ctx.ledger.shards(result.job_id)
            if s.shard_id in imported
        }
        yield dg.MaterializeResult(
            check_results=[
                checks.missing_results_check(missing, counts),
                checks.duplicate_results_check(result.lines.duplicates, result.lines.duplicate_ids),
                _stuck_check(ctx),
            ],
            metadata={
                **asset_metadata.import_metadata(pipe.spec, result, batches, ctx.batch_provider),
                **asset_metadata.cancel_metadata(ctx.spec.name, ctx.day, ctx.job()),
            },
        )

    return batch_results


def _publication_blocked(ctx: steps.StepContext) -> str | None:
    """Why a day is not published: the gate checks its latest validation failed."""
    return run_step(lambda: steps.settled_block(ctx))


@dataclasses.dataclass(frozen=True)
class _ReportingStep(Generic[_R]):
    """A step asset with no checks of its own, built for a pipeline by calling it: its body
    runs the step and reports the result as metadata. When `skip` gives a reason, the day is
    not materialized (nor are later steps in the run): the reason is logged and recorded as
    an observation of the asset, so its page says why."""

    step: str
    run: Callable[[steps.StepContext], _R]
    report: Callable[[steps.StepContext, _R], dict[str, Any]]
    description: str
    kinds: frozenset[str]
    skip: Callable[[steps.StepContext], str | None]
    after: tuple[str, ...] = (names.VALIDATED_OUTPUTS,)

    def __call__(self, pipe: Pipeline) -> dg.AssetsDefinition:
        @pipe.asset(
            self.step,
            after=self.after,
            description=self.description,
            kinds=set(self.kinds),
            output_required=False,
        )
        def reporting_step(
            context: dg.AssetExecutionContext,
        ) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult | dg.AssetObservation]:
            ctx = pipe.context(context)
            if empty_day(context, ctx):
                yield from empty_results(context, pipe, self.step)
                return
            reason = self.skip(ctx)
            if reason:
                yield skipped(context, pipe.key(self.step), reason)
                return
            result = run_step(lambda: self.run(ctx))
            yield dg.MaterializeResult(metadata=self.report(ctx, result))

        return reporting_step


def _cost_report(pipe: Pipeline) -> dg.AssetsDefinition:
    @pipe.skippable(
        names.COST_REPORT,
        after=[names.VALIDATED_OUTPUTS, names.DEAD_LETTER],
        description="Tokens and cost per item, shard, job and the pipeline's days and months, "
        "with the batch discount, retry overhead, estimate error and drift; written once "
        "every item of the day is terminal.",
        kinds={"json", "markdown"},
        check_specs=[checks.cost_drift_check_spec(pipe.key(names.COST_REPORT))],
    )
    def cost_report(
        context: dg.AssetExecutionContext,
    ) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult | dg.AssetObservation]:
        ctx = pipe.context(context)
        if empty_day(context, ctx):
            yield from empty_results(context, pipe, names.COST_REPORT)
            return
        reason = still_in_flight(ctx)
        if reason:
            yield skipped(context, pipe.key(names.COST_REPORT), reason)
            return
        report: steps.CostReport = run_step(lambda: steps.cost_report(ctx))
        yield from selected_results(
            context,
            pipe.key(names.COST_REPORT),
            [checks.cost_drift_check(report.drift)],
            {
                **asset_metadata.cost_metadata(pipe.spec, report, ctx.day),
                **asset_metadata.cancel_metadata(ctx.spec.name, ctx.day, ctx.job()),
            },
        )

    return cost_report


_BUILDERS: tuple[Callable[[Pipeline], dg.AssetsDefinition], ...] = (
    _input_snapshot,
    request_shards_asset,
    _provider_batches,
    _batch_results,
    validated_outputs_asset,
    _ReportingStep(
        names.PUBLISHED_OUTPUTS,
        steps.publish_outputs,
        asset_metadata.published_metadata,
        "The hand-off to consumers; skipped, with the reason, while the quality gate "
        "blocks the day.",
        frozenset({"parquet"}),
        _publication_blocked,
    ),
    _ReportingStep(
        names.QA_SAMPLE,
        steps.qa_sample,
        asset_metadata.sample_metadata,
        "Validated rows drawn with a fixed seed per partition, for spot checks.",
        frozenset({"jsonl"}),
        _publication_blocked,
    ),
    _ReportingStep(
        names.DEAD_LETTER,
        steps.export_dead_letters,
        asset_metadata.dead_letter_metadata,
        "Every item that will not succeed, with its class and reason; written once every "
        "item of the day is terminal.",
        frozenset({"jsonl"}),
        still_in_flight,
        after=(names.REQUEST_SHARDS, names.BATCH_RESULTS, names.VALIDATED_OUTPUTS),
    ),
    _cost_report,
)


def build_pipeline_assets(spec: PipelineSpec, settings: Settings) -> list[dg.AssetsDefinition]:
    """The nine step assets of one spec (names.ASSETS, in graph order): snapshot, shards,
    submission, import, validation, then publishing, QA sample, dead letters and cost."""
    pipe = Pipeline(spec=spec, source_uri=settings.resolve_source_uri(spec.source.uri))
    return [build(pipe) for build in _BUILDERS]
