"""`llm-assets demo` under the default personal-data policy: the e-mail addresses, phone
numbers, IBANs and IP addresses of the generated tickets (redacted) and their card number and
API key (blocked) are in no request file, no artifact made from the prompts, no ledger row but
the pseudonym table's, no line the CLI prints and no Dagster event of its runs; the demo table
counts what was redacted and what was blocked. The demo's eval replays a sample of the day
through every variant of the pipeline, to the last answer, with the same policy.

The demo is the session's (tests/demo_run.py): `llm-assets demo` with its defaults, run as a
subprocess as `make demo` runs it, so all it logs is in its output; its days hold a card
number and the pasted API key (one of them per BLOCKED_EVERY tickets) and contact details of
every kind. Only
the input snapshots, the eval's sample (rows of the snapshot) and the demo's own inbox and
truth files hold the values: they are the source as it was read.
"""

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import pytest
import sqlalchemy as sa
import yaml
from dagster._core.instance.ref import InstanceRef

from llm_assets.demo.data import BAD_ROW_REASONS, BLOCKED_EVERY
from llm_assets.demo.run import DEMO_START
from llm_assets.resources.ledger import metadata
from llm_assets.util.settings import REPO_ROOT
from tests.demo_run import shared_demo

pytestmark = pytest.mark.slow

REDACTED = ("email", "phone", "iban", "ip_address")
BLOCKED = ("card", "credential")
PLACEHOLDERS = ("<EMAIL_1>", "<PHONE_1>", "<IBAN_1>", "<IP_ADDRESS_1>")


@dataclass(frozen=True)
class Demo:
    home: Path
    output: str
    """The CLI's stdout and stderr: the demo table and every log line."""
    truth: list[dict[str, Any]]
    made: dict[str, Any]
    """`llm-assets demo --json`."""

    def values(self) -> dict[str, str]:
        """Each personal value of the generated tickets (card numbers and IBANs also without
        their spaces and dashes) → its kind."""
        found: dict[str, str] = {}
        for row in self.truth:
            for kind, values in row.get("personal_data", {}).items():
                for value in values:
                    found[value] = kind
                    if kind in ("card", "iban"):
                        found[re.sub(r"[ -]", "", value)] = kind
        return found

    def table_row(self, first_cell: str) -> list[str]:
        """The cells of the demo table's row that starts with `first_cell`."""
        for line in self.output.splitlines():
            cells = [cell.strip() for cell in re.split("[│┃]", line.strip("│┃ \n"))]
            if cells[0] == first_cell:
                return cells
        raise AssertionError(f"no table row {first_cell!r} in:\n{self.output}")

    def items(self) -> int:
        """The demo pipeline's items over its days."""
        return sum(day["total"] for day in self.made["days"])


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    run = shared_demo(tmp_path_factory)
    return Demo(run.home, run.output, run.truth(), run.made)


def eval_sample() -> int:
    """The demo spec's eval.sample: the tickets each variant answers."""
    spec = yaml.safe_load((REPO_ROOT / "pipelines" / "support_tickets.yaml").read_text())
    return int(spec["eval"]["sample"])


def _leaks(text: str, values: dict[str, str]) -> list[str]:
    return [f"{kind} {value!r}" for value, kind in values.items() if value in text]


def _files_text(root: Path) -> str:
    """Every file under root as text; parquet tables as JSON lines of their rows."""
    chunks = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        if path.suffix == ".parquet":
            chunks.append(pd.read_parquet(path).to_json(orient="records", lines=True))
        else:
            chunks.append(path.read_bytes().decode("utf-8", "replace"))
    return "\n".join(chunks)


def test_the_day_holds_every_kind_of_personal_data(demo: Demo) -> None:
    kinds = Counter(demo.values().values())
    assert set(kinds) == {*REDACTED, *BLOCKED}
    blocked = [row for row in demo.truth if set(row.get("personal_data", {})) & set(BLOCKED)]
    tickets = sum(1 for row in demo.truth if row.get("ticket_id"))
    assert len(blocked) == tickets // BLOCKED_EVERY > 1


