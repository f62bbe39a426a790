"""Anthropic Message Batches through the official SDK.

Requests go inline (`requests[{custom_id, params}]`). Batches carry no metadata, so after a
crash between create and record the adapter looks for batches created since the recorded
intent with the shard's request count; more than one candidate stops the run for an
operator instead of guessing (and never creates another).
"""

import datetime as dt
import json
import re
from collections.abc import Iterator
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
from llm_assets.resources.providers.remote import RemoteBatchProvider
from llm_assets.resources.providers.retrying import status_of

if TYPE_CHECKING:
    from llm_assets.resources.storage import ArtifactStorage
    from llm_assets.spec.model import PipelineSpec

MAX_REQUESTS = 100_000
MAX_BYTES = 256 * 1024 * 1024
CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_TRANSIENT_ERRORS = {"api_error", "overloaded_error", "rate_limit_error", "timeout_error"}


def anthropic_spec_problems(spec: "PipelineSpec") -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    unknown = set(spec.model.options) - {"top_p", "top_k", "stop_sequences"}
    if unknown:
        problems.append(("model.options", f"unknown option(s) for anthropic: {sorted(unknown)}"))
    if spec.sharding.max_requests_per_shard > MAX_REQUESTS:
        problems.append(
            ("sharding.max_requests_per_shard", f"Anthropic takes at most {MAX_REQUESTS}")
        )
    if spec.sharding.max_bytes_per_shard > MAX_BYTES:
        problems.append(("sharding.max_bytes_per_shard", f"Anthropic takes at most {MAX_BYTES}"))
    for name, field in spec.output.output_schema.items():
        if field.type == "list[float]":
            problems.append((f"output.schema.{name}", "Anthropic produces no embeddings"))
    return problems


def normalize_result(entry: Any) -> ItemResult:
    """One `results()` entry (SDK model) → ItemResult."""
    result = entry.result
    kind = result.type
    if kind == "succeeded":
        message = result.message
        text = "".join(getattr(block, "text", "") for block in message.content)
        stop = message.stop_reason
        cache_read = message.usage.cache_read_input_tokens or 0
        cache_write = message.usage.cache_creation_input_tokens or 0
        return ItemResult(
            custom_id=entry.custom_id,
            succeeded=True,
            status_code=200,
            output_text=text,
            finish_reason="length" if stop == "max_tokens" else "stop",
            # Anthropic counts cache reads and writes apart from input_tokens; all are input,
            # each kind billed at its own rate.
            input_tokens=message.usage.input_tokens + cache_read + cache_write,
            cached_input_tokens=cache_read,
            cache_write_input_tokens=cache_write,
            output_tokens=message.usage.output_tokens,
        )
    if kind == "errored":
        inner = getattr(result.error, "error", None)
        error_type = getattr(inner, "type", None) or "api_error"
        return ItemResult(
            custom_id=entry.custom_id,
            succeeded=False,
            error_class="transient" if error_type in _TRANSIENT_ERRORS else "deterministic",
            error_code=error_type,
            error_message=getattr(inner, "message", None) or error_type,
        )
    if kind == "expired":
        return ItemResult(
            custom_id=entry.custom_id,
            succeeded=False,
            error_class="expired",
            error_code="expired",
            error_message="the batch ended before this request was processed",
        )
    return ItemResult(
        custom_id=entry.custom_id,
        succeeded=False,
        error_class="transient",
        error_code=str(kind),
        error_message=f"request {kind}",
    )


