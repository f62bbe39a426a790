"""`llm-assets demo`: generated tickets through the whole platform on the local provider, then
the pipeline's evaluation (its `eval` sample through the baseline and its variants) over the
same days."""

import datetime as dt
import json
from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table

from llm_assets import steps
from llm_assets.cli.console import progress_bar
from llm_assets.compliance.policy import COMPLIANCE
from llm_assets.defs.runner import DayOutcome, run_days
from llm_assets.demo import tour
from llm_assets.demo.data import generate_demo_data
from llm_assets.demo.evaluate import evaluate
from llm_assets.resources import build_resources
from llm_assets.spec.load import load_specs
from llm_assets.spec.model import PipelineSpec
from llm_assets.util.secrecy import mask_url
from llm_assets.util.settings import Settings

DEMO_PIPELINE = "support_tickets"
DEMO_START = dt.date(2026, 11, 2)


def accuracy(
    settings: Settings, spec_name: str, day: dt.date, truth: dict[str, str]
) -> tuple[int, int]:
    """(correct, judged) of the day's validated categories against the generator's truth."""
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
) -> dict[str, Any]:
    """Generate `days` days of tickets, run each to the end (the last one cancelled and
    requeued on the way), the day after them (empty) and the first again on the strict
    pipeline (blocked), evaluate the pipeline's variants, and print what happened where.
    Returns the same as a JSON-able dict: each day's outcome, the cancelled day, the empty
    day, the blocked day, the eval."""
    spec = _demo_spec(settings)
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
    # The last day is cancelled once submitted and requeued, and the day after it has no
    # tickets: with the strict pipeline's blocked day, every kind of day docs/ui.md shows.
    *plain, cancelled_day = generated.days
    empty_day = cancelled_day + dt.timedelta(days=1)
    outcomes = run_days(
        settings, spec, plain, wait=True, approve_budget=False, display=progress_bar()
    )
    cancelled = tour.cancel_and_requeue(settings, spec, cancelled_day)
    outcomes += [cancelled.outcome, tour.run_day(settings, spec, empty_day)]
    blocked = tour.run_blocked_day(settings, DEMO_START, console)
    made: dict[str, Any] = {"days": []}
    for outcome in outcomes:
        correct, judged = (
            (0, 0) if outcome.no_data else accuracy(settings, spec.name, outcome.date, truth)
        )
        day = outcome.model_dump(mode="json")
        made["days"].append({**day, "correct": correct, "judged": judged})
    made["cancelled"] = {
        "date": cancelled_day.isoformat(),
        "cancelled": cancelled.cancelled,
        "requeued": cancelled.requeued,
    }
    made["empty_day"] = empty_day.isoformat()
    made["blocked"] = (
        None
        if blocked is None
        else {"pipeline": tour.STRICT_PIPELINE, "date": DEMO_START.isoformat(), "reason": blocked}
    )
    print_days(console, spec, made)
    made["eval"] = evaluate(settings, spec, generated.days, console)
    console.print(_where_things_are(settings, spec), highlight=False)
    return made


def print_days(console: Console, spec: PipelineSpec, made: dict[str, Any]) -> None:
    """The demo's table of days (from run_demo's dict) and a line for each day of the tour:
    the cancelled, the empty and the blocked one."""
    scored = [
        (DayOutcome.model_validate(day), int(day["correct"]), int(day["judged"]))
        for day in made["days"]
    ]
    console.print(_summary_table(spec, scored))
    console.print(_tour_lines(spec, made), highlight=False)


def _demo_spec(settings: Settings) -> PipelineSpec:
    specs = {s.name: s for s in load_specs(settings.pipelines_dir)}
    if DEMO_PIPELINE not in specs:
        raise SystemExit(
            f"the demo needs the {DEMO_PIPELINE!r} pipeline; {settings.pipelines_dir} does not "
            "have it (unset LLM_ASSETS_PIPELINES to use the repo's examples)"
        )
    return specs[DEMO_PIPELINE]


