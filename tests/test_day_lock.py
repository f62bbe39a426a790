"""The day's lock: one writer at a time, the next one waits (saying for whom) and then finds
the work done; the wait is bounded; the lock dies with its holder. And the invariants that
hold even without it: a shard is sent only with exactly its pending items."""

import contextlib
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from llm_assets import steps
from llm_assets.resources.ledger import DayBusy, LedgerResource, ShardMismatch, utcnow
from tests.conftest import DATABASES
from tests.fakes.openai_server import FakeOpenAI
from tests.harness import DAY, make_harness, truthful

JOB = "reviews-openai-20261102-13cdbde217"


def test_a_second_writer_waits_for_the_first_and_says_whom_it_waits_for(
    database_url: str,
) -> None:
    ledger = LedgerResource(database_url=database_url)
    first_holds, second_waits, release = threading.Event(), threading.Event(), threading.Event()
    order: list[str] = []
    heard: list[str] = []

    def first() -> None:
        with ledger.day_lock(JOB, holder="cli:ana, run 1234"):
            order.append("first in")
            first_holds.set()
            release.wait(60)
            order.append("first out")

    def hear(message: str) -> None:
        heard.append(message)
        second_waits.set()

    def second() -> None:
        first_holds.wait(60)
        with ledger.day_lock(JOB, holder="sensor run 5678", log=hear):
            order.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    assert second_waits.wait(60)
    release.set()
    for thread in threads:
        thread.join(60)
    assert order == ["first in", "first out", "second in"]
    assert "cli:ana, run 1234" in heard[0]
    assert JOB in heard[0]


def test_the_wait_is_bounded_and_a_thread_never_waits_for_itself(database_url: str) -> None:
    ledger = LedgerResource(database_url=database_url, day_lock_wait_seconds=0.2)
    other = LedgerResource(database_url=database_url, day_lock_wait_seconds=0.2)
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        with other.day_lock(JOB, holder="a long import"):
            holding.set()
            done.wait(60)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert holding.wait(60)
        with pytest.raises(DayBusy, match="changed nothing"), ledger.day_lock(JOB, holder="x"):
            pytest.fail("entered a day another run holds")
        # Another day is free.
        with ledger.day_lock(f"{JOB}-other", holder="x"):
            pass
    finally:
        done.set()
        thread.join(60)
    with ledger.day_lock(JOB, holder="outer"), ledger.day_lock(JOB, holder="inner"):
        pass


