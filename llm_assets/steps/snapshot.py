"""input_snapshot: the partition's source rows frozen into one content-addressed file."""

import array
import datetime as dt
import hashlib
import json
import sys

from pydantic import BaseModel

from llm_assets.items.snapshot_rows import (
    SnapshotForm,
    SnapshotTally,
    jsonl_day_blocks,
    row_lines,
    slice_key,
)
from llm_assets.items.source import SourceRow, list_source_files, rows_for_partition
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec.model import PipelineSpec
from llm_assets.steps.context import (
    MissingPrerequisite,
    StepContext,
    artifact_key,
    current_snapshot_uri,
    refuse_expired,
    snapshot_dir,
)
from llm_assets.steps.residency import refuse_outside_regions
from llm_assets.util import parallel
from llm_assets.util.failpoints import failpoint

SOURCES_SUFFIX = ".sources.json"
"""Next to each snapshot `<hash>.jsonl`, `<hash>.sources.json` maps the source files it holds
rows of to their versions (ArtifactStorage.version) as they were when the rows were read."""

SLICE_KEYS_SUFFIX = ".slices.bin"
"""Next to the snapshot of a sliced pipeline (sharding.slices above 1), `<hash>.slices.bin`
holds each row's slice key (`items.snapshot_rows.slice_key`), two bytes a row,
little-endian: a slice of the day's build (steps/build.py) takes the rows whose key falls to
it without reading the others' records."""

EMPTY_SNAPSHOT = f"{hashlib.sha256(b'').hexdigest()[:20]}.jsonl"
"""The file name of a snapshot with no rows: snapshots are named by the hash of their content."""


class SnapshotResult(BaseModel):
    uri: str
    sha256: str
    rows: int
    unreadable_rows: int
    reused: bool
    files: int

    @property
    def empty(self) -> bool:
        """No source rows for the day: the later steps skip it."""
        return self.rows == 0


def _keys_bytes(keys: "array.array[int]") -> bytes:
    if sys.byteorder != "little":
        keys = array.array("H", keys)
        keys.byteswap()
    return keys.tobytes()


def slice_keys(
    storage: ArtifactStorage, spec: PipelineSpec, snapshot_uri: str
) -> "array.array[int]":
    """The slice key of each row of the snapshot: its SLICE_KEYS_SUFFIX file, or (a snapshot
    taken while the pipeline was not sliced) read from its rows."""
    uri = snapshot_uri.removesuffix(".jsonl") + SLICE_KEYS_SUFFIX
    keys = array.array("H")
    if storage.exists(uri):
        keys.frombytes(storage.read_bytes(uri))
        if sys.byteorder != "little":
            keys.byteswap()
        return keys
    for position, line in enumerate(storage.open_lines(snapshot_uri)):
        keys.append(slice_key(SourceRow.from_json(line).record, spec.source.id_field, position))
    return keys


def take_snapshot(ctx: StepContext, source_uri: str) -> SnapshotResult:
    """Freeze the partition's source rows into an immutable, content-addressed JSONL file.

    The file is named by the hash of its content, so taking the snapshot again over the same
    rows reuses it; the CURRENT pointer names the snapshot the later steps read. The source
    files' versions are taken before their rows are read and written next to the snapshot
    (SOURCES_SUFFIX), so a file changed meanwhile shows as newer than the snapshot, never
    older. Nothing is written where `compliance.allowed_regions` does not allow it, nor for a
    day retention expired (DayExpired).
    """
    refuse_expired(ctx.spec, ctx.ledger.get_job(ctx.job_id))
    refuse_outside_regions(ctx)
    spec, day, storage = ctx.spec, ctx.day, ctx.storage
    versions = {uri: storage.version(uri) for uri in list_source_files(source_uri, storage)}
    form = SnapshotForm.of(spec)
    tally = SnapshotTally()
    # Written and hashed once, into a staged file published under the name of its hash. The
    # pool starts its processes only for a large JSONL day, and ends with the writing.
    pending = artifact_key(snapshot_dir(spec, day), "snapshot.jsonl")
    with parallel.Workers() as workers:
        if spec.source.kind == "jsonl":
            blocks = jsonl_day_blocks(workers, spec, source_uri, day, storage, tally)
            staged = storage.stage_blocks(pending, blocks)
        else:
            read = rows_for_partition(spec, source_uri, day, storage)
            staged = storage.stage_lines(pending, row_lines(read, form, tally))
    sha = staged.written.sha256
    key = artifact_key(snapshot_dir(spec, day), f"{sha[:20]}.jsonl")
    uri = storage.uri(key)
    try:
        reused = storage.exists(uri)
        if not reused:
            staged.publish(key)
            failpoint("snapshot.after_write")
    finally:
        staged.discard()  # the same content is there already (or the check failed)
    rows = staged.written.line_count
    sources = {uri: versions[uri] for uri in sorted(tally.files) if versions.get(uri)}
    storage.write_bytes(key.removesuffix(".jsonl") + SOURCES_SUFFIX, json.dumps(sources).encode())
    if form.sliced:
        storage.write_bytes(key.removesuffix(".jsonl") + SLICE_KEYS_SUFFIX, _keys_bytes(tally.keys))
    storage.write_bytes(artifact_key(snapshot_dir(spec, day), "CURRENT"), uri.encode())
    return SnapshotResult(
        uri=uri,
        sha256=sha,
        rows=rows,
        unreadable_rows=tally.unreadable,
        reused=reused,
        files=len(tally.files),
    )


def snapshot_sources(storage: ArtifactStorage, snapshot_uri: str) -> dict[str, str]:
    """The source files a snapshot holds rows of and their versions when they were read; empty
    for a snapshot taken before the versions were recorded, or whose record cannot be read."""
    uri = snapshot_uri.removesuffix(".jsonl") + SOURCES_SUFFIX
    if not storage.exists(uri):
        return {}
    try:
        sources = json.loads(storage.read_bytes(uri))
    except ValueError:
        return {}
    return sources if isinstance(sources, dict) else {}


def no_source_rows(spec: PipelineSpec, day: dt.date, storage: ArtifactStorage) -> bool:
    """Whether the day's current snapshot holds no source rows (read from its name: a
    snapshot is named by the hash of its content); False before any snapshot was taken."""
    try:
        uri = current_snapshot_uri(spec, day, storage)
    except MissingPrerequisite:
        return False
    return uri.endswith("/" + EMPTY_SNAPSHOT)


def no_source_rows_reason(day: dt.date) -> str:
    """What an empty day reports in metadata, checks, logs and the CLI."""
    return f"no source rows for {day.isoformat()}"
