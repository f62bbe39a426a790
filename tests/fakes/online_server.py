"""A fake OpenAI-compatible online chat endpoint (OpenAI, vLLM, Ollama): real HTTP on loopback.

The online provider sends chat completions one at a time through the official SDK. This fake
answers them as the Chat Completions API does -- the response and `{"error": {...}}` shapes,
OpenAI's quantized rate limits with `retry-after` and `x-ratelimit-*` headers -- and adds what a
test or a benchmark needs: a latency per request, a server capacity, and faults chosen per
request. Every request is recorded with its arrival time and the client's request id, so a test
can check pacing and that no item succeeded twice.

Knobs are plain attributes, read when a request arrives; the handler threads never hold a lock
while they sleep, so latency overlaps across concurrent requests.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from tests.fakes.base import FakeHandler, FakeServer, Reply
from tests.fakes.online_limits import DOCS, RateLimiter, go_duration, retry_after_headers
from tests.fakes.online_requests import ChatRequest, parse_chat_request
from tests.fakes.openai_model import (
    ApiError,
    Responder,
    chat_choices,
    count_tokens,
    cut_to_tokens,
    default_responder,
    error_body,
    new_id,
)

# The fake and the helpers tests use to predict its answers.
__all__ = ["FakeOnline", "OnlineCall", "go_duration", "retry_after_headers"]

JSON = dict[str, Any]
FAULTS = ("500", "502", "503", "429", "400", "timeout", "reset")
_BAD_GATEWAY = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>cloudflare</center>\r\n"
    b"</body>\r\n</html>\r\n"
)


@dataclass(frozen=True)
class OnlineCall:
    """One request to the chat endpoint, as the fake saw and answered it.

    status is the HTTP status answered, or 0 when no answer reached the client (a "reset"
    fault, or a client that had hung up before the answer was ready). arrived/started/finished
    are time.monotonic(): arrival (what the rate limiter measures), a capacity slot granted,
    the answer ready.
    """

    arrived: float
    arrived_wall: float
    request_id: str | None
    status: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    fault: str | None = None
    limited: str | None = None
    retry_count: int | None = None
    started: float | None = None
    finished: float | None = None


class FakeOnline(FakeServer):
    """The fake endpoint; knobs are plain attributes, read when a request arrives.

    latency_seconds: processing time of each request (slept in its handler thread, so
        concurrent requests overlap).
    capacity: at most this many requests processed at once; the rest queue for a slot.
    rpm_limit, tpm_limit: OpenAI's quantized limits (see RateLimiter). Refused requests get 429
        with OpenAI's rate-limit error, `retry-after` and `retry-after-ms`; every answer carries
        `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` for the limits that are set
        (limit per minute, as OpenAI reports it; remaining and reset for the current window).
    fault: (X-Client-Request-Id, body) -> None | "500" | "502" | "503" | "429" | "400" |
        "timeout" | "reset", asked for each valid chat request. "429" carries `retry-after`
        (fault_retry_after_seconds) and is not counted against the limits; "502" is a proxy's
        HTML page; "timeout" answers normally after timeout_seconds; "reset" drops the
        connection with a TCP RST.
    responder: body -> assistant content, instead of `default_responder` (which answers a
        json_schema response_format with a schema-valid instance).
    models: served model ids; None accepts any model. GET /v1/models lists them.
    api_key: when set, requests must carry `Authorization: Bearer <api_key>` (401 otherwise).
    clock: when a request arrived, as the rate limiter measures it (time.monotonic); a test
        that needs requests to arrive at one instant, whatever the machine's load, stops it.
    """

    server_name: ClassVar[str] = "fake-online/1"
    url_path: ClassVar[str] = "/v1"

    def __init__(self, *, port: int | None = None) -> None:
        super().__init__(port=port, poll_interval=0.02)
        self.latency_seconds: float = 0.0
        self.capacity: int | None = None
        self.rpm_limit: int | None = None
        self.tpm_limit: int | None = None
        self.fault: Callable[[str | None, JSON], str | None] | None = None
        self.fault_retry_after_seconds: float = 0.2
        self.timeout_seconds: float = 30.0
        self.responder: Responder | None = None
        self.models: list[str] | None = None
        self.api_key: str | None = None
        self.clock: Callable[[], float] = time.monotonic
        self.limiter = RateLimiter()
        self._calls: list[OnlineCall] = []
        self._calls_lock = threading.Lock()
        self._slots = threading.Condition()
        self._active = 0
        self._flight = threading.Condition()
        self._in_flight = 0
        self._stopping = threading.Event()

    def start(self) -> FakeOnline:
        self._stopping.clear()
        return super().start()

    def stop(self) -> None:
        """Stop listening, wake sleeping handlers and drop open connections."""
        self._stopping.set()
        with self._slots:
            self._slots.notify_all()
        super().stop()

    def calls(self) -> list[OnlineCall]:
        """Every chat request answered so far, in order of arrival."""
        with self._calls_lock:
            return sorted(self._calls, key=lambda c: c.arrived)

    def reset(self) -> None:
        """Forget the records and the rate limiter's windows."""
        with self._calls_lock:
            self._calls.clear()
        self.limiter.clear()

    def successes(self) -> list[str | None]:
        """Client request ids answered 200, in order of arrival (an id twice: done twice)."""
        return [c.request_id for c in self.calls() if c.status == 200]

    def count(self, status: int) -> int:
        return sum(1 for c in self.calls() if c.status == status)

    def rate_limited(self) -> int:
        """429s the rate limiter gave (fault-injected 429s are not counted)."""
        return sum(1 for c in self.calls() if c.limited is not None)

    def requests_per_second(self, status: int | None = None) -> dict[int, int]:
        """Arrivals per whole second since the first arrival, empty seconds included."""
        calls = self.calls()
        if not calls:
            return {}
        first = calls[0].arrived
        seconds = [int(c.arrived - first) for c in calls if status is None or c.status == status]
        histogram = dict.fromkeys(range(int(calls[-1].arrived - first) + 1), 0)
        for second in seconds:
            histogram[second] += 1
        return histogram

    def max_in_window(self, seconds: float = 1.0, status: int | None = None) -> int:
        """The most arrivals (with `status`, if given) in any rolling window of `seconds`."""
        times = [c.arrived for c in self.calls() if status is None or c.status == status]
        best = start = 0
        for end, arrived in enumerate(times):
            while arrived - times[start] >= seconds:
                start += 1
            best = max(best, end - start + 1)
        return best

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until no received chat request is still being handled (say, one whose client
        timed out while the fake slept); False if that takes longer than `timeout`."""
        with self._flight:
            return self._flight.wait_for(lambda: self._in_flight == 0, timeout)

    def max_concurrency(self) -> int:
        """The most requests that held a capacity slot at the same time."""
        events: list[tuple[float, int]] = []
        for c in self.calls():
            if c.started is not None and c.finished is not None:
                events += [(c.started, 1), (c.finished, -1)]
        best = active = 0
        for _, step in sorted(events):
            active += step
            best = max(best, active)
        return best

    def _record(self, call: OnlineCall) -> None:
        with self._calls_lock:
            self._calls.append(call)

    def respond(self, handler: FakeHandler, body: bytes) -> Reply | None:
        """The answer to one HTTP request; None to reset the connection."""
        started = time.monotonic()
        try:
            reply = self._route(handler, body)
        except ApiError as err:
            reply = Reply(err.status, err.body)
        except Exception:
            self.record_crash()
            reply = Reply(
                500, error_body("The fake server crashed; see server_errors.", "server_error")
            )
        if reply is not None:
            elapsed_ms = int((time.monotonic() - started) * 1000)
            reply.headers = {
                "x-request-id": new_id("req_"),
                "openai-version": "2020-10-01",
                "openai-processing-ms": str(elapsed_ms),
                **reply.headers,
            }
        return reply

    def _route(self, handler: FakeHandler, raw: bytes) -> Reply | None:
        if self.api_key is not None:
            auth = handler.headers.get("Authorization") or ""
            if auth != f"Bearer {self.api_key}":
                return Reply(
                    401,
                    error_body(
                        "Incorrect API key provided. You can find your API key at "
                        "https://platform.openai.com/account/api-keys.",
                        "invalid_request_error",
                        code="invalid_api_key",
                    ),
                )
        path = handler.path.split("?", 1)[0].rstrip("/")
        if handler.command == "POST" and path == "/v1/chat/completions":
            return self._chat(handler, raw)
        if handler.command == "GET" and path == "/v1/models":
            return Reply(
                body={
                    "object": "list",
                    "data": [
                        {"id": m, "object": "model", "created": 1_700_000_000, "owned_by": "fake"}
                        for m in (self.models or ["gpt-4o-mini"])
                    ],
                }
            )
        raise ApiError(404, f"Invalid URL ({handler.command} {path})")

    def _chat(self, handler: FakeHandler, raw: bytes) -> Reply | None:
        with self._flight:
            self._in_flight += 1
        try:
            return self._serve_chat(handler, raw)
        finally:
            with self._flight:
                self._in_flight -= 1
                self._flight.notify_all()

    def _serve_chat(self, handler: FakeHandler, raw: bytes) -> Reply | None:
        arrived, arrived_wall = self.clock(), time.time()
        retry_count = handler.headers.get("x-stainless-retry-count")
        call: JSON = {
            "arrived": arrived,
            "arrived_wall": arrived_wall,
            "request_id": handler.headers.get("X-Client-Request-Id"),
            "retry_count": int(retry_count) if retry_count and retry_count.isdigit() else None,
        }
        rpm, tpm = self.rpm_limit, self.tpm_limit

        def answer(reply: Reply | None, **fields: Any) -> Reply | None:
            self._record(OnlineCall(**{**call, **fields}))
            return reply

        try:
            request = parse_chat_request(raw)
            if self.models is not None and request.model not in self.models:
                raise ApiError(
                    404,
                    f"The model `{request.model}` does not exist or you do not have access to it.",
                    code="model_not_found",
                )
        except ApiError as err:
            headers = self.limiter.headers(arrived, rpm, tpm)
            return answer(Reply(err.status, err.body, headers=headers), status=err.status)
        call["prompt_tokens"] = request.prompt_tokens
        fault = self.fault(call["request_id"], request.body) if self.fault else None
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"fault returned {fault!r}; expected None or one of {FAULTS}")
        if fault in ("429", "400"):
            headers = self.limiter.headers(arrived, rpm, tpm)
            reply = self._fault_reply(fault, request.model, headers)
            return answer(reply, status=reply.status, fault=fault)
        admission = self.limiter.admit(arrived, rpm, tpm, request.estimated_tokens, request.model)
        if admission.refused is not None:
            headers = dict(admission.headers)
            if math.isfinite(admission.wait_seconds):
                headers.update(retry_after_headers(admission.wait_seconds))
            body = error_body(admission.message, admission.refused, code="rate_limit_exceeded")
            return answer(Reply(429, body, headers=headers), status=429, limited=admission.refused)
        if fault in ("500", "502", "503"):
            reply = self._fault_reply(fault, request.model, admission.headers)
            return answer(reply, status=reply.status, fault=fault)
        if fault == "reset":
            return answer(None, status=0, fault=fault)
        if fault == "timeout":
            self._stopping.wait(self.timeout_seconds)
            body, completion_tokens = self._completion(request)
            timing: JSON = {"finished": time.monotonic()}
        else:
            with self._slot():
                timing = {"started": time.monotonic()}
                if self.latency_seconds > 0:
                    self._stopping.wait(self.latency_seconds)
                body, completion_tokens = self._completion(request)
                timing["finished"] = time.monotonic()
        status = 0 if handler.client_gone() else 200
        return answer(
            Reply(200, body, headers=admission.headers),
            status=status,
            completion_tokens=completion_tokens,
            fault=fault,
            **timing,
        )

    @contextlib.contextmanager
    def _slot(self) -> Any:
        """Hold one of `capacity` processing slots, queueing for it without a lock held."""
        with self._slots:
            while True:
                capacity = self.capacity
                if capacity is None or self._active < capacity or self._stopping.is_set():
                    break
                self._slots.wait(0.05)
            self._active += 1
        try:
            yield
        finally:
            with self._slots:
                self._active -= 1
                self._slots.notify()

    def _fault_reply(self, fault: str, model: str, headers: dict[str, str]) -> Reply:
        if fault == "429":
            return Reply(
                429,
                error_body(
                    f"Rate limit reached for {model} in organization org-fake on requests per "
                    f"min (RPM). Please try again in "
                    f"{go_duration(self.fault_retry_after_seconds)}. {DOCS}",
                    "requests",
                    code="rate_limit_exceeded",
                ),
                headers={**headers, **retry_after_headers(self.fault_retry_after_seconds)},
            )
        if fault == "400":
            return Reply(
                400,
                error_body(
                    "Invalid 'messages[0].content': the fake rejects this request (injected "
                    "fault).",
                    "invalid_request_error",
                    param="messages[0].content",
                    code="invalid_value",
                ),
                headers=headers,
            )
        if fault == "502":
            return Reply(502, raw=_BAD_GATEWAY, content_type="text/html", headers=headers)
        if fault == "503":
            message = "The server is overloaded or not ready yet."
        else:
            message = "The server had an error while processing your request. Sorry about that!"
        return Reply(int(fault), error_body(message, "server_error"), headers=headers)

    def _completion(self, request: ChatRequest) -> tuple[JSON, int]:
        """The chat.completion body and its completion tokens."""
        content = (self.responder or default_responder)(request.body)
        finish_reason = "stop"
        tokens = count_tokens(content, request.model)
        if request.max_tokens is not None and tokens > request.max_tokens:
            content, _ = cut_to_tokens(content, request.max_tokens, request.model)
            tokens, finish_reason = request.max_tokens, "length"
        choices = chat_choices(content, finish_reason, request.n)
        completion_tokens = tokens * request.n
        body = {
            "id": new_id("chatcmpl-", 29),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.model,
            "choices": choices,
            "usage": {
                "prompt_tokens": request.prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": request.prompt_tokens + completion_tokens,
            },
            "service_tier": "default",
            "system_fingerprint": "fp_fake000000",
        }
        return body, completion_tokens
