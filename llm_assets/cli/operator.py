"""The operator's commands: `cancel` a day or some of its shards, `pause` and `resume` a
pipeline, apply its `retention` now.

`cancel` records the cancel and lets the day's lifecycle carry it out (steps/cancel.py): a
submission that created a batch without recording it is reconciled first, batches in flight
are cancelled, shards not sent are closed. Unless `--no-wait`, it then drives the day (the
same loop as `run --wait`) until the cancelled batches have settled and what they answered is
imported, and reports the day: every item ends succeeded or a dead letter, the unanswered
ones `cancelled`, which `llm-assets requeue --class cancelled` sends again. PIPELINE may name
an eval's pipeline (`<pipeline>__<variant>__<digest>`, as `llm-assets eval` prints it).
"""

import datetime as dt
import getpass
import sys
from typing import TYPE_CHECKING

import click

from llm_assets.cli.args import EXIT_ERROR, day_of, load_settings, pipeline_spec
from llm_assets.cli.console import console, note, say
from llm_assets.cli.ledger_report import print_pause_change, print_quotas
from llm_assets.cli.text import count_words
from llm_assets.util.words import plural

if TYPE_CHECKING:
    from llm_assets.resources.ledger import LedgerResource


@click.command()
@click.argument("pipeline")
@click.option("--date", "date_", required=True)
@click.option(
    "--shard",
    "shards",
    multiple=True,
    help="A shard to cancel (its id or the short form `status` prints; repeatable). "
    "Without it the whole day is cancelled, and its later submissions stop until a requeue.",
)
@click.option("--reason", default=None, help="Why; kept on the day and in each dead letter.")
@click.option("--no-wait", is_flag=True, help="Cancel and return; the sensor imports later.")
@click.option("--timeout", default=900.0, show_default=True, help="Seconds to wait to settle.")
@click.option("--poll-interval", default=5.0, show_default=True)
def cancel(
    pipeline: str,
    date_: str,
    shards: tuple[str, ...],
    reason: str | None,
    no_wait: bool,
    timeout: float,
    poll_interval: float,
) -> None:
    """Cancel a day (or shards of it): batches in flight are cancelled and imported."""
    from llm_assets.defs.runner import PartitionRunner, persistent_instance

    settings = load_settings()
    spec, resources, job = day_of(settings, pipeline, date_)
    day = job.partition_date
    runner = PartitionRunner(
        settings,
        spec,
        persistent_instance(settings),
        resources=resources,
        poll_interval=poll_interval,
    )
    try:
        result, settled = runner.cancel(
            day,
            shard_ids=list(shards) or None,
            reason=reason or f"cancelled by {getpass.getuser()}",
            wait=not no_wait,
            timeout=timeout,
            log=lambda message: note(message, home=settings.home),
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    if result.settling and not no_wait and not settled:
        note(
            f"the cancelled batches are still winding down after {timeout:.0f}s; "
            "the batch-status sensor imports them when they end"
        )
    _report(spec.name, day, resources["ledger"], job.job_id, waited=settled)


def _report(
    pipeline: str, day: dt.date, ledger: "LedgerResource", job_id: str, *, waited: bool
) -> None:
    counts = ledger.refresh_job(job_id)
    say(
        f"{pipeline} {day}: {plural(counts.total, 'item')}: "
        f"{count_words(counts.by_status, counts.dead_letters_by_class)}"
        + ("" if waited else "; cancelled batches are imported as they end")
    )
    if counts.dead_letters_by_class.get("cancelled"):
        say(
            f"`llm-assets requeue {pipeline} --date {day} --class cancelled` sends the "
            "cancelled items again"
        )


@click.command()
@click.argument("pipeline")
@click.option("--reason", default="", help="Why; shown wherever the pause holds work back.")
def pause(pipeline: str, reason: str) -> None:
    """Submit nothing new for a pipeline until it is resumed; in-flight batches still finish."""
    from llm_assets import steps
    from llm_assets.resources import build_resources

    settings = load_settings()
    spec = pipeline_spec(settings, pipeline)
    ledger = build_resources(settings)["ledger"]
    paused, made = ledger.pause_pipeline(
        spec.name, paused_by=f"cli:{getpass.getuser()}", reason=reason
    )
    print_pause_change(steps.pause_words(paused, made))


@click.command()
@click.argument("pipeline")
def resume(pipeline: str) -> None:
    """Let a paused pipeline submit again; the sensors send what waited."""
    from llm_assets import steps
    from llm_assets.resources import build_resources

    settings = load_settings()
    spec = pipeline_spec(settings, pipeline)
    ledger = build_resources(settings)["ledger"]
    ended = ledger.resume_pipeline(spec.name, resumed_by=f"cli:{getpass.getuser()}")
    print_pause_change(steps.resume_words(spec.name, ended))


@click.command()
@click.argument("pipeline")
@click.option("--dry-run", is_flag=True, help="Print what would be deleted; delete nothing.")
def retention(pipeline: str, dry_run: bool) -> None:
    """Apply a pipeline's retention section now: expire the days (and eval data) finished
    more than artifacts_days ago, delete provider files left after import; print, day by day,
    what was deleted, what was kept and why."""
    from llm_assets.defs.retention_jobs import apply_retention
    from llm_assets.resources import build_resources
    from llm_assets.resources.providers import provider_resource_key

    settings = load_settings()
    spec = pipeline_spec(settings, pipeline)
    resources = build_resources(settings)

    def listed(message: str) -> None:
        """One line per day or artifact, whatever the width: a list to grep and copy from."""
        console.print(message, highlight=False, markup=False, soft_wrap=True)

    run = apply_retention(
        spec,
        resources["ledger"],
        resources["storage"],
        resources[provider_resource_key(spec.model.provider)],
        info=listed,
        warn=lambda message: note(message, home=settings.home),
        dry_run=dry_run,
    )
    verb = "would expire" if dry_run else "expired"
    expiry = run.expiry
    say(
        f"{spec.name}: {verb} {plural(len(expiry.expired), 'day')} "
        f"({plural(expiry.uris, 'artifact')}), kept {plural(len(expiry.kept), 'day')}; "
        f"provider files of {plural(run.provider_files.shards, 'shard')}"
        + (f", {len(run.provider_files.failed)} failed" if run.provider_files.failed else "")
    )
    if run.provider_files.failed:
        sys.exit(EXIT_ERROR)


@click.command()
@click.argument("pipeline", required=False)
@click.option("--reset", is_flag=True, help="Forget what was learned; submission learns again.")
@click.option("--json", "as_json", is_flag=True, help="The quotas as JSON.")
def quotas(pipeline: str | None, reset: bool, as_json: bool) -> None:
    """The provider quotas submission learned (of PIPELINE's model, or every one): how much
    each admits in flight, how that was learned, and how much is in flight now. A spec's
    `quota:` section caps them; `--reset` forgets them."""
    import json

    from llm_assets.resources import build_resources
    from llm_assets.steps import quota

    settings = load_settings()
    ledger = build_resources(settings)["ledger"]
    spec = pipeline_spec(settings, pipeline) if pipeline else None
    provider = spec.model.provider if spec else None
    model = spec.model.name if spec else None
    if reset:
        forgotten = ledger.reset_quotas(provider=provider, model=model)
        say(
            f"forgot {plural(forgotten, 'learned quota')}"
            + (f" of {provider}/{model}" if spec else "")
        )
        return
    records = [r for r in ledger.quota_records(provider) if model is None or r.model_name == model]
    rows = [quota.as_row(r, ledger.in_flight_load(r.provider, r.model_name)) for r in records]
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    print_quotas(rows)
