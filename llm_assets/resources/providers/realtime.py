"""The realtime worker shared by the online provider and Bedrock's on-demand path: requests
sent one by one with `concurrency` in flight, paced under the RPM and TPM windows (this
process's, or in Redis shared by every process sending to the same quota: shared_window.py),
a pause for every sender on a rate limit, transient failures retried with jittered backoff
(tenacity), results handed over in small batches as they complete, so memory stays flat and
a checkpoint is never far behind.

Every wait is bounded and ends on a stop: a rate limit's Retry-After or reset is waited out
for at most `max_retry_after_seconds`, and a request still waiting for its turn or its
backoff when the work's `stop()` turns true is not sent (its item stays open for the next
run) within STOP_CHECK_SECONDS.
"""

import asyncio
import dataclasses
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

import tenacity
from pydantic import BaseModel

from llm_assets.resources.providers.retrying import MAX_RETRY_AFTER_SECONDS
from llm_assets.results.rows import ItemResult

MARGIN = 1.02
"""Client windows are this much longer than the provider's, so jitter never overfills one."""
TOKEN_SHARE = 0.97
"""Token counts vary per request, so the TPM window keeps a little more room than the RPM's."""
MAX_RATE_LIMIT_WAITS = 50
STOP_CHECK_SECONDS = 0.2
"""How often a waiting request looks whether the work was asked to stop."""
_NUMBER = r"(\d+(?:\.\d+)?)"
_DURATION = re.compile(rf"(?:{_NUMBER}h)?(?:{_NUMBER}m(?!s))?(?:{_NUMBER}s)?(?:{_NUMBER}ms)?$")


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


def per_minute(limit: int, share: float = 1.0) -> tuple[float, float]:
    """(capacity, seconds) of the window that keeps `share` of a per-minute `limit`: one
    second's share of the minute, or a longer window when that is under one unit; the window
    is a little longer than the provider's so network jitter cannot push an extra request
    into it."""
    seconds = max(1.0, 60.0 / limit)
    return float(int(limit * share * seconds / 60)), seconds * MARGIN


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
        return cls(*per_minute(limit, share))

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


class Pacer(Protocol):
    """Where the RPM and TPM windows of a run are kept: in this process (`LocalPacer`) or
    shared by every process that sends to the same quota (`shared_window.SharedPacer`)."""

    async def claim(self, tokens: int) -> float:
        """0.0 when a request of `tokens` may start now, its start then recorded; else the
        seconds until the windows may have room (nothing recorded)."""
        ...

    async def hold_off(self, seconds: float) -> None:
        """The endpoint said to slow down: no sender of this quota starts for `seconds`."""
        ...


class LocalPacer:
    """The RPM and TPM windows of this process alone, on its monotonic clock."""

    def __init__(self, rpm: int | None, tpm: int | None) -> None:
        self.requests = RollingWindow.per_minute(rpm) if rpm else None
        self.tokens = RollingWindow.per_minute(tpm, TOKEN_SHARE) if tpm else None

    async def claim(self, tokens: int) -> float:
        now = time.monotonic()
        ready = now
        if self.requests is not None:
            ready = max(ready, self.requests.ready_at(1, now))
        if self.tokens is not None:
            ready = max(ready, self.tokens.ready_at(tokens, now))
        if ready > now:
            return ready - now
        if self.requests is not None:
            self.requests.started(now, 1)
        if self.tokens is not None:
            self.tokens.started(now, tokens)
        return 0.0

    async def hold_off(self, seconds: float) -> None:
        """Nothing to share: the run's own pause holds this process's senders."""


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


class _Stopped(Exception):
    """The work was asked to stop while this request waited: it is not sent."""


Send = Callable[[str, dict[str, Any]], Awaitable[tuple[ItemResult, float | None]]]
"""One request: its result, and how long the endpoint said its request window stays empty
(None when it did not say). Raises Transient or RateLimited."""


@dataclasses.dataclass(frozen=True)
class OnlineWork:
    """One online shard's work as the step hands it to a provider's `run`: the
    `(custom_id, body, tokens)` requests, where their results go (`deliver`, every
    `checkpoint_every` results and the rest at the end), when to stop sending (`stop()`
    turning true; requests in flight finish and are delivered) and whom to tell."""

    requests: Iterable[tuple[str, dict[str, Any], int]]
    deliver: Callable[[list[ItemResult]], None]
    checkpoint_every: int
    stop: Callable[[], bool] = lambda: False
    progress: Callable[[OnlineStats], None] | None = None


async def run_requests(
    settings: OnlineSettings,
    work: OnlineWork,
    send: Send,
    *,
    backoff_base_seconds: float,
    backoff_cap_seconds: float,
    max_retry_after_seconds: float = MAX_RETRY_AFTER_SECONDS,
    pacer: Pacer | None = None,
) -> OnlineStats:
    """Send the work's requests through `send`: `settings.concurrency` in flight, paced
    under the RPM and TPM windows (`pacer`'s; by default this process's own), a pause for
    everyone on a rate limit (at most `max_retry_after_seconds` at a time), transient
    failures retried with jittered backoff, results handed to `work.deliver` as they
    complete."""
    worker = _Worker(
        settings,
        work,
        send,
        (backoff_base_seconds, backoff_cap_seconds),
        max_retry_after_seconds,
        pacer or LocalPacer(settings.rpm, settings.tpm),
    )
    return await worker.run(work.requests, work.stop)


