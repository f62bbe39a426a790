"""What the command line prints: its two consoles, the progress display, its tables and CSV.

Results go to stdout and progress and errors to stderr, so `--json` output and tables can be
piped. When a stream is not a terminal it is 120 columns wide, so output captured by scripts
and tests does not depend on the terminal it ran in.
"""

import csv
import datetime as dt
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

console = Console(stderr=False, width=None if sys.stdout.isatty() else 120)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 120)

_COUNTS = ("items", "succeeded", "input_tokens", "output_tokens")
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
"""What a text cell starts with when a spreadsheet would run it as a formula (OWASP, CSV
injection)."""


def progress_bar() -> Progress:
    """One line per day on stderr; silent when stderr is not a terminal."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=False,
        disable=not err.is_terminal,
    )


def print_error(message: str) -> None:
    err.print(f"[red]error[/red] {escape(message)}", highlight=False, soft_wrap=True)


def outcome_table(outcomes: Sequence[Any]) -> Table:
    """`llm-assets run`: one row per day (runner.DayOutcome)."""
    table = Table(title="llm-assets run")
    for column in ("pipeline", "date", "items", "succeeded", "dead letters", "open", "cost USD"):
        table.add_column(column)
    for o in outcomes:
        if o.no_data:
            table.add_row(o.pipeline, o.date.isoformat(), f"no data: {o.no_data}", "", "", "", "")
            continue
        classes = ", ".join(f"{k}={v}" for k, v in sorted(o.dead_letters_by_class.items()))
        table.add_row(
            o.pipeline,
            o.date.isoformat(),
            str(o.total),
            str(o.succeeded),
            f"{o.dead_letters} ({classes})" if classes else "0",
            str(o.open_items),
            f"{o.cost_usd:.4f}",
        )
    return table


def print_status(
    pipeline: str, day: dt.date, jobs: Sequence[dict[str, Any]], no_data: str | None = None
) -> None:
    """`llm-assets status`: a shard table and an item summary per job of the day; `no_data`
    says why a day with no source rows has no job."""
    if no_data and not jobs:
        console.print(f"{pipeline} {day}: no data ({no_data})", highlight=False)
        return
    if not jobs:
        console.print(f"{pipeline} {day}: nothing has run for this partition yet")
        return
    for job in jobs:
        table = Table(title=f"{pipeline} {day} — job {job['job_id']} ({job['status']})")
        for column in ("shard", "status", "provider status", "provider batch", "requests", "done"):
            table.add_column(column)
        for s in job["shards"]:
            table.add_row(
                s["shard_id"],
                s["status"],
                s["provider_status"] or "-",
                s["provider_batch_id"] or "-",
                str(s["requests"]),
                str(s["completed_requests"] + s["failed_requests"]),
            )
        console.print(table)
        console.print(
            f"items {job['items']}  by status {job['by_status']}  dead letters by class "
            f"{job['dead_letters_by_class']}  tokens {job['input_tokens']}/{job['output_tokens']}"
            f"  cost ${job['cost_usd']:.4f}",
            highlight=False,
        )


def print_costs(
    pipeline: str,
    rows: Sequence[dict[str, Any]],
    total: dict[str, Any],
    months: dict[str, float],
    no_data: Sequence[str] = (),
) -> None:
    """`llm-assets costs`: a row per job and a total row, then the cost per month; the days
    of `no_data` had no source rows and are named instead of shown as zero."""
    for day in no_data:
        console.print(f"{pipeline} {day}: no data (no source rows)", highlight=False)
    if not rows:
        console.print(f"{pipeline}: no jobs in that range")
        return
    table = Table(title=f"{pipeline} costs")
    columns = ("date", "model", "prompt", "items", "succeeded", "in tokens", "out tokens")
    for column in (*columns, "cost", "retries", "estimate"):
        table.add_column(column, justify="left" if column in columns[:3] else "right")
    for r in rows:
        table.add_row(
            r["date"],
            f"{r['provider']}/{r['model']}",
            r["prompt_version"],
            *(str(r[k]) for k in _COUNTS),
            f"${r['cost_usd']:.4f}",
            f"${r['retry_cost_usd']:.4f}",
            f"${r['estimated_cost_usd']:.4f}",
        )
    table.add_row(
        "total",
        "",
        "",
        *(str(total[k]) for k in _COUNTS),
        f"${total['cost_usd']:.4f}",
        f"${total['retry_cost_usd']:.4f}",
        f"${total['estimated_cost_usd']:.4f}",
    )
    console.print(table)
    for month, cost in months.items():
        console.print(f"{month}: ${cost:.4f}", highlight=False)


def dead_letter_table(title: str, rows: Sequence[dict[str, Any]]) -> Table:
    """`llm-assets dead-letter`: one row per item, the reason cut to 200 characters."""
    table = Table(title=title)
    for column in ("source_id", "class", "code", "attempts", "last batch", "reason"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(
            escape(str(row["source_id"])),
            row["error_class"] or "",
            escape(row["error_code"] or ""),
            str(row["attempts"]),
            row["last_provider_batch"] or "-",
            escape((row["error_message"] or "")[:200]),
        )
    return table


def spreadsheet_safe(value: Any) -> Any:
    """A text cell a spreadsheet would run as a formula, with a single quote before it so it
    shows as the text it is: error messages and ids come from providers and source data,
    and a CSV is opened in a spreadsheet. Numbers and other text are kept as they are."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def print_csv(columns: Sequence[str], rows: Iterable[dict[str, Any]]) -> None:
    """Rows as CSV with a header row on stdout, each row ended by a line feed, every cell
    `spreadsheet_safe`. With line feeds ending rows the csv module quotes only cells holding
    one; a row with a carriage return in a cell is written with every cell quoted, so a
    reader never takes that carriage return for the end of the row."""
    plain = csv.writer(sys.stdout, lineterminator="\n")
    quoted = csv.writer(sys.stdout, lineterminator="\n", quoting=csv.QUOTE_ALL)
    plain.writerow(columns)
    for row in rows:
        cells = [spreadsheet_safe(row.get(column)) for column in columns]
        carriage_return = any(isinstance(cell, str) and "\r" in cell for cell in cells)
        (quoted if carriage_return else plain).writerow(cells)
