"""The online path: an OpenAI-compatible chat endpoint (vLLM, Ollama, llama.cpp server, a
realtime API at low priority) called request by request, for endpoints without a batch API.

Here the `provider_batches` step is the worker: it streams a shard's request lines through
the realtime worker (`realtime.run_requests`: `online.concurrency` requests in flight, paced
under the spec's RPM and TPM -- in Redis, shared by every process, when
LLM_ASSETS_RATE_LIMIT_REDIS is set or Celery's result backend is a Redis (shared_window.py)
-- transient errors retried with jittered backoff). This module
speaks the endpoint: the chat request, 429 with Retry-After and x-ratelimit-* headers, and
responses read as the batch import reads OpenAI's output lines.
"""

import asyncio
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from llm_assets.resources.providers.base import (
    BatchProvider,
    BatchStatus,
    ItemResult,
    RequestItem,
    ShardSubmission,
    resolve_secret,
)
from llm_assets.resources.providers.openai_batch import chat_body
from llm_assets.resources.providers.openai_lines import normalize_line
from llm_assets.resources.providers.realtime import (
    OnlineSettings,
    OnlineStats,
    OnlineWork,
    RateLimited,
    Send,
    Transient,
    parse_duration,
    run_requests,
)
from llm_assets.resources.providers.retrying import MAX_RETRY_AFTER_SECONDS
from llm_assets.resources.providers.shared_window import KEY_PREFIX, open_pacer
from llm_assets.util.settings import rate_limit_redis_url

if TYPE_CHECKING:
    from llm_assets.spec.model import PipelineSpec


def online_spec_problems(spec: "PipelineSpec") -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    endpoint = spec.model.options.get("endpoint", "/v1/chat/completions")
    if endpoint != "/v1/chat/completions":
        problems.append(("model.options.endpoint", "the online provider speaks chat completions"))
    unknown = set(spec.model.options) - {"endpoint"}
    if unknown:
        problems.append(("model.options", f"unknown option(s) for online: {sorted(unknown)}"))
    return problems


def settings_of(spec: "PipelineSpec") -> OnlineSettings:
    return OnlineSettings(
        concurrency=spec.online.concurrency,
        rpm=spec.online.rpm,
        tpm=spec.online.tpm,
        timeout_seconds=spec.online.timeout_seconds,
        max_tries=spec.online.max_tries,
    )


class OnlineProvider(BatchProvider):
    """Chat completions over HTTP with the official `openai` SDK, one request per item."""

    priced_as_batch: ClassVar[bool] = False
    runs_in_step: ClassVar[bool] = True

    base_url: str | None = None
    """Default LLM_ASSETS_ONLINE_BASE_URL; a spec's `online.base_url` wins."""
    api_key: str | None = None
    backoff_base_seconds: float = 0.5
    backoff_cap_seconds: float = 30.0
    max_retry_after_seconds: float = MAX_RETRY_AFTER_SECONDS
    """The longest a rate limit's Retry-After or reset pauses the senders at a time."""
    rate_limit_prefix: str = KEY_PREFIX
    """Where the shared RPM/TPM windows live in the Redis: deployments that share a Redis but
    not a provider account keep apart by setting different prefixes."""

    def spec_problems(self, spec: "PipelineSpec") -> list[tuple[str, str]]:
        return online_spec_problems(spec)

    def request_line(self, spec: "PipelineSpec", item: RequestItem) -> dict[str, Any]:
        return {
            "custom_id": item.custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": chat_body(spec, item),
        }

    def find_submitted(self, shard: ShardSubmission) -> str | None:
        """A shard sent request by request records its id before its first send."""
        return None

    def poll(self, provider_batch_id: str) -> BatchStatus:
        raise NotImplementedError("online shards are run by provider_batches, not polled")

    def results(self, provider_batch_id: str) -> Iterator[ItemResult]:
        # Results went to the ledger as they came; nothing is left to fetch.
        return iter(())

    def run(self, spec: "PipelineSpec", work: OnlineWork) -> OnlineStats:
        """Send the work's `(custom_id, body, tokens)` requests to the spec's (or this
        resource's) OpenAI-compatible endpoint, paced under limits that every process
        sending to the same endpoint and model shares when a Redis is configured."""
        base_url = spec.online.base_url or resolve_secret(self.base_url)
        redis_url = rate_limit_redis_url(os.environ)
        return asyncio.run(self._run(base_url, spec.model.name, settings_of(spec), work, redis_url))

    async def _run(
        self,
        base_url: str | None,
        model: str,
        settings: OnlineSettings,
        work: OnlineWork,
        redis_url: str | None,
    ) -> OnlineStats:
        import openai

        client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=resolve_secret(self.api_key) or "none",
            timeout=settings.timeout_seconds,
            max_retries=0,
        )

        # The quota is the endpoint's (as the SDK resolved it) for the model.
        quota = ("online", str(client.base_url), model)
        try:
            async with open_pacer(settings, quota, redis_url, self.rate_limit_prefix) as pacer:
                return await run_requests(
                    settings,
                    work,
                    _chat_sender(client),
                    backoff_base_seconds=self.backoff_base_seconds,
                    backoff_cap_seconds=self.backoff_cap_seconds,
                    max_retry_after_seconds=self.max_retry_after_seconds,
                    pacer=pacer,
                )
        finally:
            await client.close()