def _personal_data_cell(outcomes: list[DayOutcome]) -> str:
    """What the personal-data policy did over these days: "redacted 7, blocked 1" counts the
    values replaced by placeholders and the items never sent."""
    done = {"redact": 0, "pseudonymize": 0, "allow": 0}
    for outcome in outcomes:
        for key, count in outcome.personal_data.items():
            action = key.partition(":")[2]
            if action in done:
                done[action] += count
    blocked = sum(o.dead_letters_by_class.get(COMPLIANCE, 0) for o in outcomes)
    words = [
        f"{word} {count}"
        for word, count in (
            ("redacted", done["redact"]),
            ("pseudonymized", done["pseudonymize"]),
            ("allowed", done["allow"]),
            ("blocked", blocked),
        )
        if count
    ]
    return ", ".join(words) or "-"


def _summary_table(spec: PipelineSpec, scored: list[tuple[DayOutcome, int, int]]) -> Table:
    """A row per day and a row for all days: items, dead letters, personal data, tokens, cost
    and accuracy."""
    table = Table(title=f"llm-assets demo: {spec.name} on {spec.model.provider}/{spec.model.name}")
    for column in (
        "date",
        "items",
        "succeeded",
        "dead letters by class",
        "personal data",
        "tokens in/out",
        "cost USD",
        "accuracy",
    ):
        table.add_column(column)
    for outcome, correct, judged in scored:
        classes = ", ".join(f"{k} {v}" for k, v in sorted(outcome.dead_letters_by_class.items()))
        table.add_row(
            outcome.date.isoformat(),
            str(outcome.total),
            str(outcome.succeeded),
            classes or "-",
            _personal_data_cell([outcome]),
            f"{outcome.input_tokens}/{outcome.output_tokens}",
            f"{outcome.cost_usd:.4f}",
            f"{correct / judged:.1%}" if judged else "-",
        )
    outcomes = [outcome for outcome, _, _ in scored]
    correct = sum(c for _, c, _ in scored)
    judged = sum(j for _, _, j in scored)
    table.add_row(
        "all",
        str(sum(o.total for o in outcomes)),
        str(sum(o.succeeded for o in outcomes)),
        "",
        _personal_data_cell(outcomes),
        f"{sum(o.input_tokens for o in outcomes)}/{sum(o.output_tokens for o in outcomes)}",
        f"{sum(o.cost_usd for o in outcomes):.4f}",
        f"{correct / judged:.1%}" if judged else "-",
    )
    return table


def _tour_lines(spec: PipelineSpec, made: dict[str, Any]) -> str:
    """The days the UI tour (docs/ui.md) shows besides the ordinary ones."""
    cancelled, blocked = made["cancelled"], made["blocked"]
    day = cancelled["date"]
    lines = [
        f"{day}: cancelled once submitted ({cancelled['cancelled']} items cancelled), "
        f"{cancelled['requeued']} requeued with `llm-assets requeue {spec.name} --date {day} "
        "--class cancelled`, then run to the end",
        f"{made['empty_day']}: no tickets, an empty day",
    ]
    if blocked is not None:
        lines.append(f"{blocked['pipeline']} {blocked['date']}: blocked: {blocked['reason']}")
    return "\n".join(lines)


def _where_things_are(settings: Settings, spec: PipelineSpec) -> str:
    storage = mask_url(settings.storage_url)
    return (
        f"published outputs: {storage}/published/{spec.name}/\n"
        f"validated outputs: {storage}/outputs/{spec.name}/\n"
        f"QA samples:        {storage}/qa/{spec.name}/\n"
        f"dead letters:      {storage}/dead_letters/{spec.name}/\n"
        f"cost reports:      {storage}/reports/{spec.name}/\n"
        f"ledger:            {mask_url(settings.database_url)}\n"
        f"Dagster runs:      {settings.dagster_home} (see them with `make ui`)"
    )
