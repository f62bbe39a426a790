"""The new-data sensor: every day a new or changed source file touches is submitted once per
file version, unless the ledger already planned that day from that very version."""

import datetime as dt
import functools
import json
from collections.abc import Callable

import dagster as dg
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from llm_assets import names, steps
from llm_assets.defs.factory import partitions_for
from llm_assets.defs.jobs import asset_keys, build_lifecycle_jobs
from llm_assets.items.source import FileDays, file_days, list_source_files
from llm_assets.resources.ledger import LedgerResource
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec.model import PipelineSpec
from llm_assets.util.settings import Settings, sensor_interval


def build_new_data_sensor(
    spec: PipelineSpec, settings: Settings, submit_job: UnresolvedAssetJobDefinition | None = None
) -> dg.SensorDefinition:
    """Submit the days a new or changed source file touches, once per file version.

    The cursor maps each source file to its version. A file whose version is not in the
    cursor (every file on the first tick and after a reset, a new file, a changed one)
    requests one submit run per day it has rows for, except for a day whose ledger job was
    planned from a snapshot that recorded this very file version (steps.snapshot_sources of
    the job's snapshot_uri): that day already holds the file's rows, so the version only
    enters the cursor. A day without a job, or whose job's snapshot has an older version of
    the file or none, is requested as before. While the pipeline is paused a tick is skipped
    and keeps its cursor, so the files that came meanwhile are requested after the resume.
    """
    source = settings.resolve_source_uri(spec.source.uri)
    job = submit_job if submit_job is not None else build_lifecycle_jobs(spec)[steps.Step.BUILD]
    partitions = partitions_for(spec)

    @dg.sensor(
        name=names.new_data_sensor(spec.name),
        description=f"Watches {spec.source.uri} and submits each day a new or changed file has "
        "rows for (run key: file, version and day).",
        minimum_interval_seconds=sensor_interval(settings, 10),
        default_status=dg.DefaultSensorStatus.RUNNING,
        required_resource_keys={"storage", "ledger"},
        jobs=[job],
    )
    def new_data(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        paused = steps.pause_reason(context.resources.ledger, spec.name)
        if paused:
            # The cursor stays: files that arrive meanwhile are submitted once it is resumed.
            return dg.SensorResult(
                skip_reason=f"{spec.name} is {paused}; new files wait for the resume"
            )
        storage: ArtifactStorage = context.resources.storage
        planned = _planned_versions(spec, context.resources.ledger, storage)
        seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
        known = set(partitions.get_partition_keys(dynamic_partitions_store=context.instance))
        current: dict[str, str] = {}
        requests: list[dg.RunRequest] = []
        for uri in list_source_files(source, storage):
            try:
                version = storage.version(uri)
                fresh = version is not None and seen.get(uri) != version
                found = file_days(spec, uri, storage) if fresh else None
            except Exception as exc:
                # One file that cannot be read holds up no other; it is read again next tick.
                context.log.error(
                    f"{uri}: cannot be read ({type(exc).__name__}: {exc}); its days are not "
                    "submitted, and it is read again on the next tick"
                )
                if uri in seen:
                    current[uri] = seen[uri]
                continue
            if version is None:
                continue
            current[uri] = version
            if found is not None:
                requests += _file_requests(context, spec, uri, version, found, known, planned)
        # Files that disappeared drop out of the cursor, so it stays as big as the folder.
        return dg.SensorResult(run_requests=requests, cursor=json.dumps(current, sort_keys=True))

    return new_data


def _planned_versions(
    spec: PipelineSpec, ledger: LedgerResource, storage: ArtifactStorage
) -> Callable[[dt.date], dict[str, str] | None]:
    """Per day, the source file versions its ledger job was planned from: those its snapshot
    recorded, none when the day has no job or its job no snapshot, None when an operator
    cancelled the day or retention expired it. Each day is looked up once a tick."""

    @functools.cache
    def planned(day: dt.date) -> dict[str, str] | None:
        job = ledger.get_job(steps.job_id_of(spec, day))
        if job is not None and job.cancelled_at is not None:
            return None  # an operator cancelled the day: left alone until a requeue
        if job is not None and job.retention_expired_at is not None:
            return None  # retention expired the day: nothing is done with it again
        if job is None or job.snapshot_uri is None:
            return {}
        return steps.snapshot_sources(storage, job.snapshot_uri)

    return planned


def _file_requests(
    context: dg.SensorEvaluationContext,
    spec: PipelineSpec,
    uri: str,
    version: str,
    found: FileDays,
    known: set[str],
    planned: Callable[[dt.date], dict[str, str] | None],
) -> list[dg.RunRequest]:
    """The runs of a new file version: one per day it has rows for, within the partitions,
    that the ledger has not planned from this version yet; rows outside the partitions, or of
    no day at all, are named in the tick's log."""
    days = sorted(found.days)
    outside = [d for d in days if d.isoformat() not in known]
    if outside:
        context.log.warning(
            f"{uri}: rows for {len(outside)} day(s) outside the partitions "
            f"({outside[0]}..{outside[-1]}) are not submitted"
        )
    if found.undated:
        context.log.error(f"{uri}: {found.undated_reason(spec)}")
    inside = [d for d in days if d.isoformat() in known]
    cancelled = [d for d in inside if planned(d) is None]
    if cancelled:
        context.log.info(
            f"{uri}: {len(cancelled)} cancelled day(s) are left alone until requeued "
            f"({', '.join(d.isoformat() for d in cancelled[:5])})"
        )
        inside = [d for d in inside if d not in cancelled]
    due = [d for d in inside if (planned(d) or {}).get(uri) != version]
    if len(due) < len(inside):
        context.log.info(
            f"{uri}: {len(inside) - len(due)} day(s) already planned from this version in the "
            "ledger are not submitted again"
        )
    return [
        dg.RunRequest(
            run_key=names.new_file_run_key(uri, version, day.isoformat()),
            partition_key=day.isoformat(),
            job_name=names.submit_job(spec.name),
            asset_selection=asset_keys(spec, steps.Step.BUILD),
            tags={names.SOURCE_FILE_TAG: uri[-200:]},
        )
        for day in due
    ]
