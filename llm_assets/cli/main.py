"""`llm-assets`: the command line for scripts and cron (exit 0 done, 2 gate, 1 error).

Commands import Dagster, the runner, the steps and the resources inside their bodies: those
imports take seconds, and `--help` or `validate-spec` need none of them. `run` is in run.py;
what the commands print is laid out in day_report.py, ledger_report.py and eval_report.py.
"""

import datetime as dt
import getpass
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.text import Text

from llm_assets.cli.args import (
    EXIT_ERROR,
    EXIT_GATE,
    current_job,
    load_settings,
    parse_date,
    pipeline_spec,
)
from llm_assets.cli.console import console, err, note, print_error, say
from llm_assets.cli.day_report import print_status
from llm_assets.cli.evaluate import eval_
from llm_assets.cli.ledger_report import print_costs, print_csv, print_dead_letters
from llm_assets.cli.operator import cancel, pause, quotas, resume, retention
from llm_assets.cli.prices import prices
from llm_assets.cli.promote import promote
from llm_assets.cli.run import run
from llm_assets.spec.load import SpecError, check_specs
from llm_assets.spec.model import PipelineSpec

if TYPE_CHECKING:
    from llm_assets.resources.ledger import JobRecord, LedgerResource, PipelinePause


class _Cli(click.Group):
    """Exit 2 means "blocked by a gate" here, so usage errors exit 1 like other errors. A
    ledger that cannot be opened is one line naming its URL with the password masked."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            return super().main(*args, **kwargs)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            exc.show()
            sys.exit(EXIT_ERROR)
        except click.exceptions.Abort:
            err.print("aborted")
            sys.exit(EXIT_ERROR)
        except Exception as exc:
            # Raised only once the ledger was used, so this import is already done.
            from llm_assets.resources.ledger import LedgerUnavailable

            if not isinstance(exc, LedgerUnavailable):
                raise
            print_error(str(exc))
            sys.exit(EXIT_ERROR)


@click.group(cls=_Cli)
def main() -> None:
    """Offline LLM batch work as Dagster assets."""


@main.command("validate-spec")
@click.argument("path", required=False, type=click.Path(path_type=Path))
def validate_spec(path: Path | None) -> None:
    """Check pipeline specs (a file or folder; default LLM_ASSETS_PIPELINES)."""
    target = path or load_settings().pipelines_dir
    try:
        specs, problems = check_specs(target)
    except SpecError as exc:
        specs, problems = [], exc.problems
    for problem in problems:
        print_error(str(problem))
    if problems:
        note(f"{len(problems)} problem(s) in {target}")
        sys.exit(EXIT_ERROR)
    for spec in specs:
        # One line per spec, whatever the width: a path to copy.
        console.print(Text(f"ok {spec.path}: pipeline {spec.name}"), soft_wrap=True)


@main.command()
@click.argument("pipeline")
@click.option("--date", "date_", required=True)
@click.option("--json", "as_json", is_flag=True)
def status(pipeline: str, date_: str, as_json: bool) -> None:
    """Jobs, shards and item counts of one partition, from the ledger."""
    from llm_assets.resources import build_resources
    from llm_assets.resources.providers import provider_resource_key

    settings = load_settings()
    spec = pipeline_spec(settings, pipeline)
    day = parse_date(date_)
    assert day is not None
    from llm_assets import steps

    resources = build_resources(settings)
    ledger = resources["ledger"]
    provider = resources.get(provider_resource_key(spec.model.provider))
    floor = getattr(provider, "stuck_after_seconds", 3600.0)
    jobs = [
        _job_status(ledger, spec, job, floor) for job in ledger.jobs_for_partition(spec.name, day)
    ]
    empty = steps.no_source_rows(spec, day, resources["storage"])
    no_data = steps.no_source_rows_reason(day) if empty else None
    # The gate that holds the day's publication, as a sentence; None when none does.
    blocked = steps.publication_block(spec, day, resources["storage"])
    pause = ledger.pipeline_pause(spec.name)
    if as_json:
        report = {
            "pipeline": spec.name,
            "date": day.isoformat(),
            "paused": None if pause is None else _pause_json(pause),
            "no_data": no_data,
            "blocked": blocked,
            "jobs": jobs,
        }
        click.echo(json.dumps(report, indent=2))
        return
    paused = steps.paused_text(pause) if pause is not None else None
    print_status(spec.name, day, jobs, no_data, blocked=blocked, paused=paused, home=settings.home)


def _pause_json(pause: "PipelinePause") -> dict[str, Any]:
    """The pipeline's pause in `status --json`: who, when, why and the sentence `run` prints."""
    from llm_assets import steps

    return {
        "paused_by": pause.paused_by,
        "paused_at": pause.paused_at.astimezone(dt.UTC).isoformat(),
        "reason": pause.reason,
        "text": steps.paused_text(pause),
    }


