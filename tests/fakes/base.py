"""The server base every fake provider server runs on: a loopback HTTP server thread, one
request handler, and the fault-injection pipeline.

A fake subclasses `FakeServer` and answers `respond(handler, body)` with a `Reply`, or None to
reset the connection. The fakes whose control plane takes injected faults subclass
`FaultInjectingServer` instead: it matches each call against a `FaultPlan`, sleeps, resets or
answers with an error as the fault says, records every call in a `CallLog`, and otherwise
hands the call to the fake's `answer(request, log)`. A fake that crashes answers 500 and keeps
the traceback in `server_errors`, which the tests' `fake` fixture asserts is empty.
"""

import contextlib
import json
import select
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar, Self
from urllib.parse import urlsplit

from tests.fakes.common import CallLog, ControlFault, FaultPlan, free_port

JSON = dict[str, Any]
CONTENT_CHUNK = 64 * 1024


@dataclass
class Reply:
    """One HTTP answer: a JSON `body`, `raw` bytes, or a file streamed in chunks
    (`stream_path`). `log` is added to the call's entry in the call log."""

    status: int = 200
    body: JSON | None = None
    raw: bytes | None = None
    content_type: str = "application/json"
    stream_path: Path | None = None
    headers: dict[str, str] = field(default_factory=dict)
    log: JSON = field(default_factory=dict)


@dataclass(frozen=True)
class Request:
    """One HTTP request as a fake routes it; `target` is the path with its query."""

    method: str
    target: str
    path: str
    query: str
    headers: Message
    body: bytes
    request_id: str


class _LoopbackServer(ThreadingHTTPServer):
    """A listen backlog deep enough that a burst of concurrent connects is never dropped."""

    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 256


class ServerThread:
    """A ThreadingHTTPServer on 127.0.0.1 that can be stopped and restarted on its port.

    `poll_interval` is how often the serving loop looks for a shutdown request: the fakes use
    a few milliseconds so that stop() (and a restart in the middle of a test) is instant.
    """

    def __init__(
        self,
        handler_factory: Callable[[], type[BaseHTTPRequestHandler]],
        port: int | None = None,
        poll_interval: float = 0.5,
    ) -> None:
        self.handler_factory = handler_factory
        self.port = port or free_port()
        self.poll_interval = poll_interval
        self.httpd: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.httpd = _LoopbackServer(("127.0.0.1", self.port), self.handler_factory())
        self.thread = threading.Thread(
            target=self.httpd.serve_forever,
            kwargs={"poll_interval": self.poll_interval},
            daemon=True,
        )
        self.thread.start()

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None
        if self.thread is not None:
            self.thread.join(timeout=10)
            self.thread = None


class FakeHandler(BaseHTTPRequestHandler):
    """One HTTP/1.1 keep-alive connection; the owning fake decides every answer."""

    protocol_version = "HTTP/1.1"
    sys_version = ""
    owner: ClassVar["FakeServer"]

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.owner.track(self.connection)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.owner.untrack(self.connection)

    def handle(self) -> None:
        """A client dropping a kept-alive connection, even with a RST (as closing a socket with
        an unread answer does), is not a server error."""
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            super().handle()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the call log is the record."""

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def _serve(self) -> None:
        try:
            body = self._read_body()
        except (OSError, ValueError):
            self.close_connection = True
            return
        reply = self.owner.respond(self, body)
        if reply is None:
            self.reset()
            return
        try:
            self._send(reply)
        except OSError:  # the client gave up (a timeout): gone, which is not a server error
            self.close_connection = True

    def _read_body(self) -> bytes:
        """The request body, chunked or with a length; one over the fake's `max_body_bytes` is
        read and dropped, so the client can finish sending before it reads the refusal."""
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
        limit = self.owner.max_body_bytes
        if limit is not None and length > limit:
            remaining = length
            while remaining > 0 and (chunk := self.rfile.read(min(remaining, 1 << 20))):
                remaining -= len(chunk)
            return b""
        return self.rfile.read(length) if length else b""

    def client_gone(self) -> bool:
        """Whether the client has hung up (as an SDK does when its timeout expires)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def reset(self) -> None:
        """Abort with a TCP RST, as a proxy dropping the connection mid-request would."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()  # takes effect once finish() closes rfile and wfile

    def _send(self, reply: Reply) -> None:
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", reply.content_type)
        if reply.stream_path is not None:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            with reply.stream_path.open("rb") as fh:
                while chunk := fh.read(CONTENT_CHUNK):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
        else:
            payload = reply.raw
            if payload is None:
                payload = json.dumps(reply.body if reply.body is not None else {}).encode()
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        self.wfile.flush()


class FakeServer:
    """A fake on 127.0.0.1: start, stop (dropping kept-alive connections, as a process exit
    would), restart on the same port, and use as a context manager.

    `poll_interval` is the serving loop's shutdown poll (see ServerThread). Subclasses answer
    `respond`, and set `server_name` (the Server header) and, if the API has one, a
    `max_body_bytes` limit.
    """

    server_name: ClassVar[str] = "fake"
    url_path: ClassVar[str] = ""
    """What the API's base URL adds to the server's address (`/v1`)."""

    def __init__(self, *, port: int | None = None, poll_interval: float = 0.02) -> None:
        self.server_errors: list[str] = []
        self.max_body_bytes: int | None = None
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self._server = ServerThread(self._handler_class, port, poll_interval)

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def base_url(self) -> str:
        """Where a client points: the server's loopback address and `url_path`."""
        return f"http://127.0.0.1:{self.port}{self.url_path}"

    def start(self) -> Self:
        self._server.start()
        return self

    def stop(self) -> None:
        """Stop listening and drop kept-alive connections, so clients really see the outage."""
        self._server.stop()
        with self._connections_lock:
            open_connections = list(self._connections)
            self._connections.clear()
        for conn in open_connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def respond(self, handler: FakeHandler, body: bytes) -> Reply | None:
        """The answer to one request, or None to reset the connection."""
        raise NotImplementedError

    def record_crash(self) -> None:
        """Keep the traceback of the fake's own crash, for the test to fail on."""
        self.server_errors.append(traceback.format_exc())
        print(self.server_errors[-1], file=sys.stderr)

    def track(self, conn: socket.socket) -> None:
        with self._connections_lock:
            self._connections.add(conn)

    def untrack(self, conn: socket.socket) -> None:
        with self._connections_lock:
            self._connections.discard(conn)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        name = f"{type(self).__name__}Handler"
        return type(name, (FakeHandler,), {"owner": self, "server_version": self.server_name})


