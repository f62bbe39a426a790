"""The online path: an OpenAI-compatible chat endpoint (vLLM, Ollama, llama.cpp server, a
realtime API at low priority) called request by request, for endpoints without a batch API.

Here the `provider_batches` step is the worker (steps.run_online_shards): it streams a shard's
request lines, keeps `online.concurrency` requests in flight with asyncio, paces them under
the spec's RPM and TPM, backs off on 429 (Retry-After, x-ratelimit-* headers) and retries
transient errors with exponential backoff and jitter (tenacity). Results reach the caller in
small batches as they complete, so memory stays flat and a checkpoint is never far behind.
"""

import asyncio
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import tenacity
from pydantic import BaseModel

from llm_assets.resources.providers.base import (
    BatchProvider,
    BatchStatus,
    ItemResult,
    RequestItem,
    resolve_secret,
)
from llm_assets.resources.providers.openai_batch import chat_body, classify_error, normalize_line

if TYPE_CHECKING:
    from llm_assets.spec import PipelineSpec

MARGIN = 1.02
"""Client windows are this much longer than the provider's, so jitter never overfills one."""
MAX_RATE_LIMIT_WAITS = 50
_NUMBER = r"(\d+(?:\.\d+)?)"
_DURATION = re.compile(rf"(?:{_NUMBER}h)?(?:{_NUMBER}m(?!s))?(?:{_NUMBER}s)?(?:{_NUMBER}ms)?$")


def online_spec_problems(spec: "PipelineSpec") -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    endpoint = spec.model.options.get("endpoint", "/v1/chat/completions")
    if endpoint != "/v1/chat/completions":
        problems.append(("model.options.endpoint", "the online provider speaks chat completions"))
    unknown = set(spec.model.options) - {"endpoint"}
    if unknown:
        problems.append(("model.options", f"unknown option(s) for online: {sorted(unknown)}"))
    return problems


