"""`llm-assets` as a process of its own, without paying for its imports each time.

`run` and `Popen` take what subprocess's take. A command whose program is the `llm-assets`
script (harness.CLI) is forked from a process of this test process that has already imported
Dagster, pandas, pyarrow, pandera, the SDKs and the llm_assets library (tests/cli_zygote.py);
anything else runs through subprocess as usual. The forked command is still a process of its
own: its own pid to signal and SIGKILL, its own pipes or terminal, environment, working
directory and exit status, and it imports the command line and the code location after its
environment is set, as `llm-assets ...` does. What it skips is three to four CPU-seconds of
imports: the suite starts a few hundred commands.
"""

import atexit
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CLI = str(Path(sys.executable).parent / "llm-assets")
_ZYGOTE = Path(__file__).with_name("cli_zygote.py")


class _Zygote:
    """The process commands are forked from, started on first use, one per test process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._control: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def fork(self, request: dict[str, Any], stdio: list[int]) -> tuple[int, "_Lines"]:
        ours, theirs = socket.socketpair()
        with self._lock:
            control = self._started()
            try:
                socket.send_fds(control, [json.dumps(request).encode()], [theirs.fileno(), *stdio])
            finally:
                theirs.close()
        replies = _Lines(ours)
        pid = replies.next(block=True)
        if pid is None:
            raise RuntimeError("the command process of the tests exited (see its stderr above)")
        return pid, replies

    def _started(self) -> socket.socket:
        if self._control is None:
            control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            self._process = subprocess.Popen(
                [sys.executable, "-P", str(_ZYGOTE), str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                env=env,
            )
            theirs.close()
            self._control = control
            atexit.register(self.close)
        return self._control

    def close(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._process is not None:
            self._process.wait(timeout=30)
            self._process = None


class _Lines:
    """The numbers the zygote sends on one command's socket: its pid, then its wait status."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = b""

    def next(self, *, block: bool) -> int | None:
        """The next number; None at the end of the socket; BlockingIOError if not `block`
        and it has not come yet."""
        self._sock.setblocking(block)
        while b"\n" not in self._buffer:
            chunk = self._sock.recv(64)
            if not chunk:
                return None
            self._buffer += chunk
            self._sock.setblocking(True)  # the rest of a line that has begun
        line, self._buffer = self._buffer.split(b"\n", 1)
        return int(line)

    def close(self) -> None:
        self._sock.close()


_zygote = _Zygote()


class Popen(subprocess.Popen[Any]):
    """subprocess.Popen whose `llm-assets` child is forked by the zygote: its pipes, text
    mode, timeouts, communicate, kill and wait are subprocess's own; only starting the child
    and reading its exit status differ."""

    _status: _Lines | None = None

    def _execute_child(  # type: ignore[override]
        self,
        args: Sequence[str],
        executable: str | None,
        preexec_fn: Any,
        close_fds: bool,
        pass_fds: Sequence[int],
        cwd: str | None,
        env: dict[str, str] | None,
        startupinfo: Any,
        creationflags: int,
        shell: bool,
        p2cread: int,
        p2cwrite: int,
        c2pread: int,
        c2pwrite: int,
        errread: int,
        errwrite: int,
        restore_signals: bool,
        gid: Any,
        gids: Any,
        uid: Any,
        umask: int,
        start_new_session: bool,
        *more: Any,
    ) -> None:
        args = [os.fspath(a) for a in args]
        if args[0] != CLI or shell or executable or preexec_fn or pass_fds:
            super()._execute_child(  # type: ignore[misc]
                args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite,
                restore_signals, gid, gids, uid, umask, start_new_session, *more,
            )  # fmt: skip
            return
        stdio = [
            p2cread if p2cread != -1 else 0,
            c2pwrite if c2pwrite != -1 else 1,
            errwrite if errwrite != -1 else 2,
        ]
        request = {
            "argv": args,
            "env": dict(os.environ if env is None else env),
            "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(),
            "new_session": bool(start_new_session),
        }
        self.pid, self._status = _zygote.fork(request, stdio)
        self._child_created = True
        # What subprocess does once its child holds these ends.
        if p2cread != -1 and p2cwrite != -1:
            os.close(p2cread)
        if c2pwrite != -1 and c2pread != -1:
            os.close(c2pwrite)
        if errwrite != -1 and errread != -1:
            os.close(errwrite)
        self._closed_child_pipe_fds = True

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:
        if self._status is None:
            return super()._try_wait(wait_flags)  # type: ignore[misc, no-any-return]
        try:
            status = self._status.next(block=not wait_flags & os.WNOHANG)
        except BlockingIOError:
            return 0, 0
        self._status.close()
        if status is None:  # the zygote is gone: count the child as killed
            return self.pid, 9
        return self.pid, status

    def _internal_poll(self, _deadstate: int | None = None, *_: Any, **__: Any) -> int | None:
        if self._status is None:
            return super()._internal_poll(_deadstate)  # type: ignore[misc, no-any-return]
        if self.returncode is None and self._waitpid_lock.acquire(False):  # type: ignore[attr-defined]
            try:
                if self.returncode is None:
                    pid, status = self._try_wait(os.WNOHANG)
                    if pid == self.pid:
                        self._handle_exitstatus(status)  # type: ignore[attr-defined]
            finally:
                self._waitpid_lock.release()  # type: ignore[attr-defined]
        return self.returncode


def run(
    args: Sequence[str],
    *,
    input: str | bytes | None = None,
    capture_output: bool = False,
    timeout: float | None = None,
    check: bool = False,
    **kwargs: Any,
) -> subprocess.CompletedProcess[Any]:
    """subprocess.run, with Popen above."""
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    with Popen(args, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            process.kill()
            exc.stdout, exc.stderr = process.communicate()
            raise
        except BaseException:
            process.kill()
            raise
    done = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    if check:
        done.check_returncode()
    return done
