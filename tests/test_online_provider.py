"""The online provider against the fake OpenAI-compatible endpoint, through the official SDK:
faults and retries, rate limits as the server measures them, checkpoints, kill -9 and
SIGTERM in the middle of a shard."""

import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_assets.resources.ledger import TERMINAL
from llm_assets.resources.providers.online import OnlineProvider, parse_duration
from tests import cli_process
from tests.fakes.online_server import FakeOnline
from tests.fakes.openai_server import user_text
from tests.harness import CLI, DAY, Harness, open_harness, review_spec, truthful, write_reviews
from tests.provider_kits import dead_letters

pytestmark = [
    pytest.mark.slow,
    pytest.mark.one_database,
    pytest.mark.fake_server("online", responder=truthful),
]


def online_spec(**online: Any) -> dict[str, Any]:
    settings = {"timeout_seconds": 5.0, "checkpoint_every": 5, **online}
    return review_spec(
        "online", "gpt-4o-mini", online=settings, retry={"max_attempts": 3, "backoff_seconds": 0}
    )


def harness_for(
    tmp_path: Path, database_url: str, fake: FakeOnline, reviews: int = 24, **online: Any
) -> Iterator[Harness]:
    provider = OnlineProvider(
        base_url=fake.base_url, backoff_base_seconds=0.01, backoff_cap_seconds=0.05
    )
    spec = online_spec(**online)
    with open_harness(tmp_path, database_url, spec, provider, reviews=reviews) as harness:
        yield harness


def sent_by_id(fake: FakeOnline) -> Counter[str]:
    return Counter(c.request_id for c in fake.calls() if c.request_id)


def test_a_day_completes_through_faults_and_a_success_is_never_sent_again(
    tmp_path: Path, database_url: str, fake: FakeOnline
) -> None:
    tries: Counter[str] = Counter()

    def fault(request_id: str | None, body: dict[str, Any]) -> str | None:
        assert request_id is not None
        tries[request_id] += 1
        text = user_text(body)
        if "Order 1003" in text:
            return "400"  # deterministic: dead letter, never retried
        if tries[request_id] > 1:
            return None
        for marker, kind in (
            ("Order 1001", "500"),
            ("Order 1002", "503"),
            ("Order 1004", "429"),
            ("Order 1005", "timeout"),
            ("Order 1006", "reset"),
        ):
            if marker in text:
                return kind
        return None

    fake.fault = fault
    fake.timeout_seconds = 2.0
    seen: list[tuple[str, int, int]] = []
    for harness in harness_for(tmp_path, database_url, fake, timeout_seconds=0.5):
        outcome = harness.runner().run_day(DAY, wait=True, progress=lambda *args: seen.append(args))

        assert outcome.done and outcome.total == 24
        rows = harness.rows()
        assert dead_letters(rows) == [("R-20261102-0003", "deterministic")]
        successes = fake.successes()
        assert len(successes) == len(set(successes)) == 23
        assert set(successes) == {cid for cid, r in rows.items() if r["status"] == "succeeded"}
        sent = sent_by_id(fake)
        faulted = {cid for cid, n in tries.items() if n > 1}
        assert {rows[cid]["source_id"][-4:] for cid in faulted} == {
            "0001",
            "0002",
            "0004",
            "0005",
            "0006",
        }
        assert all(n == 1 for cid, n in sent.items() if cid not in faulted)
        # Realtime prices, no batch discount; usage as the endpoint reported it.
        assert all(r["cost_usd"] > 0 for r in rows.values() if r["status"] == "succeeded")
        # Progress per shard (10 requests each, 4 in the last), as the CLI's bar shows it.
        assert {("online", 10, 10), ("online", 4, 4)} <= set(seen)


def test_the_limits_hold_as_the_server_measures_them(
    tmp_path: Path, database_url: str, fake: FakeOnline
) -> None:
    fake.rpm_limit = 1200
    fake.latency_seconds = 0.05
    for harness in harness_for(tmp_path, database_url, fake, reviews=50, rpm=1200, concurrency=8):
        started = time.monotonic()
        assert harness.materialize("input_snapshot", "request_shards", "provider_batches").success
        elapsed = time.monotonic() - started
        assert fake.rate_limited() == 0
        assert fake.max_in_window(1.0) <= 20
        assert len(fake.successes()) == 50
        # 50 requests at 20 a second: paced, not bursted (the first second has at most 20).
        assert elapsed >= 2.0


