"""Batches stuck before they start: found by the model's history, announced once by the
batch-status sensor with the operator's options, and listed by `status`."""

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from llm_assets.cli import main as cli
from llm_assets.resources.ledger import ShardRecord
from llm_assets.resources.providers.openai_batch import OpenAIBatchProvider
from llm_assets.steps import stuck
from tests.fakes.openai_server import FakeOpenAI
from tests.harness import DAY, Harness, open_harness, provider_for, review_spec, truthful
from tests.test_sensors import tick

NOW = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.UTC)


def _shard(shard_id: str, *, submitted_minutes_ago: float, started: bool = False) -> ShardRecord:
    submitted = NOW - dt.timedelta(minutes=submitted_minutes_ago)
    return ShardRecord(
        shard_id=shard_id,
        job_id="j",
        round=0,
        shard_index=0,
        input_uri="file:///s.jsonl",
        item_count=10,
        size_bytes=100,
        content_sha256="0" * 64,
        provider="gemini",
        provider_batch_id=f"batches/{shard_id}",
        output_uri=None,
        error_uri=None,
        status="submitted",
        raw_status="pending",
        message=None,
        retry_count=0,
        completed_requests=0,
        failed_requests=0,
        not_before=None,
        submit_intent_at=submitted,
        submitted_at=submitted,
        started_at=submitted if started else None,
        ended_at=None,
        imported_at=None,
    )


def test_a_batch_is_stuck_after_four_times_the_longest_recent_start() -> None:
    shards = [
        _shard("late", submitted_minutes_ago=9),
        _shard("on-time", submitted_minutes_ago=7),
        _shard("started", submitted_minutes_ago=60, started=True),
    ]
    starts = [60.0, 120.0]  # the model's recent batches began within two minutes

    found = stuck.find_stuck(shards, starts, floor_seconds=60.0, now=NOW)

    assert [s.shard_id for s in found] == ["late"]
    assert stuck.find_stuck(shards, starts, floor_seconds=3600.0, now=NOW) == []
    words = stuck.stuck_words("p", DAY, "gemini-2.5-flash", found)
    assert "batches/late (pending for 9 min)" in words
    assert "lately started within 2 min" in words
    assert "llm-assets cancel p --date 2026-11-02 --shard late" in words
    assert "--class cancelled" in words


@pytest.fixture
def stalled(tmp_path: Path, database_url: str) -> Iterator[tuple[Harness, FakeOpenAI]]:
    with FakeOpenAI(tmp_path / "fake") as fake:
        fake.responder = truthful
        fake.polls_per_state = 1_000_000  # every batch stays `validating`
        # Dagster makes its resources again from their fields: a copy's update is lost.
        fields = provider_for(fake).model_dump()
        provider = OpenAIBatchProvider(**(fields | {"stuck_after_seconds": 0.0}))
        spec = review_spec("openai", "gpt-4o-mini")
        with open_harness(tmp_path, database_url, spec, provider) as h:
            yield h, fake


@pytest.mark.one_database
def test_the_sensor_announces_stuck_batches_once_and_status_lists_them(
    stalled: tuple[Harness, FakeOpenAI],
) -> None:
    h, fake = stalled
    assert h.materialize("input_snapshot", "request_shards", "provider_batches").success

    first = tick(h)
    second = tick(h)

    [warned] = [e for e in first.asset_events if isinstance(e, dg.AssetCheckEvaluation)]
    assert (warned.check_name, warned.passed, warned.partition) == (
        "no_stuck_batches",
        False,
        DAY.isoformat(),
    )
    assert warned.severity == dg.AssetCheckSeverity.WARN
    assert not [e for e in second.asset_events if isinstance(e, dg.AssetCheckEvaluation)]
    [notice] = h.ledger.sent_notifications(h.spec.name, DAY)
    assert notice["outcome"] == "in progress"
    assert "not started far longer than usual" in notice["text"]
    assert "no batch of gpt-4o-mini has started yet" in notice["text"]
    assert f"llm-assets cancel {h.spec.name} --date {DAY}" in notice["text"]
    job = h.ledger.get_job(h.job_id())
    assert job is not None
    shown = cli._job_status(h.ledger, h.spec, job, 0.0)
    assert len(shown["stuck"]) == len(h.ledger.shards(h.job_id())) == 3
    assert {s["provider_status"] for s in shown["stuck"]} == {"validating"}
    # The same words as the notification (the waits have grown since).
    assert shown["stuck_text"].split(":")[0] == notice["text"].split(":")[0]

    fake.polls_per_state = 1  # the provider starts them
    tick(h)
    # The next import checks the day again: nothing is stuck now.
    checked = h.materialize("batch_results")
    [result] = [
        c for c in checked.get_asset_check_evaluations() if c.check_name == "no_stuck_batches"
    ]
    assert result.passed
    job = h.ledger.get_job(h.job_id())
    assert job is not None
    assert cli._job_status(h.ledger, h.spec, job, 0.0)["stuck"] == []
