"""OpenAI Batch API through the official SDK: Files + Batches.

Shards become JSONL files of `{custom_id, method, url, body}` uploaded with purpose `batch`;
each batch carries metadata `{job_id, shard_id, pipeline}` so that a batch created just
before a crash can be found again instead of paid for twice.
"""

import datetime as dt
import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal

import msgspec
import orjson

from llm_assets.resources.ledger import as_utc
from llm_assets.resources.providers.base import (
    AmbiguousSubmission,
    BatchStatus,
    ItemResult,
    RequestItem,
    ShardState,
    ShardSubmission,
)
from llm_assets.resources.providers.remote import RemoteBatchProvider
from llm_assets.resources.providers.retrying import is_transient
from llm_assets.resources.storage import split_lines

if TYPE_CHECKING:
    from llm_assets.resources.storage import ArtifactStorage
    from llm_assets.spec import PipelineSpec

ENDPOINTS = ("/v1/chat/completions", "/v1/responses", "/v1/embeddings")
MAX_REQUESTS = 50_000
MAX_BYTES = 200 * 1024 * 1024

STATUS_MAP = {
    "validating": ShardState.SUBMITTED,
    "in_progress": ShardState.RUNNING,
    "finalizing": ShardState.RUNNING,
    "cancelling": ShardState.RUNNING,
    "completed": ShardState.COMPLETED,
    "failed": ShardState.FAILED,
    "expired": ShardState.EXPIRED,
    "cancelled": ShardState.CANCELLED,
}
_LIVE = ("validating", "in_progress", "finalizing", "completed", "expired", "cancelling")


def endpoint_of(spec: "PipelineSpec") -> str:
    return str(spec.model.options.get("endpoint", "/v1/chat/completions"))


def openai_spec_problems(spec: "PipelineSpec") -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    endpoint = endpoint_of(spec)
    if endpoint not in ENDPOINTS:
        problems.append(("model.options.endpoint", f"{endpoint!r} is not one of {ENDPOINTS}"))
    unknown = set(spec.model.options) - {"endpoint", "reasoning_effort"}
    if unknown:
        problems.append(("model.options", f"unknown option(s) for openai: {sorted(unknown)}"))
    if endpoint == "/v1/embeddings":
        fields = spec.output.output_schema
        if spec.output.format != "json" or list(fields) != ["embedding"]:
            problems.append(
                ("output.schema", "the embeddings endpoint produces one field: embedding")
            )
        elif fields["embedding"].type != "list[float]":
            problems.append(("output.schema.embedding", "embeddings are list[float]"))
    if spec.sharding.max_requests_per_shard > MAX_REQUESTS:
        problems.append(
            ("sharding.max_requests_per_shard", f"OpenAI takes at most {MAX_REQUESTS} per batch")
        )
    if spec.sharding.max_bytes_per_shard > MAX_BYTES:
        problems.append(
            ("sharding.max_bytes_per_shard", f"OpenAI takes at most {MAX_BYTES} bytes per file")
        )
    return problems


def chat_body(spec: "PipelineSpec", item: RequestItem) -> dict[str, Any]:
    """A Chat Completions request body, for batch lines and online requests alike."""
    from llm_assets.validation import chat_response_format

    messages = [{"role": "user", "content": item.user}]
    if item.system:
        messages.insert(0, {"role": "system", "content": item.system})
    body: dict[str, Any] = {
        "model": spec.model.name,
        "messages": messages,
        "max_tokens": spec.model.max_output_tokens,
        "temperature": spec.model.temperature,
    }
    if spec.output.format == "json":
        body["response_format"] = chat_response_format(spec)
    return body


def classify_error(
    status_code: int | None, code: str | None
) -> Literal["deterministic", "transient", "expired"]:
    if code == "batch_expired":
        return "expired"
    if status_code is None:
        # Lines that never ran (batch cancelled, server trouble) can run again.
        never_ran = (None, "server_error", "rate_limit_exceeded", "batch_cancelled", "batch_failed")
        return "transient" if code in never_ran else "deterministic"
    if status_code == 429 or status_code >= 500 or status_code == 408:
        return "transient"
    return "deterministic"


