"""What the command line prints: its two consoles, the progress display, its tables and CSV.

Results go to stdout and progress and errors to stderr, so `--json` output and tables can be
piped. Widths: on a terminal a console is as wide as the terminal; a stream that is not a
terminal is COLUMNS wide when that variable holds a number, else 80 columns (what terminals
and e-mail show without wrapping), so output captured by scripts and tests does not depend on
the terminal it ran in. Tables fit that width: long cells fold onto more lines instead of
being cut, and ids are never cut into look-alikes.

What human output shows differently from `--json` and `--csv` (which keep the ledger's text):
- shard ids in a job's table are their part after the job id (`r00-s00003`: round 0, shard
  3), other ids the shortest prefix that tells the table's rows apart (`short_forms`);
- counts are words ("12 succeeded, 5 dead letters (4 quality, 1 deterministic)");
- paths under LLM_ASSETS_HOME are relative to it (`home_relative`);
- a dead letter's reason is cut to two lines in its table.
"""

import csv
import datetime as dt
import os
import re
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from llm_assets.results.rows import DEAD_LETTER, PENDING, RETRY, SUBMITTED, SUCCEEDED
from llm_assets.util.words import class_words, dead_letter_words, duration_words, plural

DEFAULT_WIDTH = 80
"""Columns of a console whose stream is not a terminal and COLUMNS is not set."""


def stream_width(stream: TextIO, environ: Mapping[str, str] = os.environ) -> int | None:
    """None on a terminal (rich then follows the terminal, or COLUMNS when set); else COLUMNS
    when it is a positive number, else DEFAULT_WIDTH."""
    if stream.isatty():
        return None
    columns = environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else DEFAULT_WIDTH


console = Console(stderr=False, width=stream_width(sys.stdout))
err = Console(stderr=True, width=stream_width(sys.stderr))

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
"""What a text cell starts with when a spreadsheet would run it as a formula (OWASP, CSV
injection)."""
REASON_LINES = 2
"""Lines a dead letter's reason takes in a table; `--json` and `--csv` have it whole."""
_STATUS_ORDER = (SUCCEEDED, DEAD_LETTER, RETRY, SUBMITTED, PENDING)
_STATUS_WORDS = {RETRY: "waiting for a retry"}


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


def print_error(message: str, home: Path | None = None) -> None:
    text = escape(home_relative(message, home))
    err.print(f"[red]error[/red] {text}", highlight=False, soft_wrap=True)


def count_words(by_status: Mapping[str, int], by_class: Mapping[str, int]) -> str:
    """Items by status in words, done ones first: "120 succeeded, 5 dead letters (4 quality,
    1 deterministic), 3 pending"."""
    order = [*_STATUS_ORDER, *sorted(set(by_status) - set(_STATUS_ORDER))]
    words = []
    for status in order:
        n = by_status.get(status, 0)
        if not n:
            continue
        if status == DEAD_LETTER:
            words.append(dead_letter_words(n, by_class))
        else:
            words.append(f"{n:,} {_STATUS_WORDS.get(status, status.replace('_', ' '))}")
    return ", ".join(words) or "no items"


def home_relative(text: str, home: Path | None) -> str:
    """`text` with every absolute path under `home` (LLM_ASSETS_HOME) written relative to it:
    "/home/x/.llm_assets/demo/inbox/a.jsonl:3: ..." reads "demo/inbox/a.jsonl:3: ...". A path
    only starts where no path or word character comes before it, so a `file://` URI or a
    longer path that merely contains the home is kept."""
    if home is None or not text:
        return text
    for root in dict.fromkeys((str(home), os.path.realpath(home))):
        text = re.sub(rf"(?<![\w./~-]){re.escape(root.rstrip('/'))}/(?=\S)", "", text)
    return text