def _job_status(
    ledger: "LedgerResource", spec: PipelineSpec, job: "JobRecord", stuck_floor: float
) -> dict[str, Any]:
    """One job of `status --json`: its counts, whether it is the spec's current one, its
    shards, and its batches stuck before they started (steps/stuck.py)."""
    from llm_assets.steps import stuck

    counts = ledger.counts(job.job_id)
    found = stuck.stuck_batches(ledger, job.job_id, job.provider, job.model_name, stuck_floor)
    return {
        "job_id": job.job_id,
        "prompt_version": job.prompt_version,
        "provider": job.provider,
        "model": job.model_name,
        "status": "cancelled"
        if job.cancelled_at is not None
        else "completed"
        if counts.total and counts.open == 0
        else job.status,
        "cancelled": (
            {
                "at": job.cancelled_at.isoformat(),
                "by": job.cancelled_by,
                "reason": job.cancel_reason,
            }
            if job.cancelled_at is not None
            else None
        ),
        "current": job.prompt_version == spec.prompt.version and job.model_name == spec.model.name,
        "items": counts.total,
        "by_status": counts.by_status,
        "dead_letters_by_class": counts.dead_letters_by_class,
        "personal_data": job.personal_data,
        "input_tokens": counts.input_tokens,
        "output_tokens": counts.output_tokens,
        "cost_usd": round(counts.cost_usd, 6),
        "shards": [
            {
                "shard_id": s.shard_id,
                "status": s.status,
                "provider_status": s.raw_status,
                "provider_batch_id": s.provider_batch_id,
                "cancelled": s.cancelled_at is not None,
                "requests": s.item_count,
                "completed_requests": s.completed_requests,
                "failed_requests": s.failed_requests,
                "message": s.message,
                "not_before": s.not_before.isoformat() if s.not_before else None,
            }
            for s in ledger.shards(job.job_id)
        ],
        "stuck": [
            {
                "shard_id": s.shard_id,
                "provider_batch_id": s.provider_batch_id,
                "provider_status": s.provider_status,
                "waited_seconds": round(s.waited.total_seconds()),
            }
            for s in found
        ],
        "stuck_text": stuck.stuck_words(spec.name, job.partition_date, job.model_name, found)
        if found
        else None,
    }


_COST_SUMS = ("items", "succeeded", "dead_letters", "input_tokens", "output_tokens")
_COST_MONEY = ("cost_usd", "retry_cost_usd", "estimated_cost_usd", "estimated_cost_upper_usd")


