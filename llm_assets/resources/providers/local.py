"""The embedded `local` provider: a batch API that runs on this machine, with no key and no network.

It follows the lifecycle of a remote batch API so that the rest of the platform cannot tell the
difference: `submit` copies a shard's request file into a batch folder, each `poll` advances the
batch (validating -> in_progress -> completed, with OpenAI's status words) and executes as many
pending requests as fit in `work_budget_seconds`, and `results` streams the output files.

Wire format is the OpenAI Batch API's: one `/v1/chat/completions` request per line, and output
and error lines of the same shape. What to produce is read from
`response_format.json_schema.schema`:

- a string property with `enum` gets a label (zero-shot, by similarity to the label phrases or to
  `x_local.label_descriptions`);
- a number property bounded to [0, 1] gets the confidence of the first label property;
- a string property without `enum` gets an extractive summary within minLength/maxLength
  (400 characters when the schema sets no maxLength);
- an array of numbers gets the 384-dimension embedding.

Text-format requests (no response_format) get a summary within `x_local.text_min_chars` and
`x_local.text_max_chars`; the latter defaults to 4 characters per `max_tokens`.

The parts: `local_plans` (what a request asks for, and the spec checks), `local_answers` (how
a request line is refused, rejected or answered), `local_files` (the batch folder, crash-safe)
and `local_engine` (the model).
"""

import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pydantic

from llm_assets.resources.providers.base import (
    BatchProvider,
    BatchStatus,
    ItemResult,
    RequestItem,
    ShardState,
    ShardSubmission,
)
from llm_assets.resources.providers.local_answers import execute, item_result, line_problem
from llm_assets.resources.providers.local_engine import LocalEngine
from llm_assets.resources.providers.local_files import (
    ENDPOINT,
    SHARD_FIELDS,
    BatchErrorData,
    LocalBatch,
    RequestCounts,
    answered,
    batch_lock,
    complete_lines,
    load_batch,
    pending_chunks,
    save_batch,
    write_atomic,
)
from llm_assets.resources.providers.local_plans import local_spec_problems

if TYPE_CHECKING:
    from llm_assets.resources.storage import ArtifactStorage
    from llm_assets.spec.model import PipelineSpec

MAX_REPORTED_PROBLEMS = 20
STATE_OF: dict[str, ShardState] = {
    "validating": ShardState.SUBMITTED,
    "in_progress": ShardState.RUNNING,
    "finalizing": ShardState.RUNNING,
    "completed": ShardState.COMPLETED,
    "failed": ShardState.FAILED,
    "expired": ShardState.EXPIRED,
    "cancelling": ShardState.RUNNING,
    "cancelled": ShardState.CANCELLED,
}
_ENDED: frozenset[str] = frozenset({"completed", "failed", "expired", "cancelled"})
_BATCH_ID = re.compile(r"^lb_[0-9a-f]{24}$")


class BatchNotEndedError(RuntimeError):
    """results() was asked for before the batch reached completed, failed, expired or cancelled."""


def local_batch_id(shard_id: str) -> str:
    """Deterministic, so submitting the same shard twice finds the first batch."""
    return "lb_" + hashlib.sha256(shard_id.encode()).hexdigest()[:24]


