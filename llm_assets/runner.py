"""Drive a partition through Dagster from a script: what `llm-assets run --wait` does.

Every step runs as a real Dagster run on a persistent instance, so it shows in the UI. Only
the waiting happens here: between runs, in-flight batches are polled with cheap status calls
(the same call the status sensor makes), never from inside an asset. `run_days` drives a
range of days one after another with a progress line each, for `llm-assets run` and the demo.
"""

import datetime as dt
import getpass
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import dagster as dg
from pydantic import BaseModel
from rich.progress import Progress, TaskID

from llm_assets import file_lock, steps
from llm_assets.checks import CHECK_GATES
from llm_assets.factory import APPROVE_BUDGET_TAG, CREATED_BY_TAG, asset_key, build_pipeline_assets
from llm_assets.failpoints import failpoint
from llm_assets.progress import listening
from llm_assets.resources import build_resources
from llm_assets.resources.ledger import LedgerResource, ShardRecord, utcnow
from llm_assets.resources.providers import provider_resource_key
from llm_assets.resources.providers.base import IN_FLIGHT_STATES, BatchProvider
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.settings import Settings
from llm_assets.spec import PipelineSpec

SUBMIT_STEPS = ("input_snapshot", "request_shards", "provider_batches")
IMPORT_STEPS = ("batch_results",)
GATED_STEPS = ("validated_outputs", "published_outputs", "qa_sample")
REPORT_STEPS = ("dead_letter", "cost_report")


class StepFailed(Exception):
    """A Dagster run failed; `gate` is set when a gate blocked it (CLI exit code 2)."""

    def __init__(self, message: str, gate: str | None = None) -> None:
        self.gate = gate
        super().__init__(message)


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


ProgressFn = Callable[[str, int, int], None]


def failure_of(result: dg.ExecuteInProcessResult) -> StepFailed:
    failed_checks = [
        e
        for e in result.get_asset_check_evaluations()
        if not e.passed and e.severity == dg.AssetCheckSeverity.ERROR
    ]
    if failed_checks:
        gate = next(
            (CHECK_GATES[e.check_name] for e in failed_checks if e.check_name in CHECK_GATES),
            "quality",
        )
        reasons = "; ".join(
            f"{e.asset_key.to_user_string()} check {e.check_name} failed"
            + (f": {e.description}" if e.description else "")
            for e in failed_checks
        )
        return StepFailed(f"{gate} gate: {reasons}", gate=gate)
    for event in result.all_events:
        if not event.is_step_failure:
            continue
        data = event.step_failure_data
        gate = None
        if data.user_failure_data is not None:
            gate_value = data.user_failure_data.metadata.get("gate")
            gate = getattr(gate_value, "value", None) if gate_value is not None else None
        return StepFailed(f"{event.step_key}: {step_failure_reason(event)}", gate=gate)
    return StepFailed(f"run {result.run_id} failed")


def step_failure_reason(event: dg.DagsterEvent) -> str:
    """What a failed step says went wrong: our Failure's description, else the real error."""
    data = event.step_failure_data
    if data.user_failure_data is not None and data.user_failure_data.description:
        return data.user_failure_data.description
    if data.error is not None:
        # The step error wraps the real one; the cause says what went wrong.
        return (data.error.cause or data.error).message.strip()
    return event.message or "failed"


