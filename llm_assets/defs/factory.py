"""The asset factory: one Dagster group of daily-partitioned assets per pipeline spec.

Each asset is built by a function of its own below; its body calls one step (steps/) with
the partition's StepContext and reports a MaterializeResult with row counts, a preview and
the lineage every materialization carries.
"""

import dataclasses
import datetime as dt
import functools
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

import dagster as dg

from llm_assets import names, steps
from llm_assets.defs import checks
from llm_assets.defs import metadata as asset_metadata
from llm_assets.resources.ledger import DayBusy, LostLock, ShardMismatch
from llm_assets.resources.providers import provider_resource_key
from llm_assets.resources.providers.base import AmbiguousSubmission
from llm_assets.spec.model import PipelineSpec
from llm_assets.steps import stuck
from llm_assets.util.settings import Settings

_R = TypeVar("_R")
_OWNER = re.compile(r"^(team:[A-Za-z0-9_-]+|[^@\s]+@[^@\s]+\.[^@\s]+)$")


class BudgetApproval(dg.Config):
    """Run config of request_shards: approve a day whose upper bound is over its budget."""

    approve_budget: bool = False


def started_by(context: dg.AssetExecutionContext | dg.OpExecutionContext) -> str:
    """Who started the run, for the ledger: its created_by tag, else the run itself."""
    return context.run.tags.get(names.CREATED_BY_TAG) or f"dagster run {context.run_id}"


def approval_of(context: dg.AssetExecutionContext, config: BudgetApproval) -> tuple[bool, str]:
    """Approved by the run config or the run tag, and by whom (for the ledger)."""
    tagged = context.run.tags.get(names.APPROVE_BUDGET_TAG, "").lower() in ("1", "true", "yes")
    return config.approve_budget or tagged, started_by(context)


def asset_key(spec: PipelineSpec, step: str) -> dg.AssetKey:
    return dg.AssetKey(names.asset_path(spec.name, step))


def partitions_for(spec: PipelineSpec) -> dg.DailyPartitionsDefinition:
    return dg.DailyPartitionsDefinition(
        start_date=spec.partitions.start_date.isoformat(),
        timezone=spec.partitions.timezone,
        end_offset=spec.partitions.end_offset,
    )


def _run_step(fn: Callable[[], Any]) -> Any:
    """Turn our own errors into Dagster failures that explain themselves in the UI."""
    try:
        return fn()
    except steps.GateBlocked as exc:
        raise dg.Failure(
            description=str(exc),
            metadata={"gate": exc.gate, "reason": exc.reason},
            allow_retries=False,
        ) from exc
    except AmbiguousSubmission as exc:
        raise dg.Failure(
            description=f"stopped to avoid paying twice: {exc}", allow_retries=False
        ) from exc
    except steps.MissingPrerequisite as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from exc
    except steps.OnlineInterrupted as exc:
        raise dg.Failure(description=str(exc), metadata={"interrupted": True}) from exc
    except DayBusy as exc:
        # Nothing was changed: a retry of the run (or the next sensor tick) does the work.
        raise dg.Failure(description=str(exc), metadata={"day_busy": True}) from exc
    except LostLock as exc:
        # Another run took the day over and carries it on; this one wrote nothing since.
        raise dg.Failure(
            description=str(exc), metadata={"day_busy": True}, allow_retries=False
        ) from exc
    except ShardMismatch as exc:
        raise dg.Failure(
            description=f"stopped to keep the ledger exact: {exc}", allow_retries=False
        ) from exc


def _empty_day(context: dg.AssetExecutionContext, ctx: steps.StepContext) -> bool:
    """Whether the day has no source rows (its snapshot is empty), logged.

    Every step after the snapshot then materializes the day as empty (`_empty_results`), so
    a run or a backfill over empty days succeeds, every asset shows the day as run, and no
    check is left skipped.
    """
    if not steps.no_source_rows(ctx.spec, ctx.day, ctx.storage):
        return False
    context.log.info(
        f"{steps.no_source_rows_reason(ctx.day)}: {context.asset_key.to_user_string()} has "
        "nothing to do"
    )
    return True