class LocalProvider(BatchProvider):
    """The embedded provider: batches live in a folder, work happens when polled."""

    ends_when_polled = True
    state_dir: str = pydantic.Field(
        description="Provider-side state, e.g. $LLM_ASSETS_HOME/local_provider."
    )
    work_budget_seconds: float = pydantic.Field(
        default=20.0,
        ge=0.0,
        description="How long one poll may spend executing requests (at least one chunk runs).",
    )
    chunk_size: int = pydantic.Field(
        default=32, gt=0, description="Requests executed together; progress is saved per chunk."
    )

    def spec_problems(self, spec: "PipelineSpec") -> list[tuple[str, str]]:
        return local_spec_problems(spec)

    def request_line(self, spec: "PipelineSpec", item: RequestItem) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": spec.model.name,
            "messages": [
                {"role": "system", "content": item.system},
                {"role": "user", "content": item.user},
            ],
            "max_tokens": spec.model.max_output_tokens,
            "temperature": spec.model.temperature,
        }
        extras: dict[str, Any] = {}
        descriptions = spec.model.options.get("label_descriptions")
        if descriptions:
            extras["label_descriptions"] = dict(descriptions)
        if spec.output.format == "json":
            from llm_assets.results.validation import chat_response_format

            body["response_format"] = chat_response_format(spec)
        else:
            text_field = spec.output.output_schema.get("text")
            min_chars = text_field.min_length if text_field is not None else None
            max_chars = text_field.max_length if text_field is not None else None
            extras["text_min_chars"] = min_chars or 0
            extras["text_max_chars"] = max_chars or 4 * spec.model.max_output_tokens
        if extras:
            body["x_local"] = extras
        return {"custom_id": item.custom_id, "method": "POST", "url": ENDPOINT, "body": body}

    def find_submitted(self, shard: ShardSubmission) -> str | None:
        batch_id = local_batch_id(shard.shard_id)
        return batch_id if (self._batches_dir() / batch_id / "batch.json").exists() else None

    def submit(self, shard: ShardSubmission, storage: "ArtifactStorage") -> str:
        batch_id = local_batch_id(shard.shard_id)
        final = self._batches_dir() / batch_id
        if (final / "batch.json").exists():
            return batch_id
        final.parent.mkdir(parents=True, exist_ok=True)
        # Built aside and renamed into place, so a batch folder is either whole or absent.
        staging = final.parent / f".staging-{batch_id}-{uuid.uuid4().hex}"
        staging.mkdir()
        try:
            count = 0
            with (staging / "input.jsonl").open("wb") as handle:
                for line in storage.open_lines(shard.input_uri):
                    handle.write(line.rstrip(b"\r") + b"\n")
                    count += bool(line.strip())
                handle.flush()
                os.fsync(handle.fileno())
            batch = LocalBatch(
                id=batch_id,
                **shard.model_dump(include=set(SHARD_FIELDS)),
                created_at=int(time.time()),
                request_counts=RequestCounts(total=count),
            )
            write_atomic(staging / "batch.json", batch.model_dump_json(indent=2).encode())
            try:
                os.rename(staging, final)
            except OSError:
                if not (final / "batch.json").exists():
                    raise
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        return batch_id

    def poll(self, provider_batch_id: str) -> BatchStatus:
        return self._poll(provider_batch_id, self.work_budget_seconds)

    def poll_briefly(self, provider_batch_id: str, timeout_seconds: float) -> BatchStatus:
        """A poll that works on the batch for at most `timeout_seconds` (one chunk at least)."""
        return self._poll(provider_batch_id, min(self.work_budget_seconds, timeout_seconds))

    def _poll(self, provider_batch_id: str, work_seconds: float) -> BatchStatus:
        folder = self._batch_dir(provider_batch_id)
        with batch_lock(folder, blocking=False) as locked:
            batch = load_batch(folder)
            if not locked or batch.status in _ENDED:
                # Another poller is working on it, or there is nothing left to do.
                return self._status(batch)
            if batch.status == "cancelling":
                batch = self._finish_cancel(folder, batch)
                return self._status(batch)
            deadline = time.monotonic() + work_seconds
            if batch.status == "validating":
                batch = self._validate(folder, batch)
                if batch.status == "failed":
                    return self._status(batch)
            batch = self._work(folder, batch, deadline)
            return self._status(batch)

    def results(self, provider_batch_id: str) -> Iterator[ItemResult]:
        folder = self._batch_dir(provider_batch_id)
        batch = load_batch(folder)
        if batch.status not in _ENDED:
            raise BatchNotEndedError(
                f"local batch {provider_batch_id} is {batch.status}; results are available "
                "once it is completed, failed, expired or cancelled (keep polling)"
            )
        return self._iter_results(folder)

    def cancel(self, provider_batch_id: str) -> BatchStatus:
        folder = self._batch_dir(provider_batch_id)
        # Waits for a running poll to finish its chunk, so output stops growing after this.
        with batch_lock(folder, blocking=True):
            batch = load_batch(folder)
            if batch.status in _ENDED:
                return self._status(batch)
            return self._status(self._finish_cancel(folder, batch))

    def _batches_dir(self) -> Path:
        return Path(self.state_dir).expanduser() / "batches"

    def _batch_dir(self, batch_id: str) -> Path:
        if not _BATCH_ID.match(batch_id):
            raise ValueError(f"{batch_id!r} is not a local provider batch id")
        folder = self._batches_dir() / batch_id
        if not (folder / "batch.json").exists():
            raise FileNotFoundError(f"no local batch {batch_id} under {self._batches_dir()}")
        return folder

    @staticmethod
    def _status(batch: LocalBatch) -> BatchStatus:
        message = None
        if batch.status == "failed" and batch.errors:
            listed = "; ".join(
                f"line {e.line}: {e.message}" if e.line else e.message for e in batch.errors
            )
            more = batch.error_count - len(batch.errors)
            message = f"input validation failed: {listed}" + (
                f"; and {more} more problem(s)" if more > 0 else ""
            )
        counts = batch.request_counts
        return BatchStatus(
            provider_batch_id=batch.id,
            state=STATE_OF[batch.status],
            raw_status=batch.status,
            total=counts.total,
            completed=counts.completed,
            failed=counts.failed,
            message=message,
        )

    def _finish_cancel(self, folder: Path, batch: LocalBatch) -> LocalBatch:
        completed, failed = (len(ids) for ids in answered(folder))
        return save_batch(
            folder,
            batch.model_copy(
                update={
                    "status": "cancelled",
                    "cancelled_at": int(time.time()),
                    "request_counts": RequestCounts(
                        total=batch.request_counts.total, completed=completed, failed=failed
                    ),
                }
            ),
        )

    def _validate(self, folder: Path, batch: LocalBatch) -> LocalBatch:
        """OpenAI checks the whole file before running any of it; so do we."""
        problems: list[BatchErrorData] = []
        seen: set[str] = set()
        total = 0
        with (folder / "input.jsonl").open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                if not raw.strip():
                    continue
                total += 1
                problem = line_problem(raw, seen)
                if problem is not None:
                    problems.append(
                        BatchErrorData(code=problem[0], message=problem[1], line=number)
                    )
        if total == 0:
            problems.append(BatchErrorData(code="empty_file", message="the input has no requests"))
        now = int(time.time())
        counts = RequestCounts(total=total)
        if problems:
            return save_batch(
                folder,
                batch.model_copy(
                    update={
                        "status": "failed",
                        "failed_at": now,
                        "request_counts": counts,
                        "errors": problems[:MAX_REPORTED_PROBLEMS],
                        "error_count": len(problems),
                    }
                ),
            )
        return save_batch(
            folder,
            batch.model_copy(
                update={"status": "in_progress", "in_progress_at": now, "request_counts": counts}
            ),
        )

    def _work(self, folder: Path, batch: LocalBatch, deadline: float) -> LocalBatch:
        """Run pending requests chunk by chunk; at least one chunk per poll, then until deadline."""
        succeeded, rejected = answered(folder)
        done = succeeded | rejected
        completed, failed = len(succeeded), len(rejected)
        del succeeded, rejected
        engine: LocalEngine | None = None
        with (
            (folder / "output.jsonl").open("ab") as output,
            (folder / "errors.jsonl").open("ab") as errors,
        ):
            for chunk in pending_chunks(folder / "input.jsonl", done, self.chunk_size):
                engine = engine or LocalEngine.shared()
                ok_lines, error_lines = execute(engine, batch.id, chunk)
                for handle, lines in ((output, ok_lines), (errors, error_lines)):
                    if lines:
                        handle.write(b"".join(lines))
                        handle.flush()
                        os.fsync(handle.fileno())
                completed += len(ok_lines)
                failed += len(error_lines)
                done.update(request["custom_id"] for _, request in chunk)
                if time.monotonic() >= deadline:
                    break
        counts = RequestCounts(total=batch.request_counts.total, completed=completed, failed=failed)
        update: dict[str, Any] = {"request_counts": counts}
        if completed + failed >= counts.total:
            update.update(status="completed", completed_at=int(time.time()))
        return save_batch(folder, batch.model_copy(update=update))

    @staticmethod
    def _iter_results(folder: Path) -> Iterator[ItemResult]:
        for name in ("output.jsonl", "errors.jsonl"):
            for line in complete_lines(folder / name):
                yield item_result(json.loads(line))
