"""Markdown tables for the metadata the UI renders, with personal data and credentials in
their cells shown as their type."""

from collections.abc import Sequence
from typing import Any

from llm_assets.compliance.policy import redacted

MISSING = "–"
"""A table cell without a value (None or blank), as the eval report shows it too."""


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return text if text.strip() else MISSING


def shown_of(shown: int, total: int, what: str) -> str:
    """The caption of a table that lists the first rows only: "20 of 31 quality failures"."""
    return f"{shown} of {total} {what}" if shown < total else f"all {total} {what}"


def case_table(
    cases: Sequence[dict[str, Any]],
    limit: int = 20,
    *,
    total: int | None = None,
    what: str = "rows",
) -> str:
    """A markdown table of the first `limit` rows, for metadata the UI renders, captioned
    with how many of `total` it shows ("20 of 31 quality failures") when a total is given.
    A cell without a value shows MISSING, not "None" or nothing. Personal data and
    credentials in the cells are shown as their type (<EMAIL>)."""
    if not cases:
        return "_none_"
    shown = cases[:limit]
    columns = list(cases[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    cells = iter(redacted([_cell(case.get(c)) for case in shown for c in columns]))
    for _ in shown:
        row = [next(cells).replace("|", "\\|").replace("\n", " ")[:120] for _ in columns]
        lines.append("| " + " | ".join(row) + " |")
    caption = [shown_of(len(shown), total, what), ""] if total is not None else []
    return "\n".join([*caption, *lines])
