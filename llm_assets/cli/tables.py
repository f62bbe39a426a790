"""Tables as wide as the console that never cut what they hold.

Each column says what its cells are (`Col.kind`): WHOLE cells (ids, dates, statuses, counts,
money) are never broken; WORDS cells wrap at their spaces and never split a word (a model
name, "5 (5 input)"); PROSE cells (a dead letter's reason) wrap at their spaces and fold a word
longer than the column (a long path) onto the next line. A header wraps between its words,
and inside one only after "_", "-" or "/" ("technical_" "issue"). A table too wide for the
console:

1. drops the columns that matter least first (lowest `Col.keep`; REQUIRED columns stay) and
   names them under the table, with where they are in full (`hint`);
2. when its required columns still do not fit with two spaces between them, tries one;
3. else prints each row as a block of "column  value" lines (`records`).

Within the width it keeps, columns are narrowed widest first (prose last) down to what their
cells need. The widths are chosen here and handed to rich fixed: rich's own Table narrows
columns whatever they hold, which cut ids and folded dates and model names mid-word.

`FitTables` makes a plain rich Table printed through a console fit the same way when it is
wider than the console (the demo builds its own); `cli/eval_report.py` does it for the
tables of a Markdown report.
"""

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from rich import box
from rich.cells import cell_len
from rich.console import (
    Console,
    ConsoleOptions,
    ConsoleRenderable,
    JustifyMethod,
    RenderableType,
    RenderHook,
    RenderResult,
)
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

Kind = Literal["whole", "words", "prose"]
WHOLE: Final = "whole"
WORDS: Final = "words"
PROSE: Final = "prose"
REQUIRED = 100
"""`Col.keep` of a column that is never dropped; lower ranks are dropped lowest first."""
GAP = 2
"""Spaces between columns; one when a table's required columns fit no other way."""
PROSE_MIN = 16
"""The narrowest a PROSE column gets for a long word: beyond it the word folds."""


@dataclass(frozen=True)
class Col:
    header: str
    kind: Kind = WHOLE
    right: bool = False
    """Right-aligned (numbers)."""
    keep: int = REQUIRED


class Pieces:
    """A cell of parts that are each WHOLE ("1,085 in", "123 out"): on one line joined by ", "
    when the column is wide enough, else one part per line."""

    def __init__(self, *parts: str) -> None:
        self.parts = parts

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(max(map(cell_len, self.parts)), cell_len(", ".join(self.parts)))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        one_line = ", ".join(self.parts)
        fits = cell_len(one_line) <= options.max_width
        yield Text(one_line if fits else "\n".join(self.parts), justify=options.justify)


Cell = str | Text | Pieces


def _as_text(cell: Cell) -> Text | Pieces:
    return Text(cell) if isinstance(cell, str) else cell


def _longest_word(text: str) -> int:
    return max(map(cell_len, text.split()), default=0)


def _header_pieces(word: str) -> list[str]:
    """A header word's pieces: it may break after "_", "-" or "/" ("technical_", "issue")."""
    return re.findall(r"[^_/-]*[_/-]+|[^_/-]+", word)


def _header_width(header: str) -> int:
    """The narrowest a header gets: its longest piece."""
    return max((cell_len(p) for word in header.split() for p in _header_pieces(word)), default=0)


def _header_lines(header: str, width: int) -> str:
    """The header on lines of at most `width`: broken between words, and inside a word only
    after "_", "-" or "/". Only headers break inside a word: they name a column, and a
    column of one-digit counts need not be as wide as "product_feedback"."""
    lines: list[str] = []
    line = ""
    for word in header.split():
        for n, piece in enumerate(_header_pieces(word)):
            joined = line + (" " if n == 0 and line else "") + piece
            if line and cell_len(joined) > width:
                lines.append(line)
                line = piece
            else:
                line = joined
    return "\n".join([*lines, line])


def _span(cell: Text | Pieces, kind: Kind) -> tuple[int, int]:
    """The narrowest and widest a cell of this kind can be shown without cutting it."""
    if isinstance(cell, Pieces):
        return max(map(cell_len, cell.parts)), cell_len(", ".join(cell.parts))
    widest = max(map(cell_len, cell.plain.splitlines() or [""]))
    if kind == WHOLE:
        return widest, widest
    longest = _longest_word(cell.plain)
    return (min(longest, PROSE_MIN) if kind == PROSE else longest), widest


@dataclass(frozen=True)
class Layout:
    kept: list[int]
    widths: list[int]
    gap: int


def layout(spans: Sequence[tuple[int, int]], columns: Sequence[Col], width: int) -> Layout | None:
    """Which columns a table keeps at `width`, their widths and the gap between them; None
    when even its required columns do not fit (the rows are then shown as records)."""
    kept = list(range(len(columns)))

    def need(gap: int) -> int:
        return sum(spans[i][0] for i in kept) + gap * (len(kept) - 1)

    while need(GAP) > width:
        droppable = [i for i in kept if columns[i].keep < REQUIRED]
        if not droppable:
            break
        kept.remove(min(droppable, key=lambda i: (columns[i].keep, -i)))
    gap = next((g for g in (GAP, 1) if need(g) <= width), None)
    if gap is None:
        return None
    widths = {i: spans[i][1] for i in kept}
    excess = sum(widths.values()) + gap * (len(kept) - 1) - width
    while excess > 0:
        narrower = [i for i in kept if widths[i] > spans[i][0]]
        widest = max(narrower, key=lambda i: (columns[i].kind != PROSE, widths[i], i))
        widths[widest] -= 1
        excess -= 1
    return Layout(kept, [widths[i] for i in kept], gap)


