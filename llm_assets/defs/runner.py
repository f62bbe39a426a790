"""Drive a partition through Dagster from a script: what `llm-assets run --wait` does.

Every step runs as a real Dagster run on a persistent instance, so it shows in the UI. What
the day does next, and the waiting between runs, is the lifecycle's (steps.drive): this
module only says how its heavy steps run here: as runs of the pipeline's named jobs
(defs/jobs.py), in this process, on the persistent instance.
`run_days` drives a range of days one after another with a progress line each, for
`llm-assets run` and the demo, and announces each day's outcome as the notification sensors
do for the code location's runs (steps/notify.py): these runs are not the code location's,
so no sensor sees them.
"""

import dataclasses
import datetime as dt
import functools
import getpass
import os
from collections.abc import Callable
from pathlib import Path

import dagster as dg
from dagster._core.execution.execution_result import ExecutionResult
from pydantic import BaseModel
from rich.progress import Progress, TaskID

from llm_assets import names, steps
from llm_assets.defs.factory import (
    asset_key,
    build_pipeline_assets,
)
from llm_assets.defs.jobs import asset_keys, build_lifecycle_jobs, job_name
from llm_assets.defs.run_failures import StepFailed, failure_of, reported_summary
from llm_assets.resources import build_resources
from llm_assets.resources.ledger import LedgerResource
from llm_assets.resources.providers import provider_resource_key
from llm_assets.resources.providers.base import BatchProvider
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec.model import PipelineSpec
from llm_assets.steps import notify
from llm_assets.util import file_lock
from llm_assets.util.failpoints import failpoint
from llm_assets.util.progress import ProgressFn, listening
from llm_assets.util.settings import Settings


class DayOutcome(BaseModel):
    pipeline: str
    date: dt.date
    job_id: str | None = None
    run_ids: list[str] = []
    total: int = 0
    succeeded: int = 0
    dead_letters: int = 0
    dead_letters_by_class: dict[str, int] = {}
    personal_data: dict[str, int] = {}
    """What the personal-data policy found in the day's prompts, by "entity:action"."""
    open_items: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    done: bool = False
    no_data: str | None = None
    """Set on a day with no source rows (why): nothing was requested and nothing is open."""


