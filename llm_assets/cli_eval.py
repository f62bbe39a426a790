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
import sys

import click
from rich.markup import escape

from llm_assets.cli_args import EXIT_ERROR, EXIT_GATE, load_settings, pipeline_spec
from llm_assets.console import err, home_relative, print_error, print_eval, progress_bar


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
@click.option(
    "--poll-interval",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=0.0),
    help="Longest wait between status polls of remote batches.",
)
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
    from llm_assets import steps
    from llm_assets.eval_jobs import eval_days
    from llm_assets.evaluation.replay import replay
    from llm_assets.evaluation.report import EvalRequest, build_report, report_key, save_report
    from llm_assets.evaluation.variants import BASELINE, UnknownVariant, resolve_variants
    from llm_assets.resources import build_resources

    settings = load_settings()
    spec = pipeline_spec(settings, pipeline)
    try:
        days = eval_days(spec, from_, to_)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    try:
        specs = resolve_variants(spec, variants.split(","))
    except UnknownVariant as exc:
        raise click.UsageError(str(exc)) from exc
    resources = build_resources(settings)
    display = progress_bar()
    try:
        with display:
            task = display.add_task(f"{spec.name} eval", total=None)

            def report(stage: str, done: int, total: int) -> None:
                display.update(
                    task, description=f"{spec.name} {stage}", completed=done, total=total
                )

            result = replay(
                resources,
                spec,
                specs,
                days,
                size=spec.eval.sample if size is None else size,
                seed=spec.eval.seed if seed is None else seed,
                created_by=f"cli:{getpass.getuser()} eval",
                approve_budget=approve_budget,
                progress=report,
                poll_interval=poll_interval,
            )
    except steps.GateBlocked as exc:
        reason = escape(home_relative(str(exc), settings.home))
        err.print(f"[red]blocked[/red]: {reason}", highlight=False, soft_wrap=True)
        sys.exit(EXIT_GATE)
    except steps.MissingPrerequisite as exc:
        print_error(str(exc), settings.home)
        sys.exit(EXIT_ERROR)
    report = build_report(spec, result, resources["ledger"], resources["storage"])
    request = EvalRequest(
        days=days,
        sample=result.sample.size,
        seed=result.sample.seed,
        variants=[name for name in specs if name != BASELINE],
    )
    uris = save_report(report, request, report_key(result), resources["storage"])
    if as_json:
        report_json = {
            "report": report.model_dump(mode="json"),
            "report_uri": uris["json"],
            "sample": result.sample.model_dump(mode="json"),
            "variants": {
                name: {
                    **run.model_dump(mode="json"),
                    "items": run.items,
                    "succeeded": run.succeeded,
                    "dead_letters_by_class": run.dead_letters_by_class,
                    "open_items": run.open_items,
                    "quality_failure_rate": run.quality_failure_rate,
                    "input_tokens": run.input_tokens,
                    "output_tokens": run.output_tokens,
                    "cost_usd": round(run.cost_usd, 6),
                    "cost_per_1000_items": round(run.cost_per_1000_items, 6),
                    "seconds_to_last_result": run.seconds_to_last_result,
                }
                for name, run in result.variants.items()
            },
        }
        click.echo(json.dumps(report_json, indent=2))
    else:
        print_eval(result, settings.home)
        # Markdown as text: tables too wide for a terminal stay readable, and paste as is.
        click.echo("\n" + report.markdown())
        click.echo(f"report: {home_relative(uris['markdown'], settings.home)}")
