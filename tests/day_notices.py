"""What the daemon does with a finished run for the day notifications, and a webhook on
loopback that keeps what the notification sensors post."""

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import dagster as dg
import pytest

from llm_assets.defs.factory import asset_key
from llm_assets.defs.notification_sensors import build_notification_sensors
from tests.harness import Harness


@contextlib.contextmanager
def loopback_webhook(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """A Slack-style webhook on loopback, set as the spec's webhook; yields what it is sent."""
    with webhook_server() as (url, posts):
        monkeypatch.setenv("LLM_ASSETS_WEBHOOK_URL", url)
        yield posts


@contextlib.contextmanager
def webhook_server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A Slack-style webhook on loopback: its URL, and what it is sent."""
    posts: list[dict[str, Any]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            posts.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hook", posts
    server.shutdown()
    server.server_close()


def announce(harness: Harness, run: dg.ExecuteInProcessResult, selection: Sequence[str]) -> None:
    """What the daemon does when the run ends: the notification sensor of its status (the run
    named with the steps `selection`, as a launched run names them) evaluates it."""
    finished, failed = build_notification_sensors([harness.spec])
    status = dg.DagsterEventType.RUN_SUCCESS if run.success else dg.DagsterEventType.RUN_FAILURE
    [event] = [e for e in run.all_events if e.event_type == status]
    keys = frozenset(asset_key(harness.spec, step) for step in selection)
    context = dg.build_run_status_sensor_context(
        sensor_name=(finished if run.success else failed).name,
        dagster_event=event,
        dagster_instance=harness.instance,
        dagster_run=run.dagster_run._replace(asset_selection=keys),
        resources={"ledger": harness.ledger},
    )
    if run.success:
        finished(context)
    else:
        failed(context.for_run_failure())
