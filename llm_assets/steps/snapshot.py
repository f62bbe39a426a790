"""input_snapshot: the partition's source rows frozen into one content-addressed file."""

import datetime as dt
import hashlib
import json
import os
import tempfile
from pathlib import Path

from pydantic import BaseModel

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
from llm_assets.util.failpoints import failpoint

SOURCES_SUFFIX = ".sources.json"
"""Next to each snapshot `<hash>.jsonl`, `<hash>.sources.json` maps the source files it holds
rows of to their versions (ArtifactStorage.version) as they were when the rows were read."""

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
    keep = {spec.source.id_field, spec.source.date_field, *spec.source.fields}
    if spec.eval.reference_field is not None:
        keep.add(spec.eval.reference_field)  # scored by an evaluation, never sent
    rows = 0
    unreadable = 0
    files: set[str] = set()
    digest = hashlib.sha256()
    with tempfile.NamedTemporaryFile("wb", suffix=".jsonl", delete=False) as tmp:
        try:
            for row in rows_for_partition(spec, source_uri, day, storage):
                files.add(row.file)
                if row.record is not None and not row.record.keys() <= keep:
                    record = {k: v for k, v in row.record.items() if k in keep}
                    row = SourceRow(row.file, row.line, record, row.error)
                row, line = row.snapshot_line()
                unreadable += row.record is None
                line += b"\n"
                digest.update(line)
                tmp.write(line)
                rows += 1
            tmp.close()
            sha = digest.hexdigest()
            key = artifact_key(snapshot_dir(spec, day), f"{sha[:20]}.jsonl")
            uri = storage.uri(key)
            reused = storage.exists(uri)
            if not reused:
                storage.write_file(key, Path(tmp.name))
                failpoint("snapshot.after_write")
        finally:
            os.unlink(tmp.name)
    sources = {uri: versions[uri] for uri in sorted(files) if versions.get(uri)}
    storage.write_bytes(key.removesuffix(".jsonl") + SOURCES_SUFFIX, json.dumps(sources).encode())
    storage.write_bytes(artifact_key(snapshot_dir(spec, day), "CURRENT"), uri.encode())
    return SnapshotResult(
        uri=uri, sha256=sha, rows=rows, unreadable_rows=unreadable, reused=reused, files=len(files)
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
