"""Control-plane retries for provider SDK calls: backoff with jitter, honouring Retry-After.

The SDKs' own retries are switched off (`max_retries=0`) where this wraps them, so a call is
never retried by two layers at once.

Every wait here is bounded and interruptible: a server's Retry-After is waited out for at
most `max_retry_after_seconds` (MAX_RETRY_AFTER_SECONDS unless a resource says otherwise;
a hint of hours means "try again then", and the next answer says again), and a wait ends at
once with WaitInterrupted when the process is asked to stop (`stop_waits`, called on the
SIGTERM path of a step that handles SIGTERM itself; in the main thread a signal handler that
raises, as Dagster's does, ends the wait too).
"""

import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import tenacity

T = TypeVar("T")

RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})
MAX_RETRY_AFTER_SECONDS = 120.0
"""The longest one wait for a server's Retry-After (or rate-limit reset) lasts."""

_stopping = threading.Event()
_WAIT_SLICE_SECONDS = 0.5
"""A retry wait wakes this often: a SIGTERM that the kernel delivers to another thread is
handled by the main thread only when it runs Python again, not while it blocks."""


class WaitInterrupted(Exception):
    """A retry wait ended early: the process is stopping (SIGTERM)."""


class QuotaRefused(Exception):
    """A provider refused to create a batch for a quota (too many batches or tokens in flight,
    a rate limit): nothing was created, and the shard waits to be submitted again. Not an
    attempt of its items. `retry_after_seconds` is the provider's hint, if it gave one."""

    def __init__(self, message: str, retry_after_seconds: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


QUOTA_TRIES = 1
"""How many 429s a create meets in a row before its shard goes back to waiting
(QuotaRefused). One: a refusal is what submission learns the provider's limit from
(steps/quota.py), and the shard waits for room rather than asking again at once."""


def quota_refusal(exc: BaseException) -> QuotaRefused:
    """An SDK's refusal (a 429) as QuotaRefused, with what the server said and its hint."""
    message = getattr(exc, "message", None) or str(exc)
    return QuotaRefused(str(message)[:500], retry_after_seconds(exc))


def stop_waits() -> None:
    """End every retry wait of the process now, and any started until `allow_waits`."""
    _stopping.set()


def allow_waits() -> None:
    """Let retry waits run again (once the stop that ended them has been handled)."""
    _stopping.clear()


def pause(seconds: float) -> None:
    """Wait `seconds` before a retry, or raise WaitInterrupted as soon as `stop_waits` is
    called."""
    deadline = time.monotonic() + max(seconds, 0.0)
    if _stopping.is_set():
        raise WaitInterrupted(f"a {seconds:.1f}s retry wait was ended: the process is stopping")
    while (left := deadline - time.monotonic()) > 0:
        if _stopping.wait(min(left, _WAIT_SLICE_SECONDS)):
            raise WaitInterrupted(f"a {seconds:.1f}s retry wait was ended: the process is stopping")


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of an SDK's error: `status_code` (openai, anthropic), `code`
    (google-genai's APIError)."""
    status = getattr(exc, "status_code", None)
    if status is None and type(exc).__module__.startswith("google.genai"):
        status = getattr(exc, "code", None)
    return status if isinstance(status, int) else None


def _is_transport_error(exc: BaseException) -> bool:
    """A connection reset, refused connection or timeout that an SDK let through unwrapped
    (google-genai raises its HTTP library's own errors, httpx's or httpx2's)."""
    return any(
        cls.__name__ == "TransportError" and cls.__module__.split(".")[0] in ("httpx", "httpx2")
        for cls in type(exc).__mro__
    )


def is_transient(exc: BaseException) -> bool:
    """Connection errors, timeouts, 429 and 5xx from any of the SDKs."""
    name = type(exc).__name__
    if name in ("APIConnectionError", "APITimeoutError") or _is_transport_error(exc):
        return True
    status = status_of(exc)
    return status is not None and status in RETRYABLE_STATUS


def retry_after_seconds(exc: BaseException) -> float | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    for name in ("retry-after-ms", "retry-after"):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value)
        except ValueError:
            return None
        return seconds / 1000 if name == "retry-after-ms" else seconds
    return None


def backoff_delay(
    exc: BaseException | None, attempt: int, base: float, cap: float, max_retry_after: float
) -> float:
    """The server's Retry-After when it gives one, else exponential backoff, full jitter."""
    hinted = retry_after_seconds(exc) if exc is not None else None
    if hinted is not None:
        return min(max(hinted, 0.0), max_retry_after)
    return random.uniform(0, min(cap, base * 2 ** (attempt - 1)))


def create_once(
    create: Callable[[], T],
    find_existing: Callable[[], T | None],
    *,
    attempts: int,
    base_seconds: float,
    cap_seconds: float,
    max_retry_after_seconds: float = MAX_RETRY_AFTER_SECONDS,
    reconcile_looks: int = 3,
) -> T:
    """Create a paid resource at most once.

    A create whose answer was lost (reset, timeout, 5xx) may still have happened, so before
    trying again we look for what it would have created. A 429, which the provider answers
    before doing anything, is a refusal for quota once QUOTA_TRIES of them came in a row
    (QuotaRefused): the caller waits for room.
    """
    refusals = 0
    for attempt in range(1, attempts + 1):
        try:
            return create()
        except Exception as exc:
            refused = status_of(exc) == 429
            refusals = refusals + 1 if refused else 0
            if refused and refusals >= QUOTA_TRIES:
                raise quota_refusal(exc) from exc
            if not is_transient(exc) or attempt == attempts:
                raise
            if not refused:
                # A create that timed out may still land a moment later: look a few times,
                # further apart each time, before daring another create.
                for look in range(reconcile_looks):
                    found = find_existing()
                    if found is not None:
                        return found
                    pause(min(cap_seconds, base_seconds * 2**look))
            pause(backoff_delay(exc, attempt, base_seconds, cap_seconds, max_retry_after_seconds))
    raise AssertionError("unreachable")


class _Wait(tenacity.wait.wait_base):
    """Exponential backoff with full jitter, or the server's Retry-After when it gives one."""

    def __init__(self, base: float, cap: float, max_retry_after: float) -> None:
        self.base = base
        self.cap = cap
        self.max_retry_after = max_retry_after

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        return backoff_delay(
            exc, retry_state.attempt_number, self.base, self.cap, self.max_retry_after
        )


def call_with_retries(
    fn: Callable[[], T],
    *,
    attempts: int,
    base_seconds: float,
    cap_seconds: float,
    max_retry_after_seconds: float = MAX_RETRY_AFTER_SECONDS,
    describe: str = "provider call",
    log: Callable[[str], Any] | None = None,
) -> T:
    """Run `fn`, retrying transient failures; the last error is re-raised unchanged."""

    def before_sleep(state: tenacity.RetryCallState) -> None:
        if log is not None and state.outcome is not None:
            log(
                f"{describe}: {type(state.outcome.exception()).__name__} on attempt "
                f"{state.attempt_number}; retrying"
            )

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(attempts),
        wait=_Wait(base_seconds, cap_seconds, max_retry_after_seconds),
        retry=tenacity.retry_if_exception(is_transient),
        reraise=True,
        before_sleep=before_sleep,
        sleep=pause,
    )
    return retrying(fn)
