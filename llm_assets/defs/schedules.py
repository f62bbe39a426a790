"""Jobs and schedules: the submit job behind UI backfills and fixed-time runs.

A day is submitted by `<pipeline>__submit` (snapshot, shards with the budget check,
submission); the batch-status sensor finishes it when the provider is done. Backfilling that
job over a date range in the UI launches one run, and so one provider job, per day. A spec
with `automation.schedule` submits the latest complete day on that cron.
"""

import datetime as dt
import zoneinfo

import dagster as dg
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from llm_assets import names
from llm_assets.defs.factory import asset_key, partitions_for
from llm_assets.spec.model import PipelineSpec


def build_submit_job(spec: PipelineSpec) -> UnresolvedAssetJobDefinition:
    return dg.define_asset_job(
        names.submit_job(spec.name),
        selection=[asset_key(spec, step) for step in names.SUBMIT_ASSETS],
        partitions_def=partitions_for(spec),
        description=f"Snapshot, shard and submit one day of {spec.name}; backfill it for a "
        "date range (one provider job per day). The batch-status sensor does the rest.",
    )


def build_schedule(
    spec: PipelineSpec, job: UnresolvedAssetJobDefinition
) -> dg.ScheduleDefinition | None:
    if spec.automation.schedule is None:
        return None
    zone = zoneinfo.ZoneInfo(spec.partitions.timezone)

    @dg.schedule(
        name=names.submit_schedule(spec.name),
        cron_schedule=spec.automation.schedule,
        execution_timezone=spec.partitions.timezone,
        job=job,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"Submits the latest complete day of {spec.name} at "
        f"'{spec.automation.schedule}' ({spec.partitions.timezone}); the budget and quality "
        "gates hold it as any run.",
    )
    def submit_latest_day(context: dg.ScheduleEvaluationContext) -> dg.RunRequest | dg.SkipReason:
        now = context.scheduled_execution_time or dt.datetime.now(dt.UTC)
        latest = now.astimezone(zone).date() - dt.timedelta(days=1 - spec.partitions.end_offset)
        if latest < spec.partitions.start_date:
            return dg.SkipReason(f"no complete day since {spec.partitions.start_date} yet")
        day = latest.isoformat()
        return dg.RunRequest(run_key=names.scheduled_run_key(day), partition_key=day)

    return submit_latest_day
