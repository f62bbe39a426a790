"""The gemini provider through the real CLI in subprocesses against the fake Gemini server:
a day end to end with the key and endpoint from the SDK's variables, a SIGKILL right after a
batch job was created or in the middle of an import that neither creates nor sends again,
and the batch-status sensor polling Gemini jobs until it asks for their import."""

import io
import json
import signal
import subprocess
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from google import genai

from llm_assets import names
from llm_assets.defs.factory import asset_key
from llm_assets.resources.ledger import LedgerResource, ShardRecord
from llm_assets.resources.providers.gemini_batch import GeminiBatchProvider
from tests import cli_process
from tests import test_gemini_provider as gemini_tests
from tests.fakes.gemini_server import FakeGemini
from tests.harness import CLI, DAY, Harness, cli_env, provider_for, review_spec, write_reviews
from tests.ledger_helpers import jobs_for_pipeline
from tests.test_sensors import tick

pytestmark = [
    pytest.mark.slow,
    pytest.mark.one_database,
    pytest.mark.fake_server("gemini", responder=gemini_tests.truthful, api_keys={"test-key"}),
]
harness = gemini_tests.harness

MODEL = "gemini-2.5-flash"
REVIEWS = 30
"""Three shards of ten: enough for a kill between two shards' imports."""
CREATE = ":batchGenerateContent"


class Day:
    """One day of the review pipeline on gemini, run by `llm-assets run --wait` processes."""

    def __init__(self, tmp_path: Path, database_url: str, fake: FakeGemini) -> None:
        spec = review_spec("gemini", MODEL)
        self.name = spec["name"]
        self.truth = write_reviews(tmp_path / "home", DAY, REVIEWS)
        self.ledger = LedgerResource(database_url=database_url)
        self.fake = fake
        self.env = cli_env(tmp_path, database_url, spec, fake)

    def run(self, failpoint: str | None = None) -> subprocess.CompletedProcess[str]:
        env = dict(self.env)
        if failpoint is not None:
            env["LLM_ASSETS_FAILPOINT"] = failpoint
        args = [CLI, "run", self.name, "--date", DAY.isoformat(), "--wait"]
        args += ["--poll-interval", "0.05", "--json"]
        return cli_process.run(args, env=env, capture_output=True, text=True, timeout=300)

    def shards(self) -> list[ShardRecord]:
        [job] = jobs_for_pipeline(self.ledger, self.name)
        return self.ledger.shards(job.job_id)

    def items(self) -> list[dict[str, Any]]:
        [job] = jobs_for_pipeline(self.ledger, self.name)
        columns = ["custom_id", "source_id", "status", "attempts", "result_json"]
        return list(self.ledger.iter_items(job.job_id, columns=columns))

    def creates(self) -> Counter[str]:
        """display_name -> batch jobs the fake created under it."""
        return Counter(
            c["display_name"]
            for c in self.fake.calls.entries()
            if c["method"] == "POST" and c["path"].endswith(CREATE) and c["status"] == 200
        )


@pytest.fixture
def day(tmp_path: Path, database_url: str, fake: FakeGemini) -> Day:
    return Day(tmp_path, database_url, fake)


def assert_done_once(day: Day, done: subprocess.CompletedProcess[str]) -> None:
    """The run finished the day, every item succeeded with the true label, and the fake
    holds one batch job per shard and ran every request once."""
    assert done.returncode == 0, done.stderr
    [outcome] = json.loads(done.stdout)
    assert outcome["done"] and outcome["open_items"] == 0
    assert (outcome["total"], outcome["succeeded"], outcome["dead_letters"]) == (
        REVIEWS,
        REVIEWS,
        0,
    )
    items = day.items()
    assert len(items) == REVIEWS
    assert {r["status"] for r in items} == {"succeeded"}
    assert {r["source_id"]: json.loads(r["result_json"])["label"] for r in items} == day.truth
    shards = day.shards()
    assert len(shards) == 3
    assert day.creates() == {s.shard_id: 1 for s in shards}
    assert Counter(b["displayName"] for b in day.fake.batches.values()) == day.creates()
    assert {s.provider_batch_id for s in shards} == set(day.fake.batches)
    # No request ran twice, and none was sent again after it succeeded.
    assert dict(day.fake.billed) == {r["custom_id"]: 1 for r in items}
    assert {r["attempts"] for r in items} == {1}


def test_a_day_runs_end_to_end_with_the_key_and_endpoint_from_the_environment(
    day: Day, fake: FakeGemini
) -> None:
    done = day.run()

    assert_done_once(day, done)
    calls = fake.calls.entries()
    # Every call reached Batch Mode's version; every one but an upload's chunks (their
    # upload id authorizes them) carried the key, which the fake accepts only as test-key.
    assert {c.get("api_version") for c in calls} == {"v1beta"}
    assert all(c["keyed"] for c in calls if "upload_id=" not in c.get("query", ""))
    assert all(c["status"] == 200 for c in calls), [c for c in calls if c["status"] != 200]
    uploads = [c for c in calls if c["path"].startswith("/upload/") and "query" not in c]
    assert len(uploads) == 3  # one input file per shard
    downloads = [c for c in calls if c["path"].endswith(":download")]
    assert len(downloads) == 3  # each responses file read once


