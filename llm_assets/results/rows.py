"""Provider results made into ledger rows: the unit of work of an import's worker processes.

Everything a worker needs to turn result lines into rows in the ledger's bulk format lives
here and in the providers' line parsers (`openai_lines`), importable without Dagster,
SQLAlchemy or pydantic, so a worker starts in a fraction of a second and a few tens of MB
(importing the steps would load all three, about 200 MB, before its first chunk). The
ledger, the steps and the providers import from here, never the other way round.
"""

import dataclasses
import datetime as dt
import functools
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, NamedTuple

from llm_assets.util import column_sizes

# An item's status in the ledger.
PENDING = "pending"
SUBMITTED = "submitted"
RETRY = "retry"
SUCCEEDED = "succeeded"
DEAD_LETTER = "dead_letter"
TERMINAL = (SUCCEEDED, DEAD_LETTER)

RESULT_COLUMNS = (
    "status",
    "error_class",
    "error_code",
    "error_message",
    "model_name",
    "input_tokens",
    "cached_input_tokens",
    "cache_write_input_tokens",
    "output_tokens",
    "cost_usd",
    "finish_reason",
    "result_json",
)
"""What an import writes over an item, in the order of a result row after its custom_id."""

ErrorClass = Literal["input", "deterministic", "transient", "expired", "quality", "cancelled"]

CostOf = Callable[[int, int, int, int], float]
"""cost_usd(input_tokens, output_tokens, cached_input_tokens, cache_write_input_tokens) at one
price (`pricing.ModelPrice.cost_calculator`)."""


@dataclasses.dataclass(slots=True, kw_only=True)
class ItemResult:
    """One normalized result line, whatever the provider's format.

    A plain dataclass: an import makes one per result line, and a pydantic model costs as
    much to build as parsing the line. Adapters build it from values they have checked. Not
    frozen: a frozen dataclass sets each field through object.__setattr__, four times the
    cost of a plain one.
    """

    custom_id: str
    succeeded: bool
    output_text: str | None = None
    finish_reason: str | None = None
    input_tokens: int = 0
    """All input tokens billed, cached ones included."""
    cached_input_tokens: int = 0
    """The part of input_tokens read from the provider's prompt cache (cheaper)."""
    cache_write_input_tokens: int = 0
    """The part of input_tokens written to the provider's prompt cache (dearer, Anthropic)."""
    output_tokens: int = 0
    status_code: int | None = None
    error_class: ErrorClass | None = None
    error_code: str | None = None
    error_message: str | None = None


class Answered(NamedTuple):
    """A plain success as a provider's line parser reads it, before it is an ItemResult: the
    shape of almost every result line of a day, made into a ledger row without building one
    (see staged_results). It writes nothing to a prompt cache (a line that does is an
    ItemResult)."""

    custom_id: str
    status_code: int
    output_text: str | None
    finish_reason: str | None
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int

    def result(self) -> ItemResult:
        """The same success as an ItemResult (each field here is one of ItemResult's)."""
        return ItemResult(succeeded=True, **self._asdict())


def ledger_text(value: Any, limit: int | None = None) -> str | None:
    """A provider's text as the ledger can hold it: a NUL character, which PostgreSQL refuses
    in text, escaped as JSON writes it (\\u0000), and the text cut to its column's `limit`
    characters, which PostgreSQL would refuse too. A value of another type is its text."""
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    if "\x00" in text:
        text = text.replace("\x00", "\\u0000")
    return text if limit is None or len(text) <= limit else text[:limit]


def copy_text(value: Any) -> str:
    """One value in PostgreSQL's COPY text format."""
    if value is None:
        return "\\N"
    if isinstance(value, str):
        if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
            value = (
                value.replace("\\", "\\\\")
                .replace("\t", "\\t")
                .replace("\n", "\\n")
                .replace("\r", "\\r")
            )
        return value
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    return str(value)