class _Message(msgspec.Struct, gc=False):
    content: str | None = None


class _Choice(msgspec.Struct, gc=False):
    message: _Message | None = None
    finish_reason: str | None = None


class _Details(msgspec.Struct, gc=False):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct, gc=False):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    prompt_tokens_details: _Details | None = None
    input_tokens_details: _Details | None = None


class _ChatBody(msgspec.Struct, gc=False):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None


class _Response(msgspec.Struct, gc=False):
    status_code: int | None = None
    body: _ChatBody | None = None


class _ChatLine(msgspec.Struct, gc=False):
    """The fields of a Chat Completions output line that an import reads; others are skipped
    unparsed."""

    custom_id: str | None = None
    response: _Response | None = None
    error: Any = None


_chat_line = msgspec.json.Decoder(_ChatLine)


def normalize_line(raw: bytes | str | dict[str, Any]) -> ItemResult | None:
    """One output or error file line → ItemResult; a status_code ≥ 400 is a failure even
    when `error` is null.

    Almost every line of a day is an answered chat completion: it is decoded into typed
    structs of just the fields read (a third of the time of building the whole line as dicts;
    see bench/README.md). Any other line, or one whose values are not of the usual types,
    goes through the general path, which reads every shape.
    """
    if not isinstance(raw, dict):
        try:
            line = _chat_line.decode(raw)
        except msgspec.DecodeError:  # also a value of another type than declared
            pass
        else:
            answered = _answered_chat(line)
            if answered is not None:
                return answered
        raw = orjson.loads(raw)
    return _normalize(raw)


def _answered_chat(line: _ChatLine) -> ItemResult | None:
    """A successful chat completion line as the general path reads it; None for anything
    else (the general path decides)."""
    response = line.response
    if not line.custom_id or line.error is not None or response is None:
        return None
    status, body = response.status_code, response.body
    if status is None or status >= 400 or body is None or not body.choices:
        return None
    choice = body.choices[0]
    usage = body.usage or _NO_USAGE
    details = usage.prompt_tokens_details
    if usage.input_tokens_details is not None and (
        details is None or details.cached_tokens is None
    ):
        if details is not None:
            # An empty object here sends the general path to input_tokens_details, one with
            # other fields does not; unknown fields are not kept to tell them apart.
            return None
        details = usage.input_tokens_details
    return _succeeded(
        line.custom_id,
        status,
        choice.message.content if choice.message is not None else None,
        choice.finish_reason,
        usage.prompt_tokens or usage.input_tokens or 0,
        (details.cached_tokens or 0) if details is not None else 0,
        usage.completion_tokens or usage.output_tokens or 0,
    )


_NO_USAGE = _Usage()


def _normalize(line: dict[str, Any]) -> ItemResult | None:
    custom_id = line.get("custom_id")
    if not custom_id:
        return None
    response = line.get("response") or {}
    error = line.get("error") or {}
    status = response.get("status_code")
    body = response.get("body") or {}
    if error or status is None or status >= 400:
        body_error = body.get("error") if isinstance(body, dict) else None
        body_error = body_error if isinstance(body_error, dict) else {}
        code = error.get("code") or body_error.get("code") or body_error.get("type")
        message = error.get("message") or body_error.get("message") or f"HTTP {status}"
        return ItemResult(
            custom_id=custom_id,
            succeeded=False,
            status_code=status,
            error_class=classify_error(status, code),
            error_code=str(code) if code else f"http_{status}",
            error_message=str(message),
        )
    text, finish = _content_of(body)
    usage = body.get("usage") or {}
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    return _succeeded(
        custom_id,
        status,
        text,
        finish,
        int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0),
        int(details.get("cached_tokens") or 0),
        int(usage.get("completion_tokens") or usage.get("output_tokens") or 0),
    )


