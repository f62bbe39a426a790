"""One `llm-assets demo` for the whole test session, run by whichever xdist worker asks first.

The demo takes most of a minute of CPU, and the UI tour, the personal-data, the terminal
width and the notification tests all look at what one `make demo` makes; each worker that
needs it waits for the first to finish it (a file lock in the session's shared temporary
folder), then reads the same home, Dagster instance, output and webhook posts.

The demo runs as `make demo` runs it (`llm-assets demo`, the repo's pipelines, its defaults)
with `--json`, so its stdout says what it made; the tables it prints go to stderr, at
COLUMNS characters.
"""

import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.day_notices import webhook_server
from tests.eval_harness import run_command
from tests.harness import CLI

COLUMNS = 200
"""Wide enough for the demo table's rows to stay on one line each."""
DAGSTER_YAML = "telemetry:\n  enabled: false\nnux:\n  enabled: false\n"
"""No telemetry, and no "join the community" dialog over the UI's pages."""


@dataclass(frozen=True)
class DemoRun:
    home: Path
    """LLM_ASSETS_HOME: the demo's inbox, artifacts, ledger.db and Dagster instance."""
    env: dict[str, str]
    """The environment it ran in (also the code location's, for a webserver over it)."""
    made: dict[str, Any]
    """`llm-assets demo --json`: each day's outcome, the cancelled, empty and blocked days,
    the eval."""
    output: str
    """Everything it printed: the JSON, then the tables and log lines of stderr."""
    tables: str
    """stderr alone: the demo's tables and sentences, and the Dagster log lines."""
    posts: list[dict[str, Any]]
    """What the notification webhook was sent."""

    @property
    def dagster_home(self) -> Path:
        return Path(self.env["DAGSTER_HOME"])

    def truth(self) -> list[dict[str, Any]]:
        """The generator's truth file: each ticket's category and personal data."""
        lines = (self.home / "demo" / "truth.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]


def shared_demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """The session's demo, run now unless another worker has run it or is running it."""
    # The workers' temporary folders are in the session's; without xdist, it is the session's.
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = shared / "shared-demo"
    done = folder / "demo.json"
    with (shared / "shared-demo.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            _run(folder, done)
    return _load(json.loads(done.read_text()))


def _environment(home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("LLM_ASSETS_") and k not in ("DAGSTER_HOME", "COLUMNS")
    }
    return env | {
        "LLM_ASSETS_HOME": str(home),
        "DAGSTER_HOME": str(home / "dagster"),
        "COLUMNS": str(COLUMNS),
    }


def _run(folder: Path, done: Path) -> None:
    home = folder / ".llm_assets"
    env = _environment(home)
    Path(env["DAGSTER_HOME"]).mkdir(parents=True)
    (Path(env["DAGSTER_HOME"]) / "dagster.yaml").write_text(DAGSTER_YAML)
    with webhook_server() as (url, posts):
        result = run_command([CLI, "demo", "--json"], env | {"LLM_ASSETS_WEBHOOK_URL": url}, 900)
    assert result.returncode == 0, f"llm-assets demo failed:\n{result.stdout}\n{result.stderr}"
    record = {
        "home": str(home),
        "env": env,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "posts": posts,
    }
    tmp = done.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.rename(done)


def _load(record: dict[str, Any]) -> DemoRun:
    return DemoRun(
        home=Path(record["home"]),
        env=record["env"],
        made=json.loads(record["stdout"]),
        output=record["stdout"] + record["stderr"],
        tables=record["stderr"],
        posts=record["posts"],
    )
