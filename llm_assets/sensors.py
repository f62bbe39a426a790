"""Sensors: what makes a dropped file end in validated outputs and a cost report.

- `<pipeline>__new_data` watches the source files and submits every day a new or changed
  file touches, unless the day's ledger job was planned from that very file version
  (new_data_sensor.py).
- `<pipeline>__batch_status` polls in-flight provider batches with cheap status calls (in
  parallel, each one try with a short timeout, under a deadline well inside Dagster's sensor
  time limit that bounds the calls still running too), imports ended ones,
  submits due retry shards, and finishes days whose items are all terminal: first the gated
  run (validation, publication), then the report run (dead letters, cost report), so the
  report is written also when a blocking check stops publication.
- `llm_assets__partition_finished` / `llm_assets__partition_failed` summarize a day when its
  report run succeeds or any of its runs fails (notify.py).
"""

import concurrent.futures
import dataclasses
import datetime as dt
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import dagster as dg

from llm_assets import notify, steps
from llm_assets.factory import STEPS, asset_key
from llm_assets.resources.ledger import LedgerResource, ShardRecord, utcnow
from llm_assets.resources.providers import provider_resource_key
from llm_assets.resources.providers.base import ENDED_STATES, IN_FLIGHT_STATES, BatchProvider
from llm_assets.runner import (
    GATED_STEPS,
    IMPORT_STEPS,
    REPORT_STEPS,
    step_failure_reason,
)
from llm_assets.settings import Settings, sensor_interval
from llm_assets.spec import PipelineSpec

POLL_DEADLINE_SECONDS = 30.0
"""How long a batch-status tick polls, calls still running included (Dagster's sensor time
limit is 60 s)."""
POLL_CALL_TIMEOUT_SECONDS = 10.0
"""The longest one status call of a tick may take; it is not retried within the tick."""
POLL_WORKERS = 8
FINISH_LOOKBACK = dt.timedelta(days=3)
"""Days whose last import is older than this are not looked at again by the sensor."""


def batch_status_sensor_name(spec: PipelineSpec) -> str:
    return f"{spec.name}__batch_status"


@dataclasses.dataclass(frozen=True)
class _StatusKeys:
    """The asset keys the batch-status sensor observes and requests runs of."""

    imports: list[dg.AssetKey]
    gated: list[dg.AssetKey]
    reports: list[dg.AssetKey]
    submit: dg.AssetKey
    validated: dg.AssetKey
    cost_report: dg.AssetKey

    @classmethod
    def of(cls, spec: PipelineSpec) -> "_StatusKeys":
        return cls(
            imports=[asset_key(spec, step) for step in IMPORT_STEPS],
            gated=[asset_key(spec, step) for step in GATED_STEPS],
            reports=[asset_key(spec, step) for step in REPORT_STEPS],
            submit=asset_key(spec, "provider_batches"),
            validated=asset_key(spec, "validated_outputs"),
            cost_report=asset_key(spec, "cost_report"),
        )


