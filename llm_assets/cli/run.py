"""`llm-assets run`: materialize a pipeline's days through Dagster, one day after another, and
print what each came to. A day a gate blocks stops the run (exit 2): the days before it are
shown as usual, then a summary of the blocked day (its items so far, cost and estimate, the
days not run) with the command to go on with, and the gate's reason on stderr. With
`--json` the same is one JSON list: an object per day run, then one for the day it stopped
at (`blocked` and its counts, or `failed`)."""

import dataclasses
import datetime as dt
import json
import sys
from typing import TYPE_CHECKING, Any

import click

from llm_assets.cli.args import (
    EXIT_ERROR,
    exit_for_failed_run,
    load_settings,
    parse_date,
    pipeline_spec,
    poll_interval_option,
)
from llm_assets.cli.console import note, progress_bar
from llm_assets.cli.day_report import BlockedDay, print_blocked, print_outcomes
from llm_assets.spec.model import PipelineSpec
from llm_assets.util.settings import Settings

if TYPE_CHECKING:
    from llm_assets.defs.run_failures import StepFailed
    from llm_assets.defs.runner import DayOutcome


@click.command()
@click.argument("pipeline")
@click.option("--date", "date_", required=True, help="Partition date, e.g. 2026-11-01.")
@click.option("--to", "to_", default=None, help="Last date of a range (inclusive).")
@click.option("--wait", is_flag=True, help="Drive each day until every item is terminal.")
@click.option("--approve-budget", is_flag=True, help="Submit even above the budget gate.")
@poll_interval_option("Longest wait between status polls of remote batches with --wait.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def run(
    pipeline: str,
    date_: str,
    to_: str | None,
    wait: bool,
    approve_budget: bool,
    poll_interval: float,
    as_json: bool,
) -> None:
    """Materialize a pipeline for a day or a range of days through Dagster."""
    from llm_assets.defs.run_failures import StepFailed
    from llm_assets.defs.runner import run_days

    settings = load_settings()
    spec = pipeline_spec(settings, pipeline)
    days = _partition_days(spec, date_, to_)
    outcomes: list[DayOutcome] = []
    for n, day in enumerate(days):
        try:
            outcomes += run_days(
                settings,
                spec,
                [day],
                wait=wait,
                approve_budget=approve_budget,
                display=progress_bar(),
                poll_interval=poll_interval,
            )
        except StepFailed as exc:
            blocked = None
            if exc.gate:
                blocked = _blocked_day(settings, spec, day, exc.gate, days[n + 1 :], wait)
            if as_json:
                held = [_held_json(spec.name, day, exc, blocked)]
                click.echo(json.dumps([*map(_outcome_json, outcomes), *held], indent=2))
            else:
                if outcomes:
                    print_outcomes(outcomes, settings.home)
                if blocked is not None:
                    print_blocked(blocked)
            exit_for_failed_run(exc, settings.home)
    if as_json:
        click.echo(json.dumps([_outcome_json(o) for o in outcomes], indent=2))
    else:
        print_outcomes(outcomes, settings.home)
    if wait and any(not o.done for o in outcomes):
        note("some items are still open; see `llm-assets status`")
        sys.exit(EXIT_ERROR)


def _outcome_json(outcome: "DayOutcome") -> dict[str, Any]:
    return outcome.model_dump(mode="json")


def _held_json(
    pipeline: str, day: dt.date, failure: "StepFailed", blocked: BlockedDay | None
) -> dict[str, Any]:
    """The day a run stopped at, for `run --json`: what blocked it (a gate: `blocked`, with
    the ledger's counts and the command that goes on) or that a run of it failed."""
    held: dict[str, Any] = {"pipeline": pipeline, "date": day.isoformat(), "done": False}
    if blocked is None:
        return held | {"failed": failure.reason, "run_id": failure.run_id}
    fields = dataclasses.asdict(blocked)
    fields.pop("day")
    return held | {
        "blocked": blocked.gate,
        "reason": str(failure),
        **{k: v for k, v in fields.items() if k not in ("pipeline", "gate", "not_run")},
        "not_run": [d.isoformat() for d in blocked.not_run],
    }


def _partition_days(spec: PipelineSpec, date_: str, to_: str | None) -> list[dt.date]:
    """The days from --date to --to, each a partition of the pipeline."""
    from llm_assets.defs.factory import partitions_for
    from llm_assets.defs.runner import date_range

    start = parse_date(date_)
    assert start is not None
    try:
        days = date_range(start, parse_date(to_))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    partitions = partitions_for(spec)
    outside = [d for d in days if not partitions.has_partition_key(d.isoformat())]
    if outside:
        raise click.BadParameter(
            f"{outside[0]} is not a partition of {spec.name}: partitions run from "
            f"{spec.partitions.start_date} to today in {spec.partitions.timezone}"
        )
    return days


def _blocked_day(
    settings: Settings,
    spec: PipelineSpec,
    day: dt.date,
    gate: str,
    not_run: list[dt.date],
    wait: bool,
) -> BlockedDay:
    """The blocked day as the ledger has it, and the command that goes on from it."""
    from llm_assets import steps
    from llm_assets.resources import build_resources

    last = not_run[-1] if not_run else day
    again = f"llm-assets run {spec.name} --date {day}" + (f" --to {last}" if last != day else "")
    again += " --wait" if wait else ""
    blocked = BlockedDay(
        spec.name, day, gate, next_step(gate, spec.name, day, again), not_run=not_run
    )
    ledger = build_resources(settings)["ledger"]
    try:
        job = steps.existing_job(spec, day, ledger)
    except steps.MissingPrerequisite:
        return blocked
    counts = ledger.counts(job.job_id)
    costs = ledger.job_cost_rows(spec.name, day, day)
    cost = next((r for r in costs if r["job_id"] == job.job_id), None)
    return dataclasses.replace(
        blocked,
        job_id=job.job_id,
        items=counts.total,
        by_status=counts.by_status,
        dead_letters_by_class=counts.dead_letters_by_class,
        input_tokens=counts.input_tokens,
        output_tokens=counts.output_tokens,
        cost_usd=counts.cost_usd,
        estimated_cost_usd=cost["estimated_cost_usd"] if cost else None,
        estimated_cost_upper_usd=cost["estimated_cost_upper_usd"] if cost else None,
    )


def next_step(gate: str, pipeline: str, day: dt.date, again: str) -> str:
    """What an operator runs after `gate` blocked the day; `again` runs it (and the days
    after it) once more."""
    day_args = f"{pipeline} --date {day}"
    steps_by_gate = {
        "budget": f"`{again} --approve-budget` (or raise budget.max_usd_per_partition)",
        "pipeline_budget": f"`llm-assets costs {pipeline}` shows what is spent; `{again}` once "
        "settled costs leave room or the caps are raised",
        "compliance": f"`llm-assets dead-letter {day_args}` lists the blocked items; fix the "
        f"source rows or compliance.pii, or raise compliance.max_blocked_rate, then `{again}`",
        "quality": f"`llm-assets dead-letter {day_args}` lists the failures; fix the prompt or "
        f"the rules, then `llm-assets requeue {day_args} --class quality` and `{again}`",
        "paused": f"`llm-assets resume {pipeline}`, then `{again}`",
        "residency": "change the provider, endpoint, region or bucket, or "
        f"compliance.allowed_regions, then `{again}`",
        "cancelled": f"`llm-assets requeue {day_args} --class cancelled`, then `{again}`",
    }
    return steps_by_gate.get(gate, f"`llm-assets status {day_args}` shows what holds it")
