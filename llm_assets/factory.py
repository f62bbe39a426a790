"""The asset factory: one Dagster group of daily-partitioned assets per pipeline spec.

Each asset is built by a function of its own below; its body calls one step (steps/) with
the partition's StepContext and reports a MaterializeResult with row counts, a preview and
the lineage every materialization carries.
"""

import dataclasses
import datetime as dt
import functools
import re
from collections.abc import Callable
from typing import Any

import dagster as dg

from llm_assets import checks, steps
from llm_assets.resources.providers import provider_resource_key
from llm_assets.resources.providers.base import AmbiguousSubmission
from llm_assets.settings import Settings
from llm_assets.spec import PipelineSpec

STEPS = (
    "input_snapshot",
    "request_shards",
    "provider_batches",
    "batch_results",
    "validated_outputs",
    "published_outputs",
    "qa_sample",
    "dead_letter",
    "cost_report",
)
APPROVE_BUDGET_TAG = "llm_assets/approve_budget"
CREATED_BY_TAG = "llm_assets/created_by"
_OWNER = re.compile(r"^(team:[A-Za-z0-9_-]+|[^@\s]+@[^@\s]+\.[^@\s]+)$")


class BudgetApproval(dg.Config):
    """Run config of request_shards: approve a day whose upper bound is over its budget."""

    approve_budget: bool = False


def approval_of(context: dg.AssetExecutionContext, config: BudgetApproval) -> tuple[bool, str]:
    """Approved by the run config or the run tag, and by whom (for the ledger)."""
    tagged = context.run.tags.get(APPROVE_BUDGET_TAG, "").lower() in ("1", "true", "yes")
    who = context.run.tags.get(CREATED_BY_TAG) or f"dagster run {context.run_id}"
    return config.approve_budget or tagged, who


def asset_key(spec: PipelineSpec, step: str) -> dg.AssetKey:
    return dg.AssetKey([spec.name, step])


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


