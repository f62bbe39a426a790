"""A snapshot's lines made from the source rows of a day: each row cut to the fields the
pipeline keeps, written as its snapshot line, with its slice key.

A JSONL file's lines are parsed, dated and written in worker processes (util.parallel), in
blocks of its physical lines numbered from their first, and come back in file order as blocks
of snapshot lines (`jsonl_day_blocks`): reading a large day's file is then a split of its
chunks here. CSV and Parquet sources are read row by row in the step's process
(`row_lines`). Both give the same bytes for the same rows.
"""

import array
import datetime as dt
import zlib
import zoneinfo
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from llm_assets.items.source import SourceRow, file_home, jsonl_row, list_source_files, row_date
from llm_assets.items.source_lines import LineTooLong, bounded_lines
from llm_assets.spec.model import PipelineSpec
from llm_assets.util import parallel

if TYPE_CHECKING:  # Dagster; blocks are made in worker processes without it
    from llm_assets.resources.storage import ArtifactStorage


class SnapshotForm(NamedTuple):
    """What a snapshot keeps of a row, and whether rows get slice keys (sliced pipelines)."""

    keep: frozenset[str]
    id_field: str
    sliced: bool

    @classmethod
    def of(cls, spec: PipelineSpec) -> "SnapshotForm":
        """The source's id, date and fields, and the evaluation's reference (scored by an
        evaluation, never sent)."""
        keep = {spec.source.id_field, spec.source.date_field, *spec.source.fields}
        if spec.eval.reference_field is not None:
            keep.add(spec.eval.reference_field)
        return cls(frozenset(keep), spec.source.id_field, spec.sharding.slices > 1)


def slice_key(record: dict[str, Any] | None, id_field: str, position: int) -> int:
    """A row's slice key: the CRC-32 of its source id, so that every row of an id falls into
    the same slice (the first of them is kept, the others are repeats, as in a build in one
    step); a row without a usable id, which repeats nothing, by its position."""
    source_id = _usable_id(record, id_field)
    return position & 0xFFFF if source_id is None else _id_key(source_id)


def _usable_id(record: dict[str, Any] | None, id_field: str) -> str | None:
    """The row's source id as the build reads it (items.prepare.as_text); None when it has
    none the build can use."""
    value = record.get(id_field) if record is not None else None
    source_id = "" if value is None else value if isinstance(value, str) else str(value)
    return None if not source_id.strip() or "\x00" in source_id else source_id


def _id_key(source_id: str) -> int:
    return zlib.crc32(source_id.encode("utf-8", errors="surrogatepass")) & 0xFFFF


def snapshot_line(form: SnapshotForm, row: SourceRow) -> tuple[SourceRow, bytes]:
    """The row as the snapshot holds it (its record cut to the kept fields; unreadable if a
    value cannot be written as JSON) and its line, without the newline."""
    if row.record is not None and not row.record.keys() <= form.keep:
        record = {k: v for k, v in row.record.items() if k in form.keep}
        row = SourceRow(row.file, row.line, record, row.error)
    return row.snapshot_line()


class JsonlDay(NamedTuple):
    """What a worker needs to make snapshot lines of a JSONL file's lines (picklable)."""

    uri: str
    limit: int
    timezone: str
    date_field: str
    day: dt.date
    home: dt.date | None
    """The date of the file's rows that cannot be dated (source.file_home)."""
    form: SnapshotForm


class SnapshotBlock(NamedTuple):
    """The snapshot lines of consecutive physical lines of a file."""

    data: bytes
    """The lines, each with its newline."""
    rows: int
    unreadable: int
    keys: bytes
    """Slice keys of the rows (sliced pipelines), array("H") in this machine's order."""
    by_position: list[int]
    """The rows (from 0 in this block) keyed by their position in the snapshot."""


def jsonl_block(
    day: JsonlDay, blocks: list[tuple[int, list[bytes | LineTooLong]]]
) -> SnapshotBlock:
    """The snapshot lines of the day's rows among numbered blocks of a file's physical lines
    (`parallel.numbered_blocks`: each with the position of its first line, from 0)."""
    tz = zoneinfo.ZoneInfo(day.timezone)
    form, uri, limit, date_field = day.form, day.uri, day.limit, day.date_field
    lines: list[bytes] = []
    keys = array.array("H")
    by_position: list[int] = []
    unreadable = 0
    for first, raws in blocks:
        for number, raw in enumerate(raws, start=first + 1):
            row = jsonl_row(uri, number, raw, limit)
            if row is None or (row_date(row, date_field, tz) or day.home) != day.day:
                continue
            row, line = snapshot_line(form, row)
            unreadable += row.record is None
            if form.sliced:
                source_id = _usable_id(row.record, form.id_field)
                if source_id is None:
                    by_position.append(len(lines))
                keys.append(0 if source_id is None else _id_key(source_id))
            lines.append(line)
    data = b"\n".join(lines) + b"\n" if lines else b""
    return SnapshotBlock(data, len(lines), unreadable, keys.tobytes(), by_position)


class SnapshotTally:
    """What the snapshot's blocks held, counted as they are made."""

    def __init__(self) -> None:
        self.unreadable = 0
        self.keys = array.array("H")
        """Each row's slice key, in snapshot order (sliced pipelines)."""
        self.files: set[str] = set()
        """The files that hold rows of the day."""


def row_lines(
    rows: Iterable[SourceRow], form: SnapshotForm, tally: SnapshotTally
) -> Iterator[bytes]:
    """The snapshot lines (without newlines) of rows read in this process."""
    for row in rows:
        tally.files.add(row.file)
        row, line = snapshot_line(form, row)
        tally.unreadable += row.record is None
        if form.sliced:
            tally.keys.append(slice_key(row.record, form.id_field, len(tally.keys)))
        yield line


def jsonl_day_blocks(
    workers: parallel.Workers,
    spec: PipelineSpec,
    source_uri: str,
    day: dt.date,
    storage: "ArtifactStorage",
    tally: SnapshotTally,
) -> Iterator[bytes]:
    """The snapshot lines of the day's rows in the JSONL files of `source_uri`, in blocks of
    whole lines in file order, made on the workers (`jsonl_file_blocks`)."""
    form = SnapshotForm.of(spec)
    limit = spec.source.max_line_bytes
    tz, date_field = spec.partitions.timezone, spec.source.date_field
    for uri in list_source_files(source_uri, storage):
        home = file_home(spec, uri, storage)
        of_day = JsonlDay(uri, limit, tz, date_field, day, home, form)
        lines = bounded_lines(storage.open_chunks(uri), limit)
        yield from jsonl_file_blocks(workers, of_day, lines, tally)


def jsonl_file_blocks(
    workers: parallel.Workers,
    of_day: JsonlDay,
    lines: Iterable[bytes | LineTooLong],
    tally: SnapshotTally,
) -> Iterator[bytes]:
    """The snapshot lines of a JSONL file's day, from its physical lines (source_lines.
    bounded_lines), made on the workers: blocks of whole lines in file order."""
    keys = tally.keys
    blocks = parallel.numbered_blocks(lines)
    for block in workers.map(jsonl_block, of_day, blocks, weight=lambda b: len(b[1])):
        if block.rows:
            tally.files.add(of_day.uri)
        tally.unreadable += block.unreadable
        if of_day.form.sliced:
            got = array.array("H", block.keys)
            for at in block.by_position:
                got[at] = (len(keys) + at) & 0xFFFF
            keys.extend(got)
        yield block.data
