"""Notification sensors: `llm_assets__partition_finished` / `llm_assets__partition_failed`
announce a day's outcome once (steps/notify.py) when the code location's runs end (sensor
runs, backfills, the UI); `llm-assets run` and the demo, whose runs no sensor sees, announce
theirs by the same rules (defs/runner.py). The summary is claimed in the ledger by its
fingerprint before it is sent, so repeated reports of the same day state (the CLI's and the
sensor's), sensor ticks and daemons send it once; a day that changes (a requeue finishes it
again) is announced again.

When a day is announced:

- finished: a successful run wrote the day's cost report and no item is open. The summary
  is the one on the cost report (its `day_summary`), so the UI and the webhook say the same;
  when the quality gate stopped publication, that summary says so.
- failed, finally: a run of the day failed and nothing already under way finishes the day.
  A failed run is not the day's outcome, and is only logged, when
  - Dagster retries it (its worker crashed: `dagster/will_retry`);
  - every failed step found the day held by another run (`day_busy`): that run's outcome
    is the day's;
  - the day still has items on their way: shards in flight at the provider, or retry
    shards waiting for their backoff (not those a gate holds for an operator); the
    batch-status sensor finishes the day.
  The quality gate fails no run (publication is skipped, see checks.BLOCKING_CHECKS): the
  day's finished summary says the gate blocked publication.
  Every other failure is final: an error in a run that nothing follows (the snapshot, a
  submission, an import, a validation or report), or a gate that waits for an operator (the
  budget).
"""

import datetime as dt
import functools
from collections.abc import Callable

import dagster as dg

from llm_assets import names
from llm_assets.defs.factory import asset_key
from llm_assets.defs.run_failures import day_busy, failure_reason, reported_summary
from llm_assets.resources.ledger import LedgerResource
from llm_assets.spec.model import PipelineSpec
from llm_assets.steps import notify


def _partition_of(
    run: dg.DagsterRun, specs: dict[str, PipelineSpec]
) -> tuple[PipelineSpec, dt.date] | None:
    """The pipeline and day a run worked on, from its asset selection and partition tag."""
    partition = run.tags.get("dagster/partition")
    keys = run.asset_selection or set()
    pipelines = {key.path[0] for key in keys if len(key.path) == 2 and key.path[1] in names.ASSETS}
    if partition is None or len(pipelines) != 1:
        return None
    spec = specs.get(pipelines.pop())
    if spec is None:
        return None
    try:
        return spec, dt.date.fromisoformat(partition)
    except ValueError:
        return None


def _failed_checks(context: dg.RunFailureSensorContext) -> list[dg.AssetCheckEvaluation]:
    """The run's checks that failed with ERROR severity (a gate)."""
    records = context.instance.get_records_for_run(
        context.dagster_run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION
    ).records
    evaluations = [
        record.event_log_entry.get_dagster_event().asset_check_evaluation_data for record in records
    ]
    return [e for e in evaluations if not e.passed and e.severity == dg.AssetCheckSeverity.ERROR]


def _failure_reason(context: dg.RunFailureSensorContext) -> str | None:
    """Why the run failed, in the words `llm-assets run` uses for its failed runs."""
    return failure_reason(
        _failed_checks(context),
        context.get_step_failure_events(),
        context.failure_event.message if context.failure_event else None,
    )


def _cost_report_of(
    context: dg.RunStatusSensorContext, key: dg.AssetKey
) -> dg.EventLogRecord | None:
    """The cost report the run wrote, if it wrote one: a run of a day still in flight skips
    its cost report and succeeds without finishing the day."""
    if key not in (context.dagster_run.asset_selection or set()):
        return None
    records = context.instance.get_records_for_run(
        context.dagster_run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
    ).records
    return next((record for record in records if record.asset_key == key), None)


def _empty_day_report(record: dg.EventLogRecord) -> bool:
    """A cost report of a day with no source rows: no path announces such a day."""
    materialization = record.asset_materialization
    return materialization is not None and "no_source_rows" in materialization.metadata


