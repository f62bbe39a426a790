"""The embedded `local` provider: a batch API that runs on this machine, with no key and no network.

It follows the lifecycle of a remote batch API so that the rest of the platform cannot tell the
difference: `submit` copies a shard's request file into a batch folder, each `poll` advances the
batch (validating -> in_progress -> completed, with OpenAI's status words) and executes as many
pending requests as fit in `work_budget_seconds`, and `results` streams the output files.

Wire format is the OpenAI Batch API's: one `/v1/chat/completions` request per line, and output
and error lines of the same shape. Convention: the system message carries the instructions and
the user message is the document to work on; the engine classifies, summarizes or embeds the
user message only. What to produce is read from `response_format.json_schema.schema`:

- a string property with `enum` gets a label (zero-shot, by similarity to the label phrases or to
  `x_local.label_descriptions`);
- a number property bounded to [0, 1] gets the confidence of the first label property;
- a string property without `enum` gets an extractive summary within minLength/maxLength
  (400 characters when the schema sets no maxLength);
- an array of numbers gets the 384-dimension embedding.

Text-format requests (no response_format) get a summary within `x_local.text_min_chars` and
`x_local.text_max_chars`; the latter defaults to 4 characters per `max_tokens`. JSON outputs are
produced whole, whatever `max_tokens` says, so `finish_reason` is always "stop".

Progress is crash-safe: which requests are answered is derived from output.jsonl and
errors.jsonl on every poll (a trailing partial line left by a kill is truncated away), so a poll
killed at any point loses nothing and answers nothing twice.
"""

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict

from llm_assets.resources.providers.base import (
    BatchProvider,
    BatchStatus,
    ItemResult,
    RequestItem,
    ShardState,
    ShardSubmission,
)
from llm_assets.resources.providers.local_engine import (
    CONTEXT_WINDOW,
    EMBEDDING_DIM,
    MODEL_NAME,
    LocalEngine,
)

if TYPE_CHECKING:
    from llm_assets.resources.storage import ArtifactStorage
    from llm_assets.spec import PipelineSpec

ENDPOINT = "/v1/chat/completions"
DEFAULT_SUMMARY_CHARS = 400
MAX_REPORTED_PROBLEMS = 20
CAPABILITIES = (
    "it produces labels (str with isin), a confidence (float with ge: 0, le: 1), "
    "summaries (str) and embeddings (list[float])"
)

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


