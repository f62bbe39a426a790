"""What the CLI's commands share: the settings, a pipeline by name, a date argument, the
day's job, and the exit codes (0 done, 1 error, 2 blocked by a gate)."""

import datetime as dt
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from llm_assets.cli.console import print_error
from llm_assets.spec.load import SpecError, load_specs
from llm_assets.spec.model import PipelineSpec
from llm_assets.util.settings import Settings

if TYPE_CHECKING:
    from llm_assets.defs.run_failures import StepFailed

EXIT_OK, EXIT_ERROR, EXIT_GATE = 0, 1, 2


def load_settings() -> Settings:
    """The settings from the environment; a bad value is said and exits 1."""
    try:
        return Settings.from_env()
    except ValueError as exc:
        print_error(str(exc))
        sys.exit(EXIT_ERROR)


def _specs(settings: Settings) -> dict[str, PipelineSpec]:
    """Every pipeline's spec by name, validated (problems printed, exit 1)."""
    try:
        return {s.name: s for s in load_specs(settings.pipelines_dir)}
    except SpecError as exc:
        for problem in exc.problems:
            print_error(str(problem))
        sys.exit(EXIT_ERROR)


def pipeline_spec(settings: Settings, name: str) -> PipelineSpec:
    """The pipeline of that name, its spec validated (problems printed, exit 1)."""
    specs = _specs(settings)
    if name not in specs:
        raise click.UsageError(
            f"no pipeline {name!r} in {settings.pipelines_dir}; known: {', '.join(sorted(specs))}"
        )
    return specs[name]


def day_of(settings: Settings, name: str, date_: str) -> tuple[PipelineSpec, Any, Any]:
    """A day of a pipeline, or of one of its evals named by its eval pipeline
    (`<pipeline>__<variant>__<digest>`): its spec, the resources and the day's job; a usage
    error when there is no such day."""
    from llm_assets.resources import build_resources
    from llm_assets.steps.executor import job_spec

    day = parse_date(date_)
    assert day is not None
    specs = _specs(settings)
    if name in specs:
        resources, job = current_job(settings, specs[name], day)
        return specs[name], resources, job
    resources = build_resources(settings)
    evals = [
        job
        for job in resources["ledger"].jobs_for_partition(name, day)
        if job.parent_pipeline in specs
    ]
    if not evals:
        raise click.UsageError(
            f"no pipeline {name!r} in {settings.pipelines_dir}, and no eval pipeline of that "
            f"name with a job on {day}; known pipelines: {', '.join(sorted(specs))}"
        )
    job = evals[-1]
    return job_spec(specs[job.parent_pipeline], job), resources, job


def parse_date(value: str | None) -> dt.date | None:
    if value is None:
        return None
    try:
        return dt.date.fromisoformat(value)
    except ValueError as exc:
        raise click.BadParameter(f"{value!r} is not a date like 2026-11-01") from exc


def current_job(settings: Settings, spec: PipelineSpec, day: dt.date) -> tuple[Any, Any]:
    """The resources and the day's job, or a usage error when the day has none."""
    from llm_assets import steps
    from llm_assets.resources import build_resources

    resources = build_resources(settings)
    try:
        job = steps.existing_job(spec, day, resources["ledger"])
    except steps.MissingPrerequisite as exc:
        raise click.UsageError(str(exc)) from exc
    return resources, job


def exit_for_failed_run(failure: "StepFailed", home: Path) -> NoReturn:
    """A Dagster run of the command failed: say why on stderr and exit 2 when a gate blocked
    it, 1 otherwise."""
    print_error(str(failure), home, label="blocked:" if failure.gate else "failed:")
    sys.exit(EXIT_GATE if failure.gate else EXIT_ERROR)


def poll_interval_option(help: str) -> Any:
    """`--poll-interval`: the longest wait between status polls of remote batches."""
    return click.option(
        "--poll-interval",
        default=30.0,
        show_default=True,
        type=click.FloatRange(min=0.0),
        help=help,
    )
