"""What `run` and `status` print about days: the outcome table of `run`, the summary of a day
a gate blocked, and a day's jobs, shards and items for `status`."""

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.text import Text

from llm_assets.cli.console import console, say
from llm_assets.cli.tables import REQUIRED, WORDS, Col, FittedTable
from llm_assets.cli.text import count_words, home_relative, personal_data_words, short_forms, usd
from llm_assets.util.words import class_words, plural


def print_outcomes(outcomes: Sequence[Any], home: Path | None = None) -> None:
    """`llm-assets run`: one row per day (runner.DayOutcome), then why each day with no data
    has none."""
    pipelines = sorted({o.pipeline for o in outcomes})
    one = len(pipelines) == 1
    columns = [
        *([] if one else [Col("pipeline")]),
        Col("date"),
        Col("items", right=True),
        Col("succeeded", right=True),
        Col("dead letters", WORDS),
        Col("open", right=True),
        Col("cost", right=True),
    ]
    rows = []
    notes = []
    for o in outcomes:
        first = [] if one else [o.pipeline]
        if o.no_data:
            rows.append([*first, o.date.isoformat(), "no data", "", "", "", ""])
            notes.append(f"{o.pipeline} {o.date}: no data ({home_relative(o.no_data, home)})")
            continue
        dead = f"{o.dead_letters:,}"
        if o.dead_letters and o.dead_letters_by_class:
            dead += f" ({class_words(o.dead_letters_by_class)})"
        cells = [f"{o.total:,}", f"{o.succeeded:,}", dead, f"{o.open_items:,}", usd(o.cost_usd)]
        rows.append([*first, o.date.isoformat(), *cells])
    title = f"llm-assets run {pipelines[0]}" if one else "llm-assets run"
    console.print(FittedTable(columns, rows, title=title))
    for note in notes:
        say(note)


@dataclass(frozen=True)
class BlockedDay:
    """A day a gate blocked, for `run`'s summary: what blocked it, how far it got, and what
    the operator runs next."""

    pipeline: str
    day: dt.date
    gate: str
    next_step: str
    job_id: str | None = None
    items: int = 0
    by_status: Mapping[str, int] | None = None
    dead_letters_by_class: Mapping[str, int] | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    estimated_cost_usd: float | None = None
    estimated_cost_upper_usd: float | None = None
    not_run: Sequence[dt.date] = ()


GATE_WORDS = {
    "budget": "the budget gate (budget.max_usd_per_partition)",
    "pipeline_budget": "the pipeline's budget caps (budget.max_usd_per_day, max_usd_per_month)",
    "compliance": "the compliance gate (compliance.max_blocked_rate)",
    "quality": "the quality gate: nothing of it is published",
    "paused": "a pause of the pipeline",
    "residency": "the residency gate (compliance.allowed_regions)",
    "cancelled": "a cancel",
}


def print_blocked(blocked: BlockedDay) -> None:
    """`llm-assets run` on a day a gate blocked: the gate, the day's items so far, its cost
    and estimate, the days not run after it, and the command to go on with. The gate's own
    reason is the `blocked:` line on stderr."""
    gate = GATE_WORDS.get(blocked.gate, f"the {blocked.gate} gate")
    say(Text(f"{blocked.pipeline} {blocked.day}: blocked by {gate}", style="bold"))
    if blocked.job_id is None:
        say("nothing of the day was built or sent")
    else:
        by_status = blocked.by_status or {}
        say(
            f"{plural(blocked.items, 'item')}: "
            f"{count_words(by_status, blocked.dead_letters_by_class or {})} "
            f"(job {blocked.job_id})"
        )
        money = (
            f"tokens {blocked.input_tokens:,} in, {blocked.output_tokens:,} out; "
            f"cost {usd(blocked.cost_usd)}"
        )
        if blocked.estimated_cost_usd is not None:
            money += f"; estimate {usd(blocked.estimated_cost_usd)}"
            if blocked.estimated_cost_upper_usd:
                money += f", at most {usd(blocked.estimated_cost_upper_usd)}"
        say(money)
    if blocked.not_run:
        days = blocked.not_run
        span = f"{days[0]}" if len(days) == 1 else f"{days[0]} to {days[-1]}"
        say(f"not run: {span}, after the blocked day")
    say(f"to go on: {blocked.next_step}")


def print_status(
    pipeline: str,
    day: dt.date,
    jobs: Sequence[dict[str, Any]],
    no_data: str | None = None,
    *,
    blocked: str | None = None,
    paused: str | None = None,
    home: Path | None = None,
) -> None:
    """`llm-assets status`: the pipeline's pause (`paused`, steps.paused_text) and the gate that
    blocks the day (`blocked`) first, then a shard table and an item summary per job of the
    day; `no_data` says why a day with no source rows has no job."""
    if paused:
        say(f"{pipeline} is {paused}", style="bold yellow", home=home)
    if blocked:
        say(f"{pipeline} {day}: {blocked}", style="bold red", home=home)
    if no_data and not jobs:
        say(f"{pipeline} {day}: no data ({no_data})")
        return
    if not jobs:
        say(f"{pipeline} {day}: nothing has run for this partition yet")
        return
    for job in jobs:
        _print_job(pipeline, day, job, home)


_SHARD_COLUMNS = (
    Col("shard"),
    Col("status"),
    Col("provider status", keep=10),
    Col("provider batch", keep=20),
    Col("done", right=True, keep=REQUIRED),
)


def _print_job(pipeline: str, day: dt.date, job: dict[str, Any], home: Path | None) -> None:
    """One job of `status`: its shards, then what holds them and its items in words."""
    title = (
        f"{pipeline} {day}, job {job['job_id']}: {job['status']}"
        f"{'' if job.get('current', True) else ' (not the current prompt and model)'}"
    )
    shards = job["shards"]
    forms = short_forms((s["shard_id"] for s in shards), job_id=job["job_id"])
    rows = [
        [
            forms[s["shard_id"]],
            s["status"] + (" (cancel)" if s.get("cancelled") else ""),
            s["provider_status"] or "-",
            s["provider_batch_id"] or "-",
            f"{s['completed_requests'] + s['failed_requests']:,} of {s['requests']:,}",
        ]
        for s in shards
    ]
    console.print(FittedTable(_SHARD_COLUMNS, rows, title=title, hint="status --json has them"))
    if job.get("cancelled"):
        cancelled = job["cancelled"]
        say(
            f"cancelled by {cancelled['by'] or 'an operator'} at {cancelled['at'][:16]}Z: "
            f"{cancelled['reason']}; `llm-assets requeue {pipeline} --date {day} --class "
            "cancelled` takes it up again",
            home=home,
        )
    # providers.base.WAITING_FOR_QUOTA (not imported: the console stays light).
    waiting = [s for s in shards if s["provider_status"] == "waiting_for_quota"]
    if waiting:
        why = (waiting[0]["message"] or "").removeprefix("waiting for quota: ")
        say(
            f"{plural(len(waiting), 'shard')} waiting for quota: {why}"
            f"; next try {min(s['not_before'] or '' for s in waiting) or 'when due'}",
            home=home,
        )
    if job.get("stuck_text"):
        say(job["stuck_text"], home=home)
    if job["personal_data"]:
        say(f"personal data in prompts: {personal_data_words(job['personal_data'])}")
    say(
        f"{plural(job['items'], 'item')}: "
        f"{count_words(job['by_status'], job['dead_letters_by_class'])}"
    )
    say(
        f"tokens {job['input_tokens']:,} in, {job['output_tokens']:,} out; "
        f"cost {usd(job['cost_usd'])}"
    )