@dataclasses.dataclass(frozen=True)
class _Pipeline:
    """What every asset of one spec shares: its keys, resources, lineage and definition
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
    def lineage(self) -> dict[str, Any]:
        spec = self.spec
        return {
            "pipeline": spec.name,
            "prompt_version": spec.prompt.version,
            "model": spec.model.name,
            "provider": spec.model.provider,
        }

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
        )


def _input_snapshot(pipe: _Pipeline) -> dg.AssetsDefinition:
    @dg.asset(
        key=pipe.key("input_snapshot"),
        description=f"Immutable, content-hashed snapshot of {pipe.spec.name}'s source rows "
        "for the day.",
        kinds={"jsonl"},
        required_resource_keys={"ledger", "storage"},
        **pipe.common,
    )
    def input_snapshot(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        ctx = pipe.context(context)
        result = _run_step(lambda: steps.take_snapshot(ctx, pipe.source_uri))
        return dg.MaterializeResult(
            metadata={
                **pipe.lineage,
                "dagster/row_count": result.rows,
                "uri": dg.MetadataValue.path(result.uri),
                "content_sha256": result.sha256,
                "unreadable_rows": result.unreadable_rows,
                "source_files": result.files,
                "reused_existing_snapshot": result.reused,
            },
            data_version=dg.DataVersion(result.sha256[:20]),
        )

    return input_snapshot


def _shards_metadata(
    pipe: _Pipeline, result: steps.ShardsResult, gate: steps.BudgetGate
) -> dict[str, Any]:
    estimate = result.estimate
    return {
        **pipe.lineage,
        "job_id": result.job_id,
        "code_version": pipe.spec.prompt_code_version,
        "snapshot_rows": result.snapshot_rows,
        "new_items": result.new_items,
        "already_in_ledger": result.already_known,
        "input_dead_letters": sum(result.input_dead_letters.values()),
        "input_dead_letters_by_reason": result.input_dead_letters,
        "shards_created": len(result.shards_created),
        "shard_uris": result.shard_uris[:20],
        "estimated_input_tokens": estimate.input_tokens,
        "input_tokens_exact": estimate.input_tokens_exact,
        "token_counter": estimate.token_counter,
        "expected_output_tokens_per_item": estimate.expected_output_tokens_per_item,
        "output_estimate_basis": estimate.output_basis,
        "estimated_cost_usd": estimate.cost_usd,
        "estimated_cost_upper_bound_usd": estimate.cost_upper_usd,
        "day_upper_bound_usd": gate.committed_usd,
    }


def _request_shards(pipe: _Pipeline) -> dg.AssetsDefinition:
    @dg.asset(
        key=pipe.key("request_shards"),
        deps=[pipe.key("input_snapshot")],
        description="JSONL request shards with stable custom_ids, a token and cost estimate and "
        "the budget gate; bad input is dead-lettered here.",
        kinds={"jsonl", pipe.spec.model.provider},
        code_version=pipe.spec.prompt_code_version,
        required_resource_keys=pipe.with_provider,
        check_specs=[checks.budget_check_spec(pipe.key("request_shards"))],
        **pipe.common,
    )
    def request_shards(
        context: dg.AssetExecutionContext, config: BudgetApproval
    ) -> dg.MaterializeResult:
        created_by = context.run.tags.get(CREATED_BY_TAG, "dagster")
        ctx = pipe.context(context, provider=True, created_by=created_by)
        approve, who = approval_of(context, config)
        result: steps.ShardsResult = _run_step(lambda: steps.build_shards(ctx))
        gate = steps.budget_gate(ctx, approve=approve, approved_by=who)
        estimate = result.estimate
        context.log.info(
            f"{result.job_id}: {result.new_items} new items, {len(result.shards_created)} "
            f"shards, {sum(result.input_dead_letters.values())} input dead letters; estimate "
            f"${estimate.cost_usd:.4f}, upper bound ${estimate.cost_upper_usd:.4f}; budget: "
            f"{gate.reason}"
        )
        return dg.MaterializeResult(
            check_results=[checks.budget_check(gate)],
            metadata=_shards_metadata(pipe, result, gate),
        )

    return request_shards


def _provider_batches(pipe: _Pipeline) -> dg.AssetsDefinition:
    @dg.asset(
        key=pipe.key("provider_batches"),
        deps=[pipe.key("request_shards")],
        description="Submits shards to the provider (never twice, never over budget); returns "
        "without waiting.",
        kinds={pipe.spec.model.provider},
        required_resource_keys=pipe.with_provider,
        pool=f"llm_provider_{pipe.spec.model.provider}",
        **pipe.common,
    )
    def provider_batches(
        context: dg.AssetExecutionContext, config: BudgetApproval
    ) -> dg.MaterializeResult:
        ctx = pipe.context(context, provider=True)
        approve, who = approval_of(context, config)
        result: steps.SubmitResult = _run_step(
            lambda: steps.submit_shards(
                ctx, approve_budget=approve, approved_by=who, progress=context.log.info
            )
        )
        return dg.MaterializeResult(
            metadata={
                **pipe.lineage,
                "job_id": result.job_id,
                "submitted_shards": len(result.submitted),
                "provider_batch_ids": list(result.submitted.values())[:20],
                "in_flight_shards": result.in_flight,
                "retry_shards_waiting_for_backoff": result.waiting_for_backoff,
                "next_submission_at": result.next_submission_at.isoformat()
                if result.next_submission_at
                else "",
                "day_upper_bound_usd": result.committed_cost_usd,
            }
        )

    return provider_batches


def _import_metadata(pipe: _Pipeline, result: steps.ImportResult) -> dict[str, Any]:
    counts = result.counts
    return {
        **pipe.lineage,
        "job_id": result.job_id,
        "imported_shards": len(result.imported_shards),
        "in_flight_shards": result.in_flight_shards,
        "result_lines": result.lines.received,
        "applied": result.lines.applied,
        "duplicate_lines": result.lines.duplicates,
        "unknown_custom_ids": result.lines.unknown,
        "already_terminal": result.lines.already_terminal,
        "missing_results": result.missing,
        "retry_shards_planned": len(result.retry_shards),
        "gave_up": result.gave_up,
        "dagster/row_count": counts.total,
        "succeeded": counts.succeeded,
        "dead_letters": counts.dead_letters,
        "open_items": counts.open,
        "input_tokens": counts.input_tokens,
        "output_tokens": counts.output_tokens,
        "cost_usd": counts.cost_usd,
    }


def _batch_results(pipe: _Pipeline) -> dg.AssetsDefinition:
    @dg.asset(
        key=pipe.key("batch_results"),
        deps=[pipe.key("provider_batches")],
        description="Imports ended batches by custom_id and plans retries of what is still open.",
        kinds={pipe.spec.model.provider},
        required_resource_keys=pipe.with_provider,
        check_specs=checks.batch_results_check_specs(pipe.key("batch_results")),
        **pipe.common,
    )
    def batch_results(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        ctx = pipe.context(context, provider=True)
        result: steps.ImportResult = _run_step(lambda: steps.import_results(ctx))
        counts = result.counts
        missing = ctx.ledger.missing_results(result.job_id) if counts.open == 0 else []
        return dg.MaterializeResult(
            check_results=[
                checks.missing_results_check(missing, counts),
                checks.duplicate_results_check(result.lines.duplicates, result.lines.duplicate_ids),
            ],
            metadata=_import_metadata(pipe, result),
        )

    return batch_results


def _validated_outputs(pipe: _Pipeline) -> dg.AssetsDefinition:
    @dg.asset(
        key=pipe.key("validated_outputs"),
        deps=[pipe.key("batch_results")],
        description="Results that pass the pydantic and pandera gate, as Parquet with lineage.",
        kinds={"parquet", "pandera"},
        required_resource_keys={"ledger", "storage"},
        check_specs=checks.validated_outputs_check_specs(pipe.spec, pipe.key("validated_outputs")),
        **pipe.common,
    )
    def validated_outputs(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        ctx = pipe.context(context)
        result: steps.ValidateResult = _run_step(lambda: steps.validate_outputs(ctx))
        schema_failures = steps.published_frame_failures(ctx, result.uri)
        return dg.MaterializeResult(
            check_results=checks.validated_outputs_checks(pipe.spec, result, schema_failures),
            metadata={
                **pipe.lineage,
                "job_id": result.job_id,
                "dagster/row_count": result.valid_rows,
                "uri": dg.MetadataValue.path(result.uri),
                "quality_dead_letters": sum(result.quality_failures.values()),
                "quality_dead_letters_total": result.quality_dead_letters,
                "quality_failure_rate": result.failure_rate,
                "quality_failures_by_rule": result.quality_failures,
                "open_items": result.open_items,
                "label_distribution": result.label_distribution,
                "preview": dg.MetadataValue.md(checks.case_table(result.preview)),
            },
        )

    return validated_outputs


def _published_outputs(pipe: _Pipeline) -> dg.AssetsDefinition:
    @dg.asset(
        key=pipe.key("published_outputs"),
        deps=[pipe.key("validated_outputs")],
        description="The hand-off to consumers; never materialized past a failed blocking check.",
        kinds={"parquet"},
        required_resource_keys={"ledger", "storage"},
        **pipe.common,
    )
    def published_outputs(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        ctx = pipe.context(context)
        result: steps.PublishResult = _run_step(lambda: steps.publish_outputs(ctx))
        return dg.MaterializeResult(
            metadata={
                **pipe.lineage,
                "dagster/row_count": result.rows,
                "uri": dg.MetadataValue.path(result.uri),
                "content_sha256": result.sha256,
            }
        )

    return published_outputs


def _qa_sample(pipe: _Pipeline) -> dg.AssetsDefinition:
    @dg.asset(
        key=pipe.key("qa_sample"),
        deps=[pipe.key("validated_outputs")],
        description="Validated rows drawn with a fixed seed per partition, for spot checks.",
        kinds={"jsonl"},
        required_resource_keys={"ledger", "storage"},
        **pipe.common,
    )
    def qa_sample(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        ctx = pipe.context(context)
        result: steps.SampleResult = _run_step(lambda: steps.qa_sample(ctx))
        return dg.MaterializeResult(
            metadata={
                **pipe.lineage,
                "dagster/row_count": result.rows,
                "uri": dg.MetadataValue.path(result.uri),
                "preview": dg.MetadataValue.md(checks.case_table(result.preview, limit=20)),
            }
        )

    return qa_sample


def _dead_letter(pipe: _Pipeline) -> dg.AssetsDefinition:
    @dg.asset(
        key=pipe.key("dead_letter"),
        deps=[pipe.key("request_shards"), pipe.key("batch_results"), pipe.key("validated_outputs")],
        description="Every item that will not succeed, with its class and reason.",
        kinds={"jsonl"},
        required_resource_keys={"ledger", "storage"},
        **pipe.common,
    )
    def dead_letter(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        ctx = pipe.context(context)
        result: steps.DeadLetterResult = _run_step(lambda: steps.export_dead_letters(ctx))
        return dg.MaterializeResult(
            metadata={
                **pipe.lineage,
                "job_id": result.job_id,
                "dagster/row_count": result.rows,
                "uri": dg.MetadataValue.path(result.uri),
                "by_class": result.by_class,
                "preview": dg.MetadataValue.md(checks.case_table(result.preview, limit=20)),
            }
        )

    return dead_letter


def _cost_metadata(pipe: _Pipeline, report: steps.CostReport, day: dt.date) -> dict[str, Any]:
    month = report.pipeline_months[-1] if report.pipeline_months else {}
    errors = (
        ("cost_estimate_error", report.cost_estimate_error),
        ("input_token_estimate_error", report.input_token_estimate_error),
    )
    return {
        **pipe.lineage,
        "job_id": report.job_id,
        "uri": dg.MetadataValue.path(report.uri),
        "markdown_uri": dg.MetadataValue.path(report.markdown_uri),
        "items": report.items,
        "succeeded": report.succeeded,
        "dead_letters": report.dead_letters,
        "open_items": report.open_items,
        "input_tokens": report.input_tokens,
        "output_tokens": report.output_tokens,
        "input_tokens_per_item": report.input_tokens_per_item,
        "output_tokens_per_item": report.output_tokens_per_item,
        "cost_usd": report.cost_usd,
        "retry_cost_usd": report.retry_cost_usd,
        "cost_per_1k_items_usd": report.cost_per_1k_items_usd,
        "estimated_cost_usd": report.estimated_cost_usd,
        "estimated_cost_upper_bound_usd": report.estimated_cost_upper_usd,
        **{name: value for name, value in errors if value is not None},
        "pipeline_month_cost_usd": month.get("cost_usd", 0.0),
        "prices_as_of": report.prices_as_of,
        "report": dg.MetadataValue.md(report.markdown(pipe.spec, day)),
    }


def _cost_report(pipe: _Pipeline) -> dg.AssetsDefinition:
    @dg.asset(
        key=pipe.key("cost_report"),
        deps=[pipe.key("validated_outputs"), pipe.key("dead_letter")],
        description="Tokens and cost per item, shard, job and the pipeline's days and months, "
        "with the batch discount, retry overhead, estimate error and drift.",
        kinds={"json", "markdown"},
        required_resource_keys={"ledger", "storage"},
        check_specs=[checks.cost_drift_check_spec(pipe.key("cost_report"))],
        **pipe.common,
    )
    def cost_report(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        ctx = pipe.context(context)
        report: steps.CostReport = _run_step(lambda: steps.cost_report(ctx))
        return dg.MaterializeResult(
            check_results=[checks.cost_drift_check(report.drift)],
            metadata=_cost_metadata(pipe, report, ctx.day),
        )

    return cost_report


_BUILDERS: tuple[Callable[[_Pipeline], dg.AssetsDefinition], ...] = (
    _input_snapshot,
    _request_shards,
    _provider_batches,
    _batch_results,
    _validated_outputs,
    _published_outputs,
    _qa_sample,
    _dead_letter,
    _cost_report,
)


def build_pipeline_assets(spec: PipelineSpec, settings: Settings) -> list[dg.AssetsDefinition]:
    """The nine step assets of one spec (STEPS, in graph order): snapshot, shards,
    submission, import, validation, then publishing, QA sample, dead letters and cost."""
    pipe = _Pipeline(spec=spec, source_uri=settings.resolve_source_uri(spec.source.uri))
    return [build(pipe) for build in _BUILDERS]