class FittedTable:
    """A table that fits the console it is printed on (see the module docstring): `title`
    above it and `caption` below wrap as text; `hint` says where dropped columns are."""

    def __init__(
        self,
        columns: Sequence[Col],
        rows: Iterable[Sequence[Cell]],
        *,
        title: str | Text | None = None,
        caption: str | Text | None = None,
        hint: str | None = None,
    ) -> None:
        self.columns = list(columns)
        self.rows = [[_as_text(cell) for cell in row] for row in rows]
        self.title = Text(title, style="bold") if isinstance(title, str) else title
        self.caption = caption
        self.hint = hint

    def spans(self) -> list[tuple[int, int]]:
        spans = []
        for n, column in enumerate(self.columns):
            cells = [_span(row[n], column.kind) for row in self.rows]
            low = max([_header_width(column.header), *(lo for lo, _ in cells)])
            high = max([cell_len(column.header), *(hi for _, hi in cells)])
            spans.append((low, max(low, high)))
        return spans

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        if self.title is not None:
            yield self.title
        fitted = layout(self.spans(), self.columns, width)
        if fitted is None:
            yield from self.records(width)
        else:
            yield self.table(fitted)
            dropped = [c.header for n, c in enumerate(self.columns) if n not in fitted.kept]
            if dropped:
                left_out = f"not shown at {width} columns: {', '.join(dropped)}"
                yield Text(left_out + (f" ({self.hint})" if self.hint else ""), style="dim")
        if self.caption is not None:
            yield Text(self.caption) if isinstance(self.caption, str) else self.caption

    def table(self, fitted: Layout) -> Table:
        table = Table(
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
            collapse_padding=True,
            padding=(0, 1) if fitted.gap == GAP else 0,
        )
        for n, width in zip(fitted.kept, fitted.widths, strict=True):
            column = self.columns[n]
            justify: JustifyMethod = "right" if column.right else "left"
            header = Text(_header_lines(column.header, width))
            table.add_column(header, justify=justify, width=width, overflow="fold")
        for row in self.rows:
            table.add_row(*(row[n] for n in fitted.kept))
        return table

    def records(self, width: int) -> Iterable[RenderableType]:
        """Each row as its first cell after its column's name, then one line per other
        column that has a value: for consoles narrower than the table's required columns."""
        first, *others = self.columns
        label = min(max(map(cell_len, (c.header for c in others)), default=0), width // 3)
        for row in self.rows:
            head = row[0] if row else Text()
            if isinstance(head, Pieces):
                head = Text(", ".join(head.parts))
            yield Text.assemble((f"{first.header} " if first.header else "", "bold"), head)
            grid = Table.grid(padding=(0, 2))
            grid.add_column(width=label)
            grid.add_column(overflow="fold")
            for column, cell in zip(others, row[1:], strict=True):
                if isinstance(cell, Text):
                    if not cell.plain.strip():
                        continue
                    cell = cell.copy()
                    cell.justify = "left"  # a number reads beside its name
                grid.add_row(column.header, cell)
            yield Padding(grid, (0, 0, 0, 2))


def fitted(table: Table, console: Console) -> FittedTable:
    """A rich Table built elsewhere (the demo's), as a FittedTable: a `no_wrap` column's
    cells are WHOLE, the others WORDS; every column is required. Text cells are read as
    rich reads them (markup)."""

    def text(cell: RenderableType) -> Text:
        if isinstance(cell, str):
            return console.render_str(cell)
        return cell if isinstance(cell, Text) else Text(str(cell))

    columns = [
        Col(
            header=text(column.header).plain,
            kind=WHOLE if column.no_wrap else WORDS,
            right=column.justify == "right",
        )
        for column in table.columns
    ]
    cells = [[text(cell) for cell in column.cells] for column in table.columns]
    rows = [list(row) for row in zip(*cells, strict=True)]
    title = text(table.title).copy() if table.title is not None else None
    if title is not None:
        title.stylize("bold")
    caption = text(table.caption) if table.caption is not None else None
    return FittedTable(columns, rows, title=title, caption=caption)


class FitTables(RenderHook):
    """A console's hook for plain rich Tables printed on it (not its subclasses, which draw
    other things): one as wide as the console or narrower is printed as it is, and rich shows
    its cells whole; a wider one is printed as a FittedTable."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        return [self.fit(r) if type(r) is Table else r for r in renderables]

    def fit(self, table: Table) -> ConsoleRenderable:
        options = self.console.options
        # Measured without the console's bound, which rich clamps a measurement to.
        natural = Measurement.get(self.console, options.update_width(10**6), table).maximum
        if natural <= options.max_width:
            return table
        return fitted(table, self.console)