def test_no_request_file_holds_a_value_and_each_kind_went_as_a_placeholder(
    demo: Demo,
) -> None:
    requests = "\n".join(
        _files_text(root)
        for root in (demo.home / "artifacts" / "shards", demo.home / "local_provider")
        if root.exists()
    )
    assert requests.count('"custom_id"') >= demo.items()
    assert all(placeholder in requests for placeholder in PLACEHOLDERS)
    assert _leaks(requests, demo.values()) == []


def test_no_artifact_made_from_the_prompts_holds_a_value(demo: Demo) -> None:
    artifacts = demo.home / "artifacts"
    read = ("snapshots", "eval", "shards")
    kinds = sorted(p.name for p in artifacts.iterdir() if p.name not in read)
    assert kinds == ["dead_letters", "gate", "outputs", "published", "qa", "reports"]
    text = "\n".join(_files_text(artifacts / kind) for kind in kinds)
    assert _leaks(text, demo.values()) == []
    # The snapshot is the source as read, and the eval's sample rows are the snapshot's: the
    # values are there, so the scan can find them.
    assert _leaks(_files_text(artifacts / "snapshots"), demo.values())
    sample = _files_text(artifacts / "eval")
    assert sample.count('"ticket_id"') == eval_sample()


def test_no_ledger_row_holds_a_value_and_blocked_items_name_only_their_types(
    demo: Demo,
) -> None:
    engine = sa.create_engine(f"sqlite:///{demo.home / 'ledger.db'}")
    rows: list[str] = []
    with engine.connect() as conn:
        for table in metadata.sorted_tables:
            if table.name != "llm_batch_pseudonym":
                rows += [repr(tuple(row)) for row in conn.execute(sa.select(table))]
        blocked = conn.execute(
            sa.text(
                "SELECT source_id, error_code, error_message FROM llm_batch_result "
                "WHERE error_class = 'compliance' ORDER BY source_id"
            )
        ).all()
    engine.dispose()
    assert len(rows) > demo.items()
    assert _leaks("\n".join(rows), demo.values()) == []

    carried = {
        row["ticket_id"]: set(row["personal_data"]) & set(BLOCKED)
        for row in demo.truth
        if set(row.get("personal_data", {})) & set(BLOCKED)
    }
    assert {source_id for source_id, _, _ in blocked} == set(carried)
    for source_id, code, message in blocked:
        assert code == "personal_data_blocked"
        assert all(kind in message for kind in carried[source_id]), message


def test_no_line_the_cli_prints_holds_a_value(demo: Demo) -> None:
    first = demo.made["days"][0]
    blocked = first["dead_letters_by_class"]["compliance"]
    assert f"{blocked} of {first['total']} items" in demo.output
    assert _leaks(demo.output, demo.values()) == []


def test_no_dagster_event_of_the_demo_runs_holds_a_value(demo: Demo) -> None:
    instance = dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(demo.home / "dagster")))
    runs = instance.get_runs()
    events = "\n".join(str(entry) for run in runs for entry in instance.all_logs(run.run_id))
    # The day's build, the import that finishes it, the eval: every kind of run the demo makes.
    assert len(runs) >= 3 and "personal_data_found" in events
    assert _leaks(events, demo.values()) == []


def test_the_demo_table_counts_redacted_values_and_blocked_tickets(demo: Demo) -> None:
    prompts: dict[str, str] = {}
    inbox = demo.home / "demo" / "inbox" / f"tickets-{DEMO_START.isoformat()}.jsonl"
    for line in inbox.read_text().splitlines():
        row = json.loads(line)
        prompts.setdefault(row.get("ticket_id", ""), f"Subject: {row['subject']}\n\n{row['body']}")
    redacted = sum(
        prompts[row["ticket_id"]].count(value)
        for row in demo.truth
        if row["ticket_id"] in prompts
        for kind, values in row.get("personal_data", {}).items()
        if kind in REDACTED
        for value in values
    )

    header = demo.table_row("date")
    assert "personal data" in header
    column = header.index("personal data")
    day = demo.table_row(DEMO_START.isoformat())
    first = demo.made["days"][0]
    blocked = first["dead_letters_by_class"]["compliance"]
    assert day[column] == f"redacted {redacted}, blocked {blocked}"
    classes = f"compliance {blocked}, input {len(BAD_ROW_REASONS)}"
    assert day[header.index("dead letters by class")] == classes
    all_blocked = sum(d["dead_letters_by_class"].get("compliance", 0) for d in demo.made["days"])
    assert demo.table_row("all")[column].endswith(f", blocked {all_blocked}")


