"""Crash safety: SIGKILL a real `llm-assets run --wait` at every failpoint, then re-run.

Each run dies at the next named point (LLM_ASSETS_FAILPOINT, see llm_assets/util/failpoints.py),
so one partition is killed at every step boundary and inside submission, import and retry
planning; a last run without a failpoint finishes it. The fake provider's own records are
the witness: nothing is sent again after success and no paid batch is orphaned.
"""

import json
import os
import random
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml

from llm_assets.resources.ledger import LedgerResource, result_table, shard_table
from llm_assets.steps import UNFINISHED, GateRecord
from llm_assets.util.failpoints import POINTS
from tests import cli_process
from tests.fakes.azure_openai_server import FakeAzureOpenAI
from tests.fakes.common import ControlFault
from tests.fakes.openai_server import FakeOpenAI, user_text
from tests.harness import CLI, DAY, review_spec, truthful, write_reviews

pytestmark = [pytest.mark.slow, pytest.mark.fake_server("openai", responder=truthful)]
KILLED = -signal.SIGKILL


@pytest.fixture
def ledger_url(one_database_url: str) -> str:
    return one_database_url


def provider_env(fake: FakeOpenAI) -> dict[str, str]:
    """The variables that point the fake's SDK client at it, with a key it accepts."""
    if isinstance(fake, FakeAzureOpenAI):
        return {
            "AZURE_OPENAI_ENDPOINT": fake.base_url,
            "AZURE_OPENAI_API_KEY": "test-key",
            "OPENAI_API_VERSION": "2024-10-21",
        }
    return {"OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "test-key"}


class Partition:
    def __init__(
        self,
        tmp_path: Path,
        ledger_url: str,
        fake: FakeOpenAI,
        items: int,
        slices: int = 1,
        model: dict[str, Any] | None = None,
    ) -> None:
        specs = tmp_path / "specs"
        specs.mkdir()
        provider = "azure_openai" if isinstance(fake, FakeAzureOpenAI) else "openai"
        spec = review_spec(
            provider,
            "gpt-4o-mini",
            sharding={"max_requests_per_shard": max(10, items // 8), "slices": slices},
            retry={"max_attempts": 4, "backoff_seconds": 0},
            model=model or {},
        )
        self.name = spec["name"]
        (specs / "reviews.yaml").write_text(yaml.safe_dump(spec))
        self.home = tmp_path / "home"
        self.truth = write_reviews(self.home, DAY, items)
        self.ledger_url = ledger_url
        self.fake = fake
        self.env = {
            **os.environ,
            "LLM_ASSETS_HOME": str(self.home),
            "LLM_ASSETS_DATABASE_URL": ledger_url,
            "LLM_ASSETS_PIPELINES": str(specs),
            "DAGSTER_HOME": str(tmp_path / "dagster"),
            **provider_env(fake),
        }
        self.env.pop("LLM_ASSETS_FAILPOINT", None)

    def run(self, failpoint: str | None = None) -> subprocess.CompletedProcess[str]:
        env = dict(self.env)
        if failpoint:
            env["LLM_ASSETS_FAILPOINT"] = failpoint
        args = ["run", self.name, "--date", DAY.isoformat(), "--wait", "--poll-interval", "0.02"]
        return cli_process.run(
            [CLI, *args, "--json"], env=env, capture_output=True, text=True, timeout=600
        )

    def ledger_rows(self) -> list[dict[str, Any]]:
        with LedgerResource(database_url=self.ledger_url).engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(sa.select(result_table))]

    def shards(self) -> list[dict[str, Any]]:
        with LedgerResource(database_url=self.ledger_url).engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(sa.select(shard_table))]

    def assert_invariants(self) -> dict[str, int]:
        """The numbers the issue asks for; every one of them must be zero but `items`."""
        return assert_provider_invariants(self.ledger_url, self.fake, set(self.truth))


def assert_provider_invariants(
    ledger_url: str, fake: FakeOpenAI, source_ids: set[str]
) -> dict[str, int]:
    """Every item of `source_ids` once in the ledger and terminal, and the fake provider's
    own records as the witness: nothing sent beyond the attempts the ledger counted (so
    nothing sent again after a success), no batch created that the ledger does not hold (a
    batch paid for twice), none recorded twice. Every number but `items` must be zero."""
    ledger = LedgerResource(database_url=ledger_url)
    with ledger.engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(sa.select(result_table))]
        shards = [dict(r._mapping) for r in conn.execute(sa.select(shard_table))]
    ledger.engine.dispose()
    submitted = Counter(fake.submitted_custom_ids())
    by_id = Counter(r["custom_id"] for r in rows)
    recorded = [s["provider_batch_id"] for s in shards if s["provider_batch_id"]]
    create_path = "/openai/batches" if isinstance(fake, FakeAzureOpenAI) else "/v1/batches"
    created = [
        e["batch_id"]
        for e in fake.calls.entries()
        if e.get("batch_id")
        and e["method"] == "POST"
        and e["path"] == create_path
        and e["status"] == 200
    ]
    numbers = {
        "items": len(rows),
        "items_lost": len(source_ids - {r["source_id"] for r in rows}),
        "duplicate_ledger_rows": sum(n - 1 for n in by_id.values()),
        "not_terminal": sum(r["status"] not in ("succeeded", "dead_letter") for r in rows),
        # Each send the provider saw is an attempt the ledger counted: a send beyond that
        # would be a re-submission (of a success, or of a batch paid twice).
        "sends_beyond_attempts": sum(
            max(0, submitted[r["custom_id"]] - r["attempts"]) for r in rows
        ),
        "resubmitted_after_success": sum(
            r["status"] == "succeeded" and submitted[r["custom_id"]] > r["attempts"] for r in rows
        ),
        "orphaned_paid_batches": len(set(created) - set(recorded)),
        "batches_recorded_twice": len(recorded) - len(set(recorded)),
        "dead_letters_without_reason": sum(
            r["status"] == "dead_letter" and not r["error_message"] for r in rows
        ),
    }
    assert numbers["items"] == len(source_ids)
    assert {k: v for k, v in numbers.items() if k != "items" and v} == {}, numbers
    return numbers


