"""Evaluations in Dagster: the `<pipeline>__eval` job and the `eval_report` asset.

The job is launched from the UI's Launchpad with the run config of `llm-assets eval` (from,
to, sample, seed, variants). It draws the seeded sample from the days' input snapshots, runs
it through the baseline and each variant (see evaluation/replay.py), scores the answers
(evaluation/report.py) and records the report as a materialization of the pipeline's
`eval_report` asset. Nothing of an eval is published.

`eval_report` has one dynamic partition per eval (days, sample size, seed and the variants'
configurations: report_store.report_key), added by the job when the eval runs. An eval compares
variants over several days, and its recommendation only exists for the whole of it, so a
partition is one eval rather than a date or a variant. The partition key is the eval's id
everywhere (the report's `eval_id`, the job's output). Materializing a partition again (from
the asset's page) re-runs that eval's request: nothing is sent twice, answers still open are
waited for, and the report is scored again.

Only pipelines with something to evaluate get the asset and the job (`has_evals`): variants,
or a reference column to score the baseline alone against. Both carry the resources of the
providers the baseline and its variants use, and no others (`eval_resource_keys`).
"""

import contextlib
import datetime as dt
from collections.abc import Iterator, Mapping
from typing import Any

import dagster as dg
import pydantic
from rich.progress import Progress

from llm_assets import names, steps
from llm_assets.defs.factory import started_by
from llm_assets.defs.metadata import RATE_DIGITS, USD_DIGITS
from llm_assets.defs.run_failures import failure_of
from llm_assets.defs.runner import persistent_instance
from llm_assets.evaluation.replay import Replay, replay
from llm_assets.evaluation.report import EvalReport, VariantReport, build_report
from llm_assets.evaluation.report_markdown import render_markdown
from llm_assets.evaluation.report_store import EvalRequest, load_request, report_key, save_report
from llm_assets.evaluation.variants import BASELINE, UnknownVariant, resolve_variants
from llm_assets.resources import build_resources
from llm_assets.resources.providers import provider_resource_key
from llm_assets.spec.model import PipelineSpec
from llm_assets.util import progress
from llm_assets.util.settings import Settings
from llm_assets.util.words import class_words, duration_words


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


EVAL_PARTITION = "eval_report_partition"
"""The eval job's output: the partition of eval_report it recorded."""


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


def has_evals(spec: PipelineSpec) -> bool:
    """Whether an eval of the pipeline compares anything: variants to the baseline, or the
    baseline to a reference column. Pipelines without either get no eval_report asset, no
    evals group and no eval job."""
    return bool(spec.variants) or spec.eval.reference_field is not None


def eval_resource_keys(spec: PipelineSpec) -> set[str]:
    """The resources an eval of the pipeline uses: the ledger, the storage and the provider of
    the baseline and of each variant (a variant's model patch may name another provider)."""
    providers = {spec.model.provider}
    providers |= {v.model.provider or spec.model.provider for v in spec.variants.values()}
    return {"ledger", "storage", *(provider_resource_key(name) for name in providers)}


def eval_partitions(spec: PipelineSpec) -> dg.DynamicPartitionsDefinition:
    return dg.DynamicPartitionsDefinition(name=names.evals(spec.name))


def eval_report_key(spec: PipelineSpec) -> dg.AssetKey:
    return dg.AssetKey(names.asset_path(spec.name, names.EVAL_REPORT))


PLOTTED = ("score", "failure_rate", "cost_per_1k_items_usd")
"""The numbers of each variant the asset's Plots tab draws across evals, as `<metric>/<variant>`:
the UI draws one chart per key, sorted by name, so a metric's variants sit side by side."""
VARIANT_COLUMNS = dg.TableSchema(
    columns=[
        dg.TableColumn("variant"),
        dg.TableColumn("model", description="provider/model (prompt version)"),
        dg.TableColumn("score", "float"),
        dg.TableColumn("score_low", "float", description="95% interval"),
        dg.TableColumn("score_high", "float", description="95% interval"),
        dg.TableColumn("failure_rate", "float"),
        dg.TableColumn("cost_per_1k_items_usd", "float", description="as billed"),
        dg.TableColumn("realtime_cost_per_1k_items_usd", "float"),
        dg.TableColumn("seconds_to_last_result", "float"),
    ]
)


def _variant_numbers(v: VariantReport) -> dict[str, float | None]:
    """A variant's numbers as metadata shows them: scores and rates to four decimals, dollars
    to six, seconds to one."""

    def rounded(value: float | None, digits: int) -> float | None:
        return None if value is None else round(float(value), digits)

    interval = v.interval
    return {
        "score": rounded(v.score, RATE_DIGITS),
        "score_low": rounded(interval.low if interval else None, RATE_DIGITS),
        "score_high": rounded(interval.high if interval else None, RATE_DIGITS),
        "failure_rate": rounded(v.failure_rate, RATE_DIGITS),
        "cost_per_1k_items_usd": rounded(v.cost_per_1k_items_usd, USD_DIGITS),
        "realtime_cost_per_1k_items_usd": rounded(v.realtime_cost_per_1k_items_usd, USD_DIGITS),
        "seconds_to_last_result": rounded(v.seconds_to_last_result, 1),
    }


