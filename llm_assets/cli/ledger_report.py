"""What `costs`, `dead-letter`, `quotas`, `pause` and `resume` print from the ledger: their
tables (cli/tables.py fits them to the console) and the CSV of `--csv`."""

import csv
import datetime as dt
import re
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.text import Text

from llm_assets.cli.console import console, say
from llm_assets.cli.tables import PROSE, WORDS, Col, FittedTable, Pieces
from llm_assets.cli.text import home_relative, usd
from llm_assets.util.words import dead_letter_words

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
"""What a text cell starts with when a spreadsheet would run it as a formula (OWASP, CSV
injection)."""

_COST_COLUMNS = (
    Col("date"),
    Col("model, prompt", WORDS),
    Col("succeeded", right=True),
    Col("tokens", right=True, keep=30),
    Col("cost", right=True),
    Col("retries", right=True, keep=10),
    Col("estimate", right=True, keep=20),
)


def print_costs(
    pipeline: str,
    rows: Sequence[dict[str, Any]],
    total: dict[str, Any],
    months: dict[str, float],
    no_data: Sequence[str] = (),
    *,
    as_of: str | None = None,
    zero_cost_notes: Sequence[str] = (),
) -> None:
    """`llm-assets costs`: a row per job and a total row, why a $0 cost is zero
    (`zero_cost_notes`), then the cost per month up to `as_of`; the days of `no_data` had no
    source rows and are named instead of shown as zero."""
    for day in no_data:
        say(f"{pipeline} {day}: no data (no source rows)")
    if not rows:
        say(f"{pipeline}: no jobs in that range")
        return
    cells = [
        [r["date"], f"{r['provider']}/{r['model']} {r['prompt_version']}", *_cost_cells(r)]
        for r in rows
    ]
    cells.append(["total", "", *_cost_cells(total)])
    title = f"{pipeline} costs"
    console.print(FittedTable(_COST_COLUMNS, cells, title=title, hint="costs --json has them"))
    for note in zero_cost_notes:
        say(f"Why $0: {note}")
    for month, cost in months.items():
        label = f"{month} total" + (f" as of {as_of}" if as_of else "")
        say(f"{label}: {usd(cost)}")


def _cost_cells(row: Mapping[str, Any]) -> list[Any]:
    money = ("cost_usd", "retry_cost_usd", "estimated_cost_usd")
    return [
        f"{row['succeeded']:,} of {row['items']:,}",
        Pieces(f"{row['input_tokens']:,} in", f"{row['output_tokens']:,} out"),
        *(usd(row[k]) for k in money),
    ]


_DEAD_LETTER_COLUMNS = (
    Col("source id"),
    Col("error", WORDS),
    Col("sent"),
    Col("last batch", keep=10),
    Col("reason", PROSE),
)


def print_dead_letters(
    pipeline: str,
    day: dt.date,
    job_id: str,
    rows: Sequence[dict[str, Any]],
    home: Path | None = None,
) -> None:
    """`llm-assets dead-letter`: one row per item with its whole reason, paths relative to
    LLM_ASSETS_HOME; when the reasons that name a source line all name one file, the file is
    said once above the table and the reasons say `line N`. The provider batch of an item's
    last attempt shows when there is room."""
    by_class = Counter(row["error_class"] or "unknown" for row in rows)
    head = f"{pipeline} {day}: {dead_letter_words(len(rows), by_class)} in job {job_id}"
    if not rows:
        say(head)
        return
    reasons = [home_relative(row["error_message"] or "", home) for row in rows]
    title = Text(head, style="bold")
    source = one_source_file(reasons)
    if source is not None:
        title.append(f"\nsource file: {source} (the reasons name its lines)", style="not bold")
        reasons = [by_line(reason, source) for reason in reasons]
    cells = [
        [
            "-" if row["source_id"] is None else str(row["source_id"]),
            ": ".join(x for x in (row["error_class"], row["error_code"]) if x),
            f"{row['attempts']}x" if row["attempts"] else "never",
            row["last_provider_batch"] or "-",
            reason,
        ]
        for row, reason in zip(rows, reasons, strict=True)
    ]
    hint = "dead-letter --json or --csv has them"
    console.print(FittedTable(_DEAD_LETTER_COLUMNS, cells, title=title, hint=hint))


_SOURCE_LINE = re.compile(r"^(?P<file>(?:s3://)?[^\s:]+):\d+: ")
"""The start of an input dead letter's reason: the source file and line of its row."""


def one_source_file(reasons: Sequence[str]) -> str | None:
    """The file of the reasons that start with a source file and line, when there is one
    such file; None when there are several, or none."""
    files = {m.group("file") for reason in reasons if (m := _SOURCE_LINE.match(reason))}
    return files.pop() if len(files) == 1 else None


def by_line(reason: str, source: str) -> str:
    """The reason with each `source:N` written `line N`: "demo/a.jsonl:10: id 'A' already
    seen at demo/a.jsonl:3" reads "line 10: id 'A' already seen at line 3"."""
    return re.sub(rf"(?<![\w./~-]){re.escape(source)}:(\d+)", r"line \1", reason)


_QUOTA_COLUMNS = (
    Col("provider"),
    Col("model"),
    Col("counts", WORDS),
    Col("in flight", right=True),
    Col("limit", right=True),
    Col("how", PROSE),
)


def print_quotas(rows: Sequence[Mapping[str, Any]]) -> None:
    """The learned provider quotas (`llm-assets quotas`), one row each."""
    if not rows:
        say("no quota learned yet: no provider has refused a batch")
        return
    cells = [
        [
            r["provider"],
            r["model"],
            r["kind"],
            str(r["in_flight"]),
            str(r["limit"] or "not known"),
            r["how"],
        ]
        for r in rows
    ]
    console.print(FittedTable(_QUOTA_COLUMNS, cells))


def print_pause_change(words: str) -> None:
    """`llm-assets pause` and `resume`: what changed, in the words of steps.pause_words and
    resume_words."""
    say(words)


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
