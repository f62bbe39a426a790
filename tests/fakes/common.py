"""What the fake provider servers share besides the server itself: injected faults, the call
log, and a free loopback port."""

import json
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

JSON = dict[str, Any]
CONTENT_CHUNK = 64 * 1024


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Gate:
    """Holds a call at the server until the test opens it: `arrived` is set when the call
    comes in; the call is served once `opened` is set (or `timeout_seconds` pass: a test
    that forgets to open it fails instead of hanging)."""

    arrived: threading.Event = field(default_factory=threading.Event)
    opened: threading.Event = field(default_factory=threading.Event)
    timeout_seconds: float = 120.0

    def hold(self) -> None:
        self.arrived.set()
        if not self.opened.wait(self.timeout_seconds):
            raise TimeoutError("a held call was never let through")


@dataclass
class ControlFault:
    """Take over the next `times` calls with this method whose path (query included) contains
    `path_contains`: sleep `delay_seconds`, then reset the connection (`reset_connection`), or
    answer `status` when it is 400 or more (with `retry-after` when `retry_after` is set), or
    else serve the call normally. With `after_handling`, the call is served and then the
    connection reset (`reset_connection`) or `status` answered instead of its answer."""

    method: str
    path_contains: str
    status: int = 429
    times: int = 1
    retry_after: float | None = None
    reset_connection: bool = False
    delay_seconds: float = 0.0
    after_handling: bool = False
    gate: Gate | None = None
    """Held at the server until the gate opens, then treated as above."""


@dataclass
class LostResponseFault(ControlFault):
    """The server does the work, then resets the connection instead of answering.

    The case a retrying client gets wrong: a create that succeeded but whose response was lost
    makes a naive retry submit the same requests twice.
    """

    reset_connection: bool = True
    after_handling: bool = True


def held_call(method: str, path_contains: str, gate: Gate, times: int = 1) -> ControlFault:
    """A fault that holds the matching calls until the gate opens, then answers them."""
    return ControlFault(method, path_contains, status=200, times=times, gate=gate)


def delay_fault(method: str, path_contains: str, seconds: float, times: int = 1) -> ControlFault:
    """A fault that only delays the matching calls, which are then answered normally."""
    return ControlFault(method, path_contains, status=200, times=times, delay_seconds=seconds)


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
    """Every call a fake saw: appended to a JSONL file, which outlives a restart, or kept in
    memory when there is no file."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.lock = threading.Lock()
        self._recorded = threading.Condition(self.lock)
        self._memory: list[JSON] = []

    def record(self, entry: JSON) -> None:
        line = json.dumps(entry)
        with self.lock:
            if self.path is None:
                self._memory.append(json.loads(line))
            else:
                with self.path.open("a", encoding="utf-8") as fh:
                    fh.write(line + "\n")
            self._recorded.notify_all()

    def entries(self) -> list[JSON]:
        with self.lock:
            return self._entries()

    def wait_for(self, found: Callable[[JSON], bool], timeout_seconds: float = 30.0) -> JSON:
        """The first entry `found` accepts, waiting for a call still being served (a delayed
        one) to be recorded; a test that waits for a call that never comes fails."""
        with self.lock:
            if not self._recorded.wait_for(
                lambda: any(found(e) for e in self._entries()), timeout_seconds
            ):
                raise TimeoutError("the awaited call was never recorded")
            return next(e for e in self._entries() if found(e))

    def _entries(self) -> list[JSON]:
        if self.path is None:
            return [dict(entry) for entry in self._memory]
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]


def format_seconds(seconds: float) -> str:
    """A `retry-after` value: whole seconds without a fraction, else as given."""
    return str(int(seconds)) if float(seconds).is_integer() else str(float(seconds))


class PrefixCache:
    """A provider's automatic prompt cache as the fakes model it (OpenAI and Gemini cache a
    long repeated prefix without being asked): a request whose prefix -- its system prompt --
    has at least `minimum` tokens reads it from the cache when an earlier batch sent the same
    prefix to the same model, and is billed `minimum` plus whole `increment`s of it as cached
    input (OpenAI: 1024 and 128). Requests of one batch run at once, so a prefix is cached once
    the batch that first sent it has ended (`settle`), not for that batch's other requests.
    Thread-safe; nothing is kept on disk."""

    def __init__(self, minimum: int, increment: int = 1) -> None:
        self.minimum = minimum
        self.increment = increment
        self._cached: set[tuple[str, str]] = set()
        self._sent: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def read(self, model: str, prefix: str, tokens: int) -> int:
        """Tokens of `prefix` (`tokens` long) read from the cache by one request."""
        if tokens < self.minimum:
            return 0
        key = (model, prefix)
        with self._lock:
            if key in self._cached:
                return tokens - (tokens - self.minimum) % self.increment
            self._sent.add(key)
            return 0

    def settle(self) -> None:
        """A batch ended: the prefixes it sent are cached for the batches after it."""
        with self._lock:
            self._cached |= self._sent
            self._sent.clear()