@main.command()
@click.argument("pipeline")
@click.option("--from", "from_", default=None, help="First partition date (inclusive).")
@click.option("--to", "to_", default=None, help="Last partition date (inclusive).")
@click.option("--json", "as_json", is_flag=True, help="Rows and totals as JSON.")
def costs(pipeline: str, from_: str | None, to_: str | None, as_json: bool) -> None:
    """Tokens and cost per day and model, with retry overhead and the estimate."""
    from llm_assets.resources import build_resources

    settings = load_settings()
    spec = pipeline_spec(settings, pipeline)
    start, end = parse_date(from_), parse_date(to_)
    if start and end and end < start:
        raise click.BadParameter(f"--to {end} is before --from {start}")
    resources = build_resources(settings)
    ledger = resources["ledger"]
    rows = ledger.job_cost_rows(spec.name, start, end)
    no_data = _no_data_days(spec, resources["storage"], start, end, rows)
    total: dict[str, Any] = {k: sum(r[k] for r in rows) for k in _COST_SUMS}
    total |= {k: round(sum(r[k] for r in rows), 6) for k in _COST_MONEY}
    months: dict[str, float] = {}
    for row in rows:
        months[row["date"][:7]] = months.get(row["date"][:7], 0.0) + row["cost_usd"]
    as_of = rows[-1]["date"] if rows else None
    notes = _zero_cost_notes(rows)
    if not as_json:
        print_costs(spec.name, rows, total, months, no_data, as_of=as_of, zero_cost_notes=notes)
        return
    report = {
        "pipeline": spec.name,
        "from": start.isoformat() if start else None,
        "to": end.isoformat() if end else None,
        "rows": [{**r, **{k: round(r[k], 6) for k in _COST_MONEY}} for r in rows],
        "months": {m: round(v, 6) for m, v in months.items()},
        "months_as_of": as_of,
        "total": total,
        "zero_cost_reasons": notes,
        "no_data": no_data,
    }
    click.echo(json.dumps(report, indent=2))


def _zero_cost_notes(rows: list[dict[str, Any]]) -> list[str]:
    """Why each $0 cost of `rows` is zero: the price table's entry of a model priced at $0
    (once per model, with the date of its prices), or nothing billed yet."""
    from llm_assets.resources.pricing import load_price_table, zero_price_reason

    table = load_price_table()
    notes: list[str] = []
    for row in rows:
        if row["cost_usd"]:
            continue
        model = f"{row['provider']}/{row['model']}"
        price = table.find(row["provider"], row["model"])
        reason = zero_price_reason(price) if price else None
        if reason and price:
            note = f"{reason} (prices as of {price.as_of or table.prices_as_of})"
        elif row["input_tokens"] or row["output_tokens"]:
            note = f"{row['date']} {model}: billed at the $0 price in force when it was sent"
        else:
            still_open = row["items"] - row["succeeded"] - row["dead_letters"]
            why = f"{still_open:,} items still open" if still_open else "no item reached it"
            note = f"{row['date']} {model}: no tokens billed yet ({why})"
        if note not in notes:
            notes.append(note)
    return notes


def _no_data_days(
    spec: PipelineSpec,
    storage: Any,
    start: dt.date | None,
    end: dt.date | None,
    rows: list[dict[str, Any]],
) -> list[str]:
    """The days from `start` (else the first costed day) to `end` (else the last) with no
    job whose snapshot has no source rows: `costs` names them as "no data", not as zero."""
    from llm_assets import steps

    dates = sorted(r["date"] for r in rows)
    first = start or (dt.date.fromisoformat(dates[0]) if dates else None)
    last = end or (dt.date.fromisoformat(dates[-1]) if dates else None)
    if first is None or last is None:
        return []
    costed = set(dates)
    days = (first + dt.timedelta(days=n) for n in range((last - first).days + 1))
    return [
        d.isoformat()
        for d in days
        if d.isoformat() not in costed and steps.no_source_rows(spec, d, storage)
    ]


