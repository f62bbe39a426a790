"""OpenAI Batch API through the official SDK: Files + Batches.

Shards become JSONL files of `{custom_id, method, url, body}` uploaded with purpose `batch`;
each batch carries metadata `{job_id, shard_id, pipeline}` so that a batch created just
before a crash can be found again instead of paid for twice.
"""

import datetime as dt
import functools
import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from llm_assets.resources.ledger import as_utc
from llm_assets.resources.providers.base import (
    AmbiguousSubmission,
    BatchStatus,
    ItemResult,
    RequestItem,
    ShardFiles,
    ShardState,
    ShardSubmission,
)
from llm_assets.resources.providers.openai_lines import read_line
from llm_assets.resources.providers.remote import RemoteBatchProvider
from llm_assets.resources.providers.retrying import is_transient
from llm_assets.resources.storage_lines import line_blocks
from llm_assets.results.rows import Answered

if TYPE_CHECKING:
    from llm_assets.resources.storage import ArtifactStorage
    from llm_assets.spec.model import PipelineSpec

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


OPTIONS = frozenset({"endpoint", "reasoning_effort"})
"""The `model.options` the openai provider takes."""


def endpoint_of(spec: "PipelineSpec", default: str = "/v1/chat/completions") -> str:
    return str(spec.model.options.get("endpoint", default))


def openai_spec_problems(
    spec: "PipelineSpec",
    *,
    label: str = "OpenAI",
    endpoints: tuple[str, ...] = ENDPOINTS,
    options: frozenset[str] = OPTIONS,
    max_requests: int = MAX_REQUESTS,
) -> list[tuple[str, str]]:
    """What an OpenAI-style batch API (`label`: OpenAI, Azure OpenAI) cannot serve of a spec:
    an endpoint not in `endpoints` (its first is the default), options not in `options`, an
    embeddings schema other than one list[float] field, shards over its limits."""
    problems: list[tuple[str, str]] = []
    endpoint = endpoint_of(spec, endpoints[0])
    if endpoint not in endpoints:
        problems.append(("model.options.endpoint", f"{endpoint!r} is not one of {endpoints}"))
    unknown = set(spec.model.options) - options
    if unknown:
        problems.append(
            ("model.options", f"unknown option(s) for {spec.model.provider}: {sorted(unknown)}")
        )
    if endpoint.endswith("/embeddings"):
        fields = spec.output.output_schema
        if spec.output.format != "json" or list(fields) != ["embedding"]:
            problems.append(
                ("output.schema", "the embeddings endpoint produces one field: embedding")
            )
        elif fields["embedding"].type != "list[float]":
            problems.append(("output.schema.embedding", "embeddings are list[float]"))
    if spec.sharding.max_requests_per_shard > max_requests:
        problems.append(
            ("sharding.max_requests_per_shard", f"{label} takes at most {max_requests} per batch")
        )
    if spec.sharding.max_bytes_per_shard > MAX_BYTES:
        problems.append(
            ("sharding.max_bytes_per_shard", f"{label} takes at most {MAX_BYTES} bytes per file")
        )
    return problems


def chat_body(spec: "PipelineSpec", item: RequestItem, model: str = "") -> dict[str, Any]:
    """A Chat Completions request body, for batch lines and online requests alike; `model`
    names the model where it is not the spec's name (an Azure deployment)."""
    from llm_assets.results.validation import chat_response_format

    messages = [{"role": "user", "content": item.user}]
    if item.system:
        messages.insert(0, {"role": "system", "content": item.system})
    body: dict[str, Any] = {
        "model": model or spec.model.name,
        "messages": messages,
        "max_tokens": spec.model.max_output_tokens,
        "temperature": spec.model.temperature,
    }
    if spec.output.format == "json":
        body["response_format"] = chat_response_format(spec)
    return body