def short_forms(ids: Iterable[str], *, job_id: str | None = None, least: int = 8) -> dict[str, str]:
    """Each id's form in a table, different for different ids. Ids that all start with
    `job_id` and a dash (a job's shards) show the rest (`r00-s00003`); others show the
    shortest prefix of at least `least` characters that no other id of the table starts
    with, and … where it was cut."""
    distinct = sorted(set(ids))
    if job_id and distinct and all(i.startswith(f"{job_id}-") for i in distinct):
        return {i: i[len(job_id) + 1 :] for i in distinct}
    forms: dict[str, str] = {}
    for n, current in enumerate(distinct):
        neighbours = distinct[max(n - 1, 0) : n] + distinct[n + 1 : n + 2]
        shared = max((_common_prefix(current, other) for other in neighbours), default=0)
        keep = max(least, shared + 1)
        forms[current] = current if keep >= len(current) - 1 else current[:keep] + "…"
    return forms


def _common_prefix(a: str, b: str) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def usd(value: float) -> str:
    """Dollars to 4 decimals; a cost too small for that shows its first digits instead of
    reading as $0.0000, which only a zero cost shows."""
    if 0 < abs(value) < 0.00005:
        return f"${value:.2g}"
    return f"${value:.4f}"


class Clipped:
    """Text wrapped to its cell and cut to `lines` lines, the cut marked with …."""

    def __init__(self, text: str, lines: int = REASON_LINES) -> None:
        self.text = Text(text)
        self.lines = lines

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        widest = Measurement.get(console, options, self.text).maximum
        return Measurement(min(widest, 20), widest)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        lines = list(self.text.wrap(console, width, overflow="fold"))
        if len(lines) > self.lines:
            last = lines[self.lines - 1]
            last.rstrip()
            last.truncate(width - 1)
            last.append("…")
            lines = lines[: self.lines]
        yield Text("\n").join(lines)


class Pieces:
    """Parts of a cell on one line joined by ", " when the cell is wide enough, else one part
    per line, so a part ("1,085 in") is never split."""

    def __init__(self, *parts: str) -> None:
        self.parts = parts

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        one_line = cell_len(", ".join(self.parts))
        return Measurement(max(cell_len(part) for part in self.parts), one_line)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        one_line = ", ".join(self.parts)
        fits = cell_len(one_line) <= options.max_width
        yield Text(one_line if fits else "\n".join(self.parts), justify=options.justify)


def _heading(text: str) -> None:
    """A table's title, on lines of its own as wide as the console (a rich title would wrap
    at the table's width)."""
    console.print(Text(text, style="bold"))


def _table(
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    numbers: Sequence[str] = (),
) -> Table:
    """A table that fits the console: no outer border and two spaces between columns, the
    `numbers` columns right-aligned. When the table is too wide, rich narrows its widest
    columns first (reasons, model names, batch ids), so dates, counts and short ids keep
    their width down to narrow consoles; a cell wraps at its spaces and folds a longer word
    onto the next line, and is never cut."""
    table = Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
    for column in columns:
        table.add_column(
            column,
            justify="right" if column in numbers else "left",
            overflow="fold",
        )
    for row in rows:
        table.add_row(*row)
    return table