@main.command("dead-letter")
@click.argument("pipeline")
@click.option("--date", "date_", required=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON array.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV with a header row.")
def dead_letter(pipeline: str, date_: str, as_json: bool, as_csv: bool) -> None:
    """Items of a partition that will not succeed, with class, code, reason and attempts."""
    settings = load_settings()
    spec = pipeline_spec(settings, pipeline)
    day = parse_date(date_)
    assert day is not None
    resources, job = current_job(settings, spec, day)
    rows = list(resources["ledger"].iter_dead_letters(job.job_id))
    if as_json:
        click.echo(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    if as_csv:
        columns = ["custom_id", "source_id", "error_class", "error_code", "error_message"]
        columns += ["attempts", "last_provider_batch"]
        print_csv(columns, rows)
        return
    print_dead_letters(spec.name, day, job.job_id, rows, settings.home)


@main.command()
@click.argument("pipeline")
@click.option("--date", "date_", required=True)
@click.option(
    "--class",
    "classes",
    multiple=True,
    type=click.Choice(
        ["input", "deterministic", "transient", "expired", "quality", "cancelled", "compliance"]
    ),
    help="Requeue dead letters of this class (repeatable).",
)
@click.option("--ids", default=None, help="Comma-separated source ids or custom_ids.")
def requeue(pipeline: str, date_: str, classes: tuple[str, ...], ids: str | None) -> None:
    """Send chosen dead letters back (after fixing the prompt or the data); `run` submits them."""
    from llm_assets import steps
    from llm_assets.resources.providers import provider_resource_key

    if not classes and not ids:
        raise click.UsageError("choose what to requeue with --class and/or --ids")
    settings = load_settings()
    spec = pipeline_spec(settings, pipeline)
    day = parse_date(date_)
    assert day is not None
    resources, job = current_job(settings, spec, day)
    if job.retention_expired_at is not None:
        # Asked before the requeue takes the day up (it lifts a cancel first).
        print_error(str(steps.DayExpired(spec, job)))
        sys.exit(EXIT_ERROR)
    ledger = resources["ledger"]
    chosen = None
    unknown: list[str] = []
    if ids:
        chosen, unknown = _known_ids(ledger, job.job_id, ids, set(classes))
        if unknown:
            print_error(
                f"{', '.join(unknown)}: no dead letter of {spec.name} {day}"
                + (f" of class {', '.join(sorted(classes))}" if classes else "")
                + f" has {'this id' if len(unknown) == 1 else 'these ids'}; "
                f"`llm-assets dead-letter {spec.name} --date {day}` lists them"
            )
        if not chosen:
            note("nothing requeued")
            sys.exit(EXIT_ERROR)
    result = steps.requeue_dead_letters(
        steps.StepContext(
            spec,
            day,
            ledger,
            resources["storage"],
            resources[provider_resource_key(spec.model.provider)],
            created_by=f"cli:{getpass.getuser()} requeue",
            log=lambda message: note(message, home=settings.home),
        ),
        classes=set(classes) or None,
        chosen_ids=chosen,
    )
    for custom_id, reason in sorted(result.still_invalid.items()):
        note(f"still invalid, not requeued: {custom_id}: {reason}", home=settings.home)
    say(
        f"requeued {result.requeued} dead letters into {len(result.shards)} shard(s); "
        f"`llm-assets run {spec.name} --date {day} --wait` sends them"
    )
    if unknown:
        sys.exit(EXIT_ERROR)


def _known_ids(
    ledger: "LedgerResource", job_id: str, ids: str, classes: set[str]
) -> tuple[set[str], list[str]]:
    """(the ids of --ids that name a dead letter of the job, of `classes` when given; the
    others, in the order given). An id is a source id or a custom_id."""
    given = list(dict.fromkeys(i.strip() for i in ids.split(",") if i.strip()))
    names: set[str] = set()
    for row in ledger.iter_dead_letters(job_id):
        if not classes or row["error_class"] in classes:
            names.update(x for x in (row["custom_id"], row["source_id"]) if x is not None)
    return {i for i in given if i in names}, [i for i in given if i not in names]


@main.command()
@click.option("--days", default=3, show_default=True, help="How many days of tickets.")
@click.option("--per-day", default=120, show_default=True, help="Tickets per day.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print what the demo did as JSON on stdout (the tables go to stderr).",
)
def demo(days: int, per_day: int, as_json: bool) -> None:
    """Generate support tickets and run the demo pipeline end to end on the local provider:
    the days, one cancelled and requeued, an empty day, a day blocked by the strict
    pipeline's quality gate, then the eval of the pipeline's variants."""
    from llm_assets.cli.console import err
    from llm_assets.defs.run_failures import StepFailed
    from llm_assets.demo.run import run_demo

    try:
        done = run_demo(
            load_settings(), days=days, per_day=per_day, console=err if as_json else console
        )
    except StepFailed as exc:
        print_error(str(exc), label="failed:")
        sys.exit(EXIT_GATE if exc.gate else EXIT_ERROR)
    if as_json:
        click.echo(json.dumps(done, indent=2))


for _command in (cancel, eval_, pause, prices, quotas, resume, retention, promote, run):
    main.add_command(_command)

if __name__ == "__main__":
    main()
