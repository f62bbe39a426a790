"""The schedule: a spec with `automation.schedule` submits the latest complete day on that
cron, as a run of `<pipeline>__submit` (defs/jobs.py: snapshot, shards with the budget check,
submission); the batch-status sensor finishes the day when the provider is done. Backfilling
that job over a date range in the UI launches one run, and so one provider job, per day.
"""

import datetime as dt
import zoneinfo

import dagster as dg
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from llm_assets import names
from llm_assets.spec.model import PipelineSpec


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