class PartitionRunner:
    def __init__(
        self,
        settings: Settings,
        spec: PipelineSpec,
        instance: dg.DagsterInstance,
        *,
        approve_budget: bool = False,
        resources: dict[str, object] | None = None,
        poll_interval: float = 5.0,
        log_level: str = "INFO",
    ) -> None:
        self.log_level = log_level
        self.settings = settings
        self.spec = spec
        self.instance = instance
        self.approve_budget = approve_budget
        self.resources = resources if resources is not None else build_resources(settings)
        self.assets = build_pipeline_assets(spec, settings)
        self.poll_interval = poll_interval

    @property
    def ledger(self) -> LedgerResource:
        ledger = self.resources["ledger"]
        assert isinstance(ledger, LedgerResource)
        return ledger

    @property
    def storage(self) -> ArtifactStorage:
        storage = self.resources["storage"]
        assert isinstance(storage, ArtifactStorage)
        return storage

    @property
    def provider(self) -> BatchProvider:
        provider = self.resources[provider_resource_key(self.spec.model.provider)]
        assert isinstance(provider, BatchProvider)
        return provider

    def materialize(
        self, day: dt.date, step: steps.Step, progress: ProgressFn | None = None
    ) -> str:
        """Run the pipeline's job for the lifecycle action `step` on the day; its run id."""
        tags = {names.CREATED_BY_TAG: f"cli:{getpass.getuser()}"}
        if self.approve_budget:
            tags[names.APPROVE_BUDGET_TAG] = "true"
        with listening(progress):
            result = self._materialize(day, step, tags)
        if not result.success:
            raise failure_of(result)
        failpoint("runner.between_runs")
        return result.run_id

    @functools.cached_property
    def _definitions(self) -> dg.Definitions:
        jobs = build_lifecycle_jobs(self.spec).values()
        return dg.Definitions(assets=self.assets, jobs=list(jobs), resources=self.resources)

    def _materialize(self, day: dt.date, step: steps.Step, tags: dict[str, str]) -> ExecutionResult:
        if self.settings.executor == "celery":
            return self._execute_on_workers(day, step, tags)
        return self._definitions.resolve_job_def(job_name(self.spec, step)).execute_in_process(
            run_config={"loggers": {"console": {"config": {"log_level": self.log_level}}}},
            instance=self.instance,
            partition_key=day.isoformat(),
            asset_selection=asset_keys(self.spec, step),
            tags=tags,
            raise_on_error=False,
        )

    def _execute_on_workers(
        self, day: dt.date, step: steps.Step, tags: dict[str, str]
    ) -> ExecutionResult:
        """The run of the code location's job (llm_assets.definitions), whose executor sends
        each step to a Celery worker; this process waits for the run to end."""
        from dagster._core.definitions.reconstruct import ReconstructableRepository

        repository = ReconstructableRepository.for_module(
            "llm_assets.definitions", "defs", working_directory=str(Path.cwd())
        )
        job = repository.get_reconstructable_job(job_name(self.spec, step))
        with dg.execute_job(
            job,
            instance=self.instance,
            tags={**tags, "dagster/partition": day.isoformat()},
            raise_on_error=False,
        ) as result:
            return result

    def outcome(self, day: dt.date, run_ids: list[str]) -> DayOutcome:
        job = steps.existing_job(self.spec, day, self.ledger)
        counts = self.ledger.refresh_job(job.job_id)
        return DayOutcome(
            pipeline=self.spec.name,
            date=day,
            job_id=job.job_id,
            run_ids=run_ids,
            total=counts.total,
            succeeded=counts.succeeded,
            dead_letters=counts.dead_letters,
            dead_letters_by_class=counts.dead_letters_by_class,
            personal_data=job.personal_data,
            open_items=counts.open,
            input_tokens=counts.input_tokens,
            output_tokens=counts.output_tokens,
            cost_usd=counts.cost_usd,
            done=counts.open == 0,
        )

    def driver(
        self, day: dt.date, run_ids: list[str], progress: ProgressFn | None
    ) -> steps.DayDriver:
        """The day on this path: its heavy steps run as Dagster runs, polled at most
        `poll_interval` apart."""
        ctx = steps.StepContext(
            self.spec,
            day,
            self.ledger,
            self.storage,
            self.provider,
            created_by=f"cli:{getpass.getuser()}",
        )
        return steps.DayDriver(
            ctx, runs=_DagsterRuns(self, run_ids, progress), poll_every=self.poll_interval
        )

    def run_day(
        self,
        day: dt.date,
        *,
        wait: bool,
        progress: ProgressFn | None = None,
        max_rounds: int = 50,
    ) -> DayOutcome:
        """Submit the day; with `wait`, drive it (steps.drive: import, retry, finish) until
        every item is terminal. A paused pipeline is blocked (also one paused while this
        runs, once what is in flight has come back)."""
        paused = steps.pause_reason(self.ledger, self.spec.governing_pipeline)
        if paused:
            raise StepFailed(paused, gate="paused")
        run_ids: list[str] = []
        day_driver = self.driver(day, run_ids, progress)
        run_ids.append(self.materialize(day, steps.Step.BUILD, progress))
        if steps.no_source_rows(self.spec, day, self.storage):
            # request_shards made no job: nothing to wait for, import or report. The later
            # steps materialize the day as empty, as a UI "Materialize all" does.
            run_ids.append(self.materialize(day, steps.Step.IMPORT))
            return DayOutcome(
                pipeline=self.spec.name,
                date=day,
                run_ids=run_ids,
                done=True,
                no_data=steps.no_source_rows_reason(day),
            )
        if progress is not None:
            progress("submitted", 1, 1)
        if not wait:
            return self.outcome(day, run_ids)
        # Other runs of the same day (a sensor's, a backfill's) may import, plan and submit
        # some of its work meanwhile: the lifecycle reads the ledger, whoever did it.
        [decision] = steps.drive(
            [day_driver], progress=_progress_of(progress), max_imports=max_rounds
        ).values()
        if decision.blocked is not None:
            raise StepFailed(decision.blocked, gate=decision.gate)
        blocked = steps.settled_block(day_driver.ctx)
        if blocked is not None:
            raise StepFailed(f"quality gate: publication {blocked}", gate="quality")
        return self.outcome(day, run_ids)

    def cancel(
        self,
        day: dt.date,
        *,
        shard_ids: list[str] | None,
        reason: str,
        wait: bool,
        timeout: float,
        log: Callable[[str], None] | None = None,
    ) -> tuple[steps.CancelResult, bool]:
        """Cancel the day (`shard_ids` None) or the chosen shards (steps.cancel_day); with
        `wait`, drive the day until what was cancelled has settled and is imported: the whole
        day finished (or held by a gate with nothing under way), or the chosen shards imported.
        Returns the cancel and whether it settled within `timeout` seconds."""
        driver = self.driver(day, [], None)
        if log is not None:
            driver = dataclasses.replace(driver, ctx=dataclasses.replace(driver.ctx, log=log))
        result = steps.cancel_day(driver.ctx, shard_ids=shard_ids, reason=reason)
        if not wait or not result.settling:
            return result, not result.settling
        settling = set(result.settling)

        def settled(decision: steps.Decision) -> bool:
            if result.whole_day:
                return decision.done or (decision.blocked is not None and decision.settled)
            state = driver.last_state
            return state is not None and all(
                s.status == "imported" for s in state.shards if s.shard_id in settling
            )

        [decision] = steps.drive([driver], until=settled, timeout_seconds=timeout).values()
        return result, settled(decision)

    def announce(
        self, day: dt.date, failure: StepFailed | None = None
    ) -> notify.Announcement | None:
        """Announce the day's outcome once, by the notification sensors' rules
        (defs/notification_sensors.py): finished once the day is done, with its cost report's
        summary (which says when the quality gate blocked publication); failed when `failure`
        is a failed run of the day and nothing under way finishes the day. None when there is
        nothing to announce: the day is still open, a pause or a gate stopped it between runs,
        another run holds it."""
        if failure is not None and failure.run_id is not None:
            summary = self.failed_summary(day, failure)
        else:
            summary = self.finished_summary(day)
        if summary is None:
            return None
        return notify.announce(self.spec, summary, self.ledger)

    def failed_summary(self, day: dt.date, failure: StepFailed) -> notify.PartitionSummary | None:
        """The day's failed summary, when the failed run is the day's outcome."""
        if failure.day_busy or notify.under_way(self.spec, day, self.ledger):
            return None
        return notify.summarize(
            self.spec,
            day,
            self.ledger,
            outcome="failed",
            reason=failure.reason,
            run_id=failure.run_id,
        )

    def finished_summary(self, day: dt.date) -> notify.PartitionSummary | None:
        """The finished day's summary: its latest cost report's (`day_summary`), when that
        says what the ledger says now, else the same made afresh (a report written on another
        Dagster instance). None until the lifecycle finds every item terminal and the day
        validated and reported."""
        job = self.ledger.get_job(steps.job_id_of(self.spec, day))
        if job is None or job.reported_at is None or job.retention_expired_at is not None:
            return None
        if not self.driver(day, [], None).decide().done:
            return None
        now = notify.summarize(
            self.spec,
            day,
            self.ledger,
            outcome="finished",
            blocked=steps.publication_block(self.spec, day, self.storage),
        )
        report = dg.AssetRecordsFilter(
            asset_key=asset_key(self.spec, names.COST_REPORT), asset_partitions=[day.isoformat()]
        )
        records = self.instance.fetch_materializations(report, limit=1).records
        reported = reported_summary(records[0]) if records else None
        if reported is not None and reported.fingerprint() == now.fingerprint():
            return reported
        return now


