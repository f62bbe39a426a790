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
from typing import TYPE_CHECKING

import click

from llm_assets.cli.args import (
    exit_for_failed_run,
    load_settings,
    parse_date,
    pipeline_spec,
    poll_interval_option,
)
from llm_assets.cli.console import progress_bar, say

if TYPE_CHECKING:
    from llm_assets.defs.run_failures import StepFailed


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
    from llm_assets.defs.run_failures import StepFailed
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
        if failure.gate:
            again = f"llm-assets eval {spec.name} --from {from_} --to {to_}"
            again += f" --sample {size}" if size is not None else ""
            again += f" --seed {seed}" if seed is not None else ""
            again += f" --variants {','.join(named)}" if named else ""
            _say_blocked(spec.name, failure, from_, to_, again, as_json=as_json)
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


def _say_blocked(
    pipeline: str,
    failure: "StepFailed",
    from_: str,
    to_: str,
    again: str,
    *,
    as_json: bool,
) -> None:
    """An eval a gate stopped: which gate, what was being evaluated, and the command that goes
    on (`again` runs the same eval; the gate's own reason is the `blocked:` line on stderr)."""
    from llm_assets.cli.day_report import GATE_WORDS
    from llm_assets.cli.run import next_step

    assert failure.gate is not None
    day = parse_date(from_)
    to_go_on = next_step(failure.gate, pipeline, day, again) if day else f"`{again}`"
    if as_json:
        held = {"pipeline": pipeline, "from": from_, "to": to_, "blocked": failure.gate}
        held |= {"reason": str(failure), "next_step": to_go_on}
        click.echo(json.dumps(held, indent=2))
        return
    gate = GATE_WORDS.get(failure.gate, f"the {failure.gate} gate")
    say(f"eval of {pipeline} {from_} to {to_}: blocked by {gate}; no report was written")
    say(f"to go on: {to_go_on}")
