"""What the fake servers share: a loopback HTTP server thread, a call log, fault plans."""

import json
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ControlFault:
    """Answer the next `times` matching calls with `status` (or reset the connection)."""

    method: str
    path_contains: str
    status: int = 429
    times: int = 1
    retry_after: float | None = None
    reset_connection: bool = False
    delay_seconds: float = 0.0


@dataclass
class FaultPlan:
    control: list[ControlFault] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, fault: ControlFault) -> None:
        with self.lock:
            self.control.append(fault)

    def take(self, method: str, path: str) -> ControlFault | None:
        with self.lock:
            for fault in self.control:
                if fault.method == method and fault.path_contains in path and fault.times > 0:
                    fault.times -= 1
                    return fault
        return None


class CallLog:
    """Every call the server saw, in memory and appended to calls.jsonl in the state dir."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()

    def record(self, entry: dict[str, Any]) -> None:
        with self.lock, self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")

    def entries(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]


class ServerThread:
    """A ThreadingHTTPServer on 127.0.0.1 that can be stopped and restarted on its port."""

    def __init__(
        self, handler_factory: Callable[[], type[BaseHTTPRequestHandler]], port: int | None = None
    ) -> None:
        self.handler_factory = handler_factory
        self.port = port or free_port()
        self.httpd: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        ThreadingHTTPServer.allow_reuse_address = True
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), self.handler_factory())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None
        if self.thread is not None:
            self.thread.join(timeout=10)
            self.thread = None
