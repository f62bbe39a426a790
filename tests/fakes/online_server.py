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
import json
import math
import select
import socket
import struct
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

from tests.fakes.common import ServerThread
from tests.fakes.openai_server import (
    ApiError,
    count_tokens,
    cut_to_tokens,
    default_responder,
    error_body,
    new_id,
    prompt_tokens_of,
)

JSON = dict[str, Any]
FAULTS = ("500", "502", "503", "429", "400", "timeout", "reset")
ROLES = ("system", "assistant", "user", "function", "tool", "developer")
# Reasoning models refuse `max_tokens` and want `max_completion_tokens`, as the real API does.
_MAX_COMPLETION_ONLY = ("o1", "o3", "o4", "gpt-5")
# Admissions older than this can no longer matter: the longest request window is 60 s (1 RPM).
_HISTORY_SECONDS = 60.0
_DOCS = "Visit https://platform.openai.com/account/rate-limits to learn more."
_BAD_GATEWAY = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>cloudflare</center>\r\n"
    b"</body>\r\n</html>\r\n"
)


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


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _invalid_type(param: str, expected: str, value: Any) -> ApiError:
    return ApiError(
        400,
        f"Invalid type for '{param}': expected {expected}, but got {_type_name(value)} instead.",
        param=param,
        code="invalid_type",
    )


def _missing(param: str) -> ApiError:
    return ApiError(
        400,
        f"Missing required parameter: '{param}'.",
        param=param,
        code="missing_required_parameter",
    )


@dataclass(frozen=True)
class ChatRequest:
    """What the fake needs of a valid chat request body."""

    body: JSON
    model: str
    prompt_tokens: int
    max_tokens: int | None
    n: int

    @property
    def estimated_tokens(self) -> int:
        """What OpenAI counts against the token limit on arrival: prompt plus max output."""
        return self.prompt_tokens + (self.max_tokens or 0) * self.n


def parse_chat_request(raw: bytes) -> ChatRequest:
    """The request body checked as the Chat Completions API checks it; ApiError(400) if not."""
    try:
        body = json.loads(raw or b"")
    except (ValueError, UnicodeDecodeError):
        body = None
    if not isinstance(body, dict):
        raise ApiError(
            400,
            "We could not parse the JSON body of your request. (HINT: This likely means you "
            "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, "
            "but what was sent was not valid JSON. If you have trouble figuring out how to fix "
            "this, please contact us through our help center at help.openai.com.)",
        )
    model = body.get("model")
    if model is None or model == "":
        raise ApiError(400, "you must provide a model parameter")
    if not isinstance(model, str):
        raise _invalid_type("model", "a string", model)
    messages = body.get("messages")
    if messages is None:
        raise _missing("messages")
    if not isinstance(messages, list):
        raise _invalid_type("messages", "an array of objects", messages)
    if not messages:
        raise ApiError(
            400,
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got "
            "an empty array instead.",
            param="messages",
            code="empty_array",
        )
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise _invalid_type(where, "an object", message)
        role = message.get("role")
        if role is None:
            raise _missing(f"{where}.role")
        if role not in ROLES:
            supported = ", ".join(f"'{r}'" for r in ROLES[:-1]) + f", and '{ROLES[-1]}'"
            raise ApiError(
                400,
                f"Invalid value: '{role}'. Supported values are: {supported}.",
                param=f"{where}.role",
                code="invalid_value",
            )
        if "content" not in message and role != "assistant":
            raise _missing(f"{where}.content")
        content = message.get("content")
        if not (
            isinstance(content, str)
            or (isinstance(content, list) and all(isinstance(p, dict) for p in content))
            or (content is None and role == "assistant")
        ):
            raise _invalid_type(f"{where}.content", "one of a string or array of objects", content)
    if body.get("stream") is True:
        raise ApiError(
            400,
            "The fake online server does not implement streaming; send 'stream': false.",
            param="stream",
            code="unsupported_value",
        )
    if "max_tokens" in body and model.startswith(_MAX_COMPLETION_ONLY):
        raise ApiError(
            400,
            "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
            "'max_completion_tokens' instead.",
            param="max_tokens",
            code="unsupported_parameter",
        )
    limits: dict[str, int] = {}
    for name, low, high in (
        ("max_tokens", 1, None),
        ("max_completion_tokens", 1, None),
        ("n", 1, 128),
    ):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise _invalid_type(name, "an integer", value)
        if value < low:
            raise ApiError(
                400,
                f"Invalid '{name}': integer below minimum value. Expected a value >= {low}, but "
                f"got {value} instead.",
                param=name,
                code="integer_below_min_value",
            )
        if high is not None and value > high:
            raise ApiError(
                400,
                f"Invalid '{name}': integer above maximum value. Expected a value <= {high}, "
                f"but got {value} instead.",
                param=name,
                code="integer_above_max_value",
            )
        limits[name] = value
    return ChatRequest(
        body=body,
        model=model,
        prompt_tokens=prompt_tokens_of(body, model),
        max_tokens=limits.get("max_completion_tokens", limits.get("max_tokens")),
        n=limits.get("n", 1),
    )


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
                        f"tokens must be reduced in order to run successfully. {_DOCS}",
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
                    f"{message} Please try again in {go_duration(wait)}. {_DOCS}",
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