COPY_BINARY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
"""The start of PostgreSQL's binary COPY data: signature, flags and header extension (none)."""
COPY_BINARY_TRAILER = b"\xff\xff"
_NULL = b"\xff\xff\xff\xff"
_length = struct.Struct(">i").pack
_int4 = struct.Struct(">ii").pack
_float8 = struct.Struct(">id").pack
_tokens_and_cost = struct.Struct(">iiiiiiiiid").pack
_INT4_COLUMNS = frozenset(
    {"input_tokens", "cached_input_tokens", "cache_write_input_tokens", "output_tokens"}
)
_RESULT_KINDS = tuple(
    "int4" if c in _INT4_COLUMNS else "float8" if c == "cost_usd" else "text"
    for c in ("custom_id", *RESULT_COLUMNS)
)
_RESULT_FIELDS = struct.pack(">h", len(_RESULT_KINDS))


def _binary_text(value: Any) -> bytes:
    """A text field of binary COPY: its UTF-8 length, then the bytes; the text of a value that
    is not a string is the one COPY text would give it."""
    if value is None:
        return _NULL
    data = (value if value.__class__ is str else copy_text(value)).encode()
    return _length(len(data)) + data


def binary_result_row(values: Sequence[Any]) -> bytes:
    """A result row (custom_id, *RESULT_COLUMNS) as one tuple of PostgreSQL's binary COPY
    format for the ledger's column types (integer tokens, double precision cost, text): no
    text for the server to parse, a third less of its time than COPY text."""
    parts = [_RESULT_FIELDS]
    for kind, value in zip(_RESULT_KINDS, values, strict=True):
        if value is None:
            parts.append(_NULL)
        elif kind == "int4":
            parts.append(_int4(4, value))
        elif kind == "float8":
            parts.append(_float8(8, value))
        else:
            parts.append(_binary_text(value))
    return b"".join(parts)


class StagedResults(NamedTuple):
    """A chunk of result rows in the ledger's bulk format, made where the rows are made (a
    worker process), so that the process writing the ledger only picks and passes them on."""

    custom_ids: list[str]
    statuses: list[str]
    rows: list[Any]
    """Per row: a tuple of binary COPY (PostgreSQL, binary_result_row) or a tuple of values
    (SQLite), custom_id first, then RESULT_COLUMNS."""


@dataclasses.dataclass(frozen=True)
class ResultStager:
    """Result rows (custom_id, *RESULT_COLUMNS) → StagedResults; picklable."""

    binary_copy: bool
    """PostgreSQL: rows as tuples of binary COPY; otherwise as they are."""

    def row(self, values: Sequence[Any]) -> Any:
        """One result row in the bulk format."""
        return binary_result_row(values) if self.binary_copy else values

    def __call__(self, rows: Iterable[Sequence[Any]]) -> StagedResults:
        rows = list(rows)
        return StagedResults(
            [row[0] for row in rows],
            [row[1] for row in rows],
            [binary_result_row(row) for row in rows] if self.binary_copy else rows,
        )


def scaled_cost_usd(
    scaled: tuple[int, int, int, int, int],
    input_tokens: int,
    output_tokens: int,
    cached_input_tokens: int,
    cache_write_input_tokens: int,
) -> float:
    """The cost of one result at per-token prices given as integers over one denominator
    (`pricing.ModelPrice.cost_calculator`)."""
    per_input, per_cached, per_write, per_output, denominator = scaled
    # int / int is correctly rounded, like float() of the exact Decimal.
    if cached_input_tokens <= 0 and cache_write_input_tokens <= 0 <= input_tokens:
        return (input_tokens * per_input + output_tokens * per_output) / denominator  # most
    cached = min(max(cached_input_tokens, 0), input_tokens)
    written = min(max(cache_write_input_tokens, 0), input_tokens - cached)
    numerator = (
        (input_tokens - cached - written) * per_input
        + cached * per_cached
        + written * per_write
        + output_tokens * per_output
    )
    return numerator / denominator


