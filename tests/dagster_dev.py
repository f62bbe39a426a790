"""`dagster dev` (webserver + the real dagster-daemon) on loopback, for end-to-end tests.

It is started in its own process group with SIGINT restored (in the background it would
ignore SIGINT and SIGTERM otherwise) and stopped by signalling the whole group.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from llm_assets.util.settings import REPO_ROOT
from tests.fakes.common import free_port

T = TypeVar("T")
_BACKFILL_UNDER_WAY = ("REQUESTED", "CANCELING", "FAILING")
"""Backfill statuses the daemon has not ended yet."""


class ServerError(AssertionError):
    """The webserver answered a query with a server error, three times over."""


@dataclass(frozen=True)
class DagsterDev:
    url: str
    env: dict[str, str]
    log: Path

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        """The query's data. A server error (HTTP 5xx: the webserver's SQLite storage busy
        under the daemon's writes, say) is asked again twice, then reported with the
        server's answer and the log's tail."""
        request = urllib.request.Request(
            f"{self.url}/graphql",
            data=json.dumps({"query": query, "variables": variables or {}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        for attempt in range(3):
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    body = json.loads(response.read())
                break
            except urllib.error.HTTPError as exc:
                if exc.code < 500:
                    raise
                answer = exc.read().decode(errors="replace")[-3000:]
                if attempt == 2:
                    tail = self.log.read_text(errors="replace")[-4000:]
                    raise ServerError(
                        f"HTTP {exc.code} from {self.url}/graphql:\n{answer}\n"
                        f"dagster dev log tail:\n{tail}"
                    ) from exc
                time.sleep(1.0)  # another process's transient error, not synchronization
        if body.get("errors"):
            raise AssertionError(f"GraphQL errors: {body['errors']}")
        return body["data"]

    def wait_for(self, what: str, probe: Callable[[], T | None], timeout: float = 240.0) -> T:
        """Poll `probe` until it returns something other than None (or fail with the log)."""
        deadline = time.monotonic() + timeout
        interval = 0.2
        while time.monotonic() < deadline:
            found = probe()
            if found is not None:
                return found
            time.sleep(interval)  # waiting on another process, not synchronizing threads
            interval = min(interval * 1.5, 2.0)
        tail = self.log.read_text(errors="replace")[-6000:]
        raise AssertionError(f"timed out waiting for {what}; dagster dev log tail:\n{tail}")

    def stop_sensors_and_schedules(self) -> None:
        """Stop every running sensor and schedule, so that only what the test launches runs."""
        data = self.graphql(
            "{ repositoriesOrError { ... on RepositoryConnection { nodes { "
            "sensors { id sensorState { status } } schedules { id scheduleState { status } } "
            "} } } }"
        )
        [repository] = data["repositoriesOrError"]["nodes"]
        assert repository["sensors"], f"no sensors found in {data}"
        for sensor in repository["sensors"]:
            if sensor["sensorState"]["status"] == "RUNNING":
                result = self.graphql(
                    "mutation($id: String) { stopSensor(id: $id) { "
                    "... on StopSensorMutationResult { instigationState { status } } } }",
                    {"id": sensor["id"]},
                )["stopSensor"]
                assert result.get("instigationState", {}).get("status") == "STOPPED", result
        for schedule in repository["schedules"]:
            if schedule["scheduleState"]["status"] == "RUNNING":
                result = self.graphql(
                    "mutation($id: String) { stopRunningSchedule(id: $id) { __typename } }",
                    {"id": schedule["id"]},
                )["stopRunningSchedule"]
                assert result["__typename"] == "ScheduleStateResult", result

    def launch_asset_backfill(
        self, partition_names: list[str], asset_paths: list[list[str]]
    ) -> str:
        """Launch a backfill of these assets over these partitions the way the UI does
        (`launchPartitionBackfill`); the daemon runs it. Returns the backfill's id."""
        launched = self.graphql(
            """
            mutation Launch($params: LaunchBackfillParams!) {
              launchPartitionBackfill(backfillParams: $params) {
                __typename
                ... on LaunchBackfillSuccess { backfillId }
                ... on PythonError { message }
              }
            }
            """,
            {
                "params": {
                    "partitionNames": partition_names,
                    "assetSelection": [{"path": path} for path in asset_paths],
                }
            },
        )["launchPartitionBackfill"]
        assert launched["__typename"] == "LaunchBackfillSuccess", launched
        return str(launched["backfillId"])

    def wait_for_backfill(self, backfill_id: str, timeout: float = 300.0) -> dict[str, Any]:
        """The backfill once the daemon has ended it: its status, and its runs with their
        status and tags. The daemon looks at a backfill every 30 seconds and ends it a look or
        two after its last run, so this takes a minute or more."""
        query = """
            query Backfill($id: String!) {
              partitionBackfillOrError(backfillId: $id) {
                ... on PartitionBackfill {
                  status
                  runs { runId status tags { key value } }
                }
              }
            }
        """

        def ended() -> dict[str, Any] | None:
            backfill = self.graphql(query, {"id": backfill_id})["partitionBackfillOrError"]
            return None if backfill["status"] in _BACKFILL_UNDER_WAY else backfill

        return self.wait_for(f"backfill {backfill_id} to end", ended, timeout=timeout)

    def backfill_asset_counts(self, backfill_id: str) -> dict[str, tuple[int, int]]:
        """(materialized, failed) partitions per asset (by its last key part), as the
        backfill's page in the UI counts them."""
        query = """
            query Assets($id: String!) {
              partitionBackfillOrError(backfillId: $id) {
                ... on PartitionBackfill {
                  assetBackfillData {
                    assetBackfillStatuses {
                      ... on AssetPartitionsStatusCounts {
                        assetKey { path }
                        numPartitionsMaterialized
                        numPartitionsFailed
                      }
                    }
                  }
                }
              }
            }
        """
        backfill = self.graphql(query, {"id": backfill_id})["partitionBackfillOrError"]
        return {
            s["assetKey"]["path"][-1]: (s["numPartitionsMaterialized"], s["numPartitionsFailed"])
            for s in backfill["assetBackfillData"]["assetBackfillStatuses"]
        }