def shards_being_submitted(ledger: LedgerResource, job_id: str) -> int:
    """How many of the day's waiting shards another run is submitting right now (it holds
    their submission locks): they will be in flight, so a run waits for them too."""
    busy = 0
    for shard in ledger.shards(job_id, ["created"]):
        with ledger.submission_lock(shard.shard_id) as free:
            busy += not free
    return busy


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
        self, day: dt.date, step_names: Sequence[str], progress: ProgressFn | None = None
    ) -> str:
        tags = {CREATED_BY_TAG: f"cli:{getpass.getuser()}"}
        if self.approve_budget:
            tags[APPROVE_BUDGET_TAG] = "true"
        with listening(progress):
            result = self._materialize(day, step_names, tags)
        if not result.success:
            raise failure_of(result)
        failpoint("runner.between_runs")
        return result.run_id

    def _materialize(
        self, day: dt.date, step_names: Sequence[str], tags: dict[str, str]
    ) -> dg.ExecuteInProcessResult:
        return dg.materialize(
            self.assets,
            run_config={"loggers": {"console": {"config": {"log_level": self.log_level}}}},
            instance=self.instance,
            resources=self.resources,
            partition_key=day.isoformat(),
            selection=[asset_key(self.spec, s) for s in step_names],
            tags=tags,
            raise_on_error=False,
        )

    def wait_for_batches(self, day: dt.date, progress: ProgressFn | None = None) -> None:
        """Poll in-flight shards until none is left; the local provider works when polled."""
        job = steps.existing_job(self.spec, day, self.ledger)
        interval = 0.0
        while True:
            shards = self.ledger.shards(job.job_id, IN_FLIGHT_STATES)
            elsewhere = self.being_submitted_elsewhere(job.job_id)
            if not shards and not elsewhere:
                return
            shards = steps.poll_shards(self.ledger, self.provider, shards)
            total = sum(s.item_count for s in shards)
            done = sum(s.completed_requests + s.failed_requests for s in shards)
            if progress is not None:
                progress("provider", min(done, total), total)
            if elsewhere or (
                any(s.status in IN_FLIGHT_STATES for s in shards)
                and not self.provider.ends_when_polled
            ):
                interval = min(max(interval * 2, 1.0), self.poll_interval)
                time.sleep(interval)

    def being_submitted_elsewhere(self, job_id: str) -> int:
        return shards_being_submitted(self.ledger, job_id)

    def wait_for_backoff(self, planned: list[ShardRecord], progress: ProgressFn | None) -> None:
        """Retry rounds wait out their backoff here, in the CLI, never inside an asset."""
        due = [s.not_before for s in planned if s.not_before is not None]
        if not due:
            return
        seconds = (min(due) - utcnow()).total_seconds()
        if seconds > 0:
            if progress is not None:
                progress(f"retry backoff {seconds:.0f}s", 0, 1)
            time.sleep(seconds)

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

    def refuse_if_paused(self) -> None:
        """A paused pipeline is not driven: blocked (exit 2), saying who paused it and why."""
        paused = steps.pause_reason(self.ledger, self.spec.name)
        if paused:
            raise StepFailed(paused, gate="paused")

    def run_day(
        self,
        day: dt.date,
        *,
        wait: bool,
        progress: ProgressFn | None = None,
        max_rounds: int = 50,
    ) -> DayOutcome:
        """Submit the day; with `wait`, import, retry and finish until every item is terminal.
        A paused pipeline (also one paused while this runs) is blocked."""
        self.refuse_if_paused()
        run_ids = [self.materialize(day, SUBMIT_STEPS, progress)]
        self.refuse_if_paused()
        if steps.no_source_rows(self.spec, day, self.storage):
            # request_shards made no job: there is nothing to wait for, import or report.
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
        # some of its work meanwhile: the day is done when no item is open, whoever did it.
        for _ in range(max_rounds):
            self.wait_for_batches(day, progress)
            run_ids.append(self.materialize(day, IMPORT_STEPS))
            job = steps.existing_job(self.spec, day, self.ledger)
            if self.ledger.counts(job.job_id).open == 0:
                break
            planned = self.ledger.shards(job.job_id, ["created"])
            if planned:
                self.wait_for_backoff(planned, progress)
                run_ids.append(self.materialize(day, ("provider_batches",), progress))
                self.refuse_if_paused()
        # Validation gates publication (a blocked day is skipped, not failed); dead letters
        # and costs are reported either way, then a blocked day exits as blocked.
        run_ids.append(self.materialize(day, GATED_STEPS))
        run_ids.append(self.materialize(day, REPORT_STEPS))
        blocked = steps.publication_block(self.spec, day, self.storage)
        if blocked is not None:
            raise StepFailed(f"quality gate: publication {blocked}", gate="quality")
        return self.outcome(day, run_ids)


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
    """Run the days one after another on the persistent instance, a progress line per day."""
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

            outcome = runner.run_day(day, wait=wait, progress=report)
            outcomes.append(outcome)
            done = f"no data ({outcome.no_data})" if outcome.no_data else "done"
            display.update(task, description=f"{spec.name} {day} {done}")
    return outcomes
