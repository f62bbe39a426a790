"""What `llm-assets eval` prints: the sample and what each variant did with it, then the
report (evaluation/report_markdown.py) rendered from its Markdown by rich: styled on a
terminal, plain text in a pipe, its tables fitted to the console like every other table."""

from pathlib import Path
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.markdown import Markdown, TableElement
from rich.text import Text

from llm_assets.cli.console import console, say
from llm_assets.cli.tables import WORDS, Col, FittedTable
from llm_assets.cli.text import home_relative, usd
from llm_assets.util.words import dead_letter_words, duration_words, plural


class _FittedTable(TableElement):
    """A Markdown table as a FittedTable: every column required, its cells wrapping between
    words (a report's columns carry no rank), right-aligned where the Markdown says so."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        header = self.header.row.cells if self.header and self.header.row else []
        columns = [Col(cell.content.plain, WORDS, right=cell.justify == "right") for cell in header]
        rows = [[cell.content for cell in row.cells] for row in self.body.rows] if self.body else []
        yield FittedTable(columns, rows)


class ReportMarkdown(Markdown):
    """rich's Markdown with tables that fit the console."""

    elements = {**Markdown.elements, "table_open": _FittedTable}


def print_eval(report: Any, home: Path | None = None) -> None:
    """`llm-assets eval`: the sample, then what each variant did with it
    (evaluation.report.EvalReport)."""
    days = report.days
    span = f"{days[0]}..{days[-1]}" if len(days) > 1 else f"{days[0]}"
    say(Text(f"llm-assets eval {report.pipeline} {span}", style="bold"))
    say(
        f"sample: {plural(report.sample_items, 'item')}, seed {report.seed} (eval "
        f"{report.eval_id}, {home_relative(report.sample_uri, home)})"
    )
    for run in report.variants:
        say(
            f"{run.name}: {run.provider}/{run.model} prompt {run.prompt_version} "
            f"(as {run.pipeline})",
            style="bold",
        )
        dead = dead_letter_words(sum(run.dead_letters_by_class.values()), run.dead_letters_by_class)
        still = f", {run.open_items:,} open" if run.open_items else ""
        say(f"  {plural(run.items, 'item')}: {run.succeeded:,} succeeded, {dead}{still}")
        say(f"  failure rate {run.failure_rate:.1%}")
        say(
            f"  tokens {run.input_tokens:,} in, {run.output_tokens:,} out; cost "
            f"{usd(run.cost_usd)}, {usd(run.cost_per_1k_items_usd)} per 1,000 items"
        )
        say(
            f"  last result {duration_words(run.seconds_to_last_result)} after the first submission"
        )


def print_report(markdown: str) -> None:
    """The eval report's Markdown, rendered (never the Markdown source: the saved .md file
    is that)."""
    console.print()
    console.print(ReportMarkdown(markdown))
