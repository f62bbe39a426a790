"""A local batch's folder: batch.json (its state) beside input.jsonl, output.jsonl and
errors.jsonl, and the crash-safe ways they are read and written.

Which requests are answered is derived from output.jsonl and errors.jsonl themselves (a
trailing partial line left by a kill is cut away first), so a poll killed at any point loses
nothing and answers nothing twice. batch.json is replaced atomically; one lock file per
folder lets one poller work on a batch at a time, across threads and processes.
"""

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from llm_assets.util import file_lock

ENDPOINT = "/v1/chat/completions"

RawStatus = Literal[
    "validating",
    "in_progress",
    "finalizing",
    "completed",
    "failed",
    "expired",
    "cancelling",
    "cancelled",
]


class RequestCounts(BaseModel):
    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchErrorData(BaseModel):
    """One input problem, shaped like an entry of OpenAI's `errors.data`."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None


class LocalBatch(BaseModel):
    """batch.json: the batch's state, rewritten atomically on every transition."""

    model_config = ConfigDict(extra="forbid")

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str = ENDPOINT
    shard_id: str
    job_id: str
    pipeline: str
    input_uri: str
    item_count: int
    status: RawStatus = "validating"
    created_at: int
    in_progress_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = RequestCounts()
    errors: list[BatchErrorData] = []
    error_count: int = 0


SHARD_FIELDS = frozenset({"shard_id", "job_id", "pipeline", "input_uri", "item_count"})
"""What a batch keeps of the shard it is made from: these fields of its ShardSubmission."""


def pending_chunks(
    input_path: Path, done: set[str], size: int
) -> Iterator[list[tuple[int, dict[str, Any]]]]:
    """Unanswered requests in input order, with their 1-based request number."""
    chunk: list[tuple[int, dict[str, Any]]] = []
    number = 0
    with input_path.open("rb") as handle:
        for raw in handle:
            if not raw.strip():
                continue
            number += 1
            request = json.loads(raw)
            if request["custom_id"] in done:
                continue
            chunk.append((number, request))
            if len(chunk) >= size:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def complete_lines(path: Path) -> Iterator[bytes]:
    """Newline-terminated lines only: a trailing partial line is a write that never finished."""
    if not path.exists():
        return
    with path.open("rb") as handle:
        for line in handle:
            if line.endswith(b"\n") and line.strip():
                yield line


def truncate_partial(path: Path) -> None:
    """Cut a trailing line a killed poll left half-written, so appends start on a fresh line."""
    if not path.exists():
        return
    with path.open("r+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return
        position = size
        block = 64 * 1024
        while position > 0:
            start = max(0, position - block)
            handle.seek(start)
            data = handle.read(position - start)
            newline = data.rfind(b"\n")
            if newline >= 0:
                handle.truncate(start + newline + 1)
                break
            position = start
        else:
            handle.truncate(0)
        handle.flush()
        os.fsync(handle.fileno())


def answered(folder: Path) -> tuple[set[str], set[str]]:
    """custom_ids answered so far, from the files themselves: the only source of truth."""
    sets: list[set[str]] = []
    for name in ("output.jsonl", "errors.jsonl"):
        path = folder / name
        truncate_partial(path)
        ids: set[str] = set()
        for line in complete_lines(path):
            ids.add(json.loads(line)["custom_id"])
        sets.append(ids)
    return sets[0], sets[1]


@contextlib.contextmanager
def batch_lock(folder: Path, *, blocking: bool) -> Iterator[bool]:
    """One worker per batch across threads and processes; yields whether the lock was taken."""
    with (
        (folder / ".lock").open("a") as handle,
        file_lock.exclusive(handle.fileno(), blocking=blocking) as taken,
    ):
        yield taken


def write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def load_batch(folder: Path) -> LocalBatch:
    return LocalBatch.model_validate_json((folder / "batch.json").read_bytes())


def save_batch(folder: Path, batch: LocalBatch) -> LocalBatch:
    write_atomic(folder / "batch.json", batch.model_dump_json(indent=2).encode())
    return batch