class AnthropicBatchProvider(RemoteBatchProvider):
    """Message Batches; control-plane calls retried here, not inside the SDK."""

    console_url_template: ClassVar[str | None] = (
        "https://console.anthropic.com/workspaces/default/batches/{batch_id}"
    )
    prompt_cache: ClassVar[Literal["marked", "automatic"] | None] = "marked"
    reconcile_page_limit: int = 50

    def make_client(self, api_key: str | None) -> Any:
        import anthropic

        return self.sdk_client(anthropic.Anthropic, api_key)

    def batches_api(self) -> Any:
        return self.client.messages.batches

    def spec_problems(self, spec: "PipelineSpec") -> list[tuple[str, str]]:
        return anthropic_spec_problems(spec)

    def request_line(self, spec: "PipelineSpec", item: RequestItem) -> dict[str, Any]:
        if not CUSTOM_ID.match(item.custom_id):
            raise ValueError(f"custom_id {item.custom_id!r} is not valid for Anthropic")
        params: dict[str, Any] = {
            "model": spec.model.name,
            "max_tokens": spec.model.max_output_tokens,
            "temperature": spec.model.temperature,
            "messages": [{"role": "user", "content": item.user}],
        }
        if item.system:
            params["system"] = _system(spec, item.system)
        for option in ("top_p", "top_k", "stop_sequences"):
            if option in spec.model.options:
                params[option] = spec.model.options[option]
        return {"custom_id": item.custom_id, "params": params}

    def find_existing(self, shard: ShardSubmission) -> str | None:
        """A batch created since the intent with this shard's request count, if exactly one."""
        assert shard.intent_at is not None
        since = as_utc(shard.intent_at) - dt.timedelta(seconds=5)
        candidates: list[str] = []
        for batches in self.batch_pages("after_id"):
            candidates.extend(
                batch.id
                for batch in batches
                if as_utc(batch.created_at) >= since
                and _request_total(batch.request_counts) == shard.item_count
                and batch.id not in shard.known_batch_ids
                # An operator resolves an ambiguity by cancelling the batches that are not
                # this shard's; a cancelled batch is never adopted.
                and batch.cancel_initiated_at is None
            )
            if all(as_utc(b.created_at) < since for b in batches):
                break
        if len(candidates) > 1:
            raise AmbiguousSubmission(
                f"shard {shard.shard_id}: {len(candidates)} Anthropic batches created since the "
                f"submission intent at {shard.intent_at} have {shard.item_count} requests "
                f"({candidates}); nothing was submitted. Cancel the batches that are not this "
                "shard's, then run again"
            )
        return candidates[0] if candidates else None

    def create_batch(self, shard: ShardSubmission, storage: "ArtifactStorage") -> str:
        requests = [json.loads(line) for line in storage.open_lines(shard.input_uri)]
        return self.create_reconciled(
            shard, lambda: str(self.batches_api().create(requests=requests).id)
        )

    def batch_status(self, batch: Any) -> BatchStatus:
        counts = batch.request_counts
        done = _request_total(counts) - counts.processing
        ended = batch.processing_status == "ended"
        state = ShardState.COMPLETED if ended else ShardState.RUNNING
        return BatchStatus(
            provider_batch_id=batch.id,
            state=state,
            raw_status=batch.processing_status,
            total=done + counts.processing,
            completed=counts.succeeded,
            failed=counts.errored + counts.canceled + counts.expired,
        )

    def results(self, provider_batch_id: str) -> Iterator[ItemResult]:
        stream = self.call("results", lambda: self.batches_api().results(provider_batch_id))
        for entry in stream:
            yield normalize_result(entry)

    def delete_files(self, shard: ShardFiles) -> list[str]:
        """The Message Batch with its requests and results. Anthropic deletes only ended
        batches: one still processing (a cancel not settled yet) is left for a later round."""
        batch_id = shard.provider_batch_id
        try:
            batch = self.call("retrieve", lambda: self.batches_api().retrieve(batch_id))
        except Exception as exc:
            if status_of(exc) == 404:
                return []
            raise
        if batch.processing_status != "ended":
            raise RuntimeError(
                f"Anthropic batch {batch_id} is {batch.processing_status}, not ended; it is "
                "deleted once it has ended"
            )
        deleted = self.delete_if_present("delete", lambda: self.batches_api().delete(batch_id))
        return [batch_id] if deleted else []


def _system(spec: "PipelineSpec", system: str) -> str | list[dict[str, Any]]:
    """The system prompt, as one text block marked for the prompt cache when the spec asks for
    caching: everything up to and including the marked block is the cached prefix."""
    cache = spec.prompt.cache
    if cache is None:
        return system
    marker = {"type": "ephemeral", "ttl": cache.ttl}
    return [{"type": "text", "text": system, "cache_control": marker}]


def _request_total(counts: Any) -> int:
    """A Message Batch's requests, whatever state each is in."""
    return counts.processing + counts.succeeded + counts.errored + counts.canceled + counts.expired
