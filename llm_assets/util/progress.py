"""Progress of long steps, for whoever is watching in this process (the CLI's progress bar).

Steps report `(label, done, total)`; the CLI registers a listener while it runs a day. In a
Dagster run without a listener, reports go nowhere (the steps also log to the run).
"""

import contextlib
import threading
from collections.abc import Callable, Iterator

ProgressFn = Callable[[str, int, int], None]
"""A listener of progress reports: (label, done, total)."""
_listeners: list[ProgressFn] = []
_lock = threading.Lock()


def report(label: str, done: int, total: int) -> None:
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener(label, done, total)


@contextlib.contextmanager
def listening(listener: ProgressFn | None) -> Iterator[None]:
    if listener is None:
        yield
        return
    with _lock:
        _listeners.append(listener)
    try:
        yield
    finally:
        with _lock:
            _listeners.remove(listener)
