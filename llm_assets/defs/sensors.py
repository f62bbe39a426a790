"""Sensors: what makes a dropped file end in validated outputs and a cost report.

- `<pipeline>__new_data` watches the source files and submits every day a new or changed
  file touches, unless the day's ledger job was planned from that very file version
  (new_data_sensor.py).
- `<pipeline>__batch_status` asks the lifecycle (steps/lifecycle.py) what each open day of
  the pipeline, and of its evals, does next, and does it: it polls in-flight provider
  batches with cheap status calls (in parallel, each one try with a short timeout, under a
  deadline well inside Dagster's sensor time limit that bounds the calls still running
  too), cancels, reconciles and closes what a cancel left, and requests the runs the
  lifecycle names for the pipeline's days: imports of ended batches, submissions of due
  shards (retry rounds, quota waits over, shards a pause held back once it is lifted, a
  first-round shard its own run never sent). An import's run goes on to validate, publish
  and report the day (defs/jobs.py `ASSETS_OF`), so the day whose last items it imports
  is finished in that run, the report written also when the quality gate stops
  publication; a day imported or validated without the rest gets a run of what is left.
  An eval's days are polled and cancelled here; their steps are the eval run's.
- `llm_assets__partition_finished` / `llm_assets__partition_failed` announce a day's outcome
  once (steps/notify.py) when the code location's runs end (notification_sensors.py).
"""

import datetime as dt
import json
import time
from collections.abc import Callable, Mapping

import dagster as dg
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from llm_assets import names, steps
from llm_assets.defs import checks
from llm_assets.defs import metadata as asset_metadata
from llm_assets.defs.factory import asset_key
from llm_assets.defs.jobs import asset_keys, build_lifecycle_jobs, job_name
from llm_assets.resources.ledger import LedgerResource, ShardRecord, utcnow
from llm_assets.resources.providers import provider_resource_key
from llm_assets.resources.providers.base import IN_FLIGHT_STATES, BatchProvider
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec.model import PipelineSpec
from llm_assets.steps import notify, stuck
from llm_assets.steps.day_state import day_state
from llm_assets.steps.executor import job_spec
from llm_assets.steps.polling import PollLimits, poll_many
from llm_assets.util.settings import Settings, sensor_interval

TICK_SECONDS = 10
"""The batch-status sensor's interval: a day's next run (validation after its import, the
report after validation) is requested within this long of the run before it ending."""
POLL_EVERY_SECONDS = 60.0
"""The longest a batch in flight goes unpolled; young batches are polled sooner, on the
lifecycle's schedule (steps/lifecycle.py `next_poll_at`), not at every tick."""
POLL_DEADLINE_SECONDS = 30.0
"""How long a batch-status tick polls, calls still running included (Dagster's sensor time
limit is 60 s)."""
POLL_CALL_TIMEOUT_SECONDS = 10.0
"""The longest one status call of a tick may take; it is not retried within the tick."""
FINISH_LOOKBACK = dt.timedelta(days=3)
"""Days whose last import is older than this are not looked at again by the sensor."""
SENSOR = "sensor"
"""Who the batch-status sensor's own writes (cancels, closes, reconciliations) are by."""