@pytest.mark.parametrize("point", ["submit.after_create", "import.after_shard:2"])
def test_a_kill_after_create_or_mid_import_neither_creates_nor_sends_again(
    day: Day, fake: FakeGemini, point: str
) -> None:
    killed = day.run(point)

    assert killed.returncode == -signal.SIGKILL, killed.stderr
    created = {b["name"]: b["displayName"] for b in fake.batches.values()}
    if point == "submit.after_create":
        # The first shard's job exists at Google, but the ledger never heard its name.
        [(lost, shard_id)] = created.items()
        [first] = [s for s in day.shards() if s.shard_id == shard_id]
        assert first.provider_batch_id is None and first.submit_intent_at is not None
    else:
        assert len(created) == 3
    listed_before = sum(c["path"] == "/v1beta/batches" for c in fake.calls.entries())

    done = day.run()

    assert_done_once(day, done)
    listed = sum(c["path"] == "/v1beta/batches" for c in fake.calls.entries()) - listed_before
    # The jobs made before the kill are the shards' jobs: none was made again.
    assert {s.provider_batch_id: s.shard_id for s in day.shards()}.items() >= created.items()
    if point == "submit.after_create":
        # The lost job was found by listing the batches and adopted.
        assert listed >= 1


def test_the_sensor_records_gemini_progress_then_requests_the_import_of_ended_jobs(
    harness: Harness, fake: FakeGemini
) -> None:
    fake.polls_per_state = 2
    shards = harness.submit()
    assert len(shards) == 3 and all(s.provider_batch_id in fake.batches for s in shards)
    submitted = len(fake.calls.entries())
    seen: dict[str, list[tuple[str, str]]] = {s.shard_id: [] for s in shards}

    for _ in range(1, 11):
        result = tick(harness)
        # Every tick polls every job in flight (a poll that failed would be logged and the
        # job left for the next tick): the ledger has each job's state of this tick.
        for shard in harness.ledger.shards(harness.job_id()):
            seen[shard.shard_id].append((shard.status, str(shard.raw_status)))
        [event] = result.asset_events  # the day's state, with every job's
        assert isinstance(event, dg.AssetObservation)
        assert event.asset_key == asset_key(harness.spec, "provider_batches")
        assert event.partition == DAY.isoformat()
        if result.run_requests:
            break

    # Each state lasted two gets, one per tick, and the jobs ended on the fifth.
    progress = [
        ("submitted", "pending"),
        ("submitted", "pending"),
        ("running", "running"),
        ("running", "running"),
        ("completed", "succeeded"),
    ]
    assert seen == {s.shard_id: progress for s in shards}
    [request] = result.run_requests
    batch_ids = sorted(str(s.provider_batch_id) for s in shards)
    assert request.run_key == ",".join(batch_ids)
    assert request.partition_key == DAY.isoformat()
    assert {asset_key(harness.spec, s) for s in names.IMPORT_ASSETS} <= set(request.asset_selection)
    # The ticks asked for status alone, keyed and on Batch Mode's version: no download, no
    # list, no create.
    polls = fake.calls.entries()[submitted:]
    assert {(c["method"], c["api_version"], c["keyed"], c["status"]) for c in polls} == {
        ("GET", "v1beta", True, 200)
    }
    assert Counter(c["path"] for c in polls) == {f"/v1beta/{b}": 5 for b in batch_ids}

    assert harness.materialize("batch_results").success
    assert harness.labels() == harness.truth
    assert dict(fake.billed) == {cid: 1 for cid in harness.rows()}
    # Imported once: the next tick asks to finish the day, not to import again.
    [finish] = tick(harness).run_requests
    assert finish.run_key.startswith(f"finish:{harness.job_id()}:3:")


def test_a_new_adapter_polled_from_several_threads_at_once_answers_every_poll(
    fake: FakeGemini, client: genai.Client
) -> None:
    """What a batch-status tick does: a resource made for the tick polls its jobs in
    parallel, so the adapter's first calls come from several threads at once. Each must be
    answered; none may fail on a transport another thread's client closed."""
    fake.polls_per_state = 1000
    names = []
    for n in range(8):
        line = {"key": f"k{n}", "request": {"contents": [{"parts": [{"text": "Fine."}]}]}}
        upload = {"mime_type": "application/jsonl", "display_name": f"shard-{n}"}
        source = client.files.upload(file=io.BytesIO(json.dumps(line).encode()), config=upload)
        batch = client.batches.create(
            model=MODEL, src=str(source.name), config={"display_name": f"shard-{n}"}
        )
        names.append(str(batch.name))

    failures: Counter[str] = Counter()
    rounds = 10
    for _ in range(rounds):
        adapter = provider_for(fake)

        def poll(name: str, adapter: GeminiBatchProvider = adapter) -> str | None:
            try:
                adapter.poll_briefly(name, timeout_seconds=1.0)
            except Exception as exc:
                return f"{type(exc).__name__}: {exc}"
            return None

        with ThreadPoolExecutor(max_workers=8) as pool:
            failures.update(f for f in pool.map(poll, names) if f is not None)

    assert failures == Counter(), (
        f"{failures.total()} of {rounds * len(names)} polls failed: {dict(failures)}"
    )
