"""`llm-assets eval`: replay a seeded sample of a pipeline's days through its baseline and
variants (evaluation/replay.py), print what each variant did with the same items, and the
report scoring them with its recommendation (evaluation/report.py), which is also saved
under eval/<pipeline>/reports/.

Exit 0 when every variant's answers are in (whatever the quality gate said of them: judging
them is the point), 2 when a gate blocked a submission (budget, compliance, residency, a
paused pipeline), 1 on any other error.
"""

import getpass
import json

import click

from llm_assets.cli.args import (
    exit_for_failed_run,
    load_settings,
    pipeline_spec,
    poll_interval_option,
)
from llm_assets.cli.console import progress_bar, say


@click.command("eval")
@click.argument("pipeline")
@click.option("--from", "from_", required=True, help="First day of the replay, e.g. 2026-11-01.")
@click.option("--to", "to_", required=True, help="Last day (inclusive).")
@click.option(
    "--sample",
    "size",
    default=None,
    type=click.IntRange(min=1),
    help="Items sampled across the days, the same for every variant [default: the spec's "
    "eval.sample].",
)
@click.option(
    "--seed",
    default=None,
    type=int,
    help="The same seed samples the same items [default: the spec's eval.seed].",
)
@click.option("--variants", default="", help="Variants to run besides the baseline, e.g. a,b.")
@click.option("--approve-budget", is_flag=True, help="Submit even above a budget gate.")
@poll_interval_option("Longest wait between status polls of remote batches.")
@click.option("--json", "as_json", is_flag=True, help="Print the sample and variants as JSON.")
def eval_(
    pipeline: str,
    from_: str,
    to_: str,
    size: int | None,
    seed: int | None,
    variants: str,
    approve_budget: bool,
    poll_interval: float,
    as_json: bool,
) -> None:
    """Replay a sample of a pipeline's days through its variants; nothing is published."""
    from llm_assets.defs.eval_jobs import eval_days, run_eval_job
    from llm_assets.defs.runner import StepFailed
    from llm_assets.evaluation.report_store import load_report
    from llm_assets.evaluation.variants import UnknownVariant, resolve_variants
    from llm_assets.resources import build_resources

    settings = load_settings()
    spec = pipeline_spec(settings, pipeline)
    try:
        eval_days(spec, from_, to_)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    named = [name for name in variants.split(",") if name.strip()]
    try:
        resolve_variants(spec, named)
    except UnknownVariant as exc:
        raise click.UsageError(str(exc)) from exc
    config: dict[str, object] = {"from": from_, "to": to_, "variants": named}
    config.update(poll_interval=poll_interval, approve_budget=approve_budget)
    if size is not None:
        config["sample"] = size
    if seed is not None:
        config["seed"] = seed
    resources = build_resources(settings)
    try:
        key, run_id = run_eval_job(
            settings,
            spec,
            config,
            created_by=f"cli:{getpass.getuser()} eval",
            approve_budget=approve_budget,
            resources=resources,
            display=progress_bar(),
        )
    except StepFailed as failure:
        exit_for_failed_run(failure, settings.home)
    report, uris = load_report(spec.name, key, resources["storage"])
    if as_json:
        summary = {"eval_report_partition": key, "run_id": run_id, **uris}
        click.echo(json.dumps({**summary, "report": report.model_dump(mode="json")}, indent=2))
        return
    from llm_assets.cli.eval_report import print_eval, print_report
    from llm_assets.evaluation.report_markdown import render_markdown

    print_eval(report, settings.home)
    print_report(render_markdown(report))
    say(f"report: {uris['markdown']}", home=settings.home)
    say(f"Dagster: eval_report partition {key} of {spec.name} (run {run_id})")