def print_outcomes(outcomes: Sequence[Any], home: Path | None = None) -> None:
    """`llm-assets run`: one row per day (runner.DayOutcome), then why each day with no data
    has none."""
    pipelines = sorted({o.pipeline for o in outcomes})
    one = len(pipelines) == 1
    columns = [*([] if one else ["pipeline"]), "date", "items", "succeeded"]
    columns += ["dead letters", "open", "cost"]
    rows = []
    notes = []
    for o in outcomes:
        first = [] if one else [escape(o.pipeline)]
        if o.no_data:
            rows.append([*first, o.date.isoformat(), "no data", "", "", "", ""])
            notes.append(f"{o.pipeline} {o.date}: no data ({home_relative(o.no_data, home)})")
            continue
        dead = f"{o.dead_letters:,}"
        if o.dead_letters and o.dead_letters_by_class:
            dead += f" ({class_words(o.dead_letters_by_class)})"
        rows.append(
            [
                *first,
                o.date.isoformat(),
                f"{o.total:,}",
                f"{o.succeeded:,}",
                dead,
                f"{o.open_items:,}",
                usd(o.cost_usd),
            ]
        )
    _heading(f"llm-assets run {pipelines[0]}" if one else "llm-assets run")
    numbers = ("items", "succeeded", "open", "cost")
    console.print(_table(columns, rows, numbers=numbers))
    for note in notes:
        console.print(note, highlight=False, markup=False)


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
        console.print(Text(f"{pipeline} is {paused}", style="bold yellow"))
    if blocked:
        console.print(
            Text(f"{pipeline} {day}: {home_relative(blocked, home)}", style="bold red"),
        )
    if no_data and not jobs:
        console.print(f"{pipeline} {day}: no data ({no_data})", highlight=False, markup=False)
        return
    if not jobs:
        console.print(f"{pipeline} {day}: nothing has run for this partition yet")
        return
    for job in jobs:
        title = (
            f"{pipeline} {day}, job {job['job_id']}: {job['status']}"
            f"{'' if job.get('current', True) else ' (not the current prompt and model)'}"
        )
        shards = job["shards"]
        forms = short_forms((s["shard_id"] for s in shards), job_id=job["job_id"])
        rows = [
            [
                escape(forms[s["shard_id"]]),
                s["status"] + (" (cancel)" if s.get("cancelled") else ""),
                escape(s["provider_status"] or "-"),
                escape(s["provider_batch_id"] or "-"),
                f"{s['completed_requests'] + s['failed_requests']:,} of {s['requests']:,}",
            ]
            for s in shards
        ]
        columns = ("shard", "status", "provider status", "provider batch", "done")
        _heading(title)
        console.print(_table(columns, rows, numbers=("done",)))
        if job.get("cancelled"):
            cancelled = job["cancelled"]
            console.print(
                f"cancelled by {cancelled['by'] or 'an operator'} at {cancelled['at'][:16]}Z: "
                f"{cancelled['reason']}; `llm-assets requeue {pipeline} --date {day} --class "
                "cancelled` takes it up again",
                highlight=False,
                markup=False,
            )
        # providers.base.WAITING_FOR_QUOTA (not imported: the console stays light).
        waiting = [s for s in shards if s["provider_status"] == "waiting_for_quota"]
        if waiting:
            why = (waiting[0]["message"] or "").removeprefix("waiting for quota: ")
            console.print(
                f"{plural(len(waiting), 'shard')} waiting for quota: {why}"
                f"; next try {min(s['not_before'] or '' for s in waiting) or 'when due'}",
                highlight=False,
                markup=False,
            )
        if job.get("stuck_text"):
            console.print(job["stuck_text"], highlight=False, markup=False)
        if job["personal_data"]:
            console.print(
                f"personal data in prompts: {personal_data_words(job['personal_data'])}",
                highlight=False,
                markup=False,
            )
        console.print(
            f"{plural(job['items'], 'item')}: "
            f"{count_words(job['by_status'], job['dead_letters_by_class'])}\n"
            f"tokens {job['input_tokens']:,} in, {job['output_tokens']:,} out; "
            f"cost {usd(job['cost_usd'])}",
            highlight=False,
            markup=False,
        )


def print_quotas(rows: Sequence[Mapping[str, Any]]) -> None:
    """The learned provider quotas (`llm-assets quotas`), one row each."""
    if not rows:
        console.print(
            "no quota learned yet: no provider has refused a batch", highlight=False, markup=False
        )
        return
    columns = ("provider", "model", "counts", "in flight", "limit", "how")
    cells = [
        [r["provider"], r["model"], r["kind"], r["in_flight"], r["limit"] or "not known", r["how"]]
        for r in rows
    ]
    console.print(_table(columns, cells, numbers=("in flight", "limit")))


def personal_data_words(found: dict[str, int]) -> str:
    """{"email:redact": 3, "card:block": 1} → "card 1 blocked, email 3 redacted"."""
    done = {"redact": "redacted", "pseudonymize": "pseudonymized", "block": "blocked"}
    words = []
    for key, count in sorted(found.items()):
        entity, _, action = key.partition(":")
        words.append(f"{entity} {count} {done.get(action, 'allowed')}")
    return ", ".join(words)