class _Worker:
    """One run of `run_requests`: its windows, pause, result buffer and counts."""

    def __init__(
        self,
        settings: OnlineSettings,
        work: OnlineWork,
        send: Send,
        backoff: tuple[float, float],
        max_retry_after_seconds: float,
        pacer: Pacer,
    ) -> None:
        self.max_tries = settings.max_tries
        self.backoff = backoff
        self.max_hold_off = max_retry_after_seconds
        self.deliver = work.deliver
        self.stop = work.stop
        self.send = send
        self.checkpoint_every = work.checkpoint_every
        self.progress = work.progress
        self.stats = OnlineStats()
        self.pacer = pacer
        self.paced_by_rpm = bool(settings.rpm)
        self.pause_until = 0.0
        self.buffer: list[ItemResult] = []
        self.flushing = asyncio.Lock()
        self.gate = asyncio.Lock()
        self.slots = asyncio.Semaphore(settings.concurrency)

    async def run(
        self, requests: Iterable[tuple[str, dict[str, Any], int]], stop: Callable[[], bool]
    ) -> OnlineStats:
        began = time.monotonic()
        tasks: set[asyncio.Task[None]] = set()
        try:
            await self._start_all(requests, stop, tasks)
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            await self.flush(force=True)
            self.stats.elapsed_seconds = time.monotonic() - began
            if self.progress is not None:
                self.progress(self.stats)
        return self.stats

    async def _start_all(
        self,
        requests: Iterable[tuple[str, dict[str, Any], int]],
        stop: Callable[[], bool],
        tasks: set[asyncio.Task[None]],
    ) -> None:
        """A task per request as a slot frees up, until the requests run out or `stop()`."""
        first = True
        for custom_id, body, tokens in requests:
            if stop():
                self.stats.interrupted = True
                return
            await self.slots.acquire()
            if stop():  # asked while waiting for a free slot
                self.slots.release()
                self.stats.interrupted = True
                return
            task = asyncio.create_task(self.one(custom_id, body, tokens))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            if first:
                first = False
                # The first request pays for the client's and the connection's setup and
                # reaches the server late; the second would land next to it in the
                # provider's window. Let it finish before the others go.
                await asyncio.gather(task, return_exceptions=True)
            await asyncio.sleep(0)

    async def one(self, custom_id: str, body: dict[str, Any], tokens: int) -> None:
        """One request to its final result (retried while transient), then buffered."""
        try:
            base, cap = self.backoff
            retrying = tenacity.AsyncRetrying(
                stop=tenacity.stop_after_attempt(self.max_tries),
                wait=tenacity.wait_random_exponential(multiplier=base, max=cap),
                retry=tenacity.retry_if_exception_type(Transient),
                reraise=True,
                sleep=self.pause,
            )
            try:
                result: ItemResult = await retrying(self.attempt, custom_id, body, tokens)
            except Transient as exc:
                result = exc.result
            except _Stopped:
                self.stats.interrupted = True
                return
            self.stats.retried += max(0, retrying.statistics.get("attempt_number", 1) - 1)
            self.stats.succeeded += result.succeeded
            self.stats.failed += not result.succeeded
            self.buffer.append(result)
            await self.flush(force=False)
        finally:
            self.slots.release()

    async def attempt(self, custom_id: str, body: dict[str, Any], tokens: int) -> ItemResult:
        """One try: sent when the windows allow, sent again after each rate limit."""
        for _ in range(MAX_RATE_LIMIT_WAITS):
            await self.wait_turn(tokens)
            self.stats.sent += 1
            try:
                result, window_empty_for = await self.send(custom_id, body)
            except RateLimited as exc:
                self.stats.rate_limited += 1
                await self.hold_off(exc.retry_after or 1.0)
                continue
            # Without a limit of our own the server's word is all we know: an empty window
            # waits for its reset. With one, our window already keeps the pace.
            if not self.paced_by_rpm and window_empty_for is not None:
                await self.hold_off(window_empty_for)
            return result
        return ItemResult(
            custom_id=custom_id,
            succeeded=False,
            error_class="transient",
            error_code="rate_limit_exceeded",
            error_message=f"still rate limited after {MAX_RATE_LIMIT_WAITS} waits",
        )

    async def wait_turn(self, tokens: int) -> None:
        """One sender at a time waits for its moment: past any rate-limit pause, then until
        the pacer records its start."""
        async with self.gate:
            while True:
                held = self.pause_until - time.monotonic()
                wait = held if held > 0 else await self.pacer.claim(tokens)
                if wait <= 0:
                    return
                await self.pause(wait)

    async def pause(self, seconds: float) -> None:
        """Sleep `seconds`, looking every STOP_CHECK_SECONDS whether to stop (_Stopped)."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if self.stop():
                raise _Stopped
            await asyncio.sleep(min(left, STOP_CHECK_SECONDS))

    async def hold_off(self, seconds: float) -> None:
        """Every sender waits `seconds` from now, at most `max_hold_off` (a longer pause
        already set stands): this run's, and through the pacer those of other processes
        sending to the same quota."""
        seconds = min(seconds, self.max_hold_off)
        until = time.monotonic() + seconds
        if until > self.pause_until:
            self.stats.paused_seconds += until - max(self.pause_until, time.monotonic())
            self.pause_until = until
        await self.pacer.hold_off(seconds)

    async def flush(self, force: bool) -> None:
        """Hand the buffered results to `deliver` once there are `checkpoint_every` of them
        (any number when forced), off the event loop."""
        async with self.flushing:
            if self.buffer and (force or len(self.buffer) >= self.checkpoint_every):
                batch = self.buffer[:]
                self.buffer.clear()
                await asyncio.to_thread(self.deliver, batch)
                if self.progress is not None:
                    self.progress(self.stats)