class _DagsterRuns:
    """The CLI's way to run a day's heavy steps: Dagster runs on the persistent instance."""

    def __init__(
        self, runner: PartitionRunner, run_ids: list[str], progress: ProgressFn | None
    ) -> None:
        self.runner, self.run_ids, self.progress = runner, run_ids, progress

    def run(self, day: steps.DayDriver, action: steps.Action) -> None:
        shown = self.progress if action.step in (steps.Step.BUILD, steps.Step.SUBMIT) else None
        self.run_ids.append(self.runner.materialize(day.ctx.day, action.step, shown))


def _progress_of(
    progress: ProgressFn | None,
) -> "Callable[[steps.DayDriver, steps.Decision], None] | None":
    """The drive's rounds as the CLI's progress line: items answered of the day's items."""
    if progress is None:
        return None

    def show(day: steps.DayDriver, decision: steps.Decision) -> None:
        counts = day.counts
        stage = "waiting" if decision.wait_until or decision.others else "working"
        progress(stage, counts.terminal, counts.total)

    return show


def date_range(start: dt.date, end: dt.date | None) -> list[dt.date]:
    end = end or start
    if end < start:
        raise ValueError(f"--to {end} is before --date {start}")
    return [start + dt.timedelta(days=n) for n in range((end - start).days + 1)]


