"""A day's life where its paths meet: a cancel after a crash between create and record, a
cancel while another run creates a batch, an approved day under the spend breaker, a pause
while the online worker sends, and a run that loses its lock while it creates a batch.

Each is an ordinary timing of two paths (a CLI run, a sensor's, a cancel) over one day; the
fake provider's own records are the witness that nothing was left running, paid twice or
sent after a stop.
"""

import datetime as dt
import json
import shutil
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import openai
import pytest
import sqlalchemy as sa

from llm_assets import steps
from llm_assets.resources.ledger import TERMINAL, QuotaKey
from llm_assets.steps import quota
from tests import cli_process
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.common import Gate, held_call
from tests.fakes.online_server import FakeOnline
from tests.fakes.openai_server import FakeOpenAI
from tests.harness import CLI, DAY, Harness, fake_harness, online_shard, truthful, write_reviews

pytestmark = pytest.mark.slow

ENDED = ("completed", "failed", "expired", "cancelled")


def context(harness: Harness, who: str = "test", **kwargs: Any) -> steps.StepContext:
    return harness.context(created_by=who, **kwargs)


def run_out_every_batch(fake: FakeOpenAI) -> dict[str, str]:
    """Let every batch the fake holds run to its end, as the provider does whether anyone
    polls it or not; returns each batch's final status."""
    client = openai.OpenAI(base_url=fake.base_url, api_key="test-key", max_retries=0)
    fake.polls_per_state = 1
    statuses = {}
    for batch in client.batches.list(limit=100).data:
        status = batch.status
        while status not in ENDED:
            status = client.batches.retrieve(batch.id).status
        statuses[batch.id] = status
    return statuses


def shard_batches(fake: FakeOpenAI) -> dict[str, list[str]]:
    """shard_id -> the batches created for it, from the fake's call log."""
    found: dict[str, list[str]] = {}
    for entry in fake.calls.entries():
        if entry["method"] == "POST" and entry["path"] == "/v1/batches" and entry["status"] == 200:
            found.setdefault(entry["metadata"]["shard_id"], []).append(entry["batch_id"])
    return found


@pytest.mark.one_database
@pytest.mark.fake_server("openai", responder=truthful)
def test_a_cancel_after_a_crash_between_create_and_record_cancels_the_unrecorded_batch(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    """The run dies right after the provider created its second batch: the cancel finds that
    batch, cancels it and keeps what it answered; the requeue sends only the rest."""
    from tests.test_crash import KILLED, Partition

    partition = Partition(tmp_path, database_url, fake, items=30)  # three shards of ten
    crashed = partition.run("submit.after_create:2")
    assert crashed.returncode == KILLED, crashed.stderr
    unrecorded = [
        s for s in partition.shards() if s["submit_intent_at"] and not s["provider_batch_id"]
    ]
    assert len(unrecorded) == 1

    args = ["cancel", partition.name, "--date", DAY.isoformat(), "--poll-interval", "0.02"]
    cancelled = cli_process.run(
        [CLI, *args], env=partition.env, capture_output=True, text=True, timeout=300
    )

    assert cancelled.returncode == 0, cancelled.stderr
    shards = {s["shard_id"]: s for s in partition.shards()}
    [orphan] = shard_batches(fake)[unrecorded[0]["shard_id"]]
    assert shards[unrecorded[0]["shard_id"]]["provider_batch_id"] == orphan
    assert shards[unrecorded[0]["shard_id"]]["cancel_sent_at"] is not None
    rows = partition.ledger_rows()
    assert all(r["status"] in TERMINAL for r in rows)
    assert {r["error_class"] for r in rows} == {"cancelled"}  # no batch had run yet

    requeue = [CLI, "requeue", partition.name, "--date", DAY.isoformat(), "--class", "cancelled"]
    requeued = cli_process.run(requeue, env=partition.env, capture_output=True, timeout=300)
    assert requeued.returncode == 0
    finished = partition.run()
    assert finished.returncode == 0, finished.stderr

    statuses = run_out_every_batch(fake)
    assert statuses[orphan] == "cancelled"
    assert set(fake.billed.values()) == {1}, "each request ran to an answer once"
    assert set(fake.billed) == {r["custom_id"] for r in partition.ledger_rows()}
    partition.assert_invariants()


REVIEWS = 30
"""Three shards of ten."""


@pytest.fixture
def openai_day(tmp_path: Path, database_url: str) -> Any:
    with FakeOpenAI(tmp_path / "fake") as fake:
        fake.responder = truthful
        with fake_harness(tmp_path, database_url, fake, REVIEWS) as harness:
            assert harness.materialize("input_snapshot", "request_shards").success
            yield harness, fake


class SubmittingRun:
    """Run A submitting the day in a thread of its own, held with its first create on the
    wire (the fake has it, and answers once let through)."""

    def __init__(self, harness: Harness, fake: FakeOpenAI) -> None:
        self.gate = Gate()
        fake.faults.add(held_call("POST", "/v1/batches", self.gate))
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.submit, args=(harness,))
        self.thread.start()
        assert self.gate.arrived.wait(60)

    def submit(self, harness: Harness) -> None:
        try:
            steps.submit_shards(context(harness, "run A"))
        except BaseException as exc:  # noqa: BLE001 - the test asserts on it
            self.error = exc

    def let_create_through(self) -> None:
        self.gate.opened.set()
        self.thread.join(120)
        assert not self.thread.is_alive()


