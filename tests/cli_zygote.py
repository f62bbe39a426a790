"""The process that `llm-assets` commands of the tests are forked from (tests/cli_process.py).

It imports the libraries the command imports -- Dagster, pandas, pyarrow, pandera, SQLAlchemy,
the provider SDKs -- once, and then forks a child for each command it is sent: the child takes
its stdin, stdout and stderr, environment, working directory and session from the request and
runs the console script as `python llm-assets ...` would. Of llm_assets, the zygote imports
the library (no module of it reads the environment, the terminal or the pipelines when
imported); the command line (whose consoles take the terminal's width), the code location
(which loads the pipelines) and the demo are imported by the command after its environment
is set, as the script imports them. Each child is reaped here and its raw wait status sent
back on the socket that came with the request.

Run as `python -P tests/cli_zygote.py FD` (FD: a SOCK_SEQPACKET socket to the test process), so
that nothing of the tests' folder is on sys.path: a child's sys.path is made as Python makes a
script's. It exits when the test process closes the socket. Self-contained on purpose: it
imports nothing from the tests.
"""

import atexit
import contextlib
import importlib
import json
import os
import pkgutil
import select
import signal
import socket
import sys
import threading
import traceback
from typing import Any, NoReturn

# What a command imports that is not llm_assets: a second or more of CPU each in every process.
PRELOAD = (
    "dagster",
    "pandas",
    "pyarrow",
    "pyarrow.parquet",
    "pyarrow.csv",
    "pandera.pandas",
    "sqlalchemy",
    "psycopg2",
    "pydantic",
    "rich.console",
    "rich.table",
    "click",
    "yaml",
    "openai",
    "anthropic",
    "boto3",
    "botocore.session",
    "google.genai",
    # Imported on first use by a command: pandera's strategies (and hypothesis with them),
    # the price library's data, the ledger's PostgreSQL driver and dialects, Dagster's
    # storage migrations, the local model's tokenizer and weights reader.
    "pandera.strategies.pandas_strategies",
    "pandera.backends.pandas.register",
    "genai_prices.data",
    "psycopg",
    "sqlalchemy.dialects.postgresql",
    "sqlalchemy.dialects.sqlite",
    "alembic",
    "structlog",
    "tokenizers",
    "safetensors.numpy",
    # What a run or a report reaches past those: Dagster's instance, run and event storage,
    # asset graph and daemon modules, the artifact paths, the token counters, the console's
    # progress bars and Markdown, the personal-data detector.
    "dagster._core.definitions.freshness_evaluator",
    "dagster._core.definitions.assets.graph.remote_asset_graph",
    "dagster._core.storage.base_storage",
    "dagster._core.storage.local_compute_log_manager",
    "dagster._core.execution.asset_backfill",
    "dagster._daemon.controller",
    "alembic.command",
    "sqlite3",
    "upath",
    "fsspec",
    "pyarrow.dataset",
    "openai.pagination",
    "msgspec",
    "tiktoken",
    "rich.progress",
    "markdown_it",
    "datafog_core",
)


IMPORTED_BY_THE_COMMAND = ("llm_assets.cli", "llm_assets.demo", "llm_assets.definitions")
"""What of llm_assets depends, when imported, on the command's environment and terminal."""


def preload() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    packages = [importlib.import_module("llm_assets")]
    while packages:
        package = packages.pop()
        for found in pkgutil.iter_modules(package.__path__, f"{package.__name__}."):
            if not found.name.startswith(IMPORTED_BY_THE_COMMAND):
                module = importlib.import_module(found.name)
                if found.ispkg:
                    packages.append(module)
    # Forking a process that runs threads copies their locks in whatever state they are in.
    assert threading.active_count() == 1, threading.enumerate()


def child(request: dict[str, Any], stdio: list[int], inherited: list[int]) -> NoReturn:
    """Become the command: never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in inherited:
            os.close(fd)
        if request["new_session"]:
            os.setsid()
        for target, fd in enumerate(stdio):
            if fd != target:
                os.dup2(fd, target)
        for fd in set(stdio) - {0, 1, 2}:
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        script = request["argv"][0]
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [os.path.dirname(script), *extra, *sys.path]
        encoding = os.environ.get("PYTHONIOENCODING")
        for stream in (sys.stdin, sys.stdout, sys.stderr):
            if encoding:
                stream.reconfigure(encoding=encoding.split(":")[0] or None)  # type: ignore[attr-defined]
        sys.stdout.reconfigure(line_buffering=sys.stdout.isatty())  # type: ignore[attr-defined]
        sys.argv = list(request["argv"])
        import runpy

        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        # What the interpreter does on the way out: wait for threads, run atexit, flush.
        try:
            threading._shutdown()  # type: ignore[attr-defined]
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(control: socket.socket) -> None:
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}

    def reap() -> None:
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            reply = children.pop(pid, None)
            if reply is not None:
                with contextlib.suppress(OSError):  # the test has stopped listening
                    reply.sendall(f"{status}\n".encode())
                reply.close()

    while True:
        try:
            ready, _, _ = select.select([control, wake_read], [], [])
        except InterruptedError:
            continue
        if wake_read in ready:
            os.read(wake_read, 4096)
        reap()
        if control not in ready:
            continue
        message, fds, _, _ = socket.recv_fds(control, 1 << 22, 4)
        if not message:
            return
        request = json.loads(message)
        reply = socket.socket(fileno=fds[0])
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            owned = [control.fileno(), wake_read, wake_write, reply.fileno()]
            owned += [s.fileno() for s in children.values()]
            child(request, fds[1:], owned)
        children[pid] = reply
        for fd in fds[1:]:
            os.close(fd)
        reply.sendall(f"{pid}\n".encode())


if __name__ == "__main__":
    preload()
    serve(socket.socket(fileno=int(sys.argv[1])))