def gate_of(partition: Partition) -> GateRecord:
    """The day's publication gate record, read from the artifacts."""
    path = partition.home / "artifacts" / "gate" / partition.name / f"{DAY}.json"
    return GateRecord.model_validate_json(path.read_bytes())


def transient_once(every: int) -> Any:
    seen: set[str] = set()

    def fault(custom_id: str, body: dict[str, Any]) -> str | None:
        number = int(user_text(body).split("Order ")[1].split(" ")[0]) - 1000
        if number % every == 0 and custom_id not in seen:
            seen.add(custom_id)
            return "5xx"
        return None

    return fault


def test_killed_at_every_failpoint_the_partition_still_ends_exactly_once(
    tmp_path: Path, ledger_url: str, fake: FakeOpenAI
) -> None:
    fake.line_fault = transient_once(every=7)
    # The day is built in two slices (steps of their own, joined before submission).
    partition = Partition(tmp_path, ledger_url, fake, items=80, slices=2)
    sequence = [
        "snapshot.after_write",
        "shards.after_file",
        "shards.after_record:2",
        "slices.after_build",
        "slices.after_build:2",
        "submit.after_intent",
        "submit.after_create",
        "submit.after_create:2",
        "submit.after_record:3",
        "runner.between_runs",
        "import.after_upsert",
        "import.after_upsert:2",
        "import.after_shard:3",
        "retry.after_file",
        "submit.after_create",
        # The run that imports the retry validates the day in the same Dagster run.
        "validate.after_write",
        "runner.between_runs",
    ]
    assert {point.split(":")[0] for point in sequence} == set(POINTS)
    killed = []
    for point in sequence:
        result = partition.run(point)
        assert result.returncode in (KILLED, 0), result.stderr
        if result.returncode == KILLED:
            killed.append(point)
            # Between kills the ledger is consistent: no row twice, no batch recorded twice.
            rows = partition.ledger_rows()
            assert len({r["custom_id"] for r in rows}) == len(rows)
            recorded = [
                s["provider_batch_id"] for s in partition.shards() if s["provider_batch_id"]
            ]
            assert len(recorded) == len(set(recorded))
            if point == "validate.after_write":
                # Killed inside validation: the day is held back, never published on the
                # verdict of an earlier validation.
                assert gate_of(partition).blocked_by == [UNFINISHED]

    final = partition.run()

    assert final.returncode == 0, final.stderr
    [outcome] = json.loads(final.stdout)
    assert outcome["open_items"] == 0
    assert len(killed) >= 12, killed
    assert "validate.after_write" in killed
    assert "slices.after_build" in killed
    assert gate_of(partition).blocked_by == []
    assert (partition.home / "artifacts" / "published" / partition.name / f"{DAY}.parquet").exists()
    numbers = partition.assert_invariants()
    assert numbers["items"] == 80
    labels = {
        r["source_id"]: json.loads(r["result_json"])["label"]
        for r in partition.ledger_rows()
        if r["status"] == "succeeded"
    }
    assert labels == partition.truth


