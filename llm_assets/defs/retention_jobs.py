"""`<pipeline>__retention`: the job, and its daily schedule, that apply a spec's `retention`
section: days finished more than `retention.artifacts_days` ago expire (their artifacts of the
kinds `retention.artifacts` names, their answers, outputs and pseudonyms in the ledger, and
the same of the pipeline's evals: compliance/expiry.py), and imported shards whose provider
files are still at the provider (a deletion after import failed) are deleted there. Built for
the pipelines that set `retention.artifacts_days`; `llm-assets retention PIPELINE` runs the
same work and prints the same report."""

import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any

import dagster as dg
import pydantic

from llm_assets import names
from llm_assets.compliance.expiry import Expiry, expire_days, ledger_words
from llm_assets.compliance.retention import ProviderFileDeletions, delete_provider_files
from llm_assets.resources.ledger import LedgerResource
from llm_assets.resources.providers import provider_resource_key
from llm_assets.resources.providers.base import BatchProvider
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec.model import PipelineSpec

RETENTION_CRON = "17 3 * * *"
"""Daily, at a quiet hour of the pipeline's time zone."""


@dataclasses.dataclass
class RetentionRun:
    expiry: Expiry
    provider_files: ProviderFileDeletions

    def report(self, dry_run: bool = False) -> str:
        """The round as markdown: one row per day, what went, what stayed and why."""
        rows = ["| pipeline | day | verdict | deleted | kept | why |", "|---|---|---|---|---|---|"]
        for day in self.expiry.days:
            deleted = [f"{k} ({len(u)})" for k, u in sorted(day.deleted.items()) if u]
            if day.purged is not None and day.purged.deleted_anything:
                deleted.append(f"ledger: {ledger_words(day.purged)}")
            kept = sorted(day.kept) if day.expired else ["everything"]
            verdict = ("would expire" if dry_run else "expired") if day.expired else "kept"
            rows.append(
                f"| {day.pipeline} | {day.day} | {verdict} | {', '.join(deleted) or '-'} | "
                f"{', '.join(kept) or '-'} | {day.why} |"
            )
        for sample in self.expiry.samples:
            verdict = "deleted" if sample.expired else "kept"
            rows.append(f"| eval sample | {sample.uri} | {verdict} | | | {sample.why} |")
        if self.expiry.unset:
            return self.expiry.unset
        return "\n".join(rows)


def apply_retention(
    spec: PipelineSpec,
    ledger: LedgerResource,
    storage: ArtifactStorage,
    provider: BatchProvider,
    *,
    now: dt.datetime | None = None,
    info: Callable[[str], None] | None = None,
    warn: Callable[[str], None] | None = None,
    dry_run: bool = False,
) -> RetentionRun:
    """One retention round for a pipeline: pending provider-file deletions, then the days
    (and eval data) that expire."""
    pending = (
        ledger.provider_files_to_delete(pipeline=spec.name)
        if spec.retention.provider_files == "delete_after_import"
        else []
    )
    files = delete_provider_files(
        spec, ledger, provider, pending, info=info, warn=warn, dry_run=dry_run
    )
    expiry = expire_days(spec, ledger, storage, now=now, info=info, dry_run=dry_run)
    return RetentionRun(expiry=expiry, provider_files=files)


class RetentionConfig(dg.Config):
    dry_run: bool = pydantic.Field(
        default=False, description="Log what would be deleted, delete nothing."
    )


def build_retention_job(
    spec: PipelineSpec, resources: Mapping[str, Any] | None = None
) -> dg.JobDefinition:
    """The retention job of a pipeline, with the ledger, the storage and the pipeline's
    provider; given `resources` (the code location's) it binds these three, so its Launchpad
    offers only their configuration."""
    provider_key = provider_resource_key(spec.model.provider)
    keys = ("ledger", "storage", provider_key)

    @dg.op(
        name=names.retention_op(spec.name),
        required_resource_keys={"ledger", "storage", provider_key},
    )
    def apply(context: dg.OpExecutionContext, config: RetentionConfig) -> None:
        run = apply_retention(
            spec,
            context.resources.ledger,
            context.resources.storage,
            getattr(context.resources, provider_key),
            info=context.log.info,
            warn=context.log.warning,
            dry_run=config.dry_run,
        )
        purged = [d.purged for d in run.expiry.expired if d.purged is not None]
        context.add_output_metadata(
            {
                "dry_run": config.dry_run,
                "days_expired": len(run.expiry.expired),
                "artifacts_deleted": run.expiry.uris,
                "days_kept": len(run.expiry.kept),
                "answers_deleted": sum(p.answers for p in purged),
                "outputs_deleted": sum(p.outputs for p in purged),
                "pseudonyms_deleted": sum(p.pseudonyms for p in purged),
                "provider_files_deleted_shards": run.provider_files.shards,
                "provider_file_failures": len(run.provider_files.failed),
                "report": dg.MetadataValue.md(run.report(config.dry_run)),
            }
        )

    @dg.job(
        name=names.retention_job(spec.name),
        description=f"Expire {spec.name}'s days finished more than "
        f"{spec.retention.artifacts_days} day(s) ago: their {', '.join(spec.retention.artifacts)}, "
        "the ledger's answers, outputs and pseudonyms, and their evals' data (days with open "
        "work are never touched); and delete provider files left after import.",
        tags={names.OPERATOR_TAG: "retention"},
        resource_defs=None if resources is None else {key: resources[key] for key in keys},
    )
    def retention_job() -> None:
        apply()

    return retention_job


def build_retention_schedule(
    spec: PipelineSpec, resources: Mapping[str, Any] | None = None
) -> dg.ScheduleDefinition | None:
    """The daily schedule of the retention job, when the spec sets artifacts_days."""
    if spec.retention.artifacts_days is None:
        return None
    return dg.ScheduleDefinition(
        name=names.retention_schedule(spec.name),
        cron_schedule=RETENTION_CRON,
        execution_timezone=spec.partitions.timezone,
        job=build_retention_job(spec, resources),
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"Applies {spec.name}'s retention section daily.",
    )