class _RequestRejected(Exception):
    """A request the provider answers with a 400 instead of a completion."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class _FieldPlan:
    name: str
    kind: Literal["label", "confidence", "summary", "embedding"]
    labels: tuple[str, ...] = ()
    min_chars: int = 0
    max_chars: int = DEFAULT_SUMMARY_CHARS
    lower: float = 0.0
    upper: float = 1.0


@dataclass(frozen=True)
class _OutputPlan:
    """What one request asks for: JSON fields, or plain text when `fields` is None."""

    fields: tuple[_FieldPlan, ...] | None
    problems: tuple[tuple[str, str], ...] = ()
    text_min_chars: int = 0
    text_max_chars: int = DEFAULT_SUMMARY_CHARS
    descriptions: tuple[tuple[str, str], ...] = ()


def _resolve(node: Any, root: dict[str, Any]) -> dict[str, Any]:
    """Follow a local `$ref` and unwrap `anyOf [X, null]` (pydantic's nullable fields)."""
    seen = 0
    while isinstance(node, dict) and seen < 16:
        seen += 1
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            target: Any = root
            for part in ref[2:].split("/"):
                target = target.get(part, {}) if isinstance(target, dict) else {}
            node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
            continue
        options = node.get("anyOf") or node.get("oneOf")
        if isinstance(options, list):
            concrete = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
            if len(concrete) == 1:
                rest = {k: v for k, v in node.items() if k not in ("anyOf", "oneOf")}
                node = {**rest, **concrete[0]}
                continue
        return node
    return node if isinstance(node, dict) else {}


def _types(node: dict[str, Any]) -> set[str]:
    declared = node.get("type")
    if isinstance(declared, list):
        return {t for t in declared if t != "null"}
    if isinstance(declared, str):
        return {declared}
    enum = node.get("enum")
    if isinstance(enum, list) and enum:
        return {"string" if isinstance(v, str) else "number" for v in enum}
    return set()


def _number_bounds(node: dict[str, Any]) -> tuple[float | None, float | None, bool, bool]:
    lower, upper = node.get("minimum"), node.get("maximum")
    lower_open = upper_open = False
    if node.get("exclusiveMinimum") is not None:
        lower, lower_open = node["exclusiveMinimum"], True
    if node.get("exclusiveMaximum") is not None:
        upper, upper_open = node["exclusiveMaximum"], True
    return lower, upper, lower_open, upper_open


def _plan_field(name: str, node: dict[str, Any], root: dict[str, Any]) -> _FieldPlan | str:
    """The plan for one property, or why it cannot be produced."""
    types = _types(node)
    enum = node.get("enum")
    if isinstance(enum, list):
        if not enum or not all(isinstance(v, str) for v in enum):
            return "labels must be strings (isin lists non-string values)"
        return _FieldPlan(name, "label", labels=tuple(enum))
    if types == {"string"}:
        max_chars = node.get("maxLength", DEFAULT_SUMMARY_CHARS)
        if int(max_chars) < 1:
            return "a summary needs a maxLength of at least 1"
        return _FieldPlan(
            name, "summary", min_chars=int(node.get("minLength", 0)), max_chars=int(max_chars)
        )
    if types == {"number"}:
        lower, upper, lower_open, upper_open = _number_bounds(node)
        if lower != 0 or upper != 1:
            return "a number is only produced as a confidence, which needs bounds ge: 0, le: 1"
        return _FieldPlan(
            name,
            "confidence",
            lower=1e-4 if lower_open else 0.0,
            upper=1 - 1e-4 if upper_open else 1.0,
        )
    if types == {"array"}:
        items = _resolve(node.get("items", {}), root)
        if _types(items) != {"number"}:
            return "an embedding model cannot generate lists of strings"
        low, high = node.get("minItems", 0), node.get("maxItems", EMBEDDING_DIM)
        if not low <= EMBEDDING_DIM <= high:
            return f"embeddings have {EMBEDDING_DIM} dimensions, outside the length bounds"
        return _FieldPlan(name, "embedding")
    if types == {"integer"}:
        return "an embedding model cannot compute counts, scores or ratings"
    if types == {"boolean"}:
        return "an embedding model cannot answer yes/no questions"
    return f"unsupported JSON Schema type {sorted(types) or 'unknown'}"


def _plan_schema(schema: dict[str, Any]) -> tuple[tuple[_FieldPlan, ...], list[tuple[str, str]]]:
    properties = _resolve(schema, schema).get("properties")
    if not isinstance(properties, dict) or not properties:
        return (), [("-", "the schema has no properties")]
    plans: list[_FieldPlan] = []
    problems: list[tuple[str, str]] = []
    for name, raw in properties.items():
        planned = _plan_field(name, _resolve(raw, schema), schema)
        if isinstance(planned, str):
            problems.append((name, planned))
        else:
            plans.append(planned)
    if any(p.kind == "confidence" for p in plans) and not any(p.kind == "label" for p in plans):
        problems.extend(
            (p.name, "a confidence needs a label field (str with isin) to be the confidence of")
            for p in plans
            if p.kind == "confidence"
        )
    return tuple(plans), problems


def _plan_request(body: dict[str, Any]) -> _OutputPlan:
    extras = body.get("x_local") or {}
    descriptions = extras.get("label_descriptions") or {}
    described = tuple(sorted((str(k), str(v)) for k, v in descriptions.items()))
    response_format = body.get("response_format")
    if response_format is None or response_format.get("type") == "text":
        max_tokens = int(body.get("max_tokens") or 512)
        max_chars = int(extras.get("text_max_chars") or 4 * max_tokens)
        return _OutputPlan(
            fields=None,
            problems=(("text", "text_max_chars must be at least 1"),) if max_chars < 1 else (),
            text_min_chars=int(extras.get("text_min_chars") or 0),
            text_max_chars=max_chars,
            descriptions=described,
        )
    if response_format.get("type") != "json_schema":
        return _OutputPlan(
            fields=(), problems=(("response_format", "only json_schema is supported"),)
        )
    schema = (response_format.get("json_schema") or {}).get("schema") or {}
    plans, problems = _plan_schema(schema)
    return _OutputPlan(fields=plans, problems=tuple(problems), descriptions=described)


def request_hash(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


def local_batch_id(shard_id: str) -> str:
    """Deterministic, so submitting the same shard twice finds the first batch."""
    return "lb_" + hashlib.sha256(shard_id.encode()).hexdigest()[:24]


def local_spec_problems(spec: "PipelineSpec") -> list[tuple[str, str]]:
    """What the local provider cannot serve in a spec, as (field, reason)."""
    from llm_assets.validation import output_json_schema

    problems: list[tuple[str, str]] = []
    if spec.model.name != MODEL_NAME:
        problems.append(
            (
                "model.name",
                f"the local provider runs {MODEL_NAME} only, not {spec.model.name!r}",
            )
        )
    labels: set[str] = set()
    if spec.output.format == "json":
        plans, unproducible = _plan_schema(output_json_schema(spec))
        for name, why in unproducible:
            field_spec = spec.output.output_schema.get(name)
            kind = field_spec.type if field_spec is not None else "such"
            problems.append(
                (
                    f"output.schema.{name}",
                    f"the local provider cannot produce {kind} fields: {why}; {CAPABILITIES}",
                )
            )
        labels = {label for plan in plans for label in plan.labels}
    else:
        text_field = spec.output.output_schema.get("text")
        if text_field is not None and (text_field.type != "str" or text_field.isin is not None):
            problems.append(
                (
                    "output.schema.text",
                    f"the local provider cannot produce {text_field.type} fields in text "
                    f"format: text output is an extractive summary; {CAPABILITIES}",
                )
            )
    for key in sorted(set(spec.model.options) - {"label_descriptions"}):
        problems.append(
            (
                "model.options",
                f"unknown option {key!r} for the local provider; it takes label_descriptions",
            )
        )
    descriptions = spec.model.options.get("label_descriptions")
    if descriptions is not None:
        if not isinstance(descriptions, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in descriptions.items()
        ):
            problems.append(
                (
                    "model.options.label_descriptions",
                    "must map each label to a non-empty description",
                )
            )
        else:
            for key in sorted(set(descriptions) - labels):
                problems.append(
                    (
                        "model.options.label_descriptions",
                        f"{key!r} is not a label of the output schema; labels are {sorted(labels)}",
                    )
                )
    return problems


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
            from llm_assets.validation import chat_response_format

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
                shard_id=shard.shard_id,
                job_id=shard.job_id,
                pipeline=shard.pipeline,
                input_uri=shard.input_uri,
                item_count=shard.item_count,
                created_at=int(time.time()),
                request_counts=RequestCounts(total=count),
            )
            _write_atomic(staging / "batch.json", batch.model_dump_json(indent=2).encode())
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
        folder = self._batch_dir(provider_batch_id)
        with _batch_lock(folder, blocking=False) as locked:
            batch = self._load(folder)
            if not locked or batch.status in _ENDED:
                # Another poller is working on it, or there is nothing left to do.
                return self._status(batch)
            if batch.status == "cancelling":
                batch = self._finish_cancel(folder, batch)
                return self._status(batch)
            deadline = time.monotonic() + self.work_budget_seconds
            if batch.status == "validating":
                batch = self._validate(folder, batch)
                if batch.status == "failed":
                    return self._status(batch)
            batch = self._work(folder, batch, deadline)
            return self._status(batch)

    def results(self, provider_batch_id: str) -> Iterator[ItemResult]:
        folder = self._batch_dir(provider_batch_id)
        batch = self._load(folder)
        if batch.status not in _ENDED:
            raise BatchNotEndedError(
                f"local batch {provider_batch_id} is {batch.status}; results are available "
                "once it is completed, failed, expired or cancelled (keep polling)"
            )
        return self._iter_results(folder)

    def cancel(self, provider_batch_id: str) -> BatchStatus:
        folder = self._batch_dir(provider_batch_id)
        # Waits for a running poll to finish its chunk, so output stops growing after this.
        with _batch_lock(folder, blocking=True):
            batch = self._load(folder)
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
    def _load(folder: Path) -> LocalBatch:
        return LocalBatch.model_validate_json((folder / "batch.json").read_bytes())

    @staticmethod
    def _save(folder: Path, batch: LocalBatch) -> LocalBatch:
        _write_atomic(folder / "batch.json", batch.model_dump_json(indent=2).encode())
        return batch

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
        completed, failed = (len(ids) for ids in _answered(folder))
        return self._save(
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
                problem = _line_problem(raw, seen)
                if problem is not None:
                    problems.append(
                        BatchErrorData(code=problem[0], message=problem[1], line=number)
                    )
        if total == 0:
            problems.append(BatchErrorData(code="empty_file", message="the input has no requests"))
        now = int(time.time())
        counts = RequestCounts(total=total)
        if problems:
            return self._save(
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
        return self._save(
            folder,
            batch.model_copy(
                update={"status": "in_progress", "in_progress_at": now, "request_counts": counts}
            ),
        )

    def _work(self, folder: Path, batch: LocalBatch, deadline: float) -> LocalBatch:
        """Run pending requests chunk by chunk; at least one chunk per poll, then until deadline."""
        succeeded, rejected = _answered(folder)
        done = succeeded | rejected
        completed, failed = len(succeeded), len(rejected)
        del succeeded, rejected
        engine: LocalEngine | None = None
        with (
            (folder / "output.jsonl").open("ab") as output,
            (folder / "errors.jsonl").open("ab") as errors,
        ):
            for chunk in _pending_chunks(folder / "input.jsonl", done, self.chunk_size):
                engine = engine or LocalEngine.shared()
                ok_lines, error_lines = _execute(engine, batch.id, chunk)
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
        return self._save(folder, batch.model_copy(update=update))

    @staticmethod
    def _iter_results(folder: Path) -> Iterator[ItemResult]:
        for name in ("output.jsonl", "errors.jsonl"):
            for line in _complete_lines(folder / name):
                yield _item_result(json.loads(line))


def _line_problem(raw: bytes, seen: set[str]) -> tuple[str, str] | None:
    try:
        request = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return "invalid_json_line", f"not valid JSON ({exc.msg if hasattr(exc, 'msg') else exc})"
    if not isinstance(request, dict):
        return "invalid_request", "a request line must be a JSON object"
    custom_id = request.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return "missing_custom_id", "custom_id is missing or not a non-empty string"
    if custom_id in seen:
        return "duplicate_custom_id", f"duplicate custom_id {custom_id!r}"
    seen.add(custom_id)
    if request.get("url") != ENDPOINT:
        return "invalid_url", f"url must be {ENDPOINT}, got {request.get('url')!r}"
    method = request.get("method", "POST")
    if method != "POST":
        return "invalid_method", f"method must be POST, got {method!r}"
    body = request.get("body")
    if not isinstance(body, dict):
        return "missing_body", "body is missing or not an object"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "missing_messages", "body.messages is missing or empty"
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        return "invalid_messages", "every entry of body.messages must be an object with a role"
    if body.get("model", MODEL_NAME) != MODEL_NAME:
        return "model_not_found", f"model {body.get('model')!r} is not served; use {MODEL_NAME}"
    return None


def _pending_chunks(
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


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _execute(
    engine: LocalEngine, batch_id: str, chunk: list[tuple[int, dict[str, Any]]]
) -> tuple[list[bytes], list[bytes]]:
    """Answer one chunk, batching model calls across its requests."""
    ok_lines: list[bytes] = []
    error_lines: list[bytes] = []
    accepted: list[tuple[int, dict[str, Any], str, int, _OutputPlan]] = []
    for number, request in chunk:
        body = request["body"]
        messages = body["messages"]
        system = "\n".join(
            _message_text(m.get("content")) for m in messages if m.get("role") == "system"
        )
        users = [_message_text(m.get("content")) for m in messages if m.get("role") == "user"]
        user = users[-1] if users else ""
        try:
            if not user.strip():
                raise _RequestRejected("empty_input", "the user message is empty")
            prompt_tokens = engine.count_tokens(f"{system}\n{user}" if system else user)
            if prompt_tokens > CONTEXT_WINDOW:
                raise _RequestRejected(
                    "context_length_exceeded",
                    f"This model's maximum context length is {CONTEXT_WINDOW} tokens. However, "
                    f"your messages resulted in {prompt_tokens} tokens.",
                )
            try:
                plan = _plan_request(body)
            except (AttributeError, TypeError, ValueError) as exc:
                raise _RequestRejected("invalid_request", f"malformed request body: {exc}") from exc
            if plan.problems:
                raise _RequestRejected(
                    "unsupported_output_schema",
                    "the local provider cannot produce "
                    + "; ".join(f"{name}: {why}" for name, why in plan.problems),
                )
        except _RequestRejected as rejected:
            error_lines.append(_error_line(batch_id, number, request, rejected))
            continue
        accepted.append((number, request, user, prompt_tokens, plan))

    contents = _produce(engine, [(user, plan) for _, _, user, _, plan in accepted])
    for (number, request, _, prompt_tokens, _), content in zip(accepted, contents, strict=True):
        completion_tokens = engine.count_tokens(content)
        ok_lines.append(
            _encode_line(
                {
                    "id": f"batch_req_{number}",
                    "custom_id": request["custom_id"],
                    "response": {
                        "status_code": 200,
                        "request_id": "req_" + request_hash(batch_id, request["custom_id"])[:24],
                        "body": {
                            "id": "chatcmpl-" + request_hash(batch_id, str(number))[:24],
                            "object": "chat.completion",
                            "created": int(time.time()),
                            "model": request["body"].get("model", MODEL_NAME),
                            "choices": [
                                {
                                    "index": 0,
                                    "message": {"role": "assistant", "content": content},
                                    "finish_reason": "stop",
                                }
                            ],
                            "usage": {
                                "prompt_tokens": prompt_tokens,
                                "completion_tokens": completion_tokens,
                                "total_tokens": prompt_tokens + completion_tokens,
                            },
                        },
                    },
                    "error": None,
                }
            )
        )
    return ok_lines, error_lines


def _produce(engine: LocalEngine, work: list[tuple[str, _OutputPlan]]) -> list[str]:
    """Each request's content; texts needing the same model call are sent together."""
    values: list[dict[str, Any]] = [{} for _ in work]

    groups: dict[Any, list[int]] = {}
    for index, (_, plan) in enumerate(work):
        if plan.fields is None:
            groups.setdefault(("summary", plan.text_min_chars, plan.text_max_chars), []).append(
                index
            )
            continue
        for spec in plan.fields:
            if spec.kind == "label":
                key: Any = ("label", spec.name, spec.labels, plan.descriptions)
            elif spec.kind == "summary":
                key = ("summary", spec.min_chars, spec.max_chars)
            elif spec.kind == "embedding":
                key = ("embedding",)
            else:
                continue
            groups.setdefault(key, []).append(index)

    for key, members in groups.items():
        texts = [work[i][0] for i in members]
        if key[0] == "label":
            _, name, labels, described = key
            for i, (label, confidence) in zip(
                members, engine.classify(texts, list(labels), dict(described)), strict=True
            ):
                values[i][name] = (label, confidence)
        elif key[0] == "summary":
            for i, summary in zip(members, engine.summarize(texts, key[1], key[2]), strict=True):
                values[i][key] = summary
        else:
            vectors = engine.embed(texts)
            for i, vector in zip(members, vectors, strict=True):
                values[i][key] = [round(float(v), 6) for v in vector]

    contents: list[str] = []
    for index, (_, plan) in enumerate(work):
        got = values[index]
        if plan.fields is None:
            contents.append(got[("summary", plan.text_min_chars, plan.text_max_chars)])
            continue
        first_label = next((p for p in plan.fields if p.kind == "label"), None)
        obj: dict[str, Any] = {}
        for spec in plan.fields:
            if spec.kind == "label":
                obj[spec.name] = got[spec.name][0]
            elif spec.kind == "confidence":
                assert first_label is not None
                confidence = round(got[first_label.name][1], 4)
                obj[spec.name] = min(spec.upper, max(spec.lower, confidence))
            elif spec.kind == "summary":
                obj[spec.name] = got[("summary", spec.min_chars, spec.max_chars)]
            else:
                obj[spec.name] = got[("embedding",)]
        contents.append(json.dumps(obj, ensure_ascii=False))
    return contents


def _error_line(
    batch_id: str, number: int, request: dict[str, Any], rejected: _RequestRejected
) -> bytes:
    return _encode_line(
        {
            "id": f"batch_req_{number}",
            "custom_id": request["custom_id"],
            "response": {
                "status_code": 400,
                "request_id": "req_" + request_hash(batch_id, request["custom_id"])[:24],
                "body": {
                    "error": {
                        "message": rejected.message,
                        "type": "invalid_request_error",
                        "param": "messages",
                        "code": rejected.code,
                    }
                },
            },
            "error": None,
        }
    )


def _item_result(line: dict[str, Any]) -> ItemResult:
    response = line.get("response") or {}
    body = response.get("body") or {}
    status_code = response.get("status_code")
    if status_code == 200:
        choice = body["choices"][0]
        usage = body.get("usage") or {}
        return ItemResult(
            custom_id=line["custom_id"],
            succeeded=True,
            output_text=choice["message"]["content"],
            finish_reason=choice.get("finish_reason"),
            input_tokens=int(usage.get("prompt_tokens", 0)),
            output_tokens=int(usage.get("completion_tokens", 0)),
            status_code=200,
        )
    error = body.get("error") or line.get("error") or {}
    return ItemResult(
        custom_id=line["custom_id"],
        succeeded=False,
        status_code=status_code,
        error_class="deterministic",
        error_code=error.get("code"),
        error_message=error.get("message"),
    )


def _encode_line(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, ensure_ascii=False).encode() + b"\n"


def _complete_lines(path: Path) -> Iterator[bytes]:
    """Newline-terminated lines only: a trailing partial line is a write that never finished."""
    if not path.exists():
        return
    with path.open("rb") as handle:
        for line in handle:
            if line.endswith(b"\n") and line.strip():
                yield line


def _truncate_partial(path: Path) -> None:
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


def _answered(folder: Path) -> tuple[set[str], set[str]]:
    """custom_ids answered so far, from the files themselves: the only source of truth."""
    sets: list[set[str]] = []
    for name in ("output.jsonl", "errors.jsonl"):
        path = folder / name
        _truncate_partial(path)
        ids: set[str] = set()
        for line in _complete_lines(path):
            ids.add(json.loads(line)["custom_id"])
        sets.append(ids)
    return sets[0], sets[1]


@contextlib.contextmanager
def _batch_lock(folder: Path, *, blocking: bool) -> Iterator[bool]:
    """One worker per batch across threads and processes; yields whether the lock was taken."""
    with (folder / ".lock").open("a") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _write_atomic(path: Path, data: bytes) -> None:
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