def print_pause_change(words: str) -> None:
    """`llm-assets pause` and `resume`: what changed, in the words of steps.pause_words and
    resume_words."""
    console.print(words, highlight=False, markup=False)


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
        console.print(f"{pipeline} {day}: no data (no source rows)", highlight=False)
    if not rows:
        console.print(f"{pipeline}: no jobs in that range")
        return
    numbers = ("succeeded", "tokens", "cost", "retries", "estimate")
    cells = [
        [r["date"], escape(f"{r['provider']}/{r['model']} {r['prompt_version']}"), *_cost_cells(r)]
        for r in rows
    ]
    cells.append(["total", "", *_cost_cells(total)])
    columns = ("date", "model, prompt", *numbers)
    _heading(f"{pipeline} costs")
    table = _table(
        columns,
        cells,
        numbers=numbers,
    )
    console.print(table)
    for note in zero_cost_notes:
        console.print(f"Why $0: {note}", highlight=False, markup=False)
    for month, cost in months.items():
        label = f"{month} total" + (f" as of {as_of}" if as_of else "")
        console.print(f"{label}: {usd(cost)}", highlight=False)


def _cost_cells(row: Mapping[str, Any]) -> list[Any]:
    money = ("cost_usd", "retry_cost_usd", "estimated_cost_usd")
    return [
        f"{row['succeeded']:,} of {row['items']:,}",
        Pieces(f"{row['input_tokens']:,} in", f"{row['output_tokens']:,} out"),
        *(usd(row[k]) for k in money),
    ]


def print_dead_letters(
    pipeline: str,
    day: dt.date,
    job_id: str,
    rows: Sequence[dict[str, Any]],
    home: Path | None = None,
) -> None:
    """`llm-assets dead-letter`: one row per item, its reason relative to LLM_ASSETS_HOME and
    cut to REASON_LINES lines."""
    by_class = Counter(row["error_class"] or "unknown" for row in rows)
    head = f"{pipeline} {day}: {dead_letter_words(len(rows), by_class)} in job {job_id}"
    if not rows:
        console.print(head, highlight=False, markup=False)
        return
    batches = short_forms(r["last_provider_batch"] for r in rows if r["last_provider_batch"])
    cells = [
        [
            "-" if row["source_id"] is None else escape(str(row["source_id"])),
            escape(": ".join(x for x in (row["error_class"], row["error_code"]) if x)),
            escape(_sent(row["attempts"], batches.get(row["last_provider_batch"] or ""))),
            Clipped(home_relative(row["error_message"] or "", home)),
        ]
        for row in rows
    ]
    columns = ("source id", "error", "sent", "reason")
    _heading(head)
    console.print(_table(columns, cells))
    console.print("reasons in full: --json or --csv", highlight=False)


def _sent(attempts: int, batch: str | None) -> str:
    """How often a dead letter was sent, and in which batch last: "never", "2x lb_e74c8132…"."""
    if not attempts:
        return "never"
    return f"{attempts}x {batch}" if batch else f"{attempts}x"


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


def print_eval(report: Any, home: Path | None = None) -> None:
    """`llm-assets eval`: the sample, then what each variant did with it
    (evaluation.report.EvalReport)."""
    days = report.days
    span = f"{days[0]}..{days[-1]}" if len(days) > 1 else f"{days[0]}"
    _heading(f"llm-assets eval {report.pipeline} {span}")
    say: dict[str, Any] = dict(highlight=False, markup=False, soft_wrap=True)
    console.print(
        f"sample: {plural(report.sample_items, 'item')}, seed {report.seed} (eval "
        f"{report.eval_id}, {home_relative(report.sample_uri, home)})",
        **say,
    )
    for run in report.variants:
        console.print(
            f"{run.name}: {run.provider}/{run.model} prompt {run.prompt_version} "
            f"(as {run.pipeline})",
            style="bold",
            **say,
        )
        dead = dead_letter_words(sum(run.dead_letters_by_class.values()), run.dead_letters_by_class)
        still = f", {run.open_items:,} open" if run.open_items else ""
        console.print(
            f"  {plural(run.items, 'item')}: {run.succeeded:,} succeeded, {dead}{still}", **say
        )
        console.print(f"  failure rate {run.failure_rate:.1%}", **say)
        console.print(
            f"  tokens {run.input_tokens:,} in, {run.output_tokens:,} out; cost "
            f"{usd(run.cost_usd)}, {usd(run.cost_per_1k_items_usd)} per 1,000 items",
            **say,
        )
        console.print(
            f"  last result {duration_words(run.seconds_to_last_result)} after the first "
            "submission",
            **say,
        )
