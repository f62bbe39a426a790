"""The demo's last part: the pipeline's evaluation over the demo days.

The spec's `eval` sample of tickets goes through the baseline and every variant as a run of
the eval job (so it is a partition of eval_report in the UI too); the demo prints each
variant's accuracy against the agents' filing (`agent_category`) with its interval, what the
same work would cost on the `eval.price_as` models, and the recommendation.
"""

import datetime as dt

from rich import box
from rich.console import Console
from rich.table import Table

from llm_assets.cli.console import home_relative, progress_bar, usd
from llm_assets.defs.eval_jobs import run_eval_job
from llm_assets.defs.run_failures import StepFailed
from llm_assets.evaluation.report import EvalReport
from llm_assets.evaluation.report_store import load_report
from llm_assets.resources import build_resources
from llm_assets.spec.model import PipelineSpec
from llm_assets.util.settings import Settings


def evaluate(
    settings: Settings, spec: PipelineSpec, days: list[dt.date], console: Console
) -> dict[str, object] | None:
    """Run the spec's eval over `days` and print it; as `llm-assets eval --json` has it (the
    eval_report partition, the run id, the report and where its files are). A
    gate that blocks a variant's day (a blocked ticket can make a day's few sampled items
    cross compliance.max_blocked_rate) is said, and the demo goes on (None)."""
    resources = build_resources(settings)
    config = {"from": days[0].isoformat(), "to": days[-1].isoformat(), "poll_interval": 1.0}
    try:
        key, run_id = run_eval_job(
            settings,
            spec,
            config,
            created_by="demo",
            resources=resources,
            display=progress_bar(),
        )
    except StepFailed as failure:
        reason = home_relative(str(failure), settings.home)
        console.print(f"eval blocked: {reason}", style="yellow", highlight=False, markup=False)
        return None
    report, uris = load_report(spec.name, key, resources["storage"])
    print_eval(console, report, key, home_relative(uris["markdown"], settings.home))
    summary = {"eval_report_partition": key, "run_id": run_id, **uris}
    return {**summary, "report": report.model_dump(mode="json")}


def print_eval(console: Console, report: EvalReport, key: str, markdown: str) -> None:
    """The eval's table, its recommendation and notes, and where its full report is."""
    console.print(_eval_table(report))
    if report.recommendation is not None:
        console.print(report.recommendation.reason, highlight=False, markup=False)
    for note in report.notes:
        console.print(note, style="yellow", highlight=False, markup=False)
    console.print(
        f"The full report (confusion matrices, macro-F1, tokens): {markdown}; in the UI, "
        f"eval_report partition {key}.",
        highlight=False,
        markup=False,
    )


def _eval_table(report: EvalReport) -> Table:
    """A row per variant: its score with the interval, failure rate, what the same work costs
    as each price_as model per 1,000 tickets at batch prices, and the verdict."""
    models = {f"{v.provider}/{v.model}" for v in report.variants}
    same_model = len(models) == 1
    title = (
        f"eval of {report.pipeline}: {report.sample_items} tickets sampled across "
        f"{len(report.days)} days (seed {report.seed}), the same for every variant"
    )
    if same_model:
        title += f", all on {next(iter(models))}"
    price_as = [p.price_as for p in report.variants[0].what_if]
    names = [model.partition("/")[2] for model in price_as]
    caption = (
        f"{', '.join(names)}: what the same work costs per 1,000 tickets on them, at batch prices"
        if price_as
        else None
    )
    table = Table(
        title=title,
        caption=caption,
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    table.add_column("variant", no_wrap=True)
    table.add_column("prompt" if same_model else "model, prompt")
    table.add_column(f"{report.scoring.metric} (95% CI)", justify="right", no_wrap=True)
    table.add_column("failed", justify="right")
    for name in names:
        table.add_column(name, justify="right")
    table.add_column("verdict")
    chosen = report.recommendation.chosen if report.recommendation else None
    verdicts = (
        {v.name: v.verdict for v in report.recommendation.verdicts}
        if report.recommendation and chosen
        else {}
    )
    for v in report.variants:
        score = "-" if v.score is None else f"{v.score:.3f}"
        if v.interval is not None:
            score += f" ({v.interval.low:.3f}–{v.interval.high:.3f})"
        costs = {p.price_as: usd(p.batch_cost_per_1k_items_usd) for p in v.what_if}
        recommended = chosen is not None and chosen.name == v.name
        table.add_row(
            v.name,
            v.prompt_version if same_model else f"{v.provider}/{v.model} {v.prompt_version}",
            score,
            f"{v.failure_rate:.1%}",
            *(costs.get(model, "-") for model in price_as),
            "recommended" if recommended else verdicts.get(v.name, "-"),
        )
    return table