@pytest.mark.one_database
def test_a_cancel_while_another_run_creates_a_batch_cancels_that_batch(
    openai_day: tuple[Harness, FakeOpenAI],
) -> None:
    """The cancel comes while a submission holds a shard and its create is on the wire: the
    batch it creates a moment later is cancelled, and nothing of the day is sent after."""
    harness, fake = openai_day
    submitting = SubmittingRun(harness, fake)
    moved = threading.Event()  # the cancel returned, or waits for the run that holds the day

    def on_log(message: str) -> None:
        if "waiting for" in message:
            moved.set()

    def cancel() -> None:
        steps.cancel_day(context(harness, "operator", log=on_log), reason="stop the day")
        moved.set()

    cancelling = threading.Thread(target=cancel)
    cancelling.start()
    assert moved.wait(60)
    submitting.let_create_through()
    cancelling.join(120)
    assert not cancelling.is_alive()

    [created] = [b for batches in shard_batches(fake).values() for b in batches]
    assert isinstance(submitting.error, steps.GateBlocked)
    assert submitting.error.gate == "cancelled"
    # Whoever asks the lifecycle next (the CLI's wait, the sensor) finishes the cancel.
    harness.wait_for_batches()
    decision = steps.DayDriver(context(harness)).advance()
    assert not decision.has(steps.Step.SUBMIT)
    harness.wait_for_batches()
    assert harness.materialize("batch_results").success
    assert run_out_every_batch(fake)[created] == "cancelled"
    assert len(shard_batches(fake)) == 1, "nothing was sent after the cancel"
    assert all(r["status"] in TERMINAL for r in harness.rows().values())
    assert {r["error_class"] for r in harness.rows().values() if r["status"] != "succeeded"} == {
        "cancelled"
    }


def end_the_first_batch(harness: Harness, fake: FakeOpenAI | FakeAnthropic) -> list[Any]:
    """Let the day's first batch complete while the others stay in progress, and record
    its end as a poll does; returns the other shards."""
    first, *rest = harness.ledger.shards(harness.job_id())
    harness.hold_batches(fake, [first], lambda status: status.state == "completed")
    steps.poll_shards(harness.ledger, harness.provider, [first])
    return rest


CAP = 0.0004
"""A day of short answers costs about $0.00026; five times longer ones, about $0.001."""


def summary_answer(words: int) -> Any:
    from tests.fakes.openai_model import user_text

    def respond(body: dict[str, Any]) -> str:
        label = json.loads(truthful(body))["label"]
        summary = " ".join(["word"] * words) if words else user_text(body)[:40]
        return json.dumps({"label": label, "summary": summary})

    return respond


