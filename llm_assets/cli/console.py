"""The command line's two consoles and how a line is printed on them.

Results go to stdout and progress and errors to stderr, so `--json` output and tables can be
piped. Widths: on a terminal a console is as wide as the terminal; a stream that is not a
terminal is COLUMNS wide when that variable holds a number, else 80 columns (what terminals
and e-mail show without wrapping), so output captured by scripts and tests does not depend on
the terminal it ran in. stdout's sentences wrap at that width between words; every table
printed on either console fits it (cli/tables.py). A message on stderr wraps the same way on
a terminal and stays one line in a pipe, so a log keeps one line per message.

What the commands print is laid out by day_report.py (run, status), ledger_report.py (costs,
dead letters, quotas) and eval_report.py (eval), in the words of text.py.
"""

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from llm_assets.cli.tables import FitTables
from llm_assets.cli.text import home_relative, usd

# home_relative and usd are here for the demo too, which prints in the CLI's words.
__all__ = ["console", "err", "home_relative", "note", "print_error", "progress_bar", "say", "usd"]

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
for _console in (console, err):
    _console.push_render_hook(FitTables(_console))


def say(text: str | Text, *, style: str | None = None, home: Path | None = None) -> None:
    """A sentence on stdout, wrapped between words at the console's width, with paths under
    `home` relative to it; `text` is printed as it is (no markup)."""
    if isinstance(text, str):
        text = Text(home_relative(text, home))
    console.print(text, style=style, highlight=False)


def note(text: str, *, home: Path | None = None) -> None:
    """A line on stderr: wrapped on a terminal, one line in a pipe."""
    err.print(Text(home_relative(text, home)), highlight=False, soft_wrap=not err.is_terminal)


def print_error(message: str, home: Path | None = None, *, label: str = "error") -> None:
    """`label` in red, then the message, on stderr as `note` prints it."""
    text = escape(home_relative(message, home))
    err.print(f"[red]{label}[/red] {text}", highlight=False, soft_wrap=not err.is_terminal)


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
