"""Sensors: what makes a dropped file end in validated outputs and a cost report.

- `<pipeline>__new_data` watches the source files and submits every day a new or changed
  file touches, unless the day's ledger job was planned from that very file version
  (new_data_sensor.py).
- `<pipeline>__batch_status` polls in-flight provider batches with cheap status calls (in
  parallel, each one try with a short timeout, under a deadline well inside Dagster's sensor
  time limit that bounds the calls still running too), imports ended ones, submits due
  retry shards (not while the pipeline is paused; after a resume, also the first-round
  shards a pause held back), and finishes days whose items are all terminal: first the gated
  run (validation, publication), then the report run (dead letters, cost report), so the
  report is written also when the quality gate stops publication.
- `llm_assets__partition_finished` / `llm_assets__partition_failed` announce a day's outcome
  once (notify.py): the summary is claimed in the ledger by its fingerprint before it is
  sent, so repeated report runs of the same day state (the CLI's and the sensor's), sensor
  ticks and daemons send it once; a day that changes (a requeue finishes it again) is
  announced again.

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
    shards waiting for their backoff; the batch-status sensor finishes the day.
  The quality gate fails no run (publication is skipped, see checks.BLOCKING_CHECKS): the
  day's finished summary says the gate blocked publication.
  Every other failure is final: an error in a run that nothing follows (the snapshot, a
  submission, an import, the report run itself), or a gate that waits for an operator (the
  budget).
"""

import concurrent.futures
import dataclasses
import datetime as dt
import functools
import hashlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import dagster as dg