def report_metadata(report: EvalReport, uris: dict[str, str]) -> dict[str, Any]:
    """The report for the asset's page: the eval's id (its partition), the markdown, the
    recommendation, the variants side by side as one table, and per metric and variant the
    numbers the Plots tab draws across evals (PLOTTED)."""
    chosen = report.recommendation.chosen if report.recommendation else None
    numbers = {v.name: _variant_numbers(v) for v in report.variants}
    metadata: dict[str, Any] = {
        "eval_id": report.eval_id,
        "report": dg.MetadataValue.md(render_markdown(report)),
        "recommended": chosen.name if chosen else "none",
        "recommendation": (
            report.recommendation.reason if report.recommendation else "; ".join(report.notes)
        ),
        "days": f"{report.days[0]}..{report.days[-1]}",
        "sampled_items": report.sample_items,
        "scored": f"{report.scoring.field} against {report.scoring.against} "
        f"({report.scoring.metric})",
        "report_uri": dg.MetadataValue.path(uris["markdown"]),
        "eval_pipelines": dg.MetadataValue.json({v.name: v.pipeline for v in report.variants}),
        "variants": dg.MetadataValue.table(
            [
                dg.TableRecord(
                    {
                        "variant": v.name,
                        "model": f"{v.provider}/{v.model} ({v.prompt_version})",
                        **numbers[v.name],
                    }
                )
                for v in report.variants
            ],
            schema=VARIANT_COLUMNS,
        ),
    }
    for metric in PLOTTED:
        for name, values in numbers.items():
            value = values[metric]
            if value is not None:
                metadata[f"{metric}/{name}"] = dg.MetadataValue.float(value)
    return metadata


def _evaluate(
    context: dg.OpExecutionContext | dg.AssetExecutionContext,
    spec: PipelineSpec,
    request: EvalRequest,
    *,
    approve_budget: bool,
    wait: bool,
    poll_interval: float,
) -> tuple[Replay, EvalReport, str, dict[str, str]]:
    """Run the request's replay, score it and save the report under its key, the eval's id;
    Failure for what a retry cannot fix (an unknown variant, a gate)."""
    resources = {key: getattr(context.resources, key) for key in eval_resource_keys(spec)}
    try:
        variants = resolve_variants(spec, request.variants)
        result = replay(
            resources,
            spec,
            variants,
            request.days,
            size=request.sample,
            seed=request.seed,
            created_by=started_by(context),
            approve_budget=approve_budget,
            wait=wait,
            progress=progress.report,
            poll_interval=poll_interval,
        )
    except UnknownVariant as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from exc
    except steps.GateBlocked as exc:
        raise dg.Failure(
            description=str(exc), metadata={"gate": exc.gate}, allow_retries=False
        ) from exc
    except (steps.MissingPrerequisite, ValueError) as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from exc
    ledger, storage = resources["ledger"], resources["storage"]
    key = report_key(result)
    # One id for an eval: the report is named by its partition of eval_report, like its files
    # (the sample's own id, shared by evals of other variants, stays in its uri).
    report = build_report(spec, result, ledger, storage).model_copy(update={"eval_id": key})
    # Saved with the variants resolved: the spec may gain variants before it is run again.
    ran = request.model_copy(update={"variants": [n for n in variants if n != BASELINE]})
    return result, report, key, save_report(report, ran, key, storage)