def _chat_sender(client: Any) -> Send:
    """`send` for the realtime worker over an `openai.AsyncOpenAI` client: 429 is a rate
    limit, 5xx, 408, timeouts and lost connections are transient, other errors final."""
    import openai

    async def send(custom_id: str, body: dict[str, Any]) -> tuple[ItemResult, float | None]:
        try:
            raw = await client.chat.completions.with_raw_response.create(
                **body, extra_headers={"X-Client-Request-Id": custom_id}
            )
        except openai.RateLimitError as exc:
            raise RateLimited(_retry_after(exc.response.headers)) from exc
        except openai.APIStatusError as exc:
            result = _failure(custom_id, exc.status_code, exc)
            if result.error_class == "transient":
                raise Transient(result) from exc
            return result, None
        except (openai.APITimeoutError, openai.APIConnectionError) as exc:
            kind = "timeout" if isinstance(exc, openai.APITimeoutError) else "connection"
            raise Transient(
                ItemResult(
                    custom_id=custom_id,
                    succeeded=False,
                    error_class="transient",
                    error_code=kind,
                    error_message=f"{kind}: {exc}",
                )
            ) from exc
        remaining = raw.headers.get("x-ratelimit-remaining-requests")
        empty_for = None
        if remaining is not None and remaining.strip() == "0":
            empty_for = parse_duration(raw.headers.get("x-ratelimit-reset-requests")) or 0.0
        response = {"status_code": raw.status_code, "body": raw.parse().model_dump()}
        return _read({"custom_id": custom_id, "response": response}), empty_for

    return send


def _retry_after(headers: Any) -> float | None:
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return float(millis) / 1000
        except ValueError:
            pass
    return parse_duration(headers.get("retry-after"))


def _failure(custom_id: str, status: int, exc: Any) -> ItemResult:
    """An HTTP error read as the batch import reads a failed line, so both classify it alike."""
    body: dict[str, Any] = exc.body if isinstance(getattr(exc, "body", None), dict) else {}
    found = body.get("error")
    error: dict[str, Any] = found if isinstance(found, dict) else body
    message = str(error.get("message") or exc)[:1000]
    response = {"status_code": status, "body": {"error": {**error, "message": message}}}
    return _read({"custom_id": custom_id, "response": response})


def _read(line: dict[str, Any]) -> ItemResult:
    result = normalize_line(line)
    assert result is not None  # the line has a custom_id
    return result