def build_batch_status_sensor(
    spec: PipelineSpec,
    settings: Settings | None = None,
    jobs: Mapping[steps.Step, UnresolvedAssetJobDefinition] | None = None,
) -> dg.SensorDefinition:
    """The sensor of one pipeline; it requests runs of the pipeline's lifecycle `jobs` (the
    code location's, built here when not given)."""
    provider_key = provider_resource_key(spec.model.provider)
    jobs = jobs if jobs is not None else build_lifecycle_jobs(spec)
    submit_key = asset_key(spec, names.PROVIDER_BATCHES)
    results_key = asset_key(spec, names.BATCH_RESULTS)

    @dg.sensor(
        name=names.batch_status_sensor(spec.name),
        description=f"Asks the lifecycle what each open day of {spec.name} (and of its evals) "
        "does next: polls in-flight provider batches, cancels and closes what a cancel left, "
        "and requests the runs that import, submit retries and finish days.",
        minimum_interval_seconds=sensor_interval(settings, TICK_SECONDS),
        default_status=dg.DefaultSensorStatus.RUNNING,
        required_resource_keys={"ledger", "storage", provider_key},
        jobs=[jobs[step] for step in sorted(_RUNS)],
    )
    def batch_status(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        ledger: LedgerResource = context.resources.ledger
        provider: BatchProvider = getattr(context.resources, provider_key)
        days = _open_days(spec, ledger, context.resources.storage, provider, context.log.info)
        _poll(context, days, provider)
        run_requests = []
        states = _DayStates(submit_key, context.cursor)
        for day in days:
            decision = day.advance(only=_CHEAP)
            states.saw(day, decision)
            if decision.blocked is not None and decision.gate == steps.lifecycle.PAUSED:
                context.log.info(
                    f"{day.ctx.spec.name} {day.ctx.day}: {decision.blocked}; shards due for "
                    "submission wait for it"
                )
            if day.ctx.spec.parent is None:
                run_requests += [_request(day, a) for a in decision.actions if a.step in _RUNS]
        events: list[dg.AssetObservation | dg.AssetCheckEvaluation] = [
            *states.changed(spec, ledger, context.resources.storage, provider)
        ]
        events += [
            found for day in days if (found := _tell_stuck(context, day, provider, results_key))
        ]
        # A paused pipeline says so on the sensor's page, as its latest tick's reason.
        paused = None if run_requests else steps.pause_reason(ledger, spec.name)
        return dg.SensorResult(
            run_requests=run_requests,
            asset_events=events,
            cursor=states.cursor(),
            skip_reason=f"{spec.name} is {paused}; batches in flight are still polled and "
            "imported, nothing is sent until it is resumed"
            if paused
            else None,
        )

    return batch_status


def _tell_stuck(
    context: dg.SensorEvaluationContext,
    day: steps.DayDriver,
    provider: BatchProvider,
    results_key: dg.AssetKey,
) -> dg.AssetCheckEvaluation | None:
    """Announce the day's batches stuck before they started (steps/stuck.py), once: a
    notification, a warning in the tick's log, and batch_results' WARN check failed."""
    spec, ledger = day.ctx.spec, day.ctx.ledger
    found = stuck.stuck_batches(
        ledger, day.ctx.job_id, spec.model.provider, spec.model.name, provider.stuck_after_seconds
    )
    if not found:
        return None
    words = stuck.stuck_words(spec.name, day.ctx.day, spec.model.name, found)
    told = notify.announce_stuck(
        spec,
        day.ctx.day,
        day.ctx.job_id,
        day.counts,
        words,
        [s.provider_batch_id for s in found],
        ledger,
    )
    if not told.first:
        return None
    context.log.warning(words + (f" (webhook: {told.error})" if told.error else ""))
    if day.ctx.spec.parent is not None:
        return None  # an eval's day: its pipeline's assets are not the eval's
    return dg.AssetCheckEvaluation(
        asset_key=results_key,
        check_name=checks.NO_STUCK_BATCHES,
        passed=False,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"stuck_batches": len(found)},
        description=words,
        partition=day.ctx.day.isoformat(),
    )


_CHEAP = frozenset({steps.Step.RECONCILE, steps.Step.CANCEL, steps.Step.CLOSE})
"""What a tick carries out itself besides its polls; the other actions become run requests."""
_RUNS = frozenset({steps.Step.SUBMIT, steps.Step.IMPORT, steps.Step.VALIDATE, steps.Step.REPORT})


def _open_days(
    spec: PipelineSpec,
    ledger: LedgerResource,
    storage: ArtifactStorage,
    provider: BatchProvider,
    log: Callable[[str], None],
) -> list[steps.DayDriver]:
    """The pipeline's days (and its evals' days on the same provider) with something left
    to do; a tick polls the batches that are due (at most POLL_EVERY_SECONDS apart)."""
    limits = PollLimits(
        deadline=time.monotonic() + POLL_DEADLINE_SECONDS,
        call_timeout_seconds=POLL_CALL_TIMEOUT_SECONDS,
        report=log,
    )
    days = []
    for job in ledger.active_jobs(spec.name, utcnow() - FINISH_LOOKBACK):
        if job.provider != spec.model.provider:
            continue  # an eval variant on another provider: its own eval run polls it
        ctx = steps.StepContext(
            job_spec(spec, job), job.partition_date, ledger, storage, provider, created_by=SENSOR
        )
        days.append(steps.DayDriver(ctx, poll_every=POLL_EVERY_SECONDS, poll_limits=limits))
    return days