def _succeeded(
    custom_id: str,
    status: int,
    text: str | None,
    finish: str | None,
    input_tokens: int,
    cached_input_tokens: int,
    output_tokens: int,
) -> ItemResult:
    return ItemResult(
        custom_id=custom_id,
        succeeded=True,
        status_code=status,
        output_text=text,
        finish_reason=finish,
        input_tokens=input_tokens,
        cached_input_tokens=cached_input_tokens,
        output_tokens=output_tokens,
    )


def _content_of(body: dict[str, Any]) -> tuple[str | None, str | None]:
    if body.get("object") == "chat.completion" or "choices" in body:
        choice = (body.get("choices") or [{}])[0]
        return (choice.get("message") or {}).get("content"), choice.get("finish_reason")
    if body.get("object") == "response" or "output" in body:
        texts = [
            part.get("text", "")
            for item in body.get("output") or []
            for part in item.get("content") or []
            if part.get("type") in ("output_text", "text")
        ]
        incomplete = (body.get("incomplete_details") or {}).get("reason")
        finish = "length" if incomplete == "max_output_tokens" else "stop"
        return "".join(texts), finish
    if "data" in body:
        embedding = (body.get("data") or [{}])[0].get("embedding")
        return json.dumps({"embedding": embedding}), "stop"
    return None, None


