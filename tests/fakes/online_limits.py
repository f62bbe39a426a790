"""OpenAI's quantized rate limits as the fake online endpoint enforces them, and the
`x-ratelimit-*` and `retry-after` headers it reports them with."""

import math
import threading
from collections import deque
from dataclasses import dataclass

# Admissions older than this can no longer matter: the longest request window is 60 s (1 RPM).
_HISTORY_SECONDS = 60.0
DOCS = "Visit https://platform.openai.com/account/rate-limits to learn more."


def go_duration(seconds: float) -> str:
    """A duration as OpenAI writes it in `x-ratelimit-reset-*`: "120ms", "1.5s", "6m0s"."""
    millis = max(0, math.ceil(seconds * 1000 - 1e-6))
    if millis == 0:
        return "0s"
    if millis < 1000:
        return f"{millis}ms"
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def retry_after_headers(seconds: float) -> dict[str, str]:
    """`retry-after` in (possibly fractional) seconds and `retry-after-ms`, rounded up to 1 ms."""
    millis = max(1, math.ceil(seconds * 1000 - 1e-6))
    return {
        "retry-after": f"{millis / 1000:.3f}".rstrip("0").rstrip("."),
        "retry-after-ms": str(millis),
    }


@dataclass(frozen=True)
class Admission:
    """The rate limiter's answer for one request: refused by which limit, and the headers."""

    refused: str | None
    wait_seconds: float
    message: str
    headers: dict[str, str]


class RateLimiter:
    """OpenAI's quantized limits: per-minute limits enforced over rolling one-second windows.

    At most rpm/60 requests (rounded down) and tpm/60 tokens are admitted in any one-second
    window, measured at arrival. Under 60 RPM the request window stretches to 60/rpm seconds
    so that one request fits. A request estimated above the per-second token allowance is let
    through alone, when the window holds no tokens; one above the whole TPM limit never is.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._admitted: deque[tuple[float, int]] = deque()

    def clear(self) -> None:
        with self._lock:
            self._admitted.clear()

    def admit(
        self, now: float, rpm: int | None, tpm: int | None, tokens: int, model: str
    ) -> Admission:
        with self._lock:
            while self._admitted and self._admitted[0][0] <= now - _HISTORY_SECONDS:
                self._admitted.popleft()
            entries = sorted(self._admitted)
            refused: str | None = None
            waits: list[float] = []
            message = ""
            if rpm is not None:
                window, allowance = self._request_window(rpm)
                times = [t for t, _ in entries if t > now - window]
                if len(times) >= allowance:
                    refused = "requests"
                    waits.append(times[len(times) - allowance] + window - now)
                    message = (
                        f"Rate limit reached for {model} in organization org-fake on requests "
                        f"per min (RPM): Limit {rpm}, Used {rpm}, Requested 1."
                    )
            if tpm is not None:
                if tokens > tpm:
                    return Admission(
                        "tokens",
                        math.inf,
                        f"Request too large for {model} in organization org-fake on tokens per "
                        f"min (TPM): Limit {tpm}, Requested {tokens}. The input or output "
                        f"tokens must be reduced in order to run successfully. {DOCS}",
                        self._headers(entries, now, rpm, tpm),
                    )
                wait = self._token_wait(entries, now, tpm, tokens)
                if wait > 0:
                    waits.append(wait)
                    if refused is None:
                        refused = "tokens"
                        used = sum(c for t, c in entries if t > now - 1.0)
                        message = (
                            f"Rate limit reached for {model} in organization org-fake on tokens "
                            f"per min (TPM): Limit {tpm}, Used {used * 60}, Requested {tokens}."
                        )
            if refused is not None:
                wait = max(waits)
                return Admission(
                    refused,
                    wait,
                    f"{message} Please try again in {go_duration(wait)}. {DOCS}",
                    self._headers(entries, now, rpm, tpm),
                )
            self._admitted.append((now, tokens))
            return Admission(None, 0.0, "", self._headers(sorted(self._admitted), now, rpm, tpm))

    def headers(self, now: float, rpm: int | None, tpm: int | None) -> dict[str, str]:
        """The `x-ratelimit-*` headers for an answer that did not pass the limiter."""
        with self._lock:
            return self._headers(sorted(self._admitted), now, rpm, tpm)

    @staticmethod
    def _request_window(rpm: int) -> tuple[float, int]:
        if rpm < 1:
            raise ValueError(f"rpm_limit must be at least 1, got {rpm}")
        window = max(1.0, 60.0 / rpm)
        return window, max(1, math.floor(rpm * window / 60.0 + 1e-9))

    @staticmethod
    def _token_wait(entries: list[tuple[float, int]], now: float, tpm: int, tokens: int) -> float:
        """Seconds until `tokens` more fit in the one-second window (0: they fit now)."""
        allowance = tpm / 60.0
        in_window = [(t, c) for t, c in entries if t > now - 1.0]
        used = sum(c for _, c in in_window)
        if used == 0 or used + tokens <= allowance:
            return 0.0
        for t, c in in_window:
            used -= c
            if used == 0 or used + tokens <= allowance:
                return t + 1.0 - now
        return 0.0

    def _headers(
        self, entries: list[tuple[float, int]], now: float, rpm: int | None, tpm: int | None
    ) -> dict[str, str]:
        """Limit per minute as OpenAI reports it; remaining and reset for the current window."""
        headers: dict[str, str] = {}
        if rpm is not None:
            window, allowance = self._request_window(rpm)
            times = [t for t, _ in entries if t > now - window]
            headers["x-ratelimit-limit-requests"] = str(rpm)
            headers["x-ratelimit-remaining-requests"] = str(max(0, allowance - len(times)))
            reset = (times[-1] + window - now) if times else 0.0
            headers["x-ratelimit-reset-requests"] = go_duration(reset)
        if tpm is not None:
            in_window = [(t, c) for t, c in entries if t > now - 1.0]
            used = sum(c for _, c in in_window)
            headers["x-ratelimit-limit-tokens"] = str(tpm)
            headers["x-ratelimit-remaining-tokens"] = str(max(0, math.floor(tpm / 60.0 - used)))
            reset = (in_window[-1][0] + 1.0 - now) if in_window else 0.0
            headers["x-ratelimit-reset-tokens"] = go_duration(reset)
        return headers
