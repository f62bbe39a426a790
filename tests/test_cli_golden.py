"""What an operator reads: `run`, `status`, `costs` and `dead-letter` tables of a real day on
the local provider, at 80 and at 200 columns, against the files in tests/golden/.

The day is the demo's generated tickets (with its deliberately bad rows) through every step
on the local provider, with the repo's price table (the local model costs $0, so `costs`
explains its zero) and shards of at most 4 requests, so the status table has several. The
CLI runs as a subprocess whose stdout is a pipe, so COLUMNS sets its width.

These tables print no timestamps, run ids or durations, and every id in them (job, shard,
local batch) is made from the pipeline, the day and the data; what varies between runs is
only where the test's temporary directory is, and the local model's output token counts,
which move with the installed transformers and tokenizers. `normalise` writes that directory
as <tmp> and each digit of an output token count as #; nothing else is changed and no line
is dropped.

To write the golden files anew after a deliberate change of the output, run

    LLM_ASSETS_UPDATE_GOLDEN=1 pytest tests/test_cli_golden.py

and review the diff of tests/golden/ before committing it.
"""

import datetime as dt
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from rich.cells import cell_len

from tests import cli_process
from tests.harness import CLI
from tests.test_cli import DAY, Env

pytestmark = pytest.mark.slow

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("LLM_ASSETS_UPDATE_GOLDEN") == "1"
WIDTHS = (80, 200)
NO_DATA_DAY = DAY + dt.timedelta(days=1)
SHARD_ID = re.compile(r"^(r\d+-s\d+)\s")
_OUTPUT_TOKENS = re.compile(r"\d[\d,]*(?= out)")


class GoldenEnv(Env):
    """test_cli's environment with the repo's prices and small shards, on SQLite (the ledger
    backend is not what these tests look at)."""

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path, f"sqlite:///{tmp_path / 'ledger.db'}")
        self.tmp_path = tmp_path
        self.runs: dict[int, subprocess.CompletedProcess[str]] = {}
        del self.vars["LLM_ASSETS_PRICES"]
        spec_file = self.specs / "support_tickets.yaml"
        spec = yaml.safe_load(spec_file.read_text())
        spec["sharding"]["max_requests_per_shard"] = 4
        spec_file.write_text(yaml.safe_dump(spec))

    def at(self, columns: int, *args: str) -> subprocess.CompletedProcess[str]:
        return cli_process.run(
            [CLI, *args],
            env={**self.vars, "COLUMNS": str(columns)},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    def normalise(self, text: str) -> str:
        text = text.replace(str(self.tmp_path), "<tmp>")
        # The local model's answers, and so their token counts, change with the installed
        # transformers and tokenizers; each digit stays a character, so the layout is checked.
        return _OUTPUT_TOKENS.sub(lambda m: re.sub(r"\d", "#", m.group()), text)


RUN = ("run", "support_tickets", "--date", DAY.isoformat(), "--to", NO_DATA_DAY.isoformat())
COMMANDS = {
    "status": ("status", "support_tickets", "--date", DAY.isoformat()),
    "costs": ("costs", "support_tickets", "--from", DAY.isoformat(), "--to", DAY.isoformat()),
    "dead-letter": ("dead-letter", "support_tickets", "--date", DAY.isoformat()),
}


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> GoldenEnv:
    """The day and the empty day after it run to the end: the 80-column `run` does the work,
    the 200-column one finds nothing left to do and prints the same outcome."""
    env = GoldenEnv(tmp_path_factory.mktemp("golden"))
    env.runs = {columns: env.at(columns, *RUN, "--wait") for columns in WIDTHS}
    return env


HEADERS = {
    "run": ("date", "items", "succeeded", "dead letters", "open", "cost"),
    "status": ("shard", "status", "provider status", "provider batch", "done"),
    "costs": ("date", "model, prompt", "succeeded", "tokens", "cost", "retries", "estimate"),
    "dead-letter": ("source id", "error", "sent", "reason"),
}
"""Each table's column headers: a column cut off at the console's edge loses its header."""


def _compare(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.txt"
    if UPDATE:
        path.write_text(text)
    assert path.exists(), f"{path} is missing; LLM_ASSETS_UPDATE_GOLDEN=1 writes it"
    assert text == path.read_text(), f"{name} differs from {path}"


def _check(
    day: GoldenEnv, name: str, columns: int, result: subprocess.CompletedProcess[str]
) -> str:
    assert result.returncode == 0, result.stderr
    text = day.normalise(result.stdout)
    _compare(f"{name}_{columns}", text)
    assert max(cell_len(line) for line in text.splitlines()) <= columns
    words = set(text.split())
    assert {w for header in HEADERS[name] for w in header.split()} <= words
    assert str(day.home) not in result.stdout
    return text


@pytest.mark.parametrize("columns", WIDTHS)
def test_run_table_matches_its_golden_file(day: GoldenEnv, columns: int) -> None:
    text = _check(day, "run", columns, day.runs[columns])

    assert f"support_tickets {NO_DATA_DAY}: no data (no source rows for {NO_DATA_DAY})" in text


@pytest.mark.parametrize("columns", WIDTHS)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_table_matches_its_golden_file(day: GoldenEnv, command: str, columns: int) -> None:
    _check(day, command, columns, day.at(columns, *COMMANDS[command]))


def test_status_shows_each_shard_by_a_short_id_of_its_own(day: GoldenEnv) -> None:
    table = day.at(80, *COMMANDS["status"]).stdout
    [job] = json.loads(day.at(80, *COMMANDS["status"], "--json").stdout)["jobs"]
    full = [s["shard_id"] for s in job["shards"]]

    short = [m.group(1) for line in table.splitlines() if (m := SHARD_ID.match(line))]

    assert len(full) >= 3
    assert len(short) == len(full)
    assert len(set(short)) == len(short)
    assert sorted(f"{job['job_id']}-{s}" for s in short) == sorted(full)


def test_json_keeps_full_ids_and_stored_reasons_and_says_what_the_tables_say(
    day: GoldenEnv,
) -> None:
    status = json.loads(day.at(80, *COMMANDS["status"], "--json").stdout)
    costs = json.loads(day.at(80, *COMMANDS["costs"], "--json").stdout)
    dead = json.loads(day.at(80, *COMMANDS["dead-letter"], "--json").stdout)
    table = day.at(80, *COMMANDS["dead-letter"]).stdout

    assert status["blocked"] is None
    assert costs["months_as_of"] == DAY.isoformat()
    [reason] = costs["zero_cost_reasons"]
    assert "local/all-MiniLM-L6-v2 is priced at $0 per token in prices.yaml" in reason
    assert "prices as of 2026-11-01" in reason
    inbox = day.home / "demo" / "inbox" / f"tickets-{DAY.isoformat()}.jsonl"
    assert all(row["error_message"].startswith(f"{inbox}:") for row in dead)
    assert f"demo/inbox/tickets-{DAY.isoformat()}" in table
