"""`llm-assets demo`: generated tickets through the whole platform on the local provider, then
the pipeline's evaluation (its `eval` sample through the baseline and its variants) over the
same days."""

import datetime as dt
import json
from typing import Any

import pandas as pd
from rich import box
from rich.console import Console
from rich.table import Table

from llm_assets import steps
from llm_assets.compliance.policy import COMPLIANCE
from llm_assets.console import Pieces, home_relative, progress_bar, usd
from llm_assets.demo_data import generate_demo_data
from llm_assets.evaluation.replay import Replay, replay
from llm_assets.evaluation.variants import resolve_variants
from llm_assets.resources import build_resources

# Importing the registry registers the provider checks with spec validation.
from llm_assets.resources.providers import registry  # noqa: F401
from llm_assets.runner import DayOutcome, run_days
from llm_assets.secrecy import mask_url
from llm_assets.settings import Settings
from llm_assets.spec import PipelineSpec, load_specs
from llm_assets.words import class_words, duration_words

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
) -> list[dict[str, Any]]:
    """Generate `days` days of tickets, run each to the end, evaluate the pipeline's variants
    on them and print what happened where."""
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
    outcomes = run_days(
        settings, spec, generated.days, wait=True, approve_budget=False, display=progress_bar()
    )
    scored: list[tuple[DayOutcome, int, int]] = []
    for outcome in outcomes:
        correct, judged = accuracy(settings, spec.name, outcome.date, truth)
        scored.append((outcome, correct, judged))
    console.print(_summary_table(spec, scored))
    result = _evaluate(settings, spec, generated.days, console)
    if result is not None:
        _print_eval(console, settings, spec, result)
    console.print(_where_things_are(settings, spec), highlight=False)
    return [
        {**outcome.model_dump(mode="json"), "correct": correct, "judged": judged}
        for outcome, correct, judged in scored
    ]


def _evaluate(
    settings: Settings, spec: PipelineSpec, days: list[dt.date], console: Console
) -> Replay | None:
    """The spec's eval over the demo days: its sample of tickets through the baseline and
    every variant. A gate that blocks a variant's day (a blocked ticket can make the day's
    few sampled items cross compliance.max_blocked_rate) is said, and the demo goes on."""
    display = progress_bar()
    try:
        with display:
            task = display.add_task(f"{spec.name} eval", total=None)

            def report(stage: str, done: int, total: int) -> None:
                display.update(
                    task, description=f"{spec.name} {stage}", completed=done, total=total
                )

            return replay(
                build_resources(settings),
                spec,
                resolve_variants(spec, None),
                days,
                size=spec.eval.sample,
                seed=spec.eval.seed,
                created_by="demo",
                progress=report,
            )
    except steps.GateBlocked as exc:
        reason = home_relative(str(exc), settings.home)
        console.print(f"eval blocked: {reason}", style="yellow", highlight=False, markup=False)
        return None


def _print_eval(console: Console, settings: Settings, spec: PipelineSpec, result: Replay) -> None:
    """The eval section of the demo: what each variant did with the same sampled tickets."""
    sample = result.sample
    console.print(
        f"eval of {spec.name}: {sample.items} sampled tickets (seed {sample.seed}) through the "
        f"baseline and {len(result.variants) - 1} variants, each answering the same tickets; "
        f"sample in {home_relative(sample.uri, settings.home)}",
        highlight=False,
        markup=False,
    )
    console.print(_variant_table(result))


def _variant_table(result: Replay) -> Table:
    """A row per variant: what it did with the sample, and how long its answers took."""
    columns = ("variant", "model, prompt", "succeeded", "dead letters", "quality failures")
    columns += ("tokens", "cost", "last result")
    numbers = ("succeeded", "quality failures", "tokens", "cost")
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    for column in columns:
        justify = "right" if column in numbers else "left"
        table.add_column(column, justify=justify, overflow="fold", no_wrap=column == "variant")
    for run in result.variants.values():
        table.add_row(
            run.variant,
            f"{run.provider}/{run.model} {run.prompt_version}",
            f"{run.succeeded:,} of {run.items:,}",
            class_words(run.dead_letters_by_class) or "0",
            f"{run.quality_failure_rate:.1%}",
            Pieces(f"{run.input_tokens:,} in", f"{run.output_tokens:,} out"),
            usd(run.cost_usd),
            duration_words(run.seconds_to_last_result),
        )
    return table


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