def _carried_on(
    context: dg.RunFailureSensorContext, spec: PipelineSpec, day: dt.date, ledger: LedgerResource
) -> str | None:
    """Why the failed run is not the day's outcome (something under way finishes the day),
    or None when the failure is final. The rules are in the module docstring."""
    run = context.dagster_run
    if run.tags.get(names.WILL_RETRY_TAG) == "true":
        return "Dagster retries the run"
    if day_busy(context.get_step_failure_events()):
        return "another run holds the day; its outcome is the day's"
    return notify.under_way(spec, day, ledger)


def _notify_partition(
    context: dg.RunStatusSensorContext,
    by_name: dict[str, PipelineSpec],
    ledger: LedgerResource,
) -> None:
    """Announce the day of a run that wrote a finished day's cost report, or whose failure is
    final; log the summary once (a warning when it alerts or the day failed)."""
    found = _partition_of(context.dagster_run, by_name)
    if found is None:
        return
    spec, day = found
    run_id = context.dagster_run.run_id
    if isinstance(context, dg.RunFailureSensorContext):
        carried_on = _carried_on(context, spec, day, ledger)
        if carried_on:
            context.log.info(f"{spec.name} {day}: run {run_id} failed; {carried_on}")
            return
        summary = notify.summarize(
            spec, day, ledger, outcome="failed", reason=_failure_reason(context), run_id=run_id
        )
    else:
        record = _cost_report_of(context, asset_key(spec, names.COST_REPORT))
        if record is None or _empty_day_report(record):
            return
        summary = reported_summary(record) or notify.summarize(
            spec, day, ledger, outcome="finished", run_id=run_id
        )
        if summary.open_items:
            context.log.info(
                f"{spec.name} {day}: run {run_id} reported the day with {summary.open_items} "
                "items still open; the day is announced when it finishes"
            )
            return
    announced = notify.announce(spec, summary, ledger)
    if not announced.first:
        context.log.info(
            f"{spec.name} {day}: this day's {summary.outcome} summary was sent before "
            f"(run {run_id} found it unchanged)"
        )
        return
    alarming = summary.alerts or summary.outcome == "failed"
    (context.log.warning if alarming else context.log.info)(summary.text())
    if announced.error:
        context.log.warning(f"{spec.name} {day}: notification not delivered: {announced.error}")


_NOTIFICATIONS = (
    (
        "finished",
        functools.partial(dg.run_status_sensor, run_status=dg.DagsterRunStatus.SUCCESS),
        "When a run writes the cost report of a day with no open item: the day's summary (items, "
        "dead letters by class, cost, duration, alerts), once per day state, to the log and the "
        "spec's webhook.",
    ),
    (
        "failed",
        dg.run_failure_sensor,
        "When a run of a day fails and nothing under way finishes the day: the day's summary "
        "with the reason, once per day state, to the log and the spec's webhook.",
    ),
)
"""Per outcome: the sensor decorator of the runs it summarizes and the sensor's description."""


def build_notification_sensors(specs: list[PipelineSpec]) -> list[dg.SensorDefinition]:
    """Summaries when a run finishes a day's cost report, or a run's failure is final."""
    by_name = {spec.name: spec for spec in specs}
    return [_notification_sensor(by_name, *notification) for notification in _NOTIFICATIONS]


def _notification_sensor(
    by_name: dict[str, PipelineSpec],
    outcome: str,
    sensor: Callable[..., Callable[..., dg.SensorDefinition]],
    description: str,
) -> dg.SensorDefinition:
    @sensor(
        name=names.outcome_sensor(outcome),
        description=description,
        default_status=dg.DefaultSensorStatus.RUNNING,
    )
    def notify_partition(context: dg.RunStatusSensorContext, ledger: LedgerResource) -> None:
        _notify_partition(context, by_name, ledger)

    return notify_partition
