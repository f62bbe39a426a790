"""Secrets in URLs stay secret: the ledger URL reaches Dagster as the name of its variable, a
URL is shown with its password masked, a webhook URL is never printed, sent in clear text
or read from a variable that holds a key."""

import datetime as dt
import http.server
import json
import logging
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from dagster._core.events import DagsterEvent, DagsterEventType
from dagster._core.test_utils import instance_for_test
from dagster_graphql.test.utils import (
    define_out_of_process_context,
    execute_dagster_graphql,
    infer_repository_selector,
)

from llm_assets.defs.notification_sensors import build_notification_sensors
from llm_assets.demo.run import _where_things_are
from llm_assets.resources import build_resources
from llm_assets.resources.ledger import LedgerResource
from llm_assets.spec.load import check_specs
from llm_assets.spec.model import PipelineSpec
from llm_assets.steps import notify
from llm_assets.util.secrecy import mask_url
from llm_assets.util.settings import REPO_ROOT, Settings
from tests import cli_process
from tests.harness import CLI, review_spec

PASSWORD = "pw-e63a00efb4f3477f88bb27f256cd6d72"
"""A password no code or log would hold by chance; fixed, as the test ids carry it and
every test worker must collect the same ids."""
DAY = dt.date(2026, 11, 3)

RESOURCES_QUERY = """
query Resources($selector: RepositorySelector!) {
  allTopLevelResourceDetailsOrError(repositorySelector: $selector) {
    __typename
    ... on ResourceDetailsList {
      results {
        name
        configuredValues { key value type }
        configFields { name defaultValueAsJson description }
      }
    }
    ... on PythonError { message }
  }
  utilizedEnvVarsOrError(repositorySelector: $selector) {
    __typename
    ... on EnvVarWithConsumersList { results { envVarName } }
  }
}
"""