@dataclass
class Reply:
    status: int = 200
    body: JSON | None = None
    raw: bytes | None = None
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


class _Server(ThreadingHTTPServer):
    """A listen backlog deep enough that a burst of concurrent connects is never dropped."""

    request_queue_size = 256
    allow_reuse_address = True
    daemon_threads = True


class _ServerThread(ServerThread):
    """ServerThread with the deep backlog, polling for shutdown every 20 ms."""

    def start(self) -> None:
        self.httpd = _Server(("127.0.0.1", self.port), self.handler_factory())
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()


class _Handler(BaseHTTPRequestHandler):
    """One HTTP/1.1 keep-alive connection; the owning FakeOnline does the real work."""

    protocol_version = "HTTP/1.1"
    server_version = "fake-online/1"
    owner: ClassVar[FakeOnline]

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.owner._track(self.connection)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.owner._untrack(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the records are the log."""

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _dispatch(self) -> None:
        try:
            body = self._read_body()
        except (OSError, ValueError):
            self.close_connection = True
            return
        reply = self.owner._handle(self, body)
        if reply is None:
            self._reset()
            return
        with contextlib.suppress(OSError):
            self._send(reply)

    def client_gone(self) -> bool:
        """Whether the client has hung up (as an SDK does when its timeout expires)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _reset(self) -> None:
        """Abort with a TCP RST, as a proxy dropping the connection mid-request would."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()

    def _send(self, reply: Reply) -> None:
        payload = reply.raw if reply.raw is not None else json.dumps(reply.body or {}).encode()
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        self.wfile.flush()


class FakeOnline:
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

    def __init__(self, *, port: int | None = None) -> None:
        self.latency_seconds: float = 0.0
        self.capacity: int | None = None
        self.rpm_limit: int | None = None
        self.tpm_limit: int | None = None
        self.fault: Callable[[str | None, JSON], str | None] | None = None
        self.fault_retry_after_seconds: float = 0.2
        self.timeout_seconds: float = 30.0
        self.responder: Callable[[JSON], str] | None = None
        self.models: list[str] | None = None
        self.api_key: str | None = None
        self.clock: Callable[[], float] = time.monotonic
        self.server_errors: list[str] = []
        self.limiter = RateLimiter()
        self._calls: list[OnlineCall] = []
        self._calls_lock = threading.Lock()
        self._slots = threading.Condition()
        self._active = 0
        self._flight = threading.Condition()
        self._in_flight = 0
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self._server = _ServerThread(self._handler_class, port)

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> FakeOnline:
        self._stopping.clear()
        self._server.start()
        return self

    def stop(self) -> None:
        """Stop listening, wake sleeping handlers and drop open connections."""
        self._stopping.set()
        with self._slots:
            self._slots.notify_all()
        self._server.stop()
        with self._connections_lock:
            open_connections = list(self._connections)
        for conn in open_connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> FakeOnline:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

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

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        return type("FakeOnlineHandler", (_Handler,), {"owner": self})

    def _track(self, conn: socket.socket) -> None:
        with self._connections_lock:
            self._connections.add(conn)

    def _untrack(self, conn: socket.socket) -> None:
        with self._connections_lock:
            self._connections.discard(conn)

    def _record(self, call: OnlineCall) -> None:
        with self._calls_lock:
            self._calls.append(call)

    def _handle(self, handler: _Handler, raw: bytes) -> Reply | None:
        """The answer to one HTTP request; None to reset the connection."""
        started = time.monotonic()
        try:
            reply = self._route(handler, raw)
        except ApiError as err:
            reply = Reply(err.status, err.body)
        except Exception:
            self.server_errors.append(traceback.format_exc())
            print(self.server_errors[-1], file=sys.stderr)
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

    def _route(self, handler: _Handler, raw: bytes) -> Reply | None:
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

    def _chat(self, handler: _Handler, raw: bytes) -> Reply | None:
        with self._flight:
            self._in_flight += 1
        try:
            return self._serve_chat(handler, raw)
        finally:
            with self._flight:
                self._in_flight -= 1
                self._flight.notify_all()

    def _serve_chat(self, handler: _Handler, raw: bytes) -> Reply | None:
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
                    f"{go_duration(self.fault_retry_after_seconds)}. {_DOCS}",
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
        choices = [
            {
                "index": index,
                "message": {
                    "role": "assistant",
                    "content": content,
                    "refusal": None,
                    "annotations": [],
                },
                "logprobs": None,
                "finish_reason": finish_reason,
            }
            for index in range(request.n)
        ]
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