_HOLD = """
import sys
from llm_assets.resources.ledger import LedgerResource
ledger = LedgerResource(database_url=sys.argv[1])
with ledger.day_lock(sys.argv[2], holder="doomed"):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_the_lock_dies_with_its_holder(database_url: str, tmp_path: Path) -> None:
    ledger = LedgerResource(database_url=database_url, day_lock_wait_seconds=30)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, database_url, JOB],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        quick = LedgerResource(database_url=database_url, day_lock_wait_seconds=0.1)
        with pytest.raises(DayBusy), quick.day_lock(JOB, holder="too early"):
            pass
        holder.kill()
        holder.wait(30)
        with ledger.day_lock(JOB, holder="after the crash"):
            pass
    finally:
        holder.kill()


def test_a_shard_being_sent_shows_as_held_and_no_other(database_url: str) -> None:
    """What a day's state reads to tell a shard another run is sending (busy) from one left
    waiting: the shards whose submission lock is held now, all asked at once."""
    ledger = LedgerResource(database_url=database_url)
    shards = [f"{JOB}-{n:04d}" for n in range(5)]
    assert ledger.submissions_held(shards) == set()
    with ledger.submission_lock(shards[1], holder="a run") as first:
        assert first
        other = LedgerResource(database_url=database_url)
        with other.submission_lock(shards[3], holder="another run") as second:
            assert second
            assert ledger.submissions_held(shards) == {shards[1], shards[3]}
            assert other.submissions_held(shards[2:]) == {shards[3]}
        assert ledger.submissions_held(shards) == {shards[1]}
    assert ledger.submissions_held(shards) == set()
    assert ledger.submissions_held([]) == set()


@pytest.mark.parametrize("database_url", [DATABASES[1]], indirect=True)
def test_a_released_lock_gives_its_connection_back_as_it_found_it(database_url: str) -> None:
    """On PostgreSQL a holder names its session after itself while it holds a lock (whoever
    waits reads the name); every pooled connection is unnamed again afterwards and holds no
    lock."""
    ledger = LedgerResource(database_url=database_url)
    holder = f"cli:ana, run {uuid.uuid4().hex[:8]}"
    name = sa.text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :name")
    with ledger.day_lock(JOB, holder=holder), ledger.engine.connect() as conn:
        assert conn.execute(name, {"name": f"llm-assets {holder}"}).scalar() == 1
        default = conn.execute(sa.text("SELECT current_setting('application_name')")).scalar()
    pooled = ledger.engine.pool.checkedin()
    assert pooled >= 2  # the lock's connection and the lease's (or this test's)
    with contextlib.ExitStack() as stack:
        for _ in range(pooled):
            conn = stack.enter_context(ledger.engine.connect())
            after = conn.execute(
                sa.text(
                    "SELECT current_setting('application_name'), "
                    "(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                    "AND pid = pg_backend_pid())"
                )
            ).one()
            assert after[0] == default, after
            assert after[1] == 0, "an advisory lock outlived its block"
        assert ledger.engine.pool.checkedin() == 0


@pytest.fixture
def fake(tmp_path: Path) -> FakeOpenAI:
    with FakeOpenAI(tmp_path / "fake") as server:
        server.responder = truthful
        yield server


def test_a_shard_is_sent_with_exactly_its_pending_items(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    """An item of a waiting shard that took a result meanwhile (a late answer to an earlier
    attempt) is left out of the file that is sent; the rest go, each at its new offset."""
    for harness in make_harness(tmp_path, database_url, fake):
        assert harness.materialize("input_snapshot", "request_shards").success
        [first, *_] = harness.ledger.shards(harness.job_id())
        ids = sorted(c for c, r in harness.rows().items() if r["shard_id"] == first.shard_id)
        late = ids[1]
        harness.ledger.upsert_results(
            harness.job_id(),
            [{"custom_id": late, "status": "succeeded", "result_json": '{"label": "positive"}'}],
        )
        assert harness.materialize("provider_batches").success
        sent = fake.submitted_custom_ids()
        shard = harness.ledger.get_shard(first.shard_id)
        assert shard is not None
        assert late not in sent
        assert set(ids) - {late} <= set(sent)
        assert shard.item_count == len(ids) - 1
        assert shard.input_uri != first.input_uri
        rows = harness.rows()
        assert {rows[c]["status"] for c in ids if c != late} == {"submitted"}
        # The narrowed file's lines are where the ledger says, for a later retry round.
        found = steps.request_lines(
            harness.storage,
            shard.input_uri,
            {c: rows[c]["request_offset"] for c in ids if c != late},
        )
        assert [c for c, _ in found] == [c for c in ids if c != late]


def test_a_shard_whose_items_went_elsewhere_after_its_submission_began_is_not_sent(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    for harness in make_harness(tmp_path, database_url, fake):
        assert harness.materialize("input_snapshot", "request_shards").success
        [first, *_] = harness.ledger.shards(harness.job_id())
        harness.ledger.update_shard(first.shard_id, submit_intent_at=utcnow())
        [late] = sorted(c for c, r in harness.rows().items() if r["shard_id"] == first.shard_id)[:1]
        harness.ledger.upsert_results(
            harness.job_id(),
            [{"custom_id": late, "status": "succeeded", "result_json": '{"label": "positive"}'}],
        )
        ctx = steps.StepContext(
            harness.spec, DAY, harness.ledger, harness.storage, harness.provider
        )
        with pytest.raises(ShardMismatch, match="it was not sent"):
            steps.submit_shards(ctx)
        assert fake.submitted_custom_ids() == []