def persistent_instance(settings: Settings) -> dg.DagsterInstance:
    """The Dagster instance under DAGSTER_HOME (default: the settings' home), so script runs
    show in the UI."""
    os.environ.setdefault("DAGSTER_HOME", str(settings.dagster_home))
    home = Path(os.environ["DAGSTER_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    # Runs started together on a new home would each create the instance's SQLite storage
    # and stamp its schema twice; one at a time, the later ones find it made.
    fd = os.open(home / ".instance.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        with file_lock.exclusive(fd, blocking=True):
            config = home / "dagster.yaml"
            if not config.exists():
                # A local instance on SQLite under the home; production uses the repo's
                # dagster.yaml.
                config.write_text("telemetry:\n  enabled: false\nnux:\n  enabled: false\n")
            return dg.DagsterInstance.get()
    finally:
        os.close(fd)


def run_days(
    settings: Settings,
    spec: PipelineSpec,
    days: list[dt.date],
    *,
    wait: bool,
    approve_budget: bool,
    display: Progress,
    poll_interval: float = 30.0,
) -> list[DayOutcome]:
    """Run the days one after another on the persistent instance, a progress line per day;
    announce each day's outcome as it ends (PartitionRunner.announce)."""
    runner = PartitionRunner(
        settings,
        spec,
        persistent_instance(settings),
        approve_budget=approve_budget,
        poll_interval=poll_interval,
    )
    outcomes = []
    with display:
        for day in days:
            task = display.add_task(f"{spec.name} {day}", total=None)

            def report(
                stage: str, done: int, total: int, task: TaskID = task, day: dt.date = day
            ) -> None:
                display.update(
                    task, description=f"{spec.name} {day} {stage}", completed=done, total=total
                )

            try:
                outcome = runner.run_day(day, wait=wait, progress=report)
            except StepFailed as failure:
                _tell(display, spec, day, runner.announce(day, failure))
                raise
            _tell(display, spec, day, runner.announce(day))
            outcomes.append(outcome)
            done = f"no data ({outcome.no_data})" if outcome.no_data else "done"
            display.update(task, description=f"{spec.name} {day} {done}")
    return outcomes


def _tell(
    display: Progress, spec: PipelineSpec, day: dt.date, told: notify.Announcement | None
) -> None:
    """Say when the day's summary did not reach the webhook (the error's type and status,
    never the URL); a sent summary is on the day's cost report and in the ledger."""
    if told is not None and told.error:
        display.console.print(
            f"{spec.name} {day}: notification not delivered: {told.error}",
            markup=False,
            highlight=False,
        )
