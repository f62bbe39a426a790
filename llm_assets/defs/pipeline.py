"""What every step asset of a pipeline shares: its keys, partitions, resources and
definition arguments (`Pipeline`), how a step's errors become Dagster failures (`run_step`),
and the outcome of a day with no source rows or a step that skips it."""

import dataclasses
import datetime as dt
import functools
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import dagster as dg

from llm_assets import names, steps
from llm_assets.defs import metadata as asset_metadata
from llm_assets.resources.ledger import DayBusy, LostLock, ShardMismatch
from llm_assets.resources.providers import provider_resource_key
from llm_assets.resources.providers.base import AmbiguousSubmission
from llm_assets.spec.model import PipelineSpec

_OWNER = re.compile(r"^(team:[A-Za-z0-9_-]+|[^@\s]+@[^@\s]+\.[^@\s]+)$")


class BudgetApproval(dg.Config):
    """Run config of request_shards: approve a day whose upper bound is over its budget."""

    approve_budget: bool = False


def started_by(context: dg.AssetExecutionContext | dg.OpExecutionContext) -> str:
    """Who started the run, for the ledger: its created_by tag, else the run itself."""
    return context.run.tags.get(names.CREATED_BY_TAG) or f"dagster run {context.run_id}"


def approval_of(
    context: dg.AssetExecutionContext | dg.OpExecutionContext, config: BudgetApproval
) -> tuple[bool, str]:
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


def run_step(fn: Callable[[], Any]) -> Any:
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


def empty_day(context: dg.AssetExecutionContext, ctx: steps.StepContext) -> bool:
    """Whether the day has no source rows (its snapshot is empty), logged.

    Every step after the snapshot then materializes the day as empty (`empty_results`), so
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


def empty_results(
    context: dg.AssetExecutionContext | dg.OpExecutionContext, pipe: "Pipeline", step: str
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
    yield from selected_results(context, key, evaluated, metadata)


@dataclasses.dataclass(frozen=True)
class Pipeline:
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

    def join_outs(self, step: str, check_specs: Sequence[dg.AssetCheckSpec]) -> dict[str, dg.Out]:
        """The outputs of a sliced step's join op: the asset's and one per check, each
        optional (an empty or skipped day yields what it yields)."""
        key = self.key(step)
        named = [step, *(f"{key.to_python_identifier()}_{c.name}" for c in check_specs)]
        return {name: dg.Out(dg.Nothing, is_required=False) for name in named}

    def sliced(
        self,
        step: str,
        *,
        after: str,
        slice_ops: Sequence[dg.OpDefinition],
        join: dg.OpDefinition,
        check_specs: Sequence[dg.AssetCheckSpec],
        description: str,
        kinds: set[str],
        code_version: str | None = None,
    ) -> dg.AssetsDefinition:
        """`step` as a graph-backed asset (sharding.slices above 1): its slice ops at once
        after the day's `after` asset, then `join`, whose outputs (`join_outs`) are the
        asset's materialization and its checks."""
        common = self.common
        out = dg.AssetOut(
            key=self.key(step),
            description=description,
            is_required=False,
            code_version=code_version,
            group_name=common["group_name"],
            tags=common["tags"],
            owners=common["owners"],
            kinds=kinds,
        )
        outputs = list(self.join_outs(step, check_specs))

        @dg.graph_multi_asset(
            name=names.asset_op(self.spec.name, step),
            ins={"after": dg.AssetIn(key=self.key(after), dagster_type=dg.Nothing)},
            outs={step: out},
            check_specs=check_specs,
            partitions_def=common["partitions_def"],
        )
        def sliced_step(after: None) -> dict[str, object]:
            joined = join([one(after) for one in slice_ops])
            return dict(zip(outputs, joined, strict=True))

        return sliced_step

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
        self,
        context: dg.AssetExecutionContext | dg.OpExecutionContext,
        *,
        provider: bool = False,
        created_by: str = "",
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


def selected_results(
    context: dg.AssetExecutionContext | dg.OpExecutionContext,
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
    yield dg.MaterializeResult(asset_key=key, check_results=check_results, metadata=metadata)


SKIPPED = "skipped"
"""Observation metadata of a step that did not materialize its day: why."""


def skipped(
    context: dg.AssetExecutionContext | dg.OpExecutionContext, key: dg.AssetKey, reason: str
) -> dg.AssetObservation:
    """A step that does not materialize its day says why, in the log and on its page."""
    context.log.info(f"{key.to_user_string()} skipped: {reason}")
    return dg.AssetObservation(
        asset_key=key, partition=context.partition_key, metadata={SKIPPED: reason}
    )


def in_flight_reason(open_items: int) -> str:
    """Why validated_outputs and the steps after it are skipped for a day."""
    return f"{open_items} items still in flight; the batch-status sensor finishes this day"


def still_in_flight(ctx: steps.StepContext) -> str | None:
    """Why a day's report waits: items still open (the batch-status sensor finishes it)."""
    still_open = run_step(lambda: ctx.ledger.counts(ctx.job().job_id).open)
    return in_flight_reason(still_open) if still_open else None