def eval_rows(demo: Demo, columns: str, table: str) -> list[Any]:
    """(pipeline, *columns) of the rows of a ledger table that belong to the demo's eval."""
    engine = sa.create_engine(f"sqlite:///{demo.home / 'ledger.db'}")
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                f"SELECT j.pipeline, {columns} FROM {table} t "
                "JOIN llm_batch_job j ON j.job_id = t.job_id WHERE j.created_by = 'demo'"
            )
        ).all()
    engine.dispose()
    return list(rows)


def test_the_demo_evaluates_every_variant_on_the_same_tickets_to_the_end(demo: Demo) -> None:
    rows = eval_rows(demo, "t.source_id, t.status", "llm_batch_result")
    size = eval_sample()
    sampled: dict[str, set[str]] = {}
    for pipeline, source_id, status in rows:
        sampled.setdefault(pipeline.split("__")[1], set()).add(source_id)
        assert status in ("succeeded", "dead_letter"), (pipeline, source_id, status)
    assert sorted(sampled) == ["baseline", "body_only", "terse_labels"]
    assert len(rows) == 3 * size
    assert sampled["baseline"] == sampled["body_only"] == sampled["terse_labels"]
    assert size < demo.items()

    def eval_row(variant: str) -> str:
        """The line of the eval table (no vertical rules) for the variant."""
        rows = [line.strip() for line in demo.output.splitlines() if line.split()[:1] == [variant]]
        assert rows, f"no eval row {variant!r} in:\n{demo.output}"
        return rows[0]

    # The report: each variant's accuracy is its validated categories against the agents'
    # filing, which is the generator's truth.
    reports = demo.home / "artifacts" / "eval" / "support_tickets" / "reports"
    [report_file] = [p for p in reports.glob("*.json") if not p.name.endswith(".request.json")]
    report = json.loads(report_file.read_text())
    assert (report["scoring"]["field"], report["scoring"]["against"]) == (
        "category",
        "agent_category",
    )
    truth = {row["ticket_id"]: row["category"] for row in demo.truth}
    answers = eval_rows(demo, "t.source_id, t.output_json", "llm_batch_output")
    correct: dict[str, int] = dict.fromkeys(sampled, 0)
    for pipeline, source_id, output_json in answers:
        variant = pipeline.split("__")[1]
        correct[variant] += json.loads(output_json)["category"] == truth.get(source_id)
    # A deliberately bad row (no agent saw it, so no agent_category) may be sampled: it is
    # left unscored, and the report says how many were.
    scored = len(sampled["baseline"] & truth.keys())
    assert scored >= size - len(BAD_ROW_REASONS)
    unscored = [n for n in report["notes"] if "have no 'agent_category'" in n]
    assert len(unscored) == (scored < size)
    for variant in report["variants"]:
        # Tickets the policy blocked or the checks refused were never sent: dead letters, but
        # no failure of the variant.
        never_sent = variant["dead_letters_by_class"]
        assert set(never_sent) <= {"input", "compliance"}
        assert variant["failure_rate"] == 0.0
        assert variant["n"] == scored
        assert variant["score"] == pytest.approx(correct[variant["name"]] / scored)
        row = eval_row(variant["name"])
        assert f" {variant['score']:.3f} (" in row, row
    chosen = report["recommendation"]["chosen"]["name"]
    assert eval_row(chosen).endswith(" recommended")
    assert f"{chosen} is the cheapest variant that meets the bar" in demo.output