@pytest.mark.one_database
def test_an_approved_day_is_not_tripped_by_the_breaker_within_what_was_approved(
    tmp_path: Path, database_url: str
) -> None:
    """The operator approved a day whose upper bound is over the partition budget; its
    answers cost five times what the estimate expected but stay within the approval."""
    earlier = DAY - dt.timedelta(days=1)
    output = {
        "schema": {
            "label": {"type": "str", "isin": ["positive", "negative"]},
            "summary": {"type": "str", "min_length": 1},
        }
    }
    budget = {"max_usd_per_partition": CAP, "history_window": 3}
    with (
        FakeOpenAI(tmp_path / "fake") as fake,
        fake_harness(
            tmp_path,
            database_url,
            fake,
            REVIEWS,
            model={"max_output_tokens": 400},
            output=output,
            budget=budget,
        ) as harness,
    ):
        write_reviews(harness.home, earlier, REVIEWS)
        runner = harness.runner(approve_budget=True)
        fake.responder = summary_answer(0)
        assert runner.run_day(earlier, wait=True).done
        # This day's answers are five times longer; its first batch ends before the rest.
        fake.responder = summary_answer(100)
        fake.polls_per_state = 1000
        runner.materialize(DAY, steps.Step.BUILD)
        end_the_first_batch(harness, fake)

        imported = steps.import_results(context(harness))

        assert imported.breaker is None
        assert imported.counts.open and imported.counts.cost_usd > 0
        fake.polls_per_state = 1
        outcome = runner.run_day(DAY, wait=True)
        job = harness.ledger.get_job(harness.job_id())
        assert job is not None and job.budget_approved_usd is not None
        assert job.budget_approved_usd > CAP
        assert CAP * 1.2 < outcome.cost_usd <= job.budget_approved_usd
        assert job.cancelled_at is None
        assert outcome.done and outcome.succeeded == REVIEWS
        assert harness.ledger.sent_notifications(harness.spec.name, DAY) == []


SEPARATOR = "=" * 2000
"""A ticket's separator line: a few cl100k tokens, five hundred of the fake Claude's."""


@pytest.mark.one_database
def test_the_breaker_cancels_a_day_whose_input_was_underestimated(
    tmp_path: Path, database_url: str
) -> None:
    """Claude's input is estimated as cl100k tokens times a factor: text that tokenizes far
    apart (long separator lines) is billed three times the bound that passed the budget
    gate. The first imported shard shows it, and the breaker cancels the rest of the day."""
    with FakeAnthropic(tmp_path / "fake") as fake:
        fake.polls_per_state = 1000
        answers = {"max_output_tokens": 30}
        with fake_harness(
            tmp_path, database_url, fake, REVIEWS, model=answers, budget={}
        ) as harness:
            path = harness.home / "reviews" / f"reviews-{DAY.isoformat()}.jsonl"
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            path.write_text(
                "".join(
                    json.dumps({**r, "text": f"{r['text']}\n{SEPARATOR}\n"}) + "\n" for r in rows
                )
            )
            assert harness.materialize("input_snapshot", "request_shards").success
            upper = harness.ledger.committed_cost(harness.job_id())
            harness.spec = harness.spec.model_copy(
                update={
                    "budget": harness.spec.budget.model_copy(
                        update={"max_usd_per_partition": upper * 1.05}
                    )
                }
            )
            assert harness.materialize("provider_batches").success
            rest = end_the_first_batch(harness, fake)

            imported = steps.import_results(context(harness))

            assert imported.breaker is not None and "breaker" in imported.breaker
            job = harness.ledger.get_job(harness.job_id())
            assert job is not None and job.cancelled_at is not None
            shards = {s.shard_id: s for s in harness.ledger.shards(harness.job_id())}
            assert all(shards[s.shard_id].cancel_sent_at is not None for s in rest)
            [alert] = harness.ledger.sent_notifications(harness.spec.name, DAY)
            assert alert["text"].startswith(f"ALERT {harness.spec.name} {DAY}")


@pytest.mark.one_database
@pytest.mark.fake_server("online")
def test_a_pause_stops_the_online_worker_and_the_resume_finishes_the_shard(
    tmp_path: Path, database_url: str, fake: FakeOnline
) -> None:
    from tests.test_pause import skip_reason
    from tests.test_sensors import tick

    def pause() -> None:
        harness.ledger.pause_pipeline(harness.spec.name, paused_by="ops", reason="incident")

    with online_shard(tmp_path, database_url, fake) as harness:
        run = harness.stop_while_sending(pause)

        assert run.success
        assert skip_reason(harness, run, "provider_batches").startswith("paused by ops")
        sent = len(fake.calls())
        assert sent < 60, "the worker stopped sending at the pause"
        [shard] = harness.ledger.shards(harness.job_id())
        assert shard.status == "running"  # left to resume, its answers checkpointed
        assert tick(harness).run_requests == []

        assert harness.ledger.resume_pipeline(harness.spec.name, resumed_by="ops") is not None
        [request] = tick(harness).run_requests
        assert request.run_key.startswith(f"resume:{shard.shard_id}:")
        assert harness.materialize("provider_batches").success

        assert len(fake.calls()) > sent
        sends = Counter(c.request_id for c in fake.calls() if c.request_id)
        assert set(sends.values()) == {1}, "each item was sent once"
        assert harness.materialize("batch_results").success
        assert harness.ledger.counts(harness.job_id()).succeeded == 60


