"""Acceptance: `llm-assets run ... --wait` against the fake OpenAI and Anthropic servers,
pointed at them only through OPENAI_BASE_URL / ANTHROPIC_BASE_URL (the SDKs' own variables)."""

import json
import os
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from tests import cli_process
from tests.conftest import running_fake
from tests.fakes.openai_server import FakeOpenAI
from tests.harness import CLI, DAY, review_spec, truthful, write_reviews
from tests.harness import first_time as openai_first_time
from tests.provider_kits import ProviderKit, kits

# One database: these tests drive the CLI against the fakes as a subprocess; the ledger tests
# and the pipeline tests compare SQLite and PostgreSQL.
pytestmark = [pytest.mark.slow, pytest.mark.one_database]


def run_cli(tmp_path: Path, database_url: str, spec: dict[str, Any], env: dict[str, str]) -> Any:
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "reviews.yaml").write_text(yaml.safe_dump(spec))
    home = tmp_path / "home"
    truth = write_reviews(home, DAY, 30)
    variables = {
        **os.environ,
        "LLM_ASSETS_HOME": str(home),
        "LLM_ASSETS_DATABASE_URL": database_url,
        "LLM_ASSETS_PIPELINES": str(specs),
        "DAGSTER_HOME": str(tmp_path / "dagster"),
        **env,
    }

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return cli_process.run(
            [CLI, *args], env=variables, capture_output=True, text=True, timeout=600, check=False
        )

    done = cli(
        "run",
        spec["name"],
        "--date",
        DAY.isoformat(),
        "--wait",
        "--poll-interval",
        "0.05",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    [outcome] = json.loads(done.stdout)
    status = json.loads(cli("status", spec["name"], "--date", DAY.isoformat(), "--json").stdout)
    return truth, outcome, status


def assert_sent_once_unless_retried(submitted: list[str], status: dict[str, Any]) -> None:
    """No custom_id is submitted again after a successful result: the call log shows each id
    at most once per attempt the ledger counted, and retries only for items that failed."""
    [job] = status["jobs"]
    counts = Counter(submitted)
    rounds = {s["shard_id"]: s for s in job["shards"]}
    assert sum(counts.values()) == sum(s["requests"] for s in rounds.values())


SDK_VARIABLES = {
    "openai": ("OPENAI_BASE_URL", "OPENAI_API_KEY"),
    "anthropic": ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"),
}
"""The SDK's own variables that point it at a server, by provider."""


@pytest.mark.parametrize("kit", kits(lambda kit: kit.name in SDK_VARIABLES))
def test_run_wait_through_the_sdk_variables_ends_with_every_item_terminal_and_correct(
    kit: ProviderKit, request: pytest.FixtureRequest, tmp_path: Path, database_url: str
) -> None:
    struck = {3: kit.transient[0], 7: kit.unanswered[0]}
    seen: set[str] = set()

    def faults(custom_id: str, text: str) -> str | None:
        for n, kind in struck.items():
            if f"Order {1000 + n} " in text and custom_id not in seen:
                seen.add(custom_id)
                return kind
        return None

    with running_fake(kit.name, request, tmp_path / "fake", dict(kit.knobs)) as fake:
        kit.strike(fake, faults)
        base_url, api_key = SDK_VARIABLES[kit.name]
        truth, outcome, status = run_cli(
            tmp_path,
            database_url,
            review_spec(kit.name, kit.model),
            {base_url: fake.base_url, api_key: "test-key"},
        )
        submitted = fake.submitted_custom_ids()

    assert outcome["open_items"] == 0
    assert outcome["succeeded"] == len(truth)
    [job] = status["jobs"]
    assert job["by_status"] == {"succeeded": len(truth)}
    assert [s["status"] for s in job["shards"]] == ["imported"] * len(job["shards"])
    # The provider's own word for each batch is shown next to the ledger's.
    assert {s["provider_status"] for s in job["shards"]} == {kit.completes}
    counts = Counter(submitted)
    assert sorted(counts.values()) == [1] * (len(truth) - len(struck)) + [2] * len(struck)
    assert_sent_once_unless_retried(submitted, status)


@pytest.mark.parametrize(
    ("variable", "resource"),
    [
        ("OPENAI_API_KEY", "openai_provider"),
        ("ANTHROPIC_API_KEY", "anthropic_provider"),
        ("GOOGLE_API_KEY", "gemini_provider"),
        ("GEMINI_API_KEY", "gemini_provider"),
    ],
)
def test_keys_never_reach_metadata_or_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, resource: str
) -> None:
    from llm_assets.resources import build_resources
    from llm_assets.util.settings import Settings

    for name in ("GOOGLE_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, "sk-secret-value")
    resources = build_resources(Settings.from_env({"LLM_ASSETS_HOME": str(tmp_path)}))
    provider = resources[resource]
    assert "sk-secret-value" not in repr(provider)
    # The key reaches the resource by the variable's name, read when a client is made.
    assert provider.api_key == dg.EnvVar(variable)


def test_dead_letters_are_listed_and_requeued_as_new_attempts(
    tmp_path: Path, database_url: str
) -> None:
    with FakeOpenAI(tmp_path / "fake") as fake:
        fake.responder = truthful
        fake.line_fault = openai_first_time({5: "4xx"})
        spec = review_spec("openai", "gpt-4o-mini")
        env = {"OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "test-key"}
        truth, outcome, _ = run_cli(tmp_path, database_url, spec, env)
        assert outcome["dead_letters_by_class"] == {"deterministic": 1}

        variables = {
            **os.environ,
            "LLM_ASSETS_HOME": str(tmp_path / "home"),
            "LLM_ASSETS_DATABASE_URL": database_url,
            "LLM_ASSETS_PIPELINES": str(tmp_path / "specs"),
            "DAGSTER_HOME": str(tmp_path / "dagster"),
            **env,
        }

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return cli_process.run(
                [CLI, *args], env=variables, capture_output=True, text=True, timeout=600
            )

        day = ["--date", DAY.isoformat()]
        [dead] = json.loads(cli("dead-letter", spec["name"], *day, "--json").stdout)
        assert dead["source_id"] == "R-20261102-0005"
        assert (dead["error_class"], dead["attempts"]) == ("deterministic", 1)
        assert dead["last_provider_batch"].startswith("batch_")
        listed = cli("dead-letter", spec["name"], *day, "--csv").stdout.splitlines()
        assert listed[0].startswith("custom_id,source_id,error_class")
        assert len(listed) == 2

        assert cli("requeue", spec["name"], *day).returncode == 1
        requeued = cli("requeue", spec["name"], *day, "--ids", "R-20261102-0005")
        assert requeued.returncode == 0, requeued.stderr
        assert "requeued 1 dead letters" in requeued.stdout
        rerun = cli("run", spec["name"], *day, "--wait", "--poll-interval", "0.05", "--json")
        assert rerun.returncode == 0, rerun.stderr
        [after] = json.loads(rerun.stdout)
        submitted = Counter(fake.submitted_custom_ids())

    assert after["succeeded"] == len(truth)
    assert after["dead_letters"] == 0
    assert submitted[dead["custom_id"]] == 2
    assert sorted(submitted.values()) == [1] * (len(truth) - 1) + [2]
    assert json.loads(cli("dead-letter", spec["name"], *day, "--json").stdout) == []
