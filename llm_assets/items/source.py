"""Reading a pipeline's source rows for one partition date.

A source is one file or a glob of files (local or s3://) in JSONL, CSV or Parquet. Rows are
assigned to the date of their `date_field` in the spec's timezone. A row that cannot be
dated or parsed still belongs somewhere, so it is never dropped: it goes to the date named
in its file name (`...2026-11-01...`) or, failing that, the earliest date among the file's
dated rows, and the snapshot carries the reason for the input dead letter.
"""

import datetime as dt
import fnmatch
import functools
import json
import re
import zoneinfo
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson
from pydantic import BaseModel

from llm_assets.items.source_lines import CsvText, LineTooLong, bounded_lines
from llm_assets.spec.model import PipelineSpec
from llm_assets.util import fastjson

if TYPE_CHECKING:  # Dagster; rows are read in worker processes without it
    from llm_assets.resources.storage import ArtifactStorage

_DATE_IN_NAME = re.compile(r"(\d{4}-\d{2}-\d{2})")
_GLOB = re.compile(r"[*?\[]")
_TOO_DEEP = "nested too deeply to read (JSON arrays and objects within each other)"


class SourceRow(NamedTuple):
    """One row as read, with where it came from; `error` says why it cannot be used.

    A plain tuple: a day has a million of them, and building a pydantic model for each
    would be most of the snapshot step. What makes a record is checked where it is read."""

    file: str
    line: int
    record: dict[str, Any] | None = None
    error: str | None = None

    def to_json(self) -> bytes:
        """The row as its snapshot line (without the newline). orjson writes what JSON
        sources hold; a pydantic model writes the rest the way it always did (datetimes
        and decimals of parquet sources, integers past 64 bits)."""
        try:
            # The fields by name, as _asdict makes them at twice the cost (once per row).
            fields = {
                "file": self.file,
                "line": self.line,
                "record": self.record,
                "error": self.error,
            }
            return orjson.dumps(fields, option=orjson.OPT_UTC_Z)
        except TypeError:
            return SourceRowModel(**self._asdict()).model_dump_json().encode()

    def snapshot_line(self) -> tuple["SourceRow", bytes]:
        """The row and its snapshot line (to_json). A row holding a value JSON cannot hold
        (bytes that are not UTF-8, an object of no JSON type, arrays nested past the
        writers' depth) becomes an unreadable row naming the field, not a failed snapshot."""
        try:
            return self, self.to_json()
        except (TypeError, ValueError, RecursionError):
            pass
        unreadable = self._replace(record=None, error=_unwritable(self.record or {}))
        return unreadable, unreadable.to_json()

    @classmethod
    def from_json(cls, line: bytes) -> "SourceRow":
        """A snapshot line back into a row."""
        return cls(**fastjson.json_loads(line))


class SourceRowModel(BaseModel):
    """SourceRow's JSON as snapshots have always been written: the reference to_json keeps."""

    file: str
    line: int
    record: dict[str, Any] | None = None
    error: str | None = None


def _unwritable(record: dict[str, Any]) -> str:
    """Which of a record's values cannot be written as JSON, and why."""
    for key, value in record.items():
        try:
            SourceRowModel(file="", line=0, record={key: value}).model_dump_json()
        except (TypeError, ValueError, RecursionError) as exc:
            return f"the value of {key!r} cannot be written as JSON: {str(exc)[:200]}"
    return "the row cannot be written as JSON"