def build_batch_status_sensor(
    spec: PipelineSpec, settings: Settings | None = None
) -> dg.SensorDefinition:
    provider_key = provider_resource_key(spec.model.provider)
    keys = _StatusKeys.of(spec)

    @dg.sensor(
        name=batch_status_sensor_name(spec),
        description=f"Polls {spec.name}'s in-flight provider batches, imports ended ones and "
        "finishes days whose items are all terminal.",
        minimum_interval_seconds=sensor_interval(settings, 60),
        default_status=dg.DefaultSensorStatus.RUNNING,
        required_resource_keys={"ledger", provider_key},
        asset_selection=[*keys.imports, *keys.gated, *keys.reports, keys.submit],
    )
    def batch_status(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        ledger: LedgerResource = context.resources.ledger
        provider: BatchProvider = getattr(context.resources, provider_key)
        in_flight = ledger.pipeline_shards(spec.name, IN_FLIGHT_STATES)
        polled = _poll_until_deadline(context, ledger, provider, in_flight)

        run_requests = [
            *_import_requests(ledger, spec.name, keys),
            *_retry_requests(ledger, spec.name, keys),
            *_finish_requests(context.instance, ledger, spec.name, keys),
        ]
        observations = [_observation(keys.submit, shard, day) for shard, day in polled]
        return dg.SensorResult(run_requests=run_requests, asset_events=observations)

    return batch_status


def _poll_until_deadline(
    context: dg.SensorEvaluationContext,
    ledger: LedgerResource,
    provider: BatchProvider,
    in_flight: list[tuple[ShardRecord, dt.date]],
) -> list[tuple[ShardRecord, dt.date]]:
    """Poll the in-flight shards in parallel, each with one status call of at most
    POLL_CALL_TIMEOUT_SECONDS, until POLL_DEADLINE_SECONDS have passed: a call is started only
    while it can end before the deadline, and the tick stops waiting at the deadline even for
    calls still running (their answers are recorded when they come). A failed call is logged
    by its exception's type and HTTP status; the next tick asks again."""
    deadline = time.monotonic() + POLL_DEADLINE_SECONDS

    def poll(item: tuple[ShardRecord, dt.date]) -> tuple[ShardRecord, dt.date] | str | None:
        if time.monotonic() + POLL_CALL_TIMEOUT_SECONDS > deadline:
            return None
        try:
            [updated] = steps.poll_shards(
                ledger, provider, [item[0]], timeout_seconds=POLL_CALL_TIMEOUT_SECONDS
            )
        except Exception as exc:
            status = getattr(exc, "status_code", None)
            http = f", HTTP {status}" if status else ""
            return f"{item[0].shard_id}: status poll failed ({type(exc).__name__}{http})"
        return updated, item[1]

    pool = ThreadPoolExecutor(max_workers=POLL_WORKERS)
    futures = [pool.submit(poll, item) for item in in_flight]
    done, _ = concurrent.futures.wait(futures, timeout=max(0.0, deadline - time.monotonic()))
    pool.shutdown(wait=False, cancel_futures=True)
    answers = [future.result() for future in futures if future in done]
    for failure in (a for a in answers if isinstance(a, str)):
        context.log.warning(f"{failure}; polled again next tick")
    polled = [answer for answer in answers if isinstance(answer, tuple)]
    if len(polled) < len(in_flight):
        context.log.info(f"{len(in_flight) - len(polled)} shards left for the next tick")
    return polled


def _observation(submit_key: dg.AssetKey, shard: ShardRecord, day: dt.date) -> dg.AssetObservation:
    """A polled shard's provider status, shown on the day's provider_batches in the UI."""
    return dg.AssetObservation(
        asset_key=submit_key,
        partition=day.isoformat(),
        metadata={
            "shard_id": shard.shard_id,
            "provider_batch_id": shard.provider_batch_id or "",
            "status": shard.status,
            "provider_status": shard.raw_status or "",
            "requests": shard.item_count,
            "completed_requests": shard.completed_requests,
            "failed_requests": shard.failed_requests,
        },
    )


def _import_requests(
    ledger: LedgerResource, pipeline: str, keys: _StatusKeys
) -> list[dg.RunRequest]:
    """One import run per partition imports every ended shard of that day; the run key names
    the batches, so each set of ended batches is imported once."""
    ended: dict[dt.date, list[str]] = {}
    for shard, day in ledger.pipeline_shards(pipeline, ENDED_STATES):
        ended.setdefault(day, []).append(shard.provider_batch_id or shard.shard_id)
    return [
        dg.RunRequest(
            run_key=",".join(sorted(batch_ids)),
            partition_key=day.isoformat(),
            asset_selection=keys.imports,
            tags={"llm_assets/provider_batches": ",".join(sorted(batch_ids))[:200]},
        )
        for day, batch_ids in sorted(ended.items())
    ]


def _retry_requests(
    ledger: LedgerResource, pipeline: str, keys: _StatusKeys
) -> list[dg.RunRequest]:
    """Retry shards planned by an import wait in `created`; submit each once, when due."""
    return [
        dg.RunRequest(
            run_key=f"submit:{shard.shard_id}",
            partition_key=day.isoformat(),
            asset_selection=[keys.submit],
        )
        for shard, day in ledger.pipeline_shards(pipeline, ["created"])
        if shard.round > 0 and (shard.not_before is None or shard.not_before <= utcnow())
    ]


def _finish_requests(
    instance: dg.DagsterInstance, ledger: LedgerResource, pipeline: str, keys: _StatusKeys
) -> list[dg.RunRequest]:
    """Validate, publish and report days whose items are all terminal.

    A day is validated and published once per set of imported shards (the blocking checks
    gate publication in that run), then reported once its validation has run, whatever the
    checks said. Days finished another way (the CLI) are recognized by their materializations
    and left alone.
    """
    requests = []
    for job, shard_count, last in ledger.finished_jobs(pipeline, utcnow() - FINISH_LOOKBACK):
        day = job.partition_date.isoformat()
        key = f"{job.job_id}:{shard_count}:{last.isoformat()}"
        validated = _latest(instance, keys.validated, day)
        if validated is None or validated < last.timestamp():
            requests.append(
                dg.RunRequest(
                    run_key=f"finish:{key}", partition_key=day, asset_selection=keys.gated
                )
            )
            continue
        reported = _latest(instance, keys.cost_report, day)
        if reported is None or reported < validated:
            requests.append(
                dg.RunRequest(
                    run_key=f"report:{key}", partition_key=day, asset_selection=keys.reports
                )
            )
    return requests


def _latest(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str) -> float | None:
    """When the asset was last materialized for the partition (epoch seconds), if ever."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=1
    ).records
    return records[0].timestamp if records else None


def _partition_of(
    run: dg.DagsterRun, specs: dict[str, PipelineSpec]
) -> tuple[PipelineSpec, dt.date] | None:
    """The pipeline and day a run worked on, from its asset selection and partition tag."""
    partition = run.tags.get("dagster/partition")
    keys = run.asset_selection or set()
    names = {key.path[0] for key in keys if len(key.path) == 2 and key.path[1] in STEPS}
    if partition is None or len(names) != 1:
        return None
    spec = specs.get(names.pop())
    if spec is None:
        return None
    try:
        return spec, dt.date.fromisoformat(partition)
    except ValueError:
        return None


def _failure_reason(context: dg.RunFailureSensorContext) -> str | None:
    """The failed steps and why, or the run's own failure message when no step failed."""
    reason = context.failure_event.message if context.failure_event else None
    step_failures = context.get_step_failure_events()
    if step_failures:
        reason = "; ".join(f"{e.step_key}: {step_failure_reason(e)[:300]}" for e in step_failures)
    return reason


def _materialized_in(context: dg.RunStatusSensorContext, key: dg.AssetKey) -> bool:
    """Whether the run wrote the asset: a run of a day still in flight skips its cost report
    and succeeds without finishing the day."""
    if key not in (context.dagster_run.asset_selection or set()):
        return False
    records = context.instance.get_records_for_run(
        context.dagster_run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
    ).records
    return any(record.asset_key == key for record in records)


def _notify_partition(
    context: dg.RunStatusSensorContext,
    by_name: dict[str, PipelineSpec],
    ledger: LedgerResource,
    *,
    outcome: str,
) -> None:
    """Summarize the partition of a run that finished a day's cost report or failed, log it
    (a warning when the run failed) and deliver it to the spec's webhook."""
    found = _partition_of(context.dagster_run, by_name)
    if found is None:
        return
    spec, day = found
    if isinstance(context, dg.RunFailureSensorContext):
        reason, log = _failure_reason(context), context.log.warning
    elif _materialized_in(context, asset_key(spec, "cost_report")):
        reason, log = None, context.log.info
    else:
        return
    summary = notify.summarize(
        spec, day, ledger, outcome=outcome, reason=reason, run_id=context.dagster_run.run_id
    )
    log(summary.text())
    notify.deliver(spec, summary)


_NOTIFICATIONS = (
    (
        "finished",
        functools.partial(dg.run_status_sensor, run_status=dg.DagsterRunStatus.SUCCESS),
        "When a day's cost report is written: a summary (items, dead letters by class, cost, "
        "duration) to the log and the spec's webhook, with alerts.",
    ),
    (
        "failed",
        dg.run_failure_sensor,
        "When any run of a day fails (a gate or an error): a summary with the reason to the "
        "log and the spec's webhook.",
    ),
)
"""Per outcome: the sensor decorator of the runs it summarizes and the sensor's description."""


def build_notification_sensors(specs: list[PipelineSpec]) -> list[dg.SensorDefinition]:
    """Summaries when a day's report run succeeds (finished) or any run of a day fails."""
    by_name = {spec.name: spec for spec in specs}
    return [_notification_sensor(by_name, *notification) for notification in _NOTIFICATIONS]


def _notification_sensor(
    by_name: dict[str, PipelineSpec],
    outcome: str,
    sensor: Callable[..., Callable[..., dg.SensorDefinition]],
    description: str,
) -> dg.SensorDefinition:
    @sensor(
        name=f"llm_assets__partition_{outcome}",
        description=description,
        default_status=dg.DefaultSensorStatus.RUNNING,
    )
    def notify_partition(context: dg.RunStatusSensorContext, ledger: LedgerResource) -> None:
        _notify_partition(context, by_name, ledger, outcome=outcome)

    return notify_partition