def break_locks(harness: Harness) -> None:
    """Take the day's locks away from whoever holds them while it lives on: on PostgreSQL
    the backends of their connections are terminated (as an idle-session timeout or a
    failover does); beside SQLite the lock files are removed."""
    from llm_assets.resources.ledger.mutex import _advisory_key, _halves

    engine = harness.ledger.engine
    if engine.dialect.name != "postgresql":
        shutil.rmtree(f"{engine.url.database}.locks")
        return
    names = [f"day\0{harness.job_id()}"]
    names += [f"shard\0{s.shard_id}" for s in harness.ledger.shards(harness.job_id())]
    provider = harness.provider
    admission = QuotaKey(
        provider=harness.spec.model.provider,
        account=provider.quota_account(),
        model_name=harness.spec.model.name,
        kind=provider.quota_kind,
    )
    names.append(f"quota\0{quota.key_name(admission)}")
    with engine.connect() as conn:
        killed = 0
        for name in names:
            high, low = _halves(_advisory_key(conn, name))
            killed += len(
                conn.execute(
                    sa.text(
                        "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = "
                        "'advisory' AND granted AND classid = :high AND objid = :low"
                    ),
                    {"high": high, "low": low},
                ).all()
            )
    assert killed, "the holder's lock connections were found"


def test_a_run_that_lost_its_locks_while_creating_a_batch_records_nothing(
    openai_day: tuple[Harness, FakeOpenAI],
) -> None:
    """Run A holds the day and a shard and its create is on the wire when its locks are
    taken away; run B takes them and submits the day. A's batch, created after that, is not
    recorded: A stops with LostLock and cancels it; each shard has one batch that runs."""
    harness, fake = openai_day
    run_a = SubmittingRun(harness, fake)
    break_locks(harness)

    result_b = steps.submit_shards(context(harness, "run B"))
    run_a.let_create_through()

    assert len(result_b.submitted) == 3
    error = run_a.error
    assert type(error).__name__ == "LostLock", error
    assert "lost its hold" in str(error) and "taken over" in str(error)
    recorded = {s.shard_id: s.provider_batch_id for s in harness.ledger.shards(harness.job_id())}
    created = shard_batches(fake)
    [contested] = [shard for shard, batches in created.items() if len(batches) == 2]
    [lost] = [b for b in created[contested] if b != recorded[contested]]
    assert all(len(batches) == 1 for shard, batches in created.items() if shard != contested)
    statuses = run_out_every_batch(fake)
    assert statuses[lost] == "cancelled"
    assert {statuses[b] for b in recorded.values()} == {"completed"}
    assert harness.run_day().done
    assert set(fake.billed.values()) == {1}
    assert all(r["attempts"] == 1 for r in harness.rows().values())


@pytest.mark.one_database
def test_a_cancel_that_reaches_a_batch_after_it_ended_imports_it(
    openai_day: tuple[Harness, FakeOpenAI],
) -> None:
    """The provider finished the batch before the cancel reached it (it refuses to cancel an
    ended batch): the cancel takes the batch as it ended, and its answers are kept."""
    harness, fake = openai_day
    assert harness.materialize("provider_batches").success
    run_out_every_batch(fake)  # ended at the provider; the ledger has not polled yet

    result = steps.cancel_day(context(harness), reason="too late")

    assert result.cancelled_batches == []
    assert {s.status for s in harness.ledger.shards(harness.job_id())} == {"completed"}
    assert harness.materialize("batch_results").success
    assert {r["status"] for r in harness.rows().values()} == {"succeeded"}