class FaultInjectingServer(FakeServer):
    """A fake whose calls first meet `faults` and all land in `calls`.

    Each call gets an entry (`call_entry`: ts, method, path, query, status, request_id, plus
    what the fake adds). A matching ControlFault sleeps `delay_seconds` (entry "delayed"); then
    `reset_connection` resets (status `reset_status`, fault "reset"); a `status` >= 400
    answers `fault_reply` (fault "<status>"); anything else is served by `answer`, which may
    add to the entry. `after_handling` serves the call and then resets (fault
    "lost_response"), or, with `status` >= 400 and no reset, answers that status all the same
    (fault "<status>_after_handling"). The entry is written before the answer is sent.
    """

    reset_status: ClassVar[int | None] = 0

    def __init__(
        self, calls: CallLog, *, port: int | None = None, poll_interval: float = 0.02
    ) -> None:
        super().__init__(port=port, poll_interval=poll_interval)
        self.faults = FaultPlan()
        self.calls = calls

    def answer(self, request: Request, log: JSON) -> Reply:
        """Serve one call; `log` is its call-log entry, to add to."""
        raise NotImplementedError

    def fault_reply(self, fault: ControlFault, request: Request) -> Reply:
        """The API's error answer for an injected `fault.status`."""
        raise NotImplementedError

    def crash_reply(self, request: Request) -> Reply:
        """The 500 answer when the fake itself crashed."""
        raise NotImplementedError

    def new_request_id(self) -> str:
        raise NotImplementedError

    def response_headers(self, request: Request) -> dict[str, str]:
        """Headers every answer carries (the request id, under the API's name for it)."""
        return {}

    def call_entry(self, request: Request) -> JSON:
        entry: JSON = {
            "ts": time.time(),
            "method": request.method,
            "path": request.path,
            "status": None,
            "request_id": request.request_id,
        }
        if request.query:
            entry["query"] = request.query
        return entry

    def respond(self, handler: FakeHandler, body: bytes) -> Reply | None:
        split = urlsplit(handler.path)
        request = Request(
            handler.command,
            handler.path,
            split.path,
            split.query,
            handler.headers,
            body,
            self.new_request_id(),
        )
        entry = self.call_entry(request)
        fault = self.faults.take(request.method, request.target)
        if fault is not None and fault.delay_seconds > 0:
            entry["delayed"] = fault.delay_seconds
            time.sleep(fault.delay_seconds)
        if fault is not None and fault.gate is not None:
            entry["held"] = True
            fault.gate.hold()
        handled = fault is not None and fault.after_handling
        lost = handled and fault is not None and fault.reset_connection
        if fault is not None and fault.reset_connection and not lost:
            entry.update(status=self.reset_status, fault="reset")
            self.calls.record(entry)
            return None
        if fault is not None and not handled and fault.status >= 400:
            reply = self.fault_reply(fault, request)
            entry["fault"] = str(fault.status)
        else:
            reply = self._answer_or_crash(request, entry)
            if handled and not lost and fault is not None and fault.status >= 400:
                # The work is done, and the answer says it failed.
                entry.update(reply.log, handled_status=reply.status)
                reply = self.fault_reply(fault, request)
                entry["fault"] = f"{fault.status}_after_handling"
        entry.update(reply.log, status=reply.status)
        if lost:
            entry["fault"] = "lost_response"
        self.calls.record(entry)
        if lost:
            return None
        reply.headers = {**self.response_headers(request), **reply.headers}
        return reply

    def _answer_or_crash(self, request: Request, entry: JSON) -> Reply:
        try:
            return self.answer(request, entry)
        except Exception:
            self.record_crash()
            return self.crash_reply(request)