def _poll(
    context: dg.SensorEvaluationContext, days: list[steps.DayDriver], provider: BatchProvider
) -> None:
    """Every day's due polls in one pool, bounded by the tick's deadline (see PollLimits);
    shards left for the next tick are least recently polled first then. What a poll learned
    is in the ledger, where the days' states are read from."""
    due: list[ShardRecord] = []
    for day in days:
        wanted = {
            shard_id
            for action in day.decide().actions
            if action.step == steps.Step.POLL
            for shard_id in action.shard_ids
        }
        if wanted:
            shards = day.ledger.shards(day.ctx.job_id, IN_FLIGHT_STATES)
            due += [s for s in shards if s.shard_id in wanted]
    if not due:
        return
    due.sort(key=lambda shard: (shard.updated_at or utcnow(), shard.shard_id))
    polled = poll_many(days[0].ledger, provider, due, days[0].poll_limits)
    if len(polled) < len(due):
        context.log.info(f"{len(due) - len(polled)} shards left for the next tick")


def _request(day: steps.DayDriver, action: steps.Action) -> dg.RunRequest:
    """The run of the pipeline's job for a heavy action of a day, keyed by what it does in
    which state, so each is requested once."""
    tags = {}
    if action.step == steps.Step.IMPORT and action.shard_ids:
        tags[names.PROVIDER_BATCHES_TAG] = action.key[:200]
    return dg.RunRequest(
        run_key=names.lifecycle_run_key(action.key),
        partition_key=day.ctx.day.isoformat(),
        job_name=job_name(day.ctx.spec, action.step),
        asset_selection=asset_keys(day.ctx.spec, action.step),
        tags=tags,
    )


class _DayStates:
    """The pipeline's days whose state (steps/day_state.py) changed since the last tick, as
    observations of their provider_batches partition. The cursor holds each open day's last
    state; a day that left the open days (finished, or expired) is looked at once more, so
    its last observation says how it ended."""

    def __init__(self, key: dg.AssetKey, cursor: str | None) -> None:
        self.key = key
        self.before: dict[str, str] = json.loads(cursor) if cursor else {}
        self.now: dict[str, str] = {}
        self.events: list[dg.AssetObservation] = []

    def saw(self, day: steps.DayDriver, decision: steps.Decision) -> None:
        if day.ctx.spec.parent is not None or day.last_state is None:
            return  # an eval's day: its pipeline's assets are not the eval's
        view = day_state(day.last_state, decision)
        shards = day.ledger.shards(day.ctx.job_id)
        fingerprint = json.dumps(
            [view.state, view.description]
            + [[s.status, s.raw_status, s.completed_requests, s.failed_requests] for s in shards]
        )
        self.now[day.ctx.job_id] = fingerprint
        if self.before.get(day.ctx.job_id) != fingerprint:
            self.events.append(
                asset_metadata.day_state_observation(
                    self.key, day.ctx.day, view, day.counts, shards
                )
            )

    def changed(
        self,
        spec: PipelineSpec,
        ledger: LedgerResource,
        storage: ArtifactStorage,
        provider: BatchProvider,
    ) -> list[dg.AssetObservation]:
        """The observations of this tick, with the last of the days that are no longer open."""
        for job_id in sorted(set(self.before) - set(self.now)):
            job = ledger.get_job(job_id)
            if job is None:
                continue
            ctx = steps.StepContext(
                job_spec(spec, job),
                job.partition_date,
                ledger,
                storage,
                provider,
                created_by=SENSOR,
            )
            day = steps.DayDriver(ctx)
            self.saw(day, day.decide())
            self.now.pop(job_id, None)  # looked at once, then forgotten
        return self.events

    def cursor(self) -> str:
        return json.dumps(self.now, sort_keys=True)