def _empty_results(
    context: dg.AssetExecutionContext, pipe: "_Pipeline", step: str
) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult]:
    """An empty day's outcome of a step: its materialization (metadata `no_source_rows` and
    the day's state `empty`) and each of its selected checks passed with nothing to check."""
    reason = steps.no_source_rows_reason(dt.date.fromisoformat(context.partition_key))
    key = pipe.key(step)
    evaluated = [
        dg.AssetCheckResult(
            asset_key=key,
            check_name=check.name,
            passed=True,
            description=f"{reason}: nothing to check",
            metadata={"no_source_rows": reason},
        )
        for check in sorted(context.selected_asset_check_keys, key=lambda c: c.name)
        if check.asset_key == key
    ]
    metadata = asset_metadata.empty_day_metadata(pipe.spec, reason)
    yield from _selected_results(context, key, evaluated, metadata)


@dataclasses.dataclass(frozen=True)
class _Pipeline:
    """What every asset of one spec shares: its keys, resources and definition
    arguments (partitions, group, tags, owners)."""

    spec: PipelineSpec
    source_uri: str

    @property
    def provider_key(self) -> str:
        return provider_resource_key(self.spec.model.provider)

    @property
    def with_provider(self) -> set[str]:
        """The resource keys of the assets that talk to the provider."""
        return {"ledger", "storage", self.provider_key}

    @functools.cached_property
    def common(self) -> dict[str, Any]:
        spec = self.spec
        return {
            "partitions_def": partitions_for(spec),
            "group_name": spec.name,
            "tags": spec.tags,
            "owners": [spec.owner] if _OWNER.match(spec.owner or "") else None,
        }

    def key(self, step: str) -> dg.AssetKey:
        return asset_key(self.spec, step)

    def partitioned(self, specs: Sequence[dg.AssetCheckSpec]) -> list[dg.AssetCheckSpec]:
        """The checks with the pipeline's daily partitions, so that each result belongs to
        its day (the UI's Partition column, per-day check history)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dg.PreviewWarning)
            return [
                dg.AssetCheckSpec(
                    check.name,
                    asset=check.asset_key,
                    description=check.description,
                    blocking=check.blocking,
                    partitions_def=self.common["partitions_def"],
                )
                for check in specs
            ]

    def asset(
        self, step: str, *, after: Sequence[str] = (), provider: bool = False, **kwargs: Any
    ) -> Callable[[Callable[..., Any]], dg.AssetsDefinition]:
        """`dg.asset` for `step`, downstream of the steps `after`, with the resources its
        step context needs (the provider only where `provider`) and the spec's partitions,
        group, tags and owners."""
        return dg.asset(
            key=self.key(step),
            deps=[self.key(name) for name in after] or None,
            required_resource_keys=self.with_provider if provider else {"ledger", "storage"},
            **self.common,
            **kwargs,
        )

    def skippable(
        self,
        step: str,
        *,
        after: Sequence[str],
        description: str,
        kinds: set[str],
        check_specs: Sequence[dg.AssetCheckSpec],
    ) -> Callable[[Callable[..., Any]], dg.AssetsDefinition]:
        """A step that may skip its day, checks included: a one-asset `dg.multi_asset` whose
        asset is skippable and subsettable, so that its checks are optional outputs too."""
        return dg.multi_asset(
            specs=[
                dg.AssetSpec(
                    self.key(step),
                    deps=[self.key(name) for name in after],
                    description=description,
                    kinds=kinds,
                    skippable=True,
                    **{k: v for k, v in self.common.items() if k != "partitions_def"},
                )
            ],
            name=names.asset_op(self.spec.name, step),
            partitions_def=self.common["partitions_def"],
            required_resource_keys={"ledger", "storage"},
            check_specs=self.partitioned(check_specs),
            can_subset=True,
        )

    def context(
        self, context: dg.AssetExecutionContext, *, provider: bool = False, created_by: str = ""
    ) -> steps.StepContext:
        """The step context of the asset's partition, from the run's resources."""
        return steps.StepContext(
            spec=self.spec,
            day=dt.date.fromisoformat(context.partition_key),
            ledger=context.resources.ledger,
            storage=context.resources.storage,
            provider=getattr(context.resources, self.provider_key) if provider else None,
            created_by=created_by or "dagster",
            run_id=context.run_id,
            log=context.log.info,
        )


def _input_snapshot(pipe: _Pipeline) -> dg.AssetsDefinition:
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
        result = _run_step(lambda: steps.take_snapshot(ctx, pipe.source_uri))
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


def _request_shards(pipe: _Pipeline) -> dg.AssetsDefinition:
    @pipe.asset(
        names.REQUEST_SHARDS,
        after=[names.INPUT_SNAPSHOT],
        provider=True,
        description="JSONL request shards with stable custom_ids, a token and cost estimate and "
        "the budget gate; bad input is dead-lettered here. A day with no source rows gets no "
        "job: this and every later step materialize it as empty.",
        kinds={"jsonl", pipe.spec.model.provider},
        code_version=pipe.spec.prompt_code_version,
        check_specs=pipe.partitioned(
            [
                checks.budget_check_spec(pipe.key(names.REQUEST_SHARDS)),
                checks.compliance_check_spec(pipe.key(names.REQUEST_SHARDS)),
            ]
        ),
        output_required=False,
    )
    def request_shards(
        context: dg.AssetExecutionContext, config: BudgetApproval
    ) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult]:
        created_by = context.run.tags.get(names.CREATED_BY_TAG, "dagster")
        ctx = pipe.context(context, provider=True, created_by=created_by)
        if _empty_day(context, ctx):
            yield from _empty_results(context, pipe, names.REQUEST_SHARDS)
            return
        approve, who = approval_of(context, config)
        result: steps.ShardsResult = _run_step(lambda: steps.build_shards(ctx))
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
        yield dg.MaterializeResult(
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

    return request_shards


def _provider_batches(pipe: _Pipeline) -> dg.AssetsDefinition:
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
        if _empty_day(context, ctx):
            yield from _empty_results(context, pipe, names.PROVIDER_BATCHES)
            return
        approve, who = approval_of(context, config)
        try:
            result: steps.SubmitResult = _run_step(
                lambda: steps.submit_shards(
                    ctx, approve_budget=approve, approved_by=who, progress=context.log.info
                )
            )
        except steps.PipelinePaused as paused:
            # An operator's choice, not an error: the day is not submitted (nor are the later
            # steps of this run); what is in flight is still imported by the sensor.
            yield _skipped(context, pipe.key(names.PROVIDER_BATCHES), str(paused))
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


def _batch_results(pipe: _Pipeline) -> dg.AssetsDefinition:
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
        if _empty_day(context, ctx):
            yield from _empty_results(context, pipe, names.BATCH_RESULTS)
            return
        result: steps.ImportResult = _run_step(lambda: steps.import_results(ctx))
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


def _validated_outputs(pipe: _Pipeline) -> dg.AssetsDefinition:
    """While the day has open items it materializes nothing, so its checks and the steps
    after it in the same run are skipped, not failed; the batch-status sensor validates the
    day once every item is terminal."""

    @pipe.skippable(
        names.VALIDATED_OUTPUTS,
        after=[names.BATCH_RESULTS],
        description="Results that pass the pydantic and pandera gate, as Parquet with "
        "lineage; skipped while items are still in flight.",
        kinds={"parquet", "pandera"},
        check_specs=checks.validated_outputs_check_specs(
            pipe.spec, pipe.key(names.VALIDATED_OUTPUTS)
        ),
    )
    def validated_outputs(
        context: dg.AssetExecutionContext,
    ) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult | dg.AssetObservation]:
        ctx = pipe.context(context)
        if _empty_day(context, ctx):
            yield from _empty_results(context, pipe, names.VALIDATED_OUTPUTS)
            return
        reason = _still_in_flight(ctx)
        if reason:
            yield _skipped(context, pipe.key(names.VALIDATED_OUTPUTS), reason)
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

        result, evaluated = _run_step(validate)
        yield from _selected_results(
            context,
            pipe.key(names.VALIDATED_OUTPUTS),
            evaluated,
            asset_metadata.validated_metadata(ctx, result),
        )

    return validated_outputs


def _selected_results(
    context: dg.AssetExecutionContext,
    key: dg.AssetKey,
    evaluated: Sequence[dg.AssetCheckResult],
    metadata: dict[str, Any],
) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult]:
    """A skippable step's materialization with the check results the run selected; only the
    checks when only they were selected (the UI's "Execute checks")."""
    selected = context.selected_asset_check_keys
    check_results = [
        c
        for c in evaluated
        if c.check_name is not None and dg.AssetCheckKey(key, c.check_name) in selected
    ]
    if key not in context.selected_asset_keys:
        yield from check_results
        return
    yield dg.MaterializeResult(check_results=check_results, metadata=metadata)


def in_flight_reason(open_items: int) -> str:
    """Why validated_outputs and the steps after it are skipped for a day."""
    return f"{open_items} items still in flight; the batch-status sensor finishes this day"


def _still_in_flight(ctx: steps.StepContext) -> str | None:
    """Why a day's report waits: items still open (the batch-status sensor finishes it)."""
    still_open = _run_step(lambda: ctx.ledger.counts(ctx.job().job_id).open)
    return in_flight_reason(still_open) if still_open else None


def _publication_blocked(ctx: steps.StepContext) -> str | None:
    """Why a day is not published: the gate checks its latest validation failed."""
    return _run_step(lambda: steps.settled_block(ctx))


SKIPPED = "skipped"
"""Observation metadata of a step that did not materialize its day: why."""


def _skipped(
    context: dg.AssetExecutionContext, key: dg.AssetKey, reason: str
) -> dg.AssetObservation:
    """A step that does not materialize its day says why, in the log and on its page."""
    context.log.info(f"{key.to_user_string()} skipped: {reason}")
    return dg.AssetObservation(
        asset_key=key, partition=context.partition_key, metadata={SKIPPED: reason}
    )


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

    def __call__(self, pipe: _Pipeline) -> dg.AssetsDefinition:
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
            if _empty_day(context, ctx):
                yield from _empty_results(context, pipe, self.step)
                return
            reason = self.skip(ctx)
            if reason:
                yield _skipped(context, pipe.key(self.step), reason)
                return
            result = _run_step(lambda: self.run(ctx))
            yield dg.MaterializeResult(metadata=self.report(ctx, result))

        return reporting_step


def _cost_report(pipe: _Pipeline) -> dg.AssetsDefinition:
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
        if _empty_day(context, ctx):
            yield from _empty_results(context, pipe, names.COST_REPORT)
            return
        reason = _still_in_flight(ctx)
        if reason:
            yield _skipped(context, pipe.key(names.COST_REPORT), reason)
            return
        report: steps.CostReport = _run_step(lambda: steps.cost_report(ctx))
        yield from _selected_results(
            context,
            pipe.key(names.COST_REPORT),
            [checks.cost_drift_check(report.drift)],
            {
                **asset_metadata.cost_metadata(pipe.spec, report, ctx.day),
                **asset_metadata.cancel_metadata(ctx.spec.name, ctx.day, ctx.job()),
            },
        )

    return cost_report


_BUILDERS: tuple[Callable[[_Pipeline], dg.AssetsDefinition], ...] = (
    _input_snapshot,
    _request_shards,
    _provider_batches,
    _batch_results,
    _validated_outputs,
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
        _still_in_flight,
        after=(names.REQUEST_SHARDS, names.BATCH_RESULTS, names.VALIDATED_OUTPUTS),
    ),
    _cost_report,
)


def build_pipeline_assets(spec: PipelineSpec, settings: Settings) -> list[dg.AssetsDefinition]:
    """The nine step assets of one spec (names.ASSETS, in graph order): snapshot, shards,
    submission, import, validation, then publishing, QA sample, dead letters and cost."""
    pipe = _Pipeline(spec=spec, source_uri=settings.resolve_source_uri(spec.source.uri))
    return [build(pipe) for build in _BUILDERS]
