"""A fake of Anthropic's Message Batches API: real HTTP on loopback, state on disk.

The official SDK talks to it through `base_url`, so an adapter tested against it exercises the
real wire protocol: envelopes, status codes, `request-id` / `retry-after` headers, cursor
pagination and a `results_url` streamed as JSONL. Batch state advances on retrieve calls rather
than wall time, so tests need no sleeps, and every byte of state lives in `state_dir` (written
atomically), so `restart()` mid-batch loses nothing.

Two deliberate readings of the real API worth knowing:

* Authentication accepts `x-api-key` *or* `Authorization: Bearer ...`: anthropic 2.x sends the
  `api_key` as a bearer token, and the real API accepts both.
* A body over `max_body_bytes` (256 MB) is a 413 `request_too_large`, as on the real API; every
  other create violation is a 400 `invalid_request_error` and creates no batch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import re
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.fakes.common import CallLog, ControlFault, FaultPlan, ServerThread

CUSTOM_ID_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_REQUESTS = 100_000
MAX_BODY_BYTES = 256 * 1024 * 1024
BATCH_PATH_RE = re.compile(r"^/v1/messages/batches/([^/]+)(/cancel|/results)?$")
POSITIVE_WORDS = ("good", "great", "love", "excellent")

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
ERROR_MESSAGES = {
    429: "Number of request tokens has exceeded your per-minute rate limit.",
    500: "Internal server error",
    529: "Overloaded",
}
ITEM_ERRORS = {
    "invalid_request": ("invalid_request_error", "messages: the request was invalid"),
    "api_error": ("api_error", "Internal server error"),
    "overloaded": ("overloaded_error", "Overloaded"),
}

ItemFault = Callable[[str, dict[str, Any]], str | None]
BatchOutcome = Callable[[dict[str, Any]], str]
Responder = Callable[[dict[str, Any]], str]


@dataclass
class LostResponseFault(ControlFault):
    """The server does the work, then resets the connection instead of answering.

    The case a retrying client gets wrong: a create that succeeded but whose response was lost
    makes a naive retry submit the same requests twice.
    """

    reset_connection: bool = True
    after_handling: bool = True


def delay_fault(method: str, path_contains: str, seconds: float, times: int = 1) -> ControlFault:
    """A fault that only delays the matching calls, which are then answered normally."""
    return ControlFault(method, path_contains, status=200, times=times, delay_seconds=seconds)


@dataclass
class Reply:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    log: dict[str, Any] = field(default_factory=dict)


class ApiError(Exception):
    """Raised inside a route to answer with the API's error envelope."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def approx_tokens(chars: int) -> int:
    return math.ceil(chars / 4)


