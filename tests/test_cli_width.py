"""What an operator reads at 80 columns and in a pipe: the real `llm-assets` on a real day on
the local provider, run as a subprocess whose stdout is a pipe (so COLUMNS sets its width) or,
for the eval report, a terminal (a pseudo-terminal).

Nothing the tables print is cut: ids, dates, statuses, numbers and model names show whole
(a column may be left out, and said to be; a row may take several lines); a dead letter's
reason shows whole, its paths relative to LLM_ASSETS_HOME and no Python repr in it; the eval
report is rendered, never printed as Markdown source; a run a gate blocks says what blocked
it, how far the day got and what to run next; `requeue --ids` names the ids it does not know.
"""

import io
import json
import os
import pty
import re
import select
import subprocess
from pathlib import Path

import pytest
import yaml
from rich.cells import cell_len
from rich.console import Console

from llm_assets.cli.tables import FitTables
from llm_assets.demo.evaluate import print_eval
from llm_assets.demo.run import DEMO_PIPELINE, print_days
from llm_assets.evaluation.report import EvalReport
from llm_assets.resources.ledger import DEAD_LETTER, SUCCEEDED, LedgerResource, utcnow
from llm_assets.spec.load import load_specs
from llm_assets.util.settings import REPO_ROOT
from tests import cli_process
from tests.demo_run import shared_demo
from tests.harness import CLI
from tests.ledger_helpers import set_item_status
from tests.test_cli import DAY, Env

pytestmark = [pytest.mark.slow, pytest.mark.one_database]

COLUMNS = 80
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
MARKDOWN = ("|---", "**", "## ", "`")
"""What Markdown source shows that its rendering does not."""


