"""The Dagster code location, `llm_assets.definitions:defs`: every pipeline spec's assets,
jobs, sensors and schedules from `llm_assets.defs`, merged into one `Definitions`."""

import dagster as dg

from llm_assets.defs.cancel_job import build_cancel_job
from llm_assets.defs.eval_jobs import build_eval_job, build_eval_report_asset, has_evals
from llm_assets.defs.factory import build_pipeline_assets
from llm_assets.defs.jobs import build_lifecycle_jobs
from llm_assets.defs.new_data_sensor import build_new_data_sensor
from llm_assets.defs.notification_sensors import build_notification_sensors
from llm_assets.defs.pause_jobs import build_pause_jobs
from llm_assets.defs.retention_jobs import build_retention_schedule
from llm_assets.defs.schedules import build_schedule
from llm_assets.defs.sensors import build_batch_status_sensor
from llm_assets.resources import build_resources
from llm_assets.spec.load import load_specs
from llm_assets.spec.model import PipelineSpec
from llm_assets.steps import Step
from llm_assets.util.settings import Settings


def build_definitions(
    settings: Settings, specs: list[PipelineSpec] | None = None
) -> dg.Definitions:
    """Every pipeline spec under LLM_ASSETS_PIPELINES becomes an asset group and its submit,
    cancel, pause and resume jobs, sensors and (optionally) a schedule and a retention
    schedule; one with something to evaluate (eval_jobs.has_evals) its eval job and
    eval_report too. The operator's jobs bind only the resources they use."""
    specs = load_specs(settings.pipelines_dir) if specs is None else specs
    resources = build_resources(settings)
    evaluated = [spec for spec in specs if has_evals(spec)]
    assets = [asset for spec in specs for asset in build_pipeline_assets(spec, settings)]
    assets += [build_eval_report_asset(spec) for spec in evaluated]
    jobs = {spec.name: build_lifecycle_jobs(spec) for spec in specs}
    sensors = [build_batch_status_sensor(spec, settings, jobs[spec.name]) for spec in specs]
    sensors += [
        build_new_data_sensor(spec, settings, jobs[spec.name][Step.BUILD])
        for spec in specs
        if spec.automation.new_data_sensor
    ]
    sensors += build_notification_sensors(specs)
    schedules = [
        s for spec in specs if (s := build_schedule(spec, jobs[spec.name][Step.BUILD])) is not None
    ]
    schedules += [
        s for spec in specs if (s := build_retention_schedule(spec, resources)) is not None
    ]
    return dg.Definitions(
        assets=assets,
        jobs=[
            *(job for of_spec in jobs.values() for job in of_spec.values()),
            *(build_cancel_job(spec, resources) for spec in specs),
            *(build_eval_job(spec, resources) for spec in evaluated),
            *(job for spec in specs for job in build_pause_jobs(spec, resources)),
        ],
        sensors=sensors,
        schedules=schedules,
        resources=resources,
        executor=build_executor(settings),
    )


CELERY_SETTINGS = {
    # A step's task is acknowledged when it ends, not when a worker takes it: the broker
    # hands the task of a worker that died mid-step to another worker, which runs the step
    # again (the ledger's idempotent writes make the repeat harmless).
    "task_acks_late": True,
    "task_reject_on_worker_lost": True,
    "worker_prefetch_multiplier": 1,
}
"""The Celery settings of the executor; celery.yaml gives the workers the same."""


def build_executor(settings: Settings) -> dg.ExecutorDefinition:
    """Where a run's steps execute. `in_process` (the default): steps are thin I/O over the
    ledger and the provider, and a subprocess per step would cost seconds each; runs stay
    isolated from each other by the run launcher. `celery`: each step is a Celery task that
    any worker (`make worker`) takes, so the days of a backfill and the steps of a run spread
    over machines; broker and result backend from LLM_ASSETS_CELERY_BROKER and
    LLM_ASSETS_CELERY_BACKEND (docs/operations.md, "More than one machine")."""
    if settings.executor != "celery":
        return dg.in_process_executor
    try:
        from dagster_celery import celery_executor
    except ImportError as exc:
        raise ValueError(
            "LLM_ASSETS_EXECUTOR=celery needs dagster-celery: pip install -e '.[celery]'"
        ) from exc
    return celery_executor.configured(
        {
            "broker": {"env": "LLM_ASSETS_CELERY_BROKER"},
            "backend": {"env": "LLM_ASSETS_CELERY_BACKEND"},
            "config_source": CELERY_SETTINGS,
        },
        name="celery",
    )


defs = build_definitions(Settings.from_env())
