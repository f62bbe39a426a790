"""Named points where a crash test can kill this process, to prove every step is crash-safe.

Inactive unless LLM_ASSETS_FAILPOINT names a point, as `name` or `name:n` (die the n-th time
the point is passed in this process). The process then kills itself with SIGKILL: no
cleanup, no finally blocks, exactly like the OOM killer or a lost machine (with
LLM_ASSETS_FAILPOINT_SCOPE=group, its whole process group: a Celery worker and its children).
A test that searches many interleavings in one process installs a handler instead
(`handled_by`): it is told of every point passed and may raise there.
"""

import contextlib
import os
import signal
from collections import Counter
from collections.abc import Callable, Iterator

_passed: Counter[str] = Counter()
_handler: Callable[[str], None] | None = None


@contextlib.contextmanager
def handled_by(handler: Callable[[str], None]) -> Iterator[None]:
    """Call `handler` with the name of every point passed while the block runs."""
    global _handler
    previous, _handler = _handler, handler
    try:
        yield
    finally:
        _handler = previous


POINTS = (
    "snapshot.after_write",
    "shards.after_file",
    "shards.after_record",
    "slices.after_build",
    "submit.after_intent",
    "submit.after_create",
    "submit.after_record",
    "import.after_upsert",
    "import.after_shard",
    "retry.after_file",
    "validate.after_write",
    "runner.between_runs",
)


def failpoint(name: str) -> None:
    if _handler is not None:
        _handler(name)
    wanted = os.environ.get("LLM_ASSETS_FAILPOINT")
    if not wanted:
        return
    target, _, nth = wanted.partition(":")
    if target != name:
        return
    _passed[name] += 1
    if _passed[name] >= int(nth or 1):
        if os.environ.get("LLM_ASSETS_FAILPOINT_SCOPE") == "group":
            # The whole process group: a Celery worker with its pool and step processes, as
            # when its machine is lost.
            os.killpg(os.getpgid(0), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