def list_source_files(uri: str, storage: "ArtifactStorage") -> list[str]:
    """Expand a file, folder or glob into sorted file uris."""
    if uri.startswith("s3://"):
        if not _GLOB.search(uri):
            return [uri] if storage.exists(uri) else []
        bucket, _, key_pattern = uri[len("s3://") :].partition("/")
        prefix = _GLOB.split(key_pattern, maxsplit=1)[0]
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        from llm_assets.resources.storage import ArtifactStorage

        candidates = ArtifactStorage(base_url=f"s3://{bucket}").list_uris(folder)
        return sorted(u for u in candidates if fnmatch.fnmatch(u, uri))
    path = Path(uri)
    if path.is_dir():
        return sorted(str(p) for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    if _GLOB.search(uri):
        anchor = Path(_GLOB.split(uri, maxsplit=1)[0]).parent
        pattern = str(Path(uri).relative_to(anchor))
        return sorted(str(p) for p in anchor.glob(pattern) if p.is_file())
    return [uri] if path.is_file() else []


def parse_date(value: Any, tz: zoneinfo.ZoneInfo) -> dt.date | None:
    """A row's partition date from an ISO date or timestamp (naive timestamps are UTC)."""
    if value is None or isinstance(value, list | dict):
        return None
    if isinstance(value, dt.datetime):
        stamp = value
    elif isinstance(value, dt.date):
        return value
    else:
        text = str(value)
        return _remembered_date(text, tz) if len(text) <= 64 else _text_date(text, tz)
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    return stamp.astimezone(tz).date()


def _text_date(value: str, tz: zoneinfo.ZoneInfo) -> dt.date | None:
    text = value.strip()
    if not text:
        return None
    try:
        stamp = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if len(text) == 10:
        return stamp.date()
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    return stamp.astimezone(tz).date()


_remembered_date = functools.lru_cache(maxsize=4096)(_text_date)
"""`_text_date` of a short text, remembered: rows written in the same second or on the same
date (a day's rows share a few thousand of them, often) are parsed once."""


def _jsonl_rows(uri: str, storage: "ArtifactStorage", limit: int) -> Iterator[SourceRow]:
    lines = bounded_lines(storage.open_chunks(uri), limit)
    for number, raw in enumerate(lines, start=1):
        row = jsonl_row(uri, number, raw, limit)
        if row is not None:
            yield row


def jsonl_row(uri: str, number: int, raw: bytes | LineTooLong, limit: int) -> SourceRow | None:
    """Physical line `number` of a JSONL file as its row; None for a blank line."""
    if isinstance(raw, LineTooLong):
        return SourceRow(file=uri, line=number, error=raw.reason(limit))
    if not raw.strip():
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return SourceRow(file=uri, line=number, error=f"invalid UTF-8 at byte {exc.start}")
    try:
        record, clean = fastjson.parse(text)
    except json.JSONDecodeError as exc:
        return SourceRow(file=uri, line=number, error=f"not valid JSON: {exc.msg}")
    except RecursionError:
        return SourceRow(file=uri, line=number, error=_TOO_DEEP)
    if not isinstance(record, dict):
        return SourceRow(file=uri, line=number, error="not a JSON object")
    if clean:
        # orjson read it, so its text is valid Unicode: nothing for _checked to find.
        return SourceRow(uri, number, record)
    return _checked(uri, number, record)


def _checked(uri: str, line: int, record: dict[str, Any]) -> SourceRow:
    """A record whose text cannot be stored as UTF-8 (a lone surrogate escape) is bad input
    of its own, not a reason to fail the whole day."""
    try:
        _encodable(record)
    except UnicodeEncodeError as exc:
        return SourceRow(file=uri, line=line, error=f"invalid Unicode: {exc.reason}")
    except RecursionError:
        return SourceRow(file=uri, line=line, error=_TOO_DEEP)
    return SourceRow(file=uri, line=line, record=record)


def _encodable(value: Any) -> None:
    """Raise UnicodeEncodeError where a text in `value` cannot be UTF-8."""
    if isinstance(value, str):
        value.encode("utf-8")
    elif isinstance(value, dict):
        for key, item in value.items():
            _encodable(key)
            _encodable(item)
    elif isinstance(value, list | tuple):
        for item in value:
            _encodable(item)


def _csv_rows(uri: str, storage: "ArtifactStorage", limit: int) -> Iterator[SourceRow]:
    """Rows keep their physical line number, also after quoted fields that span lines. A
    row the csv module refuses (a field over its field_size_limit), or that holds a line
    over the limit or one that is not UTF-8, is an unreadable row; the rows after it are
    read on. A header that cannot be read makes every row of the file unreadable."""
    import csv

    text = CsvText(bounded_lines(storage.open_chunks(uri), limit), limit)
    reader = csv.reader(text)
    header: list[str] | None = None
    header_error: str | None = None
    error: str | None
    while True:
        start = text.number + 1
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            fields, error = [], f"not valid CSV: {exc}"
        else:
            error = text.problem(start)
        if header is None and header_error is None:
            if error is None:
                header = fields
            else:
                header_error = f"the file's header (line {start}) cannot be read: {error}"
            continue
        if error is None and not fields:
            continue  # a blank line
        error = error or header_error
        if error is not None:
            yield SourceRow(file=uri, line=start, error=error)
        elif header is not None:
            record = dict.fromkeys(header)
            record.update((k, v or None) for k, v in zip(header, fields, strict=False))
            yield _checked(uri, start, record)


def _parquet_rows(uri: str, storage: "ArtifactStorage") -> Iterator[SourceRow]:
    """Read with pyarrow so integer ids next to nulls stay integers. A file pyarrow cannot
    read (not Parquet, cut short, a page it cannot decode) ends in one unreadable row for
    the rows from there on, so the rows before it still count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with storage.local_copy(uri) as path:
        number = 0
        try:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=10_000):
                for record in batch.to_pylist():
                    number += 1
                    yield _checked(uri, number, record)
        except pa.ArrowException as exc:
            error = f"cannot read the Parquet file from row {number + 1} on: {exc}"
            yield SourceRow(file=uri, line=number + 1, error=error)


def read_file_rows(uri: str, spec: PipelineSpec, storage: "ArtifactStorage") -> Iterator[SourceRow]:
    limit = spec.source.max_line_bytes
    if spec.source.kind == "jsonl":
        return _jsonl_rows(uri, storage, limit)
    if spec.source.kind == "csv":
        return _csv_rows(uri, storage, limit)
    return _parquet_rows(uri, storage)


def _date_in_name(uri: str) -> dt.date | None:
    named = _DATE_IN_NAME.search(Path(uri).name)
    if named is None:
        return None
    try:
        return dt.date.fromisoformat(named.group(1))
    except ValueError:
        return None


def _dated_rows(
    spec: PipelineSpec, uri: str, storage: "ArtifactStorage"
) -> Iterator[tuple[SourceRow, dt.date | None]]:
    """A file's rows in file order with their partition date (`row_date`). In file order, so
    "the first row of an id" is the first line."""
    home = file_home(spec, uri, storage)
    tz = zoneinfo.ZoneInfo(spec.partitions.timezone)
    date_field = spec.source.date_field
    for row in read_file_rows(uri, spec, storage):
        yield row, row_date(row, date_field, tz) or home


def row_date(row: SourceRow, date_field: str, tz: zoneinfo.ZoneInfo) -> dt.date | None:
    """A row's own partition date; None for a row that cannot be dated, which gets its
    file's (file_home)."""
    if row.record is None:
        return None
    return parse_date(row.record.get(date_field), tz)


def file_home(spec: PipelineSpec, uri: str, storage: "ArtifactStorage") -> dt.date | None:
    """The date of a file's rows that cannot be dated: from its name, else its earliest dated
    row (found by reading the file once more first)."""
    home = _date_in_name(uri)
    if home is not None:
        return home
    tz = zoneinfo.ZoneInfo(spec.partitions.timezone)
    date_field = spec.source.date_field
    days = (row_date(row, date_field, tz) for row in read_file_rows(uri, spec, storage))
    return min((day for day in days if day is not None), default=None)


def rows_for_partition(
    spec: PipelineSpec, source_uri: str, partition_date: dt.date, storage: "ArtifactStorage"
) -> Iterator[SourceRow]:
    """Every source row that belongs to `partition_date`, in file and line order."""
    for uri in list_source_files(source_uri, storage):
        for row, day in _dated_rows(spec, uri, storage):
            if day == partition_date:
                yield row


class FileDays(NamedTuple):
    """The partition dates a source file has rows for, and its rows that belong to none (no
    date of their own, and none in the file's name or its other rows)."""

    days: set[dt.date]
    undated: int = 0
    first_undated: SourceRow | None = None

    def undated_reason(self, spec: PipelineSpec) -> str:
        """Why the undated rows are not submitted, naming the first."""
        row = self.first_undated
        first = f"line {row.line}: {row.error or 'no date'}" if row is not None else ""
        return (
            f"{self.undated} row(s) belong to no day: no usable {spec.source.date_field!r}, and "
            f"no date in the file's name or its other rows (first at {first}); they are not "
            "submitted until the file names its day"
        )


def file_days(spec: PipelineSpec, uri: str, storage: "ArtifactStorage") -> FileDays:
    """The partition dates a source file has rows for, and the rows that have none."""
    days: set[dt.date] = set()
    undated = 0
    first: SourceRow | None = None
    for row, day in _dated_rows(spec, uri, storage):
        if day is not None:
            days.add(day)
            continue
        undated += 1
        if first is None:
            first = row
    return FileDays(days, undated, first)