class OpenAIBatchProvider(RemoteBatchProvider):
    """Files + Batches; control-plane calls retried here, not inside the SDK."""

    quota_kind: ClassVar[str] = "tokens"
    prompt_cache: ClassVar[Literal["marked", "automatic"] | None] = "automatic"
    refuses_after_create: ClassVar[bool] = True
    console_url_template: ClassVar[str | None] = "https://platform.openai.com/batches/{batch_id}"
    label: ClassVar[str] = "OpenAI"
    """The provider as messages name it."""

    def make_client(self, api_key: str | None) -> Any:
        import openai

        return self.sdk_client(openai.OpenAI, api_key)

    def batches_api(self) -> Any:
        return self.client.batches

    def spec_problems(self, spec: "PipelineSpec") -> list[tuple[str, str]]:
        return openai_spec_problems(spec)

    def endpoint(self, spec: "PipelineSpec") -> str:
        """The endpoint the spec's request lines name (`url`) and their batch is created for."""
        return endpoint_of(spec)

    def line_model(self, spec: "PipelineSpec") -> str:
        """What a request line's body names as its model."""
        return spec.model.name

    def request_line(self, spec: "PipelineSpec", item: RequestItem) -> dict[str, Any]:
        from llm_assets.results.validation import output_json_schema

        endpoint = self.endpoint(spec)
        kind = endpoint.removeprefix("/v1")
        model = self.line_model(spec)
        body: dict[str, Any]
        if kind == "/embeddings":
            body = {"model": model, "input": item.user}
        elif kind == "/responses":
            body = {
                "model": model,
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
            body = chat_body(spec, item, model)
        if "reasoning_effort" in spec.model.options and kind == "/chat/completions":
            body["reasoning_effort"] = spec.model.options["reasoning_effort"]
        return {"custom_id": item.custom_id, "method": "POST", "url": endpoint, "body": body}

    def find_existing(self, shard: ShardSubmission) -> str | None:
        """A live batch created for this shard since its first intent, if any."""
        since = as_utc(shard.intent_at) - dt.timedelta(minutes=5) if shard.intent_at else None
        found: list[str] = []
        for batches in self.batch_pages("after"):
            for batch in batches:
                meta = batch.metadata or {}
                if meta.get("shard_id") == shard.shard_id and batch.status in _LIVE:
                    found.append(batch.id)
            if since is not None and all(
                dt.datetime.fromtimestamp(b.created_at, dt.UTC) < since for b in batches
            ):
                break
        if len(found) > 1:
            raise AmbiguousSubmission(
                f"shard {shard.shard_id} has {len(found)} live {self.label} batches "
                f"({found}); cancel the extra ones, then record the one to keep"
            )
        return found[0] if found else None

    def create_batch(self, shard: ShardSubmission, storage: "ArtifactStorage") -> str:
        with storage.local_copy(shard.input_uri) as path:

            def upload() -> Any:
                # Streamed from disk, reopened on every attempt.
                with path.open("rb") as handle:
                    return self.client.files.create(
                        file=(f"{shard.shard_id}.jsonl", handle), purpose="batch"
                    )

            uploaded = self.call("upload", upload)
        endpoint = self._endpoint_of_file(storage, shard.input_uri)
        return self.create_reconciled(
            shard,
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
        )

    @staticmethod
    def _endpoint_of_file(storage: "ArtifactStorage", uri: str) -> str:
        for line in storage.open_lines(uri):
            return str(json.loads(line)["url"])
        raise ValueError(f"shard {uri} is empty")

    def ended_for_quota(self, raw_status: str | None, message: str | None) -> bool:
        return raw_status == "failed" and "token_limit_exceeded" in (message or "")

    def batch_status(self, batch: Any) -> BatchStatus:
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

    def _file_blocks(self, file_id: str | None) -> Iterator[bytes]:
        """A result file's bytes in blocks of whole lines."""
        if not file_id:
            return
        # Streamed in chunks; a transient failure restarts the download, and the ledger's
        # upsert makes lines seen twice harmless.
        for attempt in range(self.max_attempts):
            try:
                with self.client.files.with_streaming_response.content(file_id) as response:
                    yield from line_blocks(response.iter_bytes(1 << 20))
                return
            except Exception as exc:
                if not is_transient(exc) or attempt == self.max_attempts - 1:
                    raise

    def result_blocks(
        self, provider_batch_id: str
    ) -> tuple[Iterator[bytes], Callable[[bytes], Answered | ItemResult | None]]:
        return self._result_blocks(provider_batch_id), read_line

    def _result_blocks(self, provider_batch_id: str) -> Iterator[bytes]:
        batch = self.call("retrieve", lambda: self.batches_api().retrieve(provider_batch_id))
        if STATUS_MAP.get(batch.status) not in (
            ShardState.COMPLETED,
            ShardState.FAILED,
            ShardState.EXPIRED,
            ShardState.CANCELLED,
        ):
            raise RuntimeError(
                f"{self.label} batch {provider_batch_id} has not ended ({batch.status})"
            )
        for file_id in (batch.output_file_id, batch.error_file_id):
            yield from self._file_blocks(file_id)

    def delete_files(self, shard: ShardFiles) -> list[str]:
        """The batch's input, output and error files (Files API delete); the batch object,
        which holds no request or answer, stays (OpenAI deletes no batches)."""
        batch = self.call("retrieve", lambda: self.batches_api().retrieve(shard.provider_batch_id))
        return [
            file_id
            for file_id in (batch.input_file_id, batch.output_file_id, batch.error_file_id)
            if file_id
            and self.delete_if_present(
                "delete file", functools.partial(self.client.files.delete, file_id)
            )
        ]
