"""Sensors: the batch-status sensor that turns ended provider batches into import runs.

It only makes cheap status calls, in parallel and under a deadline well inside Dagster's
sensor time limit; shards it did not reach are polled first on the next tick.
"""

import datetime as dt
import time
from concurrent.futures import ThreadPoolExecutor

import dagster as dg

from llm_assets import steps
from llm_assets.factory import asset_key
from llm_assets.resources.ledger import LedgerResource, ShardRecord, utcnow
from llm_assets.resources.providers import provider_resource_key
from llm_assets.resources.providers.base import ENDED_STATES, IN_FLIGHT_STATES, BatchProvider
from llm_assets.spec import PipelineSpec

IMPORT_STEPS = ("batch_results",)
FINISH_STEPS = ("validated_outputs", "published_outputs", "qa_sample", "dead_letter", "cost_report")
POLL_DEADLINE_SECONDS = 30.0
POLL_WORKERS = 8


def batch_status_sensor_name(spec: PipelineSpec) -> str:
    return f"{spec.name}__batch_status"


def build_batch_status_sensor(spec: PipelineSpec) -> dg.SensorDefinition:
    provider_key = provider_resource_key(spec.model.provider)
    import_keys = [asset_key(spec, step) for step in IMPORT_STEPS]
    finish_keys = [asset_key(spec, step) for step in FINISH_STEPS]
    submit_key = asset_key(spec, "provider_batches")

    @dg.sensor(
        name=batch_status_sensor_name(spec),
        description=f"Polls {spec.name}'s in-flight provider batches and imports ended ones.",
        minimum_interval_seconds=60,
        default_status=dg.DefaultSensorStatus.RUNNING,
        required_resource_keys={"ledger", provider_key},
        asset_selection=[*import_keys, *finish_keys, submit_key],
    )
    def batch_status(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        ledger: LedgerResource = context.resources.ledger
        provider: BatchProvider = getattr(context.resources, provider_key)
        deadline = time.monotonic() + POLL_DEADLINE_SECONDS
        in_flight = ledger.pipeline_shards(spec.name, IN_FLIGHT_STATES)

        def poll(item: tuple[ShardRecord, dt.date]) -> tuple[ShardRecord, dt.date] | None:
            if time.monotonic() > deadline:
                return None
            [updated] = steps.poll_shards(ledger, provider, [item[0]])
            return updated, item[1]

        with ThreadPoolExecutor(max_workers=POLL_WORKERS) as pool:
            polled = [p for p in pool.map(poll, in_flight) if p is not None]

        observations = [
            dg.AssetObservation(
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
            for shard, day in polled
        ]
        # One import run per partition per tick imports every ended shard of that day; the
        # run key names the batches, so each set of ended batches is imported once.
        ended: dict[dt.date, list[str]] = {}
        for shard, day in ledger.pipeline_shards(spec.name, ENDED_STATES):
            ended.setdefault(day, []).append(shard.provider_batch_id or shard.shard_id)
        run_requests = [
            dg.RunRequest(
                run_key=",".join(sorted(batch_ids)),
                partition_key=day.isoformat(),
                asset_selection=import_keys,
                tags={"llm_assets/provider_batches": ",".join(sorted(batch_ids))[:200]},
            )
            for day, batch_ids in sorted(ended.items())
        ]
        # Retry shards planned by an import wait in `created`; submit them (once per shard).
        run_requests += [
            dg.RunRequest(
                run_key=f"submit:{shard.shard_id}",
                partition_key=day.isoformat(),
                asset_selection=[submit_key],
            )
            for shard, day in ledger.pipeline_shards(spec.name, ["created"])
            if shard.round > 0 and (shard.not_before is None or shard.not_before <= utcnow())
        ]
        # A day whose items are all terminal is validated, published and reported once per
        # set of imported shards; the blocking checks then gate publication in that run.
        for job in ledger.jobs_for_pipeline(spec.name):
            if job.status != "completed":
                continue
            shards = ledger.shards(job.job_id)
            if not shards or any(s.status != "imported" for s in shards):
                continue
            last = max(s.imported_at for s in shards if s.imported_at)
            run_requests.append(
                dg.RunRequest(
                    run_key=f"finish:{job.job_id}:{len(shards)}:{last.isoformat()}",
                    partition_key=job.partition_date.isoformat(),
                    asset_selection=finish_keys,
                )
            )
        skipped = len(in_flight) - len(polled)
        if skipped:
            context.log.info(f"deadline reached; {skipped} shards left for the next tick")
        return dg.SensorResult(run_requests=run_requests, asset_events=observations)

    return batch_status