@pytest.mark.fake_server(
    "azure_openai", responder=truthful, deployments={"reviews-4o-mini": "gpt-4o-mini"}
)
def test_azure_killed_after_create_finds_its_batch_instead_of_paying_twice(
    tmp_path: Path, ledger_url: str, fake: FakeAzureOpenAI
) -> None:
    partition = Partition(
        tmp_path, ledger_url, fake, items=20, model={"options": {"deployment": "reviews-4o-mini"}}
    )

    killed = partition.run("submit.after_create")

    assert killed.returncode == KILLED, killed.stderr
    # The provider has the batch; the ledger has only the intent to create it.
    [created] = fake.store.all_batches()
    [intended] = [s for s in partition.shards() if s["submit_intent_at"] is not None]
    assert intended["provider_batch_id"] is None

    final = partition.run()

    assert final.returncode == 0, final.stderr
    shards = {s["shard_id"]: s for s in partition.shards()}
    assert shards[intended["shard_id"]]["provider_batch_id"] == created["id"]
    assert len(fake.store.all_batches()) == len(shards)
    numbers = partition.assert_invariants()
    assert numbers["items"] == 20
    assert {e.get("auth") for e in fake.calls.entries()} == {"api-key"}


def test_chaos_two_thousand_items_with_faults_of_every_class_and_random_kills(
    tmp_path: Path, ledger_url: str, fake: FakeOpenAI
) -> None:
    rng = random.Random(2026)
    items = 2000
    plan: dict[str, str] = {}
    # The first bound a roll is below picks the fault: 2% 5xx, 1% 429, 2% 4xx and so on.
    odds = [
        (0.02, "5xx"),
        (0.03, "429"),
        (0.05, "4xx"),
        (0.07, "missing"),
        (0.09, "duplicate"),
        (0.10, "expire"),
    ]

    def line_fault(custom_id: str, body: dict[str, Any]) -> str | None:
        if custom_id in plan:  # each item misbehaves at most once, then answers
            return None
        roll = rng.random()
        kind = next((fault for below, fault in odds if roll < below), None)
        plan[custom_id] = kind or "ok"
        return kind

    garbage: set[str] = set()

    def responder(body: dict[str, Any]) -> str:
        text = user_text(body)
        if rng.random() < 0.02 and text not in garbage:
            garbage.add(text)
            return "{not json"
        return truthful(body)

    fake.line_fault = line_fault
    fake.responder = responder
    expired_batches: set[str] = set()

    def outcome_of(batch: dict[str, Any]) -> str:
        if len(expired_batches) < 1 and rng.random() < 0.5:
            expired_batches.add(batch["id"])
            return "expired"
        return "completed"

    fake.batch_outcome = outcome_of
    fake.faults.add(ControlFault("POST", "/v1/batches", status=500, times=2))
    fake.faults.add(ControlFault("GET", "/v1/batches/", status=500, times=3))
    fake.faults.add(ControlFault("POST", "/v1/files", status=429, times=2, retry_after=0))
    fake.faults.add(ControlFault("GET", "/v1/files/", status=502, times=2))
    partition = Partition(tmp_path, ledger_url, fake, items=items)

    # Random points, in the order a partition reaches them, at a random pass of each.
    skipped = ("snapshot.after_write", "slices.after_build", "runner.between_runs")
    order = [p for p in POINTS if p not in skipped]
    points = sorted(rng.sample(order, 6), key=order.index)
    kills = 0
    for round_no, point in enumerate(points):
        result = partition.run(f"{point}:{rng.randint(1, 2)}")
        assert result.returncode in (KILLED, 0), result.stderr
        kills += result.returncode == KILLED
        if round_no == 2:
            fake.restart()
    final = partition.run()

    assert final.returncode == 0, final.stderr
    numbers = partition.assert_invariants()
    rows = partition.ledger_rows()
    classes = Counter(r["error_class"] for r in rows if r["status"] == "dead_letter")
    print(
        f"chaos: {items} items, {kills} kills, faults planned "
        f"{Counter(v for v in plan.values() if v != 'ok')}, garbage {len(garbage)}, "
        f"dead letters by class {dict(classes)}, numbers {numbers}"
    )
    assert kills >= 3
    assert classes["deterministic"] == sum(1 for v in plan.values() if v == "4xx")
    succeeded = sum(r["status"] == "succeeded" for r in rows)
    assert succeeded + sum(classes.values()) == items