def _restore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _descendants(pid: int) -> list[int]:
    """The processes started under `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                # After the command's name in parentheses: the state, then the parent's pid.
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


@contextmanager
def dagster_dev(env: dict[str, str], log: Path, *, daemon: bool = True) -> Iterator[DagsterDev]:
    """Run `dagster dev -w workspace.yaml` from the repo with `env`; yields once the code
    location has loaded. Without `daemon`, the webserver alone (`dagster-webserver`): the
    pages, and no sensor, schedule or backfill runs."""
    port = free_port()
    bin_dir = Path(sys.executable).parent
    command = [str(bin_dir / "dagster"), "dev"] if daemon else [str(bin_dir / "dagster-webserver")]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*command, "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_restore_sigint,
        )
        server = DagsterDev(url=f"http://127.0.0.1:{port}", env=env, log=log)
        try:

            def loaded() -> bool | None:
                if process.poll() is not None:
                    raise AssertionError(f"dagster dev exited:\n{log.read_text()[-6000:]}")
                try:
                    data = server.graphql(
                        "{ workspaceOrError { ... on Workspace { locationEntries { name "
                        "loadStatus locationOrLoadError { __typename } } } } }"
                    )
                except (urllib.error.URLError, ConnectionError, TimeoutError, ServerError):
                    return None
                entries = data["workspaceOrError"].get("locationEntries") or []
                ready = [
                    e
                    for e in entries
                    if e["loadStatus"] == "LOADED"
                    and e["locationOrLoadError"]["__typename"] == "RepositoryLocation"
                ]
                failed = [
                    e for e in entries if e["locationOrLoadError"]["__typename"] == "PythonError"
                ]
                if failed:
                    raise AssertionError(f"code location failed to load: {failed}")
                return True if ready else None

            server.wait_for("the code location to load", loaded, timeout=180)
            yield server
        finally:
            # The code server's gRPC process runs in a session of its own, outside the group.
            family = _descendants(process.pid)
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(timeout=30)
            for survivor in family:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(survivor, signal.SIGKILL)