class WidthEnv(Env):
    """test_cli's environment with the repo's prices (the local model costs $0, so no budget
    gate) unless `priced`; `changes` sets the spec's values at dotted paths."""

    def __init__(
        self,
        tmp_path: Path,
        database_url: str,
        priced: bool = False,
        changes: dict[str, object] | None = None,
    ) -> None:
        super().__init__(tmp_path, database_url)
        self.tmp_path = tmp_path
        # A spec's pandera_model may name a rule of tests/quality_rules.py: the CLI imports it
        # from the repository, whatever directory the suite runs in.
        self.vars["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
        if not priced:
            del self.vars["LLM_ASSETS_PRICES"]
        spec_file = self.specs / "support_tickets.yaml"
        spec = yaml.safe_load(spec_file.read_text())
        for path, value in (changes or {}).items():
            *parents, key = path.split(".")
            place = spec
            for parent in parents:
                place = place.setdefault(parent, {})
            place[key] = value
        spec_file.write_text(yaml.safe_dump(spec))

    def at(self, *args: str, columns: int = COLUMNS) -> subprocess.CompletedProcess[str]:
        return cli_process.run(
            [CLI, *args],
            env={**self.vars, "COLUMNS": str(columns)},
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )

    def on_terminal(self, *args: str, columns: int = COLUMNS) -> str:
        """What the command shows on a terminal `columns` wide (stdout and stderr)."""
        env = {**self.vars, "COLUMNS": str(columns), "TERM": "xterm-256color"}
        env.pop("NO_COLOR", None)
        main, child = pty.openpty()
        process = cli_process.Popen([CLI, *args], env=env, stdin=child, stdout=child, stderr=child)
        os.close(child)
        shown = bytearray()
        while True:
            ready, _, _ = select.select([main], [], [], 900)
            if not ready:
                process.kill()
                raise AssertionError(f"{args} showed nothing for 900 s")
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the terminal closed: the command ended
                break
            if not chunk:
                break
            shown += chunk
        os.close(main)
        assert process.wait(timeout=60) == 0, shown.decode(errors="replace")
        return shown.decode()


def _fits(text: str, columns: int = COLUMNS) -> None:
    too_wide = [line for line in text.splitlines() if cell_len(line) > columns]
    assert too_wide == [], too_wide
    assert "…" not in text, text


def _tokens(text: str) -> set[str]:
    return set(text.split())


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> WidthEnv:
    """A day of the demo's tickets (with its deliberately bad rows) run to the end."""
    tmp_path = tmp_path_factory.mktemp("width")
    # Shards of at most 4 requests: the status table has several.
    env = WidthEnv(
        tmp_path,
        f"sqlite:///{tmp_path / 'ledger.db'}",
        changes={"sharding.max_requests_per_shard": 4},
    )
    done = env.at("run", "support_tickets", "--date", DAY.isoformat(), "--wait")
    assert done.returncode == 0, done.stderr
    return env


def test_status_shows_every_batch_id_and_status_whole(day: WidthEnv) -> None:
    """A cancelled shard's status reads "imported (cancel)": at their cells' widths the columns
    are wider than 80, and the table wraps a header rather than cut a batch id; at 70 it
    leaves out the provider's status, and says so."""
    args = ("status", "support_tickets", "--date", DAY.isoformat())
    [job] = json.loads(day.at(*args, "--json").stdout)["jobs"]
    ledger = LedgerResource(database_url=day.database_url)
    first = job["shards"][0]["shard_id"]
    assert ledger.update_shard(first, cancelled_at=utcnow())

    shown = day.at(*args)

    assert shown.returncode == 0, shown.stderr
    _fits(shown.stdout)
    words = _tokens(shown.stdout)
    batches = {s["provider_batch_id"] for s in job["shards"]}
    assert len(batches) >= 2 and batches <= words
    assert {"imported", "(cancel)"} <= words
    said = " ".join(shown.stdout.split())
    assert f"support_tickets {DAY}, job {job['job_id']}: completed" in said

    narrow = day.at(*args, columns=70)

    _fits(narrow.stdout, 70)
    assert batches <= _tokens(narrow.stdout)
    said = " ".join(narrow.stdout.split())
    assert "not shown at 70 columns: provider status (status --json has them)" in said


def test_costs_shows_the_model_name_and_every_number_whole(day: WidthEnv) -> None:
    shown = day.at("costs", "support_tickets", "--from", DAY.isoformat(), "--to", DAY.isoformat())
    report = json.loads(
        day.at(
            "costs", "support_tickets", "--from", DAY.isoformat(), "--to", DAY.isoformat(), "--json"
        ).stdout
    )

    assert shown.returncode == 0, shown.stderr
    _fits(shown.stdout)
    [row] = report["rows"]
    # The day's row of the table (the notes under it name the model too).
    [line] = [line for line in shown.stdout.splitlines() if line.startswith(DAY.isoformat())]
    assert f"{row['provider']}/{row['model']}" in line.split()
    assert f"{row['succeeded']} of {row['items']}" in line
    assert f"{row['input_tokens']:,} in" in line


def test_dead_letter_reasons_show_whole_relative_to_the_home_without_reprs(
    day: WidthEnv,
) -> None:
    args = ("dead-letter", "support_tickets", "--date", DAY.isoformat())
    rows = json.loads(day.at(*args, "--json").stdout)

    shown = day.at(*args)

    assert shown.returncode == 0, shown.stderr
    _fits(shown.stdout)
    assert str(day.home) not in shown.stdout
    lines = shown.stdout.splitlines()
    header = next(line for line in lines if line.startswith("source id"))
    start = header.index("reason")
    reasons = "".join(line[start:] for line in lines[lines.index(header) + 2 :])
    squeezed = "".join(reasons.split())
    # Every reason names its row in the day's one source file, said once above the table.
    source = f"demo/inbox/tickets-{DAY}.jsonl"
    assert f"source file: {source} " in " ".join(shown.stdout.split())
    home = f"{day.home}/"
    for row in rows:
        reason = row["error_message"].replace(home, "")
        assert reason.startswith(f"{source}:"), reason
        by_line = re.sub(rf"{re.escape(source)}:(\d+)", r"line \1", reason)
        assert "".join(by_line.split()) in squeezed, by_line
        assert "['" not in reason and "[]" not in reason, reason
    blank = next(row for row in rows if row["error_code"] == "empty_field")
    assert blank["error_message"].endswith(": empty field: body")


EVAL_ONE_DAY = (
    "eval",
    "support_tickets",
    "--from",
    DAY.isoformat(),
    "--to",
    DAY.isoformat(),
    "--sample",
    "6",
)


def test_eval_report_is_plain_text_in_a_pipe(day: WidthEnv) -> None:
    shown = day.at(*EVAL_ONE_DAY)

    assert shown.returncode == 0, shown.stderr
    _fits(shown.stdout)
    assert not ANSI.search(shown.stdout)
    for source in MARKDOWN:
        assert source not in shown.stdout, source
    text = " ".join(shown.stdout.split())
    assert "Recommendation:" in text or "Confusion matrices" in text
    assert "report: artifacts/eval/support_tickets/reports/" in text


def test_eval_report_is_rendered_on_a_terminal(day: WidthEnv) -> None:
    shown = day.on_terminal(*EVAL_ONE_DAY)

    assert ANSI.search(shown), "nothing styled on a terminal"
    plain = ANSI.sub("", shown)
    # stderr shows here too (progress, Dagster's log lines): only what Markdown alone shows.
    assert "|---" not in plain and "**" not in plain
    assert "Confusion matrices" in plain


def test_demo_tables_cut_no_cell_at_80_columns(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The session's demo (tests/demo_run.py) printed again the way the demo prints it, on a
    console of 80 columns fitted as the CLI's are: its table of days, the tour's days and the
    eval's table."""
    made = shared_demo(tmp_path_factory).made
    spec = next(s for s in load_specs(REPO_ROOT / "pipelines") if s.name == DEMO_PIPELINE)
    out = io.StringIO()
    console = Console(file=out, width=COLUMNS)
    console.push_render_hook(FitTables(console))

    print_days(console, spec, made)
    report = EvalReport.model_validate(made["eval"]["report"])
    print_eval(console, report, made["eval"]["eval_report_partition"], "eval/report.md")

    shown = out.getvalue()
    _fits(shown)
    words = _tokens(shown)
    assert {"2026-11-02", "succeeded", "accuracy", "baseline", "terse_labels", "body_only"} <= words
    assert {made["empty_day"] + ":", "recommended"} <= words
    assert f"{made['blocked']['pipeline']} {made['blocked']['date']}: blocked:" in shown


@pytest.mark.parametrize(
    ("gate", "changes", "go_on"),
    [
        ("budget", {}, "--approve-budget"),
        # Every answer's summary is longer than the rule allows: all are quality failures.
        (
            "quality",
            {"output.pandera_model": "tests.quality_rules:TerseSummaries"},
            "--class quality",
        ),
        ("compliance", {"compliance.max_blocked_rate": 0.0}, "compliance.max_blocked_rate"),
    ],
)
def test_a_blocked_run_sums_up_the_day_and_says_how_to_go_on(
    tmp_path: Path, gate: str, changes: dict, go_on: str
) -> None:
    env = WidthEnv(
        tmp_path, f"sqlite:///{tmp_path / 'ledger.db'}", priced=gate == "budget", changes=changes
    )
    if gate == "compliance":
        inbox = env.home / "demo" / "inbox" / f"tickets-{DAY.isoformat()}.jsonl"
        card = {
            "ticket_id": "T-CARD-1",
            "created_at": f"{DAY.isoformat()}T09:00:00Z",
            "subject": "charged twice",
            "body": "My card 4111 1111 1111 1111 was charged twice, please refund one.",
            "channel": "email",
        }
        with inbox.open("a") as f:
            f.write(json.dumps(card) + "\n")

    blocked = env.at("run", "support_tickets", "--date", DAY.isoformat(), "--wait")

    assert blocked.returncode == 2, blocked.stderr
    assert blocked.stderr.strip().splitlines()[-1].startswith("blocked: ")
    _fits(blocked.stdout)
    said = " ".join(blocked.stdout.split())
    assert f"support_tickets {DAY}: blocked by the {gate} gate" in said
    [job] = json.loads(
        env.at("status", "support_tickets", "--date", DAY.isoformat(), "--json").stdout
    )["jobs"]
    assert f"{job['items']} items: " in said and f"(job {job['job_id']})" in said
    assert "to go on: " in said and go_on in said
    assert f"llm-assets run support_tickets --date {DAY} --wait" in said


def test_requeue_names_unknown_ids_and_requeues_only_known_ones(day: WidthEnv) -> None:
    date = ("--date", DAY.isoformat())
    dead = json.loads(day.at("dead-letter", "support_tickets", *date, "--json").stdout)
    before = json.loads(day.at("status", "support_tickets", *date, "--json").stdout)

    unknown = day.at("requeue", "support_tickets", *date, "--ids", "T-NOPE-1,T-NOPE-2")

    assert unknown.returncode == 1, unknown.stdout
    said = " ".join(unknown.stderr.split())
    assert "T-NOPE-1, T-NOPE-2: no dead letter of support_tickets" in said
    assert "requeued" not in unknown.stdout
    assert json.loads(day.at("dead-letter", "support_tickets", *date, "--json").stdout) == dead
    [same] = json.loads(day.at("status", "support_tickets", *date, "--json").stdout)["jobs"]
    [job] = before["jobs"]
    assert [s["shard_id"] for s in same["shards"]] == [s["shard_id"] for s in job["shards"]]
    assert same["by_status"] == job["by_status"]

    # A succeeded item made a deterministic dead letter: requeueing it sends it again.
    ledger = LedgerResource(database_url=day.database_url)
    item = next(
        row
        for row in ledger.iter_items(job["job_id"], [SUCCEEDED], columns=["custom_id", "source_id"])
    )
    moved = set_item_status(
        ledger,
        job["job_id"],
        [item["custom_id"]],
        from_status=[SUCCEEDED],
        status=DEAD_LETTER,
        error_class="deterministic",
        error_code="invalid_request",
        error_message="400 from the provider",
    )
    assert moved == 1

    some = day.at("requeue", "support_tickets", *date, "--ids", f"{item['source_id']},T-NOPE-3")

    assert some.returncode == 1, some.stderr
    assert "T-NOPE-3: no dead letter of support_tickets" in " ".join(some.stderr.split())
    assert "requeued 1 dead letters" in " ".join(some.stdout.split())
    [after] = json.loads(day.at("status", "support_tickets", *date, "--json").stdout)["jobs"]
    assert len(after["shards"]) == len(job["shards"]) + 1
