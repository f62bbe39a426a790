"""An exclusive advisory lock on an open file (flock), held for a `with` block.

The kernel drops the lock when its holder dies, so a crashed worker never leaves a lock
behind; the ledger's local submission locks and the local provider's batch folders use it.
"""

import contextlib
import fcntl
from collections.abc import Iterator


@contextlib.contextmanager
def exclusive(fd: int, *, blocking: bool = False) -> Iterator[bool]:
    """Hold an exclusive lock on `fd` for the block and yield True; when another holder has
    it and `blocking` is off, yield False at once without the lock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        yield False
        return
    try:
        yield True
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
