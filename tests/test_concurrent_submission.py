"""Two runs submitting the same day at once (a sensor's run and a backfill's, say) create one
provider batch per shard between them, on SQLite and on PostgreSQL."""

import threading
from collections.abc import Iterator
from pathlib import Path

import dagster as dg

from llm_assets import steps
from tests.fakes.common import ControlFault
from tests.fakes.openai_server import FakeOpenAI
from tests.harness import DAY, Harness, provider_for, review_spec, truthful


def test_concurrent_submissions_of_a_day_create_one_batch_per_shard(
    tmp_path: Path, database_url: str
) -> None:
    with FakeOpenAI(tmp_path / "fake") as fake, dg.DagsterInstance.ephemeral() as instance:
        fake.responder = truthful
        harness = Harness(
            tmp_path,
            database_url,
            instance,
            review_spec("openai", "gpt-4o-mini"),
            fake_provider := provider_for(fake),
        )
        assert harness.materialize("input_snapshot", "request_shards").success
        shards = harness.ledger.shards(harness.job_id())
        # Slow uploads keep the first submitter inside its lock while the second arrives.
        fake.faults.add(
            ControlFault(
                method="POST", path_contains="/files", status=200, times=3, delay_seconds=0.5
            )
        )
        start = threading.Barrier(2)
        results: list[steps.SubmitResult] = []

        def submit() -> None:
            start.wait()
            results.append(
                steps.submit_shards(
                    steps.StepContext(
                        harness.spec, DAY, harness.ledger, harness.storage, fake_provider
                    )
                )
            )

        threads = [threading.Thread(target=submit) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        creates = [
            c for c in fake.calls.entries() if c["method"] == "POST" and c["path"] == "/v1/batches"
        ]
        assert len(creates) == len(shards) == 3
        assert sorted(c["metadata"]["shard_id"] for c in creates) == sorted(
            s.shard_id for s in shards
        )
        assert sum(len(r.submitted) for r in results) == 3
        assert sum(r.being_submitted_elsewhere for r in results) >= 1
        submitted = harness.ledger.shards(harness.job_id())
        assert {s.provider_batch_id for s in submitted} == {c["batch_id"] for c in creates}
        assert fake.server_errors == []


def test_the_submission_lock_is_per_ledger(database_url: str, tmp_path: Path) -> None:
    """Two ledgers never block each other's shards, even two PostgreSQL schemas of one
    database (whose advisory locks are shared); within one ledger the lock is exclusive."""
    from llm_assets.resources.ledger import LedgerResource
    from tests.conftest import PG_URL, _pg_schema_url

    if database_url.startswith("sqlite"):
        other_url = f"sqlite:///{tmp_path / 'other-ledger.db'}"
        others: Iterator[str] = iter([other_url])
    else:
        assert PG_URL is not None
        others = _pg_schema_url()
        other_url = next(others)
    try:
        ours = LedgerResource(database_url=database_url)
        theirs = LedgerResource(database_url=other_url)
        shard = "reviews-openai-20261102-13cdbde217-r00-s00001"
        with ours.submission_lock(shard) as first:
            assert first
            with ours.submission_lock(shard) as again:
                assert not again
            with theirs.submission_lock(shard) as elsewhere:
                assert elsewhere
        with ours.submission_lock(shard) as after_release:
            assert after_release
    finally:
        for _ in others:
            pass
