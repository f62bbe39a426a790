"""From a dropped file to the day's cost report with `dagster dev`: seconds, step by step.

`dagster dev` (webserver and daemon, sensors on as shipped) runs on loopback against a fresh
instance with the demo spec (support_tickets, the local provider). Once its code location
has loaded, one day of the demo's tickets (120 by default) is generated in a staging folder
and renamed into the spec's inbox, so it appears whole. The script then reads the instance
until the day's cost_report is materialized and prints, for each step, when its first
materialization of the day came, counted from the drop, and the end-to-end time.

    .venv/bin/python bench/drop_to_report.py [--tickets 120] [--runs 1]
"""

import argparse
import datetime as dt
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import dagster as dg

from llm_assets import names
from llm_assets.demo.data import generate_demo_data
from llm_assets.demo.run import DEMO_START
from llm_assets.util.settings import REPO_ROOT

PIPELINE = "support_tickets"
TIMEOUT_SECONDS = 600.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def materialized_at(
    instance: dg.DagsterInstance, step: str, day: str, after: float
) -> float | None:
    """When the step's first materialization of the day since `after` was stored."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(
            asset_key=dg.AssetKey(names.asset_path(PIPELINE, step)), asset_partitions=[day]
        ),
        limit=20,
    ).records
    times = [r.timestamp for r in records if r.timestamp >= after]
    return min(times) if times else None


def wait_until_loaded(log: Path, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"dagster dev exited:\n{log.read_text()[-4000:]}")
        if "Started Dagster code server" in log.read_text(errors="replace") or (
            "Serving dagster-webserver" in log.read_text(errors="replace")
        ):
            return
        time.sleep(0.5)  # waiting on another process
    sys.exit(f"dagster dev did not start:\n{log.read_text()[-4000:]}")


def one_run(tickets: int) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="drop-to-report-"))
    home, dagster_home, pipelines = tmp / ".llm_assets", tmp / "dagster", tmp / "pipelines"
    for folder in (dagster_home, pipelines, home / "demo" / "inbox"):
        folder.mkdir(parents=True)
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    shutil.copy(REPO_ROOT / "pipelines" / f"{PIPELINE}.yaml", pipelines)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_ASSETS_")}
    env |= {
        "LLM_ASSETS_HOME": str(home),
        "LLM_ASSETS_PIPELINES": str(pipelines),
        "DAGSTER_HOME": str(dagster_home),
    }
    log = tmp / "dagster-dev.log"
    dagster = str(Path(sys.executable).parent / "dagster")
    command = [dagster, "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(free_port())]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until_loaded(log, process)
        time.sleep(15)  # the daemon's first sensor ticks on an empty inbox
        staged = generate_demo_data(
            tmp / "staging", start=DEMO_START, days=1, tickets_per_day=tickets
        )
        [source] = staged.files
        dropped = time.time()
        source.rename(home / "demo" / "inbox" / source.name)
        day = DEMO_START.isoformat()
        instance = dg.DagsterInstance.from_config(str(dagster_home))
        try:
            deadline = time.monotonic() + TIMEOUT_SECONDS
            while materialized_at(instance, names.COST_REPORT, day, dropped) is None:
                if time.monotonic() > deadline:
                    sys.exit(f"no cost report after {TIMEOUT_SECONDS:.0f} s; log in {log}")
                time.sleep(0.5)  # waiting on the daemon's runs
            return {
                step: at - dropped
                for step in names.ASSETS
                if (at := materialized_at(instance, step, day, dropped)) is not None
            }
        finally:
            instance.dispose()
    finally:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tickets", type=int, default=120)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    for n in range(1, args.runs + 1):
        seconds = one_run(args.tickets)
        print(f"run {n} ({dt.datetime.now():%H:%M}), {args.tickets} tickets, seconds from drop:")
        for step, at in sorted(seconds.items(), key=lambda item: item[1]):
            print(f"  {step:<18} {at:6.1f}")
        print(f"  drop to cost_report: {seconds[names.COST_REPORT]:.1f} s")


if __name__ == "__main__":
    main()