def block_text(content: Any) -> str:
    """The text of a `content` / `system` value: a string or a list of content blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(block.get("text", ""))
            for block in content
            if isinstance(block, dict) and block.get("type") == "text"
        )
    return ""


def user_text(params: dict[str, Any]) -> str:
    return "\n".join(
        block_text(message.get("content"))
        for message in params.get("messages", [])
        if isinstance(message, dict) and message.get("role") == "user"
    )


def input_chars(params: dict[str, Any]) -> int:
    messages = params.get("messages", [])
    chars = len(block_text(params.get("system")))
    return chars + sum(len(block_text(m.get("content"))) for m in messages if isinstance(m, dict))


def default_responder(params: dict[str, Any]) -> str:
    """A deterministic JSON answer, so pipelines that parse and validate output have data."""
    text = user_text(params)
    lowered = text.lower()
    label = "positive" if any(word in lowered for word in POSITIVE_WORDS) else "negative"
    match = re.match(r"\s*(.*?[.!?])(?=\s|$)", text, flags=re.DOTALL)
    first = (match.group(1) if match else text).strip()
    return json.dumps({"label": label, "summary": first[:200]})


def error_body(status: int, message: str, request_id: str) -> bytes:
    error_type = ERROR_TYPES.get(status, "api_error")
    envelope = {
        "type": "error",
        "error": {"type": error_type, "message": message},
        "request_id": request_id,
    }
    return json.dumps(envelope).encode()


class _ReusableServer(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True


class _QuickServerThread(ServerThread):
    """A ServerThread whose stop() takes milliseconds, not the default 0.5 s poll interval."""

    def start(self) -> None:
        self.httpd = _ReusableServer(("127.0.0.1", self.port), self.handler_factory())
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self.thread.start()


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class FakeAnthropic:
    """The Message Batches API on 127.0.0.1.

    Knobs (plain attributes, read at the moment they matter):

    * `polls_per_state`: retrieves a batch answers `in_progress` before the next one ends it.
    * `item_fault(custom_id, params)`: None or one of "invalid_request", "api_error",
      "overloaded" (errored results), "expired", "canceled", "missing" (no result line, yet
      counted as succeeded: a lost line) or "duplicate" (the succeeded line appears twice).
    * `batch_outcome(batch)`: "ended" or "expired"; `batch` is the MessageBatch JSON plus
      "requests". On "expired" the second half of the requests expire.
    * `shuffle_results`: results out of request order, deterministically per batch.
    * `responder(params)`: the assistant text; `default_responder` when None.
    * `max_requests`, `max_body_bytes`: the API's limits, lowerable so tests stay small.

    Results are decided once, when the batch ends, and stored; knobs changed later do not
    rewrite them.

    `faults` are matched by method and a substring of the path (query included) before auth
    or routing, and are applied in this order: `delay_seconds`; then `reset_connection` (a TCP
    RST, nothing handled); then a `status` >= 400 answers with the error envelope (429 always
    carries `retry-after`, 1 s unless `retry_after` is set; other statuses only when it is). A
    status below 400 lets the call through, which is what `delay_fault` builds.
    `LostResponseFault` handles the call, then resets instead of answering.
    """

    def __init__(self, state_dir: Path, *, port: int | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.batches_dir = self.state_dir / "batches"
        self.batches_dir.mkdir(parents=True, exist_ok=True)
        self.faults = FaultPlan()
        self.calls = CallLog(self.state_dir / "calls.jsonl")
        self.polls_per_state: int = 1
        self.item_fault: ItemFault | None = None
        self.batch_outcome: BatchOutcome | None = None
        self.shuffle_results: bool = True
        self.responder: Responder | None = None
        self.max_requests: int = MAX_REQUESTS
        self.max_body_bytes: int = MAX_BODY_BYTES
        self._lock = threading.RLock()
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self._server = _QuickServerThread(lambda: make_handler(self), port=port)
        self.port = self._server.port
        self.base_url = f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeAnthropic:
        self._server.start()
        return self

    def stop(self) -> None:
        """Stop listening and drop kept-alive connections, as a real process exit would."""
        self._server.stop()
        with self._connections_lock:
            connections = list(self._connections)
            self._connections.clear()
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> FakeAnthropic:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def submitted_custom_ids(self) -> list[str]:
        """Every custom_id of every batch created, deleted ones included, in creation order."""
        with self._lock:
            metas = sorted(self._all_metas(), key=lambda meta: meta["seq"])
            return [
                request["custom_id"] for meta in metas for request in self._requests(meta["id"])
            ]

    def batch_ids(self) -> list[str]:
        """Ids of every batch created, deleted ones included, in creation order."""
        with self._lock:
            return [meta["id"] for meta in sorted(self._all_metas(), key=lambda m: m["seq"])]

    def _batch_dir(self, batch_id: str) -> Path:
        return self.batches_dir / batch_id

    def _all_metas(self) -> list[dict[str, Any]]:
        return [
            json.loads(path.read_text())
            for path in self.batches_dir.glob("*/meta.json")
            if path.is_file()
        ]

    def _load_meta(self, batch_id: str) -> dict[str, Any]:
        path = self._batch_dir(batch_id) / "meta.json"
        if not re.fullmatch(r"msgbatch_[0-9a-f]+", batch_id) or not path.is_file():
            raise ApiError(404, f"Message Batch {batch_id!r} not found.")
        meta: dict[str, Any] = json.loads(path.read_text())
        if meta.get("deleted"):
            raise ApiError(404, f"Message Batch {batch_id!r} not found.")
        return meta

    def _save_meta(self, meta: dict[str, Any]) -> None:
        write_atomic(self._batch_dir(meta["id"]) / "meta.json", json.dumps(meta).encode())

    def _requests(self, batch_id: str) -> list[dict[str, Any]]:
        requests: list[dict[str, Any]] = json.loads(
            (self._batch_dir(batch_id) / "requests.json").read_text()
        )
        return requests

    def _batch_json(self, meta: dict[str, Any]) -> dict[str, Any]:
        ended = meta["processing_status"] == "ended"
        return {
            "id": meta["id"],
            "type": "message_batch",
            "processing_status": meta["processing_status"],
            "request_counts": meta["request_counts"],
            "created_at": meta["created_at"],
            "ended_at": meta["ended_at"],
            "expires_at": meta["expires_at"],
            "cancel_initiated_at": meta["cancel_initiated_at"],
            "archived_at": meta["archived_at"],
            "results_url": (
                f"{self.base_url}/v1/messages/batches/{meta['id']}/results" if ended else None
            ),
        }

    def _create(self, body: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        requests = validate_create(body, self.max_requests)
        now = datetime.now(UTC)
        with self._lock:
            batch_id = f"msgbatch_{secrets.token_hex(12)}"
            batch_dir = self._batch_dir(batch_id)
            batch_dir.mkdir()
            write_atomic(batch_dir / "requests.json", json.dumps(requests).encode())
            meta = {
                "id": batch_id,
                "seq": len(list(self.batches_dir.glob("*/meta.json"))),
                "processing_status": "in_progress",
                "request_counts": counts(processing=len(requests)),
                "created_at": rfc3339(now),
                "ended_at": None,
                "expires_at": rfc3339(now + timedelta(hours=24)),
                "cancel_initiated_at": None,
                "archived_at": None,
                "polls": 0,
                "deleted": False,
            }
            self._save_meta(meta)
        return self._batch_json(meta), [request["custom_id"] for request in requests]

    def _retrieve(self, batch_id: str) -> dict[str, Any]:
        with self._lock:
            meta = self._load_meta(batch_id)
            if meta["processing_status"] == "canceling":
                self._end(meta, cutoff_as="canceled")
            elif meta["processing_status"] == "in_progress":
                meta["polls"] += 1
                if meta["polls"] > self.polls_per_state:
                    self._end(meta, cutoff_as=None)
                else:
                    self._save_meta(meta)
            return self._batch_json(meta)

    def _cancel(self, batch_id: str) -> dict[str, Any]:
        with self._lock:
            meta = self._load_meta(batch_id)
            if meta["processing_status"] == "ended":
                raise ApiError(400, f"Message Batch {batch_id!r} has ended and cannot be canceled.")
            if meta["processing_status"] == "in_progress":
                meta["processing_status"] = "canceling"
                meta["cancel_initiated_at"] = rfc3339(datetime.now(UTC))
                self._save_meta(meta)
            return self._batch_json(meta)

    def _delete(self, batch_id: str) -> dict[str, Any]:
        with self._lock:
            meta = self._load_meta(batch_id)
            if meta["processing_status"] != "ended":
                raise ApiError(
                    400,
                    f"Message Batch {batch_id!r} is still processing; cancel it and wait for it "
                    "to end before deleting it.",
                )
            meta["deleted"] = True
            self._save_meta(meta)
            return {"id": batch_id, "type": "message_batch_deleted"}

    def _results(self, batch_id: str) -> bytes:
        with self._lock:
            meta = self._load_meta(batch_id)
            if meta["processing_status"] != "ended":
                raise ApiError(
                    404, f"Results for Message Batch {batch_id!r} are not available: not ended."
                )
            return (self._batch_dir(batch_id) / "results.jsonl").read_bytes()

    def _list(self, query: dict[str, list[str]]) -> dict[str, Any]:
        after_id = (query.get("after_id") or [None])[0]
        before_id = (query.get("before_id") or [None])[0]
        raw_limit = (query.get("limit") or ["20"])[0]
        try:
            limit = int(raw_limit)
        except ValueError:
            message = f"limit: Input should be a valid integer, got {raw_limit!r}"
            raise ApiError(400, message) from None
        if not 1 <= limit <= 1000:
            raise ApiError(400, "limit: Input should be between 1 and 1000")
        if after_id and before_id:
            raise ApiError(400, "Only one of after_id and before_id may be given.")
        with self._lock:
            metas = [meta for meta in self._all_metas() if not meta.get("deleted")]
        metas.sort(key=lambda meta: meta["seq"], reverse=True)
        ids = [meta["id"] for meta in metas]
        for cursor in (after_id, before_id):
            if cursor and cursor not in ids:
                raise ApiError(400, f"Invalid pagination cursor {cursor!r}: no such Message Batch.")
        if after_id:
            rest = metas[ids.index(after_id) + 1 :]
            page, has_more = rest[:limit], len(rest) > limit
        elif before_id:
            rest = metas[: ids.index(before_id)]
            page, has_more = rest[-limit:], len(rest) > limit
        else:
            page, has_more = metas[:limit], len(metas) > limit
        return {
            "data": [self._batch_json(meta) for meta in page],
            "has_more": has_more,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
        }

    def _end(self, meta: dict[str, Any], cutoff_as: str | None) -> None:
        """Decide every request's result, write results.jsonl, then flip the batch to ended.

        Requests in the second half count as not yet processed: they become `cutoff_as`
        (canceled) or, if `batch_outcome` says so, expired.
        """
        requests = self._requests(meta["id"])
        if cutoff_as is None and self.batch_outcome is not None:
            outcome = self.batch_outcome({**self._batch_json(meta), "requests": requests})
            if outcome not in ("ended", "expired"):
                raise ValueError(f"batch_outcome returned {outcome!r}")
            cutoff_as = "expired" if outcome == "expired" else None
        processed = len(requests) // 2 if cutoff_as else len(requests)
        tally = counts()
        lines: list[dict[str, Any]] = []
        for index, request in enumerate(requests):
            custom_id, params = request["custom_id"], request["params"]
            if index >= processed:
                kind = cutoff_as or "expired"
            else:
                kind = (self.item_fault(custom_id, params) if self.item_fault else None) or "ok"
            result: dict[str, Any]
            if kind in ("ok", "missing", "duplicate"):
                result = {"type": "succeeded", "message": self._message(meta["id"], request)}
                tally["succeeded"] += 1
            elif kind in ITEM_ERRORS:
                error_type, message = ITEM_ERRORS[kind]
                result = {
                    "type": "errored",
                    "error": {"type": "error", "error": {"type": error_type, "message": message}},
                }
                tally["errored"] += 1
            elif kind in ("expired", "canceled"):
                result = {"type": kind}
                tally[kind] += 1
            else:
                raise ValueError(f"item_fault returned {kind!r} for {custom_id!r}")
            line = {"custom_id": custom_id, "result": result}
            if kind != "missing":
                lines.append(line)
            if kind == "duplicate":
                lines.append(line)
        if self.shuffle_results and len(lines) > 1:
            original = list(lines)
            random.Random(meta["id"]).shuffle(lines)
            if lines == original:
                lines = lines[1:] + lines[:1]
        payload = "".join(json.dumps(line) + "\n" for line in lines).encode()
        write_atomic(self._batch_dir(meta["id"]) / "results.jsonl", payload)
        meta["processing_status"] = "ended"
        meta["ended_at"] = rfc3339(datetime.now(UTC))
        meta["request_counts"] = tally
        self._save_meta(meta)

    def _message(self, batch_id: str, request: dict[str, Any]) -> dict[str, Any]:
        params = request["params"]
        text = (self.responder or default_responder)(params)
        limit = params["max_tokens"] * 4
        stop_reason = "end_turn"
        if len(text) > limit:
            text, stop_reason = text[:limit], "max_tokens"
        digest = hashlib.sha256(f"{batch_id}/{request['custom_id']}".encode()).hexdigest()
        return {
            "id": f"msg_{digest[:24]}",
            "type": "message",
            "role": "assistant",
            "model": params["model"],
            "content": [{"type": "text", "text": text}],
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {
                "input_tokens": max(1, approx_tokens(input_chars(params))),
                "output_tokens": approx_tokens(len(text)),
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "service_tier": "batch",
            },
        }

    def _track(self, conn: socket.socket, open_: bool) -> None:
        with self._connections_lock:
            if open_:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)


def counts(
    processing: int = 0, succeeded: int = 0, errored: int = 0, canceled: int = 0, expired: int = 0
) -> dict[str, int]:
    return {
        "processing": processing,
        "succeeded": succeeded,
        "errored": errored,
        "canceled": canceled,
        "expired": expired,
    }


def validate_create(body: Any, max_requests: int) -> list[dict[str, Any]]:
    """The create-time checks of the real API; the first violation fails the whole batch."""
    if not isinstance(body, dict) or not isinstance(body.get("requests"), list):
        raise ApiError(400, "requests: Field required (a list of {custom_id, params})")
    requests: list[Any] = body["requests"]
    if not requests:
        raise ApiError(400, "requests: List should have at least 1 item after validation, not 0")
    if len(requests) > max_requests:
        limit = f"requests: a Message Batch holds at most {max_requests} requests"
        raise ApiError(400, f"{limit}, not {len(requests)}")
    seen: set[str] = set()
    clean: list[dict[str, Any]] = []
    for index, request in enumerate(requests):
        where = f"requests.{index}"
        if not isinstance(request, dict):
            raise ApiError(400, f"{where}: Input should be an object")
        custom_id = request.get("custom_id")
        if not isinstance(custom_id, str) or not CUSTOM_ID_RE.fullmatch(custom_id):
            raise ApiError(
                400,
                f"{where}.custom_id: String should match pattern '{CUSTOM_ID_RE.pattern}' "
                f"(got {custom_id!r})",
            )
        if custom_id in seen:
            raise ApiError(
                400,
                f"{where}.custom_id: duplicate custom_id {custom_id!r}; custom_id must be unique "
                "within a Message Batch",
            )
        seen.add(custom_id)
        params = request.get("params")
        label = f"{where}.params (custom_id {custom_id!r})"
        if not isinstance(params, dict):
            raise ApiError(400, f"{label}: Field required")
        if not isinstance(params.get("model"), str) or not params["model"]:
            raise ApiError(400, f"{label}.model: Field required")
        max_tokens = params.get("max_tokens")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ApiError(400, f"{label}.max_tokens: Input should be an integer >= 1")
        messages = params.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, f"{label}.messages: List should have at least 1 item")
        for position, message in enumerate(messages):
            if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
                raise ApiError(
                    400, f"{label}.messages.{position}.role: Input should be 'user' or 'assistant'"
                )
            if not isinstance(message.get("content"), str | list):
                raise ApiError(400, f"{label}.messages.{position}.content: Field required")
        clean.append({"custom_id": custom_id, "params": params})
    return clean


def make_handler(fake: FakeAnthropic) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "fake-anthropic"
        sys_version = ""

        def setup(self) -> None:
            super().setup()
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            fake._track(self.connection, open_=True)

        def finish(self) -> None:
            fake._track(self.connection, open_=False)
            with contextlib.suppress(OSError):
                super().finish()

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the call log is the record."""

        def do_GET(self) -> None:
            self._serve()

        def do_POST(self) -> None:
            self._serve()

        def do_DELETE(self) -> None:
            self._serve()

        def do_PUT(self) -> None:
            self._serve()

        def do_PATCH(self) -> None:
            self._serve()

        def _serve(self) -> None:
            request_id = f"req_{secrets.token_hex(12)}"
            path = urlsplit(self.path).path
            entry: dict[str, Any] = {"ts": time.time(), "method": self.command, "path": path}
            body = self._read_body()
            fault = fake.faults.take(self.command, self.path)
            if fault is not None and fault.delay_seconds > 0:
                time.sleep(fault.delay_seconds)
            after_handling = fault is not None and getattr(fault, "after_handling", False)
            if fault is not None and fault.reset_connection and not after_handling:
                fake.calls.record({**entry, "status": None, "fault": "reset"})
                self._reset()
                return
            if fault is not None and not after_handling and fault.status >= 400:
                headers: dict[str, str] = {}
                if fault.retry_after is not None or fault.status == 429:
                    retry_after = 1.0 if fault.retry_after is None else fault.retry_after
                    headers["retry-after"] = format_seconds(retry_after)
                message = ERROR_MESSAGES.get(fault.status, f"Injected fault {fault.status}")
                reply = Reply(fault.status, error_body(fault.status, message, request_id))
                reply.headers.update(headers)
                reply.log["fault"] = str(fault.status)
            else:
                reply = self._route(path, body, request_id)
            if after_handling:
                reply.log["fault"] = "lost_response"
            fake.calls.record({**entry, "status": reply.status, **reply.log})
            if after_handling:
                self._reset()
                return
            self._send(reply, request_id)

        def _read_body(self) -> bytes:
            length = int(self.headers.get("content-length") or 0)
            if length > fake.max_body_bytes:
                remaining = length
                while remaining > 0:
                    chunk = self.rfile.read(min(remaining, 1 << 20))
                    if not chunk:
                        break
                    remaining -= len(chunk)
                return b""
            return self.rfile.read(length) if length else b""

        def _route(self, path: str, body: bytes, request_id: str) -> Reply:
            log: dict[str, Any] = {}
            try:
                auth = self.headers.get("authorization", "")
                has_bearer = auth.lower().startswith("bearer ") and auth[7:].strip()
                if not self.headers.get("x-api-key") and not has_bearer:
                    raise ApiError(401, "x-api-key header is required")
                if not self.headers.get("anthropic-version"):
                    raise ApiError(400, "anthropic-version: header is required")
                reply = self._dispatch(path, body, log)
                reply.log = log
                return reply
            except ApiError as err:
                reply = Reply(err.status, error_body(err.status, err.message, request_id))
                reply.headers.update(err.headers)
                reply.log = log
                return reply

        def _dispatch(self, path: str, body: bytes, log: dict[str, Any]) -> Reply:
            method = self.command
            if path == "/v1/messages/batches" and method == "POST":
                log.update({"batch_id": None, "custom_ids": []})
                length = int(self.headers.get("content-length") or 0)
                if length > fake.max_body_bytes:
                    raise ApiError(
                        413, f"Request exceeds the maximum size of {fake.max_body_bytes} bytes"
                    )
                try:
                    parsed = json.loads(body or b"null")
                except ValueError:
                    raise ApiError(400, "The request body is not valid JSON.") from None
                if isinstance(parsed, dict) and isinstance(parsed.get("requests"), list):
                    log["custom_ids"] = [
                        r.get("custom_id") for r in parsed["requests"] if isinstance(r, dict)
                    ]
                batch, custom_ids = fake._create(parsed)
                log.update({"batch_id": batch["id"], "custom_ids": custom_ids})
                return json_reply(batch)
            if path == "/v1/messages/batches" and method == "GET":
                return json_reply(fake._list(parse_qs(urlsplit(self.path).query)))
            match = BATCH_PATH_RE.match(path)
            if match:
                batch_id, action = match.group(1), match.group(2)
                log["batch_id"] = batch_id
                if action is None and method == "GET":
                    return json_reply(fake._retrieve(batch_id))
                if action is None and method == "DELETE":
                    return json_reply(fake._delete(batch_id))
                if action == "/cancel" and method == "POST":
                    return json_reply(fake._cancel(batch_id))
                if action == "/results" and method == "GET":
                    return Reply(200, fake._results(batch_id), content_type="application/x-jsonl")
            raise ApiError(404, f"Not found: {method} {path}")

        def _send(self, reply: Reply, request_id: str) -> None:
            """Answer; a client that gave up (a timeout) is gone, which is not a server error."""
            try:
                self.send_response(reply.status)
                self.send_header("content-type", reply.content_type)
                self.send_header("content-length", str(len(reply.body)))
                self.send_header("request-id", request_id)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(reply.body)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def _reset(self) -> None:
            """Close with SO_LINGER 0, so the client sees a TCP RST rather than a clean close."""
            self.close_connection = True
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()  # takes effect once finish() closes rfile and wfile

    return Handler


def json_reply(payload: dict[str, Any]) -> Reply:
    return Reply(200, json.dumps(payload).encode())


def format_seconds(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))