class OpenAIBatchProvider(RemoteBatchProvider):
    """Files + Batches; control-plane calls retried here, not inside the SDK."""

    reconcile_page_limit: int = 100

    def make_client(self, api_key: str | None) -> Any:
        import openai

        return openai.OpenAI(
            api_key=api_key,
            base_url=self.base_url,
            timeout=self.timeout_seconds,
            max_retries=0,
        )

    def spec_problems(self, spec: "PipelineSpec") -> list[tuple[str, str]]:
        return openai_spec_problems(spec)

    def request_line(self, spec: "PipelineSpec", item: RequestItem) -> dict[str, Any]:
        from llm_assets.validation import output_json_schema

        endpoint = endpoint_of(spec)
        body: dict[str, Any]
        if endpoint == "/v1/embeddings":
            body = {"model": spec.model.name, "input": item.user}
        elif endpoint == "/v1/responses":
            body = {
                "model": spec.model.name,
                "instructions": item.system,
                "input": item.user,
                "max_output_tokens": spec.model.max_output_tokens,
                "temperature": spec.model.temperature,
            }
            if spec.output.format == "json":
                body["text"] = {
                    "format": {
                        "type": "json_schema",
                        "name": spec.name,
                        "schema": output_json_schema(spec),
                        "strict": True,
                    }
                }
        else:
            body = chat_body(spec, item)
        if "reasoning_effort" in spec.model.options and endpoint == "/v1/chat/completions":
            body["reasoning_effort"] = spec.model.options["reasoning_effort"]
        return {"custom_id": item.custom_id, "method": "POST", "url": endpoint, "body": body}

    def find_existing(self, shard: ShardSubmission) -> str | None:
        """A live batch created for this shard since its first intent, if any."""
        since = as_utc(shard.intent_at) - dt.timedelta(minutes=5) if shard.intent_at else None
        found: list[str] = []
        after: str | None = None
        for _ in range(self.reconcile_page_limit):
            kwargs: dict[str, Any] = {"limit": 100}
            if after:
                kwargs["after"] = after
            page = self.call("list batches", lambda kw=kwargs: self.client.batches.list(**kw))
            batches = list(page.data)
            for batch in batches:
                meta = batch.metadata or {}
                if meta.get("shard_id") == shard.shard_id and batch.status in _LIVE:
                    found.append(batch.id)
            older = (
                since is not None
                and batches
                and all(dt.datetime.fromtimestamp(b.created_at, dt.UTC) < since for b in batches)
            )
            if not batches or not page.has_more or older:
                break
            after = batches[-1].id
        if len(found) > 1:
            raise AmbiguousSubmission(
                f"shard {shard.shard_id} has {len(found)} live OpenAI batches ({found}); cancel "
                "the extra ones, then record the one to keep"
            )
        return found[0] if found else None

    def submit(self, shard: ShardSubmission, storage: "ArtifactStorage") -> str:
        if shard.intent_at is not None:
            existing = self.find_existing(shard)
            if existing is not None:
                return existing
        with storage.local_copy(shard.input_uri) as path:

            def upload() -> Any:
                # Streamed from disk, reopened on every attempt.
                with path.open("rb") as handle:
                    return self.client.files.create(
                        file=(f"{shard.shard_id}.jsonl", handle), purpose="batch"
                    )

            uploaded = self.call("upload", upload)
        endpoint = self._endpoint_of_file(storage, shard.input_uri)
        attempt_at = dt.datetime.now(dt.UTC)
        return self.create_once(
            lambda: str(
                self.client.batches.create(
                    input_file_id=uploaded.id,
                    endpoint=endpoint,
                    completion_window="24h",
                    metadata={
                        "job_id": shard.job_id[:512],
                        "shard_id": shard.shard_id[:512],
                        "pipeline": shard.pipeline[:512],
                    },
                ).id
            ),
            lambda: self.find_existing(shard.model_copy(update={"intent_at": attempt_at})),
        )

    @staticmethod
    def _endpoint_of_file(storage: "ArtifactStorage", uri: str) -> str:
        for line in storage.open_lines(uri):
            return str(json.loads(line)["url"])
        raise ValueError(f"shard {uri} is empty")

    def _status(self, batch: Any) -> BatchStatus:
        counts = batch.request_counts
        message = None
        if batch.errors is not None and batch.errors.data:
            parts = [
                f"line {e.line}: {e.code}: {e.message}" if e.line else f"{e.code}: {e.message}"
                for e in batch.errors.data[:20]
            ]
            message = "; ".join(parts)
        return BatchStatus(
            provider_batch_id=batch.id,
            state=STATUS_MAP.get(batch.status, ShardState.RUNNING),
            raw_status=batch.status,
            total=counts.total if counts else 0,
            completed=counts.completed if counts else 0,
            failed=counts.failed if counts else 0,
            message=message,
        )

    def poll(self, provider_batch_id: str) -> BatchStatus:
        batch = self.call("retrieve", lambda: self.client.batches.retrieve(provider_batch_id))
        return self._status(batch)

    def cancel(self, provider_batch_id: str) -> BatchStatus:
        batch = self.call("cancel", lambda: self.client.batches.cancel(provider_batch_id))
        return self._status(batch)

    def _file_lines(self, file_id: str | None) -> Iterator[bytes]:
        if not file_id:
            return
        # Streamed in chunks; a transient failure restarts the download, and the ledger's
        # upsert makes lines seen twice harmless.
        for attempt in range(self.max_attempts):
            try:
                with self.client.files.with_streaming_response.content(file_id) as response:
                    lines = split_lines(response.iter_bytes(1 << 20))
                    yield from (line for line in lines if line.strip())
                return
            except Exception as exc:
                if not is_transient(exc) or attempt == self.max_attempts - 1:
                    raise

    def results(self, provider_batch_id: str) -> Iterator[ItemResult]:
        for raw in self._result_lines(provider_batch_id):
            result = normalize_line(raw)
            if result is not None:
                yield result

    def result_lines(
        self, provider_batch_id: str
    ) -> tuple[Iterator[bytes], Callable[[bytes], ItemResult | None]]:
        return self._result_lines(provider_batch_id), normalize_line

    def _result_lines(self, provider_batch_id: str) -> Iterator[bytes]:
        batch = self.call("retrieve", lambda: self.client.batches.retrieve(provider_batch_id))
        if STATUS_MAP.get(batch.status) not in (
            ShardState.COMPLETED,
            ShardState.FAILED,
            ShardState.EXPIRED,
            ShardState.CANCELLED,
        ):
            raise RuntimeError(f"OpenAI batch {provider_batch_id} has not ended ({batch.status})")
        for file_id in (batch.output_file_id, batch.error_file_id):
            yield from self._file_lines(file_id)
