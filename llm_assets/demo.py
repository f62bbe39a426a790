"""`llm-assets demo`: generated tickets through the whole platform on the local provider."""

import datetime as dt
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from llm_assets import steps
from llm_assets.demo_data import generate_demo_data
from llm_assets.settings import Settings
from llm_assets.spec import load_specs

DEMO_PIPELINE = "support_tickets"
DEMO_START = dt.date(2026, 11, 2)


def accuracy(
    settings: Settings, spec_name: str, day: dt.date, truth: dict[str, str]
) -> tuple[int, int]:
    """(correct, judged) of the day's validated categories against the generator's truth."""
    import pandas as pd

    from llm_assets.resources import build_resources

    resources = build_resources(settings)
    spec = next(s for s in load_specs(settings.pipelines_dir) if s.name == spec_name)
    job = steps.existing_job(spec, day, resources["ledger"])
    storage = resources["storage"]
    uri = storage.uri(f"outputs/{spec.name}/{day.isoformat()}/{job.job_id}.parquet")
    with storage.local_copy(uri) as path:
        frame = pd.read_parquet(path, columns=["source_id", "category"])
    judged = frame[frame["source_id"].isin(truth.keys())]
    correct = int((judged["category"] == judged["source_id"].map(truth)).sum())
    return correct, len(judged)


def run_demo(
    settings: Settings,
    *,
    days: int,
    per_day: int,
    console: Console,
) -> list[dict[str, Any]]:
    from llm_assets.cli import run_days

    specs = {s.name: s for s in load_specs(settings.pipelines_dir)}
    if DEMO_PIPELINE not in specs:
        raise SystemExit(
            f"the demo needs the {DEMO_PIPELINE!r} pipeline; {settings.pipelines_dir} does not "
            "have it (unset LLM_ASSETS_PIPELINES to use the repo's examples)"
        )
    spec = specs[DEMO_PIPELINE]
    generated = generate_demo_data(
        settings.home / "demo", start=DEMO_START, days=days, tickets_per_day=per_day
    )
    console.print(
        f"generated {generated.rows_written} tickets over {days} days in {generated.inbox_dir} "
        f"(deliberately bad rows: {', '.join(sorted(generated.bad_rows))})",
        highlight=False,
    )
    truth = {
        row["ticket_id"]: row["category"]
        for row in map(json.loads, generated.truth_path.read_text().splitlines())
    }
    outcomes = run_days(settings, spec, generated.days, wait=True, approve_budget=False)

    table = Table(title=f"llm-assets demo: {spec.name} on {spec.model.provider}/{spec.model.name}")
    for column in (
        "date",
        "items",
        "succeeded",
        "dead letters by class",
        "tokens in/out",
        "cost USD",
        "accuracy",
    ):
        table.add_column(column)
    summary = []
    totals = {"items": 0, "succeeded": 0, "tokens_in": 0, "tokens_out": 0, "correct": 0, "n": 0}
    cost = 0.0
    for outcome in outcomes:
        correct, judged = accuracy(settings, spec.name, outcome.date, truth)
        classes = ", ".join(f"{k} {v}" for k, v in sorted(outcome.dead_letters_by_class.items()))
        table.add_row(
            outcome.date.isoformat(),
            str(outcome.total),
            str(outcome.succeeded),
            classes or "-",
            f"{outcome.input_tokens}/{outcome.output_tokens}",
            f"{outcome.cost_usd:.4f}",
            f"{correct / judged:.1%}" if judged else "-",
        )
        totals["items"] += outcome.total
        totals["succeeded"] += outcome.succeeded
        totals["tokens_in"] += outcome.input_tokens
        totals["tokens_out"] += outcome.output_tokens
        totals["correct"] += correct
        totals["n"] += judged
        cost += outcome.cost_usd
        summary.append({**outcome.model_dump(mode="json"), "correct": correct, "judged": judged})
    table.add_row(
        "all",
        str(totals["items"]),
        str(totals["succeeded"]),
        "",
        f"{totals['tokens_in']}/{totals['tokens_out']}",
        f"{cost:.4f}",
        f"{totals['correct'] / totals['n']:.1%}" if totals["n"] else "-",
    )
    console.print(table)
    console.print(
        f"published outputs: {settings.storage_url}/published/{spec.name}/\n"
        f"validated outputs: {settings.storage_url}/outputs/{spec.name}/\n"
        f"QA samples:        {settings.storage_url}/qa/{spec.name}/\n"
        f"dead letters:      {settings.storage_url}/dead_letters/{spec.name}/\n"
        f"cost reports:      {settings.storage_url}/reports/{spec.name}/\n"
        f"ledger:            {settings.database_url}\n"
        f"Dagster runs:      {settings.dagster_home} (see them with `make ui`)",
        highlight=False,
    )
    return summary