def test_429s_from_a_stricter_server_are_waited_out(
    tmp_path: Path, database_url: str, fake: FakeOnline
) -> None:
    fake.rpm_limit = 600  # the spec does not know: the server's 429s and headers must do
    for harness in harness_for(tmp_path, database_url, fake, reviews=30, concurrency=8):
        outcome = harness.run_day()
        assert outcome.succeeded == 30
        successes = fake.successes()
        assert len(successes) == len(set(successes)) == 30
        assert fake.rate_limited() > 0
        assert fake.max_in_window(1.0, status=200) <= 10


def test_parse_duration_reads_openai_reset_headers() -> None:
    assert parse_duration("1.5") == 1.5
    assert parse_duration("20ms") == pytest.approx(0.02)
    assert parse_duration("6m0s") == 360
    assert parse_duration("1h2m3.5s") == pytest.approx(3723.5)
    assert parse_duration("soon") is None


def cli_env(tmp_path: Path, database_url: str, fake: FakeOnline, **online: Any) -> dict[str, str]:
    specs = tmp_path / "specs"
    specs.mkdir(exist_ok=True)
    (specs / "reviews.yaml").write_text(yaml.safe_dump(online_spec(**online)))
    write_reviews(tmp_path / "home", DAY, 60)
    return {
        **os.environ,
        "LLM_ASSETS_HOME": str(tmp_path / "home"),
        "LLM_ASSETS_DATABASE_URL": database_url,
        "LLM_ASSETS_PIPELINES": str(specs),
        "DAGSTER_HOME": str(tmp_path / "dagster"),
        "LLM_ASSETS_ONLINE_BASE_URL": fake.base_url,
    }


def run_args() -> list[str]:
    return [CLI, "run", "reviews_online", "--date", DAY.isoformat(), "--wait", "--json"]


def ledger_rows(database_url: str) -> dict[str, dict[str, Any]]:
    import sqlalchemy as sa

    from llm_assets.resources.ledger import LedgerResource, result_table

    ledger = LedgerResource(database_url=database_url)
    with ledger.engine.connect() as conn:
        return {r.custom_id: dict(r._mapping) for r in conn.execute(sa.select(result_table))}


def test_kill_9_mid_shard_then_resume_sends_only_what_has_no_result(
    tmp_path: Path, database_url: str, fake: FakeOnline
) -> None:
    fake.latency_seconds = 0.02
    env = cli_env(tmp_path, database_url, fake, concurrency=4)
    killed = cli_process.run(
        run_args(),
        env={**env, "LLM_ASSETS_FAILPOINT": "online.after_checkpoint:3"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    before = ledger_rows(database_url)
    checkpointed = {cid for cid, r in before.items() if r["status"] in TERMINAL}
    assert 15 <= len(checkpointed) < 60  # three checkpoints of five, maybe a fourth

    done = cli_process.run(run_args(), env=env, capture_output=True, text=True, timeout=300)

    assert done.returncode == 0, done.stderr
    after = ledger_rows(database_url)
    assert len(after) == 60 and all(r["status"] == "succeeded" for r in after.values())
    sent = sent_by_id(fake)
    # Nothing with a result in the ledger was sent again; only what was in flight (or
    # answered but not yet checkpointed) at the kill went twice.
    assert all(sent[cid] == 1 for cid in checkpointed)
    assert sum(n - 1 for n in sent.values()) <= 4 + 5


def test_sigterm_finishes_what_is_in_flight_and_checkpoints_it(
    tmp_path: Path, database_url: str, fake: FakeOnline
) -> None:
    fake.latency_seconds = 0.1
    env = cli_env(tmp_path, database_url, fake, concurrency=4, checkpoint_every=25)
    process = cli_process.Popen(
        run_args(), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while len(fake.successes()) < 8:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)  # waiting on another process
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)

    assert process.returncode == 1, stderr
    assert "stopped by SIGTERM" in stderr
    rows = ledger_rows(database_url)
    succeeded = {cid for cid, r in rows.items() if r["status"] == "succeeded"}
    # Every answer the endpoint gave before the stop is in the ledger: nothing was lost.
    assert set(fake.successes()) == succeeded
    assert len(succeeded) < 60

    done = cli_process.run(run_args(), env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    successes = fake.successes()
    assert len(successes) == len(set(successes)) == 60


def test_the_token_limit_holds_as_the_server_measures_it(
    tmp_path: Path, database_url: str, fake: FakeOnline
) -> None:
    # About 140 tokens a request (prompt plus max_tokens, as OpenAI estimates): 10 a second.
    fake.tpm_limit = 84_000
    for harness in harness_for(tmp_path, database_url, fake, reviews=30, tpm=84_000):
        assert harness.materialize("input_snapshot", "request_shards", "provider_batches").success
        assert fake.rate_limited() == 0
        assert len(fake.successes()) == 30