from llm_assets import notify, steps
from llm_assets.asset_metadata import DAY_SUMMARY_JSON
from llm_assets.factory import STEPS, asset_key
from llm_assets.resources.ledger import LedgerResource, ShardRecord, utcnow
from llm_assets.resources.providers import provider_resource_key
from llm_assets.resources.providers.base import (
    ENDED_STATES,
    IN_FLIGHT_STATES,
    WAITING_FOR_QUOTA,
    BatchProvider,
)
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
        paused = steps.pause_reason(ledger, spec.name)
        if paused:
            context.log.info(f"{spec.name} is {paused}; shards due for submission wait for it")

        run_requests = [
            *_import_requests(ledger, spec.name, keys),
            *([] if paused else _retry_requests(ledger, spec.name, keys)),
            *([] if paused else _held_requests(ledger, spec.name, keys)),
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
    """Retry shards planned by an import, and shards waiting for the provider's quota, wait
    in `created`; each retry shard is submitted once when due, and a day's shards waiting for
    quota once per wait (one run submits them all, as room allows)."""
    now = utcnow()
    keys_by_day: dict[dt.date, list[str]] = {}
    for shard, day in ledger.pipeline_shards(pipeline, ["created"]):
        if shard.not_before is not None and shard.not_before > now:
            continue
        if shard.raw_status == WAITING_FOR_QUOTA:
            when = shard.not_before.isoformat() if shard.not_before else ""
            keys_by_day.setdefault(day, []).append(f"quota:{shard.shard_id}:{when}")
        elif shard.round > 0:  # the first round is submitted by the run that planned it
            keys_by_day.setdefault(day, []).append(f"submit:{shard.shard_id}")
    return [
        dg.RunRequest(
            run_key=_run_key(run_keys), partition_key=day.isoformat(), asset_selection=[keys.submit]
        )
        for day, run_keys in sorted(keys_by_day.items())
    ]


def _held_requests(ledger: LedgerResource, pipeline: str, keys: _StatusKeys) -> list[dg.RunRequest]:
    """First-round shards a pause held back (a submit run met it) are submitted once the
    pipeline is resumed: one run per day, once per hold (its message names the pause). Later
    rounds are requested as retries are."""
    keys_by_day: dict[dt.date, list[str]] = {}
    for shard, day in ledger.pipeline_shards(pipeline, ["created", "uploaded"]):
        if shard.raw_status == steps.PAUSED and shard.round == 0:
            hold = hashlib.sha256((shard.message or "").encode()).hexdigest()[:12]
            keys_by_day.setdefault(day, []).append(f"held:{shard.shard_id}:{hold}")
    return [
        dg.RunRequest(
            run_key=_run_key(run_keys), partition_key=day.isoformat(), asset_selection=[keys.submit]
        )
        for day, run_keys in sorted(keys_by_day.items())
    ]


def _run_key(parts: list[str]) -> str:
    """One run key for a set of parts: the parts themselves while short, else their hash."""
    joined = ",".join(sorted(parts))
    if len(joined) <= 200:
        return joined
    return f"submit-set:{hashlib.sha256(joined.encode()).hexdigest()[:32]}"


def _finish_requests(
    instance: dg.DagsterInstance, ledger: LedgerResource, pipeline: str, keys: _StatusKeys
) -> list[dg.RunRequest]:
    """Validate, publish and report days whose items are all terminal.

    A day is validated and published once per set of imported shards (the gate checks
    decide publication in that run), then reported once its validation has run, whatever the
    checks said. Days finished another way (the CLI) are recognized by their materializations
    and left alone.
    """
    requests = []
    for job, shard_count, last in ledger.finished_jobs(pipeline, utcnow() - FINISH_LOOKBACK):
        if job.cancelled_at is not None:
            continue  # an operator cancelled the day: the cancel reports it
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


def _failed_checks(context: dg.RunFailureSensorContext) -> list[dg.AssetCheckEvaluation]:
    """The run's checks that failed with ERROR severity (a gate)."""
    records = context.instance.get_records_for_run(
        context.dagster_run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION
    ).records
    evaluations = [record.event_log_entry.dagster_event.event_specific_data for record in records]
    return [e for e in evaluations if not e.passed and e.severity == dg.AssetCheckSeverity.ERROR]


def _failure_reason(context: dg.RunFailureSensorContext) -> str | None:
    """The failed checks and what they said, else the failed steps and why, else the run's
    own failure message."""
    checks = _failed_checks(context)
    if checks:
        return "; ".join(
            f"{e.asset_key.to_user_string()} check {e.check_name} failed"
            + (f": {e.description[:300]}" if e.description else "")
            for e in checks
        )
    step_failures = context.get_step_failure_events()
    if step_failures:
        return "; ".join(f"{e.step_key}: {step_failure_reason(e)[:300]}" for e in step_failures)
    return context.failure_event.message if context.failure_event else None


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


def _reported_summary(record: dg.EventLogRecord) -> notify.PartitionSummary | None:
    """The day's summary the cost report carries as metadata (None for a report without)."""
    materialization = record.asset_materialization
    value = materialization.metadata.get(DAY_SUMMARY_JSON) if materialization else None
    if value is None:
        return None
    return notify.PartitionSummary.model_validate(value.value)


WILL_RETRY_TAG = "dagster/will_retry"
"""Set on a failed run by Dagster: "true" when run retries will launch it again."""


def _failure_data(event: dg.DagsterEvent) -> dict[str, object]:
    """The metadata a step's dg.Failure carried (empty for an error)."""
    data = event.step_failure_data
    if data is None or data.user_failure_data is None:
        return {}
    return {
        name: getattr(value, "value", value)
        for name, value in data.user_failure_data.metadata.items()
    }


def _carried_on(
    context: dg.RunFailureSensorContext, spec: PipelineSpec, day: dt.date, ledger: LedgerResource
) -> str | None:
    """Why the failed run is not the day's outcome (something under way finishes the day),
    or None when the failure is final. The rules are in the module docstring."""
    run = context.dagster_run
    if run.tags.get(WILL_RETRY_TAG) == "true":
        return "Dagster retries the run"
    failures = context.get_step_failure_events()
    if failures and all(_failure_data(event).get("day_busy") for event in failures):
        return "another run holds the day; its outcome is the day's"
    try:
        job = steps.existing_job(spec, day, ledger)
    except steps.MissingPrerequisite:
        return None
    waiting = [s for s in ledger.shards(job.job_id, ["created"]) if s.round > 0]
    if ledger.shards(job.job_id, IN_FLIGHT_STATES) or waiting:
        return "items are still on their way; the batch-status sensor finishes the day"
    return None


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
        record = _cost_report_of(context, asset_key(spec, "cost_report"))
        if record is None:
            return
        summary = _reported_summary(record) or notify.summarize(
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
        name=f"llm_assets__partition_{outcome}",
        description=description,
        default_status=dg.DefaultSensorStatus.RUNNING,
    )
    def notify_partition(context: dg.RunStatusSensorContext, ledger: LedgerResource) -> None:
        _notify_partition(context, by_name, ledger)

    return notify_partition