def test_the_ui_shows_the_ledger_variable_by_name_never_its_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The code location, loaded as `dagster dev` loads it (a code server), answers the UI's
    resource query with LLM_ASSETS_DATABASE_URL as an env var, not the URL."""
    monkeypatch.setenv("LLM_ASSETS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(
        "LLM_ASSETS_DATABASE_URL", f"postgresql+psycopg2://ledger:{PASSWORD}@127.0.0.1:1/ledger"
    )
    monkeypatch.setenv("LLM_ASSETS_ONLINE_BASE_URL", f"http://proxy:{PASSWORD}@127.0.0.1:1/v1")
    with (
        instance_for_test() as instance,
        define_out_of_process_context(str(REPO_ROOT / "workspace.yaml"), None, instance) as ctx,
    ):
        selector = infer_repository_selector(ctx)
        answer = execute_dagster_graphql(ctx, RESOURCES_QUERY, {"selector": selector}).data
    assert answer is not None
    assert PASSWORD not in json.dumps(answer)
    details = answer["allTopLevelResourceDetailsOrError"]
    assert details["__typename"] == "ResourceDetailsList", details
    values = {
        (resource["name"], value["key"]): value
        for resource in details["results"]
        for value in resource["configuredValues"]
    }
    assert values[("ledger", "database_url")] == {
        "key": "database_url",
        "value": "LLM_ASSETS_DATABASE_URL",
        "type": "ENV_VAR",
    }
    assert values[("online_provider", "base_url")]["type"] == "ENV_VAR"
    used = {v["envVarName"] for v in answer["utilizedEnvVarsOrError"]["results"]}
    assert "LLM_ASSETS_DATABASE_URL" in used


def test_the_default_sqlite_ledger_stays_a_plain_value(tmp_path: Path) -> None:
    settings = Settings.from_env({"LLM_ASSETS_HOME": str(tmp_path)})
    ledger = build_resources(settings)["ledger"]
    assert not isinstance(ledger.database_url, dg.EnvVar)
    assert ledger.url == settings.database_url


def test_a_ledger_given_as_envvar_opens_outside_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    monkeypatch.setenv("LLM_ASSETS_DATABASE_URL", url)
    ledger = build_resources(Settings.from_env())["ledger"]
    assert isinstance(ledger.database_url, dg.EnvVar)
    assert ledger.url == url
    assert ledger.jobs_for_partition("nothing", DAY) == []


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"postgresql://bob:{PASSWORD}@db:5432/l", "postgresql://bob:***@db:5432/l"),
        (f"postgresql+psycopg2://bob@db/l?password={PASSWORD}", "password=%2A%2A%2A"),
        (f"https://u:{PASSWORD}@store.example/x", "https://u:***@store.example/x"),
        (f"postgresql://bob:{PASSWORD}@db:notaport/l", "postgresql://bob:***@db:notaport/l"),
        ("postgresql://bob@db/l", "postgresql://bob@db/l"),
        ("s3://bucket/prefix", "s3://bucket/prefix"),
        ("/srv/artifacts", "/srv/artifacts"),
    ],
)
def test_mask_url_hides_the_password_and_keeps_the_rest(url: str, shown: str) -> None:
    masked = mask_url(url)
    assert PASSWORD not in masked
    assert shown in masked


def test_the_demo_shows_where_the_ledger_is_without_its_password(tmp_path: Path) -> None:
    settings = Settings.from_env(
        {
            "LLM_ASSETS_HOME": str(tmp_path),
            "LLM_ASSETS_DATABASE_URL": f"postgresql://bob:{PASSWORD}@db/ledger",
        }
    )
    spec = PipelineSpec.model_validate(review_spec("local", "all-MiniLM-L6-v2"))
    where = _where_things_are(settings, spec)
    assert PASSWORD not in where
    assert "postgresql://bob:***@db/ledger" in where


@pytest.mark.parametrize(
    ("url", "why"),
    [
        (f"postgresql://bob:{PASSWORD}@127.0.0.1:1/ledger", "Connection refused"),
        (f"postgresql://postgres:{PASSWORD}@127.0.0.1:5432/no_such_ledger_db", "no_such_ledger"),
    ],
)
def test_status_with_an_unreachable_ledger_names_it_with_the_password_masked(
    tmp_path: Path, url: str, why: str
) -> None:
    env = {**os.environ, "LLM_ASSETS_HOME": str(tmp_path), "LLM_ASSETS_DATABASE_URL": url}
    done = cli_process.run(
        [CLI, "status", "support_tickets", "--date", "2026-11-01"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1
    assert PASSWORD not in done.stdout + done.stderr
    assert "cannot open the ledger at" in done.stderr
    assert mask_url(url) in done.stderr.replace("\n", "")
    assert why in done.stderr
    assert "Traceback" not in done.stderr


# Webhooks


def write_spec(folder: Path, **notify_settings: Any) -> Path:
    spec = review_spec("local", "all-MiniLM-L6-v2", automation={"notify": notify_settings})
    path = folder / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize(
    "variable",
    ["LLM_ASSETS_DATABASE_URL", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "GEMINI_API_KEY"],
)
def test_a_webhook_variable_that_holds_a_key_is_refused(tmp_path: Path, variable: str) -> None:
    path = write_spec(tmp_path, webhook_env=variable)
    _, problems = check_specs(path)
    [problem] = problems
    assert problem.field == "automation.notify.webhook_env"
    assert variable in problem.reason


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://hooks.slack.com/services/T0/B0/{secret}", True),
        ("http://127.0.0.1:8080/{secret}", True),
        ("http://[::1]:8080/{secret}", True),
        ("http://localhost/{secret}", True),
        ("http://hooks.example.com/{secret}", False),
        ("http://127.0.0.1.example.com/{secret}", False),
        ("ftp://files.example.com/{secret}", False),
        ("{secret}", False),
    ],
)
def test_a_webhook_url_must_be_https_or_loopback_http(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, allowed: bool
) -> None:
    secret = f"hook-{uuid.uuid4().hex}"
    monkeypatch.setenv("TEAM_WEBHOOK", url.format(secret=secret))
    _, problems = check_specs(write_spec(tmp_path, webhook_env="TEAM_WEBHOOK"))
    assert [p.field for p in problems] == ([] if allowed else ["automation.notify.webhook_env"])
    assert all(secret not in p.reason and "TEAM_WEBHOOK" in p.reason for p in problems)


class _Hook(http.server.BaseHTTPRequestHandler):
    answer = 500

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(self.answer)
        if self.answer in (301, 302, 307):
            self.send_header("Location", f"http://elsewhere.example/{self.path}")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hook_server() -> Iterator[tuple[str, type[_Hook]]]:
    handler = type("Hook", (_Hook,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", handler
    server.shutdown()
    server.server_close()


def failed_run_context(spec: PipelineSpec, ledger: LedgerResource) -> Any:
    """What Dagster hands the failure sensor when a run of the spec's day failed."""
    instance = dg.DagsterInstance.ephemeral()
    run = dg.DagsterRun(
        job_name="__ASSET_JOB",
        run_id=str(uuid.uuid4()),
        tags={"dagster/partition": DAY.isoformat()},
        asset_selection=frozenset({dg.AssetKey([spec.name, "provider_batches"])}),
        status=dg.DagsterRunStatus.FAILURE,
    )
    event = DagsterEvent(
        event_type_value=DagsterEventType.RUN_FAILURE.value,
        job_name=run.job_name,
        message="provider_batches failed: the budget gate",
    )
    return dg.build_run_status_sensor_context(
        sensor_name="llm_assets__partition_failed",
        dagster_event=event,
        dagster_instance=instance,
        dagster_run=run,
        resources={"ledger": ledger},
    ).for_run_failure()