def parse_duration(value: str | None) -> float | None:
    """Seconds from a header like "1.5", "20ms", "1s" or "6m0s" (OpenAI's reset format)."""
    if not value:
        return None
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    match = _DURATION.match(text)
    if not match or not any(match.groups()):
        return None
    hours, minutes, seconds, millis = (float(g) if g else 0.0 for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds + millis / 1000


class RollingWindow:
    """At most `capacity` units (requests, or tokens) started in any rolling `seconds`, the
    way providers enforce per-minute limits quantized to short windows (OpenAI: 600 RPM as
    10 per second). The window is checked itself, so requests of different sizes never
    overfill it, and starts are spread evenly over it, measured when each request goes."""

    def __init__(self, capacity: float, seconds: float) -> None:
        self.capacity = capacity
        self.seconds = seconds
        self.window: deque[tuple[float, float]] = deque()
        self.total = 0.0
        # Starts are at least an even share of the window apart: no bursts, which send delays
        # on a busy event loop would smear into the provider's next window.
        self.spacing = seconds / capacity if capacity else 0.0

    @classmethod
    def per_minute(cls, limit: int, share: float = 1.0) -> "RollingWindow":
        # One second's share of the minute, or a longer window when that is under one unit;
        # the window is a little longer than the provider's so network jitter cannot push
        # an extra request into it.
        seconds = max(1.0, 60.0 / limit)
        return cls(capacity=float(int(limit * share * seconds / 60)), seconds=seconds * MARGIN)

    def ready_at(self, cost: float, now: float) -> float:
        while self.window and self.window[0][0] <= now - self.seconds:
            self.total -= self.window.popleft()[1]
        total, moment = self.total, now
        if self.window:
            moment = max(moment, self.window[-1][0] + self.spacing * cost)
        for start, used in self.window:
            if total + cost <= self.capacity:
                break
            total -= used
            moment = max(moment, start + self.seconds)
        return moment

    def started(self, moment: float, cost: float) -> None:
        self.window.append((moment, cost))
        self.total += cost


class OnlineSettings(BaseModel):
    concurrency: int
    rpm: int | None
    tpm: int | None
    timeout_seconds: float
    max_tries: int


class OnlineStats(BaseModel):
    sent: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    rate_limited: int = 0
    paused_seconds: float = 0.0
    elapsed_seconds: float = 0.0
    interrupted: bool = False


class Transient(Exception):
    """A failure worth another try inside this run."""

    def __init__(self, result: ItemResult) -> None:
        self.result = result
        super().__init__(result.error_message)


class RateLimited(Exception):
    """The endpoint said to slow down: every sender pauses, then this request goes again."""

    def __init__(self, retry_after: float | None) -> None:
        self.retry_after = retry_after
        super().__init__(f"rate limited (retry after {retry_after})")


Send = Callable[[str, dict[str, Any]], Awaitable[tuple[ItemResult, float | None]]]
"""One request: its result, and how long the endpoint said its request window stays empty
(None when it did not say). Raises Transient or RateLimited."""


async def run_requests(
    settings: OnlineSettings,
    requests: Iterable[tuple[str, dict[str, Any], int]],
    deliver: Callable[[list[ItemResult]], None],
    send: Send,
    *,
    checkpoint_every: int,
    stop: Callable[[], bool],
    progress: Callable[[OnlineStats], None] | None,
    backoff_base_seconds: float,
    backoff_cap_seconds: float,
) -> OnlineStats:
    """The realtime worker shared by the online provider and Bedrock's on-demand path:
    `settings.concurrency` requests in flight, paced under the RPM and TPM windows, a pause
    for everyone on a rate limit, transient failures retried with jittered backoff, results
    handed to `deliver` every `checkpoint_every`."""
    stats = OnlineStats()
    began = time.monotonic()
    requests_window = RollingWindow.per_minute(settings.rpm) if settings.rpm else None
    # Token counts vary per request, so keep a little more room than for requests.
    tokens_window = RollingWindow.per_minute(settings.tpm, 0.97) if settings.tpm else None
    pause = {"until": 0.0}
    buffer: list[ItemResult] = []
    flushing = asyncio.Lock()
    slots = asyncio.Semaphore(settings.concurrency)

    async def flush(force: bool) -> None:
        async with flushing:
            if buffer and (force or len(buffer) >= checkpoint_every):
                batch = buffer[:]
                buffer.clear()
                await asyncio.to_thread(deliver, batch)
                if progress is not None:
                    progress(stats)

    gate = asyncio.Lock()

    async def wait_turn(tokens: int) -> None:
        """One sender at a time waits for its moment; the moment it goes is recorded."""
        async with gate:
            while True:
                now = time.monotonic()
                ready = [now, pause["until"]]
                if requests_window is not None:
                    ready.append(requests_window.ready_at(1, now))
                if tokens_window is not None:
                    ready.append(tokens_window.ready_at(tokens, now))
                if max(ready) <= now:
                    break
                await asyncio.sleep(max(ready) - now)
            if requests_window is not None:
                requests_window.started(now, 1)
            if tokens_window is not None:
                tokens_window.started(now, tokens)

    def hold_off(seconds: float) -> None:
        until = time.monotonic() + seconds
        if until > pause["until"]:
            stats.paused_seconds += until - max(pause["until"], time.monotonic())
            pause["until"] = until

    async def attempt(custom_id: str, body: dict[str, Any], tokens: int) -> ItemResult:
        for _ in range(MAX_RATE_LIMIT_WAITS):
            await wait_turn(tokens)
            stats.sent += 1
            try:
                result, window_empty_for = await send(custom_id, body)
            except RateLimited as exc:
                stats.rate_limited += 1
                hold_off(exc.retry_after or 1.0)
                continue
            # Without a limit of our own the server's word is all we know: an empty window
            # waits for its reset. With one, our window already keeps the pace.
            if requests_window is None and window_empty_for is not None:
                hold_off(window_empty_for)
            return result
        return ItemResult(
            custom_id=custom_id,
            succeeded=False,
            error_class="transient",
            error_code="rate_limit_exceeded",
            error_message=f"still rate limited after {MAX_RATE_LIMIT_WAITS} waits",
        )

    async def one(custom_id: str, body: dict[str, Any], tokens: int) -> None:
        try:
            retrying = tenacity.AsyncRetrying(
                stop=tenacity.stop_after_attempt(settings.max_tries),
                wait=tenacity.wait_random_exponential(
                    multiplier=backoff_base_seconds, max=backoff_cap_seconds
                ),
                retry=tenacity.retry_if_exception_type(Transient),
                reraise=True,
            )
            try:
                result = await retrying(attempt, custom_id, body, tokens)
            except Transient as exc:
                result = exc.result
            stats.retried += max(0, retrying.statistics.get("attempt_number", 1) - 1)
            stats.succeeded += result.succeeded
            stats.failed += not result.succeeded
            buffer.append(result)
            await flush(force=False)
        finally:
            slots.release()

    tasks: set[asyncio.Task[None]] = set()
    first = True
    try:
        for custom_id, body, tokens in requests:
            if stop():
                stats.interrupted = True
                break
            await slots.acquire()
            if stop():  # asked while waiting for a free slot
                slots.release()
                stats.interrupted = True
                break
            task = asyncio.create_task(one(custom_id, body, tokens))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            if first:
                first = False
                # The first request pays for the client's and the connection's setup and
                # reaches the server late; the second would land next to it in the
                # provider's window. Let it finish before the others go.
                await asyncio.gather(task, return_exceptions=True)
            await asyncio.sleep(0)
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await flush(force=True)
        stats.elapsed_seconds = time.monotonic() - began
        if progress is not None:
            progress(stats)
    return stats


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

    def spec_problems(self, spec: "PipelineSpec") -> list[tuple[str, str]]:
        return online_spec_problems(spec)

    def request_line(self, spec: "PipelineSpec", item: RequestItem) -> dict[str, Any]:
        return {
            "custom_id": item.custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": chat_body(spec, item),
        }

    def poll(self, provider_batch_id: str) -> BatchStatus:
        raise NotImplementedError("online shards are run by provider_batches, not polled")

    def results(self, provider_batch_id: str) -> Iterator[ItemResult]:
        # Results went to the ledger as they came; nothing is left to fetch.
        return iter(())

    def run(
        self,
        spec: "PipelineSpec",
        requests: Iterable[tuple[str, dict[str, Any], int]],
        deliver: Callable[[list[ItemResult]], None],
        *,
        checkpoint_every: int,
        stop: Callable[[], bool] = lambda: False,
        progress: Callable[[OnlineStats], None] | None = None,
    ) -> OnlineStats:
        """Send `(custom_id, body, tokens)` requests; hand results to `deliver` in batches of
        `checkpoint_every` (and the rest at the end). `stop()` turning true stops sending
        new requests; those in flight finish and are delivered."""
        return asyncio.run(
            self._run(
                spec.online.base_url or self.base_url,
                settings_of(spec),
                requests,
                deliver,
                checkpoint_every=checkpoint_every,
                stop=stop,
                progress=progress,
            )
        )

    async def _run(
        self,
        base_url: str | None,
        settings: OnlineSettings,
        requests: Iterable[tuple[str, dict[str, Any], int]],
        deliver: Callable[[list[ItemResult]], None],
        *,
        checkpoint_every: int,
        stop: Callable[[], bool],
        progress: Callable[[OnlineStats], None] | None,
    ) -> OnlineStats:
        import openai

        client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=resolve_secret(self.api_key) or "none",
            timeout=settings.timeout_seconds,
            max_retries=0,
        )

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
            result = normalize_line({"custom_id": custom_id, "response": response})
            assert result is not None
            return result, empty_for

        try:
            return await run_requests(
                settings,
                requests,
                deliver,
                send,
                checkpoint_every=checkpoint_every,
                stop=stop,
                progress=progress,
                backoff_base_seconds=self.backoff_base_seconds,
                backoff_cap_seconds=self.backoff_cap_seconds,
            )
        finally:
            await client.close()


def _retry_after(headers: Any) -> float | None:
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return float(millis) / 1000
        except ValueError:
            pass
    return parse_duration(headers.get("retry-after"))


def _failure(custom_id: str, status: int, exc: Any) -> ItemResult:
    body = exc.body if isinstance(getattr(exc, "body", None), dict) else {}
    error = body.get("error") if isinstance(body.get("error"), dict) else body
    code = error.get("code") or error.get("type") if isinstance(error, dict) else None
    message = (error.get("message") if isinstance(error, dict) else None) or str(exc)
    return ItemResult(
        custom_id=custom_id,
        succeeded=False,
        status_code=status,
        error_class=classify_error(status, code),
        error_code=str(code) if code else f"http_{status}",
        error_message=str(message)[:1000],
    )
