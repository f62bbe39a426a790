"""The days `llm-assets demo` adds so that the UI tour (docs/ui.md) has every kind of day to
show: one cancelled after its submission and then requeued, one without tickets, and the
first day again on `support_tickets_strict`, whose quality gate blocks its publication."""

import datetime as dt
import shutil
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from llm_assets import steps
from llm_assets.cli.console import progress_bar
from llm_assets.defs.run_failures import StepFailed
from llm_assets.defs.runner import (
    DayOutcome,
    PartitionRunner,
    persistent_instance,
    run_days,
)
from llm_assets.spec.load import load_specs
from llm_assets.spec.model import PipelineSpec
from llm_assets.util.settings import Settings

STRICT_PIPELINE = "support_tickets_strict"
CANCEL_REASON = "the demo: cancelled after its submission, then requeued"


@dataclass(frozen=True)
class CancelledDay:
    outcome: DayOutcome
    """The day once its requeued items have finished."""
    cancelled: int
    """Items the cancel stopped: cancelled dead letters until the requeue."""
    requeued: int


def cancel_and_requeue(settings: Settings, spec: PipelineSpec, day: dt.date) -> CancelledDay:
    """Submit the day, cancel it while its batches are in flight (the local provider works
    only when polled, so nothing has been answered yet), requeue the cancelled items and run
    the day to its end: what `llm-assets run`, `cancel`, `requeue --class cancelled` and
    `run --wait` do one after another."""
    run_day(settings, spec, day, wait=False)
    runner = PartitionRunner(settings, spec, persistent_instance(settings))
    runner.cancel(day, shard_ids=None, reason=CANCEL_REASON, wait=True, timeout=300.0)
    job = steps.existing_job(spec, day, runner.ledger)
    cancelled = runner.ledger.refresh_job(job.job_id).dead_letters_by_class.get("cancelled", 0)
    requeued = steps.requeue_dead_letters(
        steps.StepContext(
            spec, day, runner.ledger, runner.storage, runner.provider, created_by="demo requeue"
        ),
        classes={"cancelled"},
        chosen_ids=None,
    )
    outcome = run_day(settings, spec, day)
    return CancelledDay(outcome=outcome, cancelled=cancelled, requeued=requeued.requeued)


def run_blocked_day(settings: Settings, day: dt.date, console: Console) -> str | None:
    """Run `day` of the strict pipeline on a copy of the day's tickets; what held it (the
    quality gate's "publication blocked by ..."), or None when the pipelines folder has no
    strict pipeline (LLM_ASSETS_PIPELINES names another folder) or the gate let it through."""
    specs = {s.name: s for s in load_specs(settings.pipelines_dir)}
    spec = specs.get(STRICT_PIPELINE)
    if spec is None:
        console.print(
            f"no {STRICT_PIPELINE} pipeline in {settings.pipelines_dir}: no blocked day",
            highlight=False,
        )
        return None
    # The strict spec's source folder (demo/strict/), filled from the demo's inbox.
    inbox = Path(settings.resolve_source_uri(spec.source.uri)).parent
    inbox.mkdir(parents=True, exist_ok=True)
    for path in (settings.home / "demo" / "inbox").glob(f"*{day.isoformat()}*.jsonl"):
        shutil.copyfile(path, inbox / path.name)
    try:
        run_day(settings, spec, day)
    except StepFailed as held:
        if held.gate != "quality":
            raise
        return held.reason
    return None


def run_day(
    settings: Settings, spec: PipelineSpec, day: dt.date, *, wait: bool = True
) -> DayOutcome:
    """One day as `llm-assets run` runs it, with its progress line."""
    [outcome] = run_days(
        settings, spec, [day], wait=wait, approve_budget=False, display=progress_bar()
    )
    return outcome