def build_eval_report_asset(spec: PipelineSpec) -> dg.AssetsDefinition:
    """The pipeline's `eval_report`: one partition per eval (see the module docstring)."""

    @dg.asset(
        key=eval_report_key(spec),
        # A group of its own: the pipeline's group stays daily-partitioned throughout, so
        # "Materialize all" there launches the day's steps and not an eval.
        group_name=names.evals(spec.name),
        partitions_def=eval_partitions(spec),
        required_resource_keys=eval_resource_keys(spec),
        description=f"Evaluations of {spec.name}'s variants: each scored on the same sample "
        "of past items, costed, and the cheapest that meets the bar recommended. A partition "
        f"is one eval, added by the {names.eval_job(spec.name)} job.",
        tags=spec.tags,
    )
    def eval_report(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        key = context.partition_key
        request = load_request(spec.name, key, context.resources.storage)
        if request is None:
            raise dg.Failure(
                description=f"no eval {key!r} of {spec.name} was run; launch "
                f"{names.eval_job(spec.name)} to run one",
                allow_retries=False,
            )
        _, report, ran_as, uris = _evaluate(
            context, spec, request, approve_budget=False, wait=True, poll_interval=30.0
        )
        if ran_as != key:
            raise dg.Failure(
                description=f"a variant of eval {key} is configured differently now, so it "
                f"would be eval {ran_as}; launch {names.eval_job(spec.name)} to run that one",
                allow_retries=False,
            )
        return dg.MaterializeResult(metadata=report_metadata(report, uris))

    return eval_report


def build_eval_job(
    spec: PipelineSpec, resources: Mapping[str, Any] | None = None
) -> dg.JobDefinition:
    """The pipeline's eval job: one op driving the replay, with the resources of the providers
    its baseline and variants use. Given `resources` (the code location's), the job binds
    those it needs, so its Launchpad offers only their configuration."""
    keys = eval_resource_keys(spec)

    @dg.op(
        name=names.eval_op(spec.name),
        required_resource_keys=keys,
        description=f"Replay a seeded sample of {spec.name}'s days through its variants.",
        out={EVAL_PARTITION: dg.Out(str, description="The eval's partition of eval_report.")},
    )
    def eval_replay(context: dg.OpExecutionContext, config: EvalConfig) -> dg.Output[str]:
        try:
            days = eval_days(spec, config.from_, config.to)
        except ValueError as exc:
            raise dg.Failure(description=str(exc), allow_retries=False) from exc
        request = EvalRequest(
            days=days,
            sample=spec.eval.sample if config.sample is None else config.sample,
            seed=spec.eval.seed if config.seed is None else config.seed,
            variants=config.variants,
        )
        tagged = context.run.tags.get(names.APPROVE_BUDGET_TAG, "").lower() in ("1", "true", "yes")
        result, report, key, uris = _evaluate(
            context,
            spec,
            request,
            approve_budget=config.approve_budget or tagged,
            wait=config.wait,
            poll_interval=config.poll_interval,
        )
        # Recorded even for a pipeline without evals in the code location (an eval run from
        # the CLI): the run said what it did, and its report is found by this partition.
        context.instance.add_dynamic_partitions(eval_partitions(spec).name or "", [key])
        context.log_event(
            dg.AssetMaterialization(
                asset_key=eval_report_key(spec),
                partition=key,
                metadata=report_metadata(report, uris),
            )
        )
        open_items = sum(run.open_items for run in result.variants.values())
        return dg.Output(
            key,
            output_name=EVAL_PARTITION,
            metadata={
                "eval_id": key,
                "sample_uri": dg.MetadataValue.path(result.sample.uri),
                "sampled_items": result.sample.items,
                "open_items": open_items,
                "variants": dg.MetadataValue.md(variant_table(result)),
            },
        )

    @dg.job(
        name=names.eval_job(spec.name),
        description=f"Evaluate {spec.name}: a seeded sample of its days' input snapshots, the "
        "same items for the baseline and every variant named, each run through the normal "
        "steps as its own eval pipeline, scored and recorded as a partition of eval_report. "
        "Nothing is published. Run config: from, to, sample, seed, variants.",
        tags={names.OPERATOR_TAG: "eval"},
        resource_defs=None if resources is None else {key: resources[key] for key in keys},
    )
    def eval_job() -> None:
        eval_replay()

    return eval_job


def run_eval_job(
    settings: Settings,
    spec: PipelineSpec,
    config: dict[str, Any],
    *,
    created_by: str,
    approve_budget: bool = False,
    resources: dict[str, Any] | None = None,
    display: Progress | None = None,
) -> tuple[str, str]:
    """Run the eval job in process in the Dagster instance, as the CLI runs days, so the eval
    is in the UI as when the job is launched there; `config` is its run config. Returns the
    eval's partition of eval_report and the run id; StepFailed (its gate set when a gate
    blocked the eval) when the run fails. `display` shows the eval's progress."""
    tags = {names.CREATED_BY_TAG: created_by}
    if approve_budget:
        tags[names.APPROVE_BUDGET_TAG] = "true"
    with _showing(display, spec):
        result = _execute(settings, spec, config, tags, resources)
    if not result.success:
        raise failure_of(result)
    return result.output_for_node(names.eval_op(spec.name), EVAL_PARTITION), result.run_id


@contextlib.contextmanager
def _showing(display: Progress | None, spec: PipelineSpec) -> Iterator[None]:
    """The replay's progress (progress.report) on `display` while the block runs."""
    if display is None:
        yield
        return
    with display:
        task = display.add_task(f"{spec.name} eval", total=None)

        def show(stage: str, done: int, total: int) -> None:
            display.update(task, description=f"{spec.name} {stage}", completed=done, total=total)

        with progress.listening(show):
            yield


def _execute(
    settings: Settings,
    spec: PipelineSpec,
    config: dict[str, Any],
    tags: dict[str, str],
    resources: dict[str, Any] | None,
) -> dg.ExecuteInProcessResult:
    return build_eval_job(spec).execute_in_process(
        run_config={
            "ops": {names.eval_op(spec.name): {"config": config}},
            "loggers": {"console": {"config": {"log_level": "INFO"}}},
        },
        instance=persistent_instance(settings),
        resources=resources if resources is not None else build_resources(settings),
        tags=tags,
        raise_on_error=False,
    )