@pytest.mark.parametrize("failure", ["500", "redirect", "closed port", "bad port", "reset"])
def test_a_webhook_failure_names_its_type_and_status_never_the_url(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
    hook_server: tuple[str, type[_Hook]],
    failure: str,
) -> None:
    """The failure sensor of a day logs the summary and the delivery error, and the ledger
    records the error; neither the sensor's result, its log, the ledger nor the process
    output holds the webhook URL."""
    base, handler = hook_server
    secret = f"xoxb-{uuid.uuid4().hex}"
    url, expected = {
        "500": (f"{base}/services/{secret}", "webhook answered HTTP 500"),
        "redirect": (f"{base}/services/{secret}", "webhook answered HTTP 302"),
        "closed port": (f"http://127.0.0.1:9/services/{secret}", "ConnectionRefusedError"),
        "bad port": (f"http://127.0.0.1:{secret}/services", "webhook failed: InvalidURL"),
        "reset": (f"{base}/services/{secret}", "webhook unreachable"),
    }[failure]
    handler.answer = 302 if failure == "redirect" else 500
    if failure == "reset":
        # Closed without an answer once the handler returns.
        handler.do_POST = lambda self: setattr(self, "close_connection", True)  # type: ignore[method-assign]
    monkeypatch.setenv("TEAM_WEBHOOK", url)
    spec = PipelineSpec.model_validate(
        review_spec(
            "local", "all-MiniLM-L6-v2", automation={"notify": {"webhook_env": "TEAM_WEBHOOK"}}
        )
    )
    ledger = LedgerResource(database_url=f"sqlite:///{tmp_path / 'ledger.db'}")
    sensor = next(s for s in build_notification_sensors([spec]) if s.name.endswith("_failed"))
    caplog.set_level(logging.DEBUG)

    result = sensor(failed_run_context(spec, ledger))

    out, err = capfd.readouterr()
    logged = out + err  # the sensor's log
    assert "notification not delivered" in logged  # the sensor ran and the post failed
    assert expected in logged
    [sent] = ledger.sent_notifications(spec.name, DAY)
    assert expected in sent["delivery_error"]
    error = notify.deliver(spec, notify.summarize(spec, DAY, ledger, outcome="failed"))
    assert error is not None and expected in error
    out, err = capfd.readouterr()
    seen = "\n".join([caplog.text, logged, out, err, repr(result), error, repr(sent)])
    assert secret not in seen
    assert "/services" not in seen