def ledger_values(result: ItemResult, cost: CostOf, model_name: str) -> tuple[Any, ...]:
    """A normalized result as ledger values, custom_id then RESULT_COLUMNS. Successes are
    billed, and failures the provider billed all the same (a refusal whose result carries
    its tokens); they carry tokens and cost, at the price recorded when their shard was
    submitted."""
    error_class: ErrorClass | None
    if result.succeeded:
        status, error_class = SUCCEEDED, None
    elif result.error_class in ("transient", "expired"):
        status, error_class = RETRY, result.error_class
    else:
        status, error_class = DEAD_LETTER, result.error_class or "deterministic"
    billed = result.succeeded or result.input_tokens > 0 or result.output_tokens > 0
    return (
        result.custom_id,
        status,
        error_class,
        ledger_text(result.error_code, column_sizes.ERROR_CODE),
        ledger_text(result.error_message),
        model_name,
        result.input_tokens if billed else 0,
        result.cached_input_tokens if billed else 0,
        result.cache_write_input_tokens if billed else 0,
        result.output_tokens if billed else 0,
        cost(
            result.input_tokens,
            result.output_tokens,
            result.cached_input_tokens,
            result.cache_write_input_tokens,
        )
        if billed
        else 0.0,
        ledger_text(result.finish_reason, column_sizes.FINISH_REASON),
        ledger_text(result.output_text),
    )


@dataclasses.dataclass(frozen=True)
class RowMaker:
    """ItemResult → ledger values with a shard's price (its cost calculator) bound."""

    cost: CostOf
    model_name: str

    def __call__(self, result: ItemResult) -> tuple[Any, ...]:
        return ledger_values(result, self.cost, self.model_name)

    @functools.cached_property
    def success_fields(self) -> bytes:
        """Binary COPY of the columns of a success from its status to its model name, the same
        for every success."""
        return _binary_text(SUCCEEDED) + _NULL * 3 + _binary_text(self.model_name)


def _answered_row(answered: Answered, to_row: RowMaker, binary_copy: bool) -> Any:
    """The ledger row of a plain success as `ResultStager(binary_copy)([to_row(answered.result())])`
    makes it, in half the time: no ItemResult, and the columns a success leaves empty or the
    same written as constants."""
    cid, _, text, finish, tokens_in, cached, tokens_out = answered
    cost = to_row.cost(tokens_in, tokens_out, cached, 0)
    if text is not None and "\x00" in text:
        text = ledger_text(text)
    if finish is not None and (len(finish) > column_sizes.FINISH_REASON or "\x00" in finish):
        finish = ledger_text(finish, column_sizes.FINISH_REASON)
    if not binary_copy:
        model = to_row.model_name
        return (
            cid,
            SUCCEEDED,
            None,
            None,
            None,
            model,
            tokens_in,
            cached,
            0,
            tokens_out,
            cost,
            finish,
            text,
        )
    cid_bytes = cid.encode()
    return b"".join(
        (
            _RESULT_FIELDS,
            _length(len(cid_bytes)),
            cid_bytes,
            to_row.success_fields,
            _tokens_and_cost(4, tokens_in, 4, cached, 4, 0, 4, tokens_out, 8, cost),
            _binary_text(finish),
            _binary_text(text),
        )
    )


def block_lines(blocks: Iterable[bytes]) -> Iterator[bytes]:
    """The lines of blocks of whole lines (a block's last one may lack its newline; lines
    never run on into the next block), blank ones skipped."""
    for block in blocks:
        for line in block.split(b"\n"):
            if line and not line.isspace():
                yield line


def staged_results(
    context: tuple[Callable[[bytes], "Answered | ItemResult | None"], RowMaker, ResultStager],
    blocks: list[bytes],
) -> StagedResults:
    """Raw result lines, in blocks of whole lines (see block_lines) → ledger rows in the
    ledger's bulk format: the unit of work of a worker process, so that the importing process
    only passes blocks of a file on, and picks the rows.

    The parser gives an Answered for a plain success (almost every line), made into its row
    directly; anything else as an ItemResult, made into one by `to_row` and the stager."""
    parse, to_row, stage = context
    binary_copy = stage.binary_copy
    ids: list[str] = []
    statuses: list[str] = []
    rows: list[Any] = []
    for read in map(parse, block_lines(blocks)):
        if read is None:
            continue
        if read.__class__ is Answered:
            ids.append(read.custom_id)
            statuses.append(SUCCEEDED)
            rows.append(_answered_row(read, to_row, binary_copy))
            continue
        values = to_row(read)  # type: ignore[arg-type]
        ids.append(values[0])
        statuses.append(values[1])
        rows.append(stage.row(values))
    return StagedResults(ids, statuses, rows)
