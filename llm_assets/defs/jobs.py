"""A pipeline's named jobs: one per heavy action of a day's lifecycle (steps/lifecycle.py).

Every path runs a day's steps as these jobs: the new-data sensor, the schedule and a UI
backfill run `<pipeline>__submit`, the batch-status sensor the others, and `llm-assets run`
and the demo all of them in their own process. So the runs page and the timeline say what
each run did, whoever started it, and a job's page lists every run of that kind.
"""

import dagster as dg
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from llm_assets import names, steps
from llm_assets.defs.factory import asset_key, partitions_for
from llm_assets.spec.model import PipelineSpec

ASSETS_OF: dict[steps.Step, tuple[str, ...]] = {
    steps.Step.BUILD: names.SUBMIT_ASSETS,
    steps.Step.SUBMIT: (names.PROVIDER_BATCHES,),
    steps.Step.IMPORT: (*names.IMPORT_ASSETS, *names.GATED_ASSETS, *names.REPORT_ASSETS),
    steps.Step.VALIDATE: (*names.GATED_ASSETS, *names.REPORT_ASSETS),
    steps.Step.REPORT: names.REPORT_ASSETS,
}
"""The assets a run materializes to carry out each of the lifecycle's heavy actions. An
import's run goes on to validate, publish and report the day: when it leaves items open
(retries planned, batches still in flight) validated_outputs skips the day and Dagster skips
the steps after it in that run; when it closes the day's last items, the day is finished in
the same run, without waiting for another sensor tick or run between the steps. A validation
run reports the day too (the quality gate skips publication only, not the report); the
lifecycle asks for a report alone when a validation is already newer than the last import."""

_WHAT: dict[steps.Step, str] = {
    steps.Step.BUILD: "Snapshot, shard and submit one day of {p}; backfill it for a date range "
    "(one provider job per day). The batch-status sensor does the rest.",
    steps.Step.SUBMIT: "Submit {p}'s shards that are due: retry rounds, shards a quota or a "
    "pause held back.",
    steps.Step.IMPORT: "Import {p}'s ended batches; once no item is open, validate, publish "
    "and report the day in the same run.",
    steps.Step.VALIDATE: "Validate, publish (unless the quality gate blocks it) and report a "
    "day of {p} whose items are all terminal.",
    steps.Step.REPORT: "Write a finished day's dead letters and cost report for {p}.",
}


def job_name(spec: PipelineSpec, step: steps.Step) -> str:
    return names.lifecycle_job(spec.name, step.value)


def asset_keys(spec: PipelineSpec, step: steps.Step) -> list[dg.AssetKey]:
    """The asset keys a run of the action materializes."""
    return [asset_key(spec, name) for name in ASSETS_OF[step]]


def build_lifecycle_jobs(spec: PipelineSpec) -> dict[steps.Step, UnresolvedAssetJobDefinition]:
    """The pipeline's job for each heavy action, on its daily partitions."""
    return {
        step: dg.define_asset_job(
            job_name(spec, step),
            selection=asset_keys(spec, step),
            partitions_def=partitions_for(spec),
            description=_WHAT[step].format(p=spec.name),
        )
        for step in ASSETS_OF
    }
