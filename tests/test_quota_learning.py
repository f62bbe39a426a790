"""Quotas nobody declared: the limit is learned from what the provider does, shards are
admitted one at a time as room frees, and what was learned is shared by every run and day."""

import dataclasses
import datetime as dt
import math
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_assets import steps
from llm_assets.resources.ledger import LedgerResource, QuotaKey, QuotaRecord, shard_table, utcnow
from llm_assets.resources.providers.base import WAITING_FOR_QUOTA, BatchProvider
from llm_assets.resources.providers.bedrock import BedrockBatchProvider
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.steps import day_model, lifecycle, quota
from llm_assets.steps.in_process import InProcessRuns
from tests.conftest import MotoS3
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.bedrock_server import FakeBedrock
from tests.fakes.gemini_server import FakeGemini
from tests.fakes.openai_server import FakeOpenAI
from tests.harness import DAY, Harness, open_harness, provider_for, review_spec, truthful
from tests.harness import write_reviews as write_day

pytestmark = pytest.mark.slow

NOW = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.UTC)
KEY = QuotaKey(provider="openai", account="default", model_name="m", kind=quota.TOKENS)


# The learner's rules, against a provider with a hidden limit.


def _apply(record: QuotaRecord, values: dict[str, Any]) -> QuotaRecord:
    return record.model_copy(update=values)


@settings(max_examples=300, deadline=None)
@given(
    limit=st.integers(1, 60),
    sizes=st.lists(st.integers(1, 20), min_size=1, max_size=120),
    ends=st.lists(st.booleans(), min_size=1, max_size=30),
    slow_start=st.booleans(),
    states_limit=st.booleans(),
)
def test_the_learner_never_learns_above_the_limit_and_refusals_stay_few(
    limit: int, sizes: list[int], ends: list[bool], slow_start: bool, states_limit: bool
) -> None:
    queue = [size for size in sizes if size <= limit]  # a bigger shard is refused by the spec
    record = QuotaRecord.new(KEY)
    in_flight: list[int] = []
    refusals = admissions = step = 0
    while queue:
        step += 1
        assert step < 10_000, "no progress"
        if in_flight and ends[step % len(ends)]:
            in_flight.pop(0)  # a batch ends: room frees
            continue
        load, amount = sum(in_flight), queue[0]
        gate = quota.admission(
            record,
            load=load,
            amount=amount,
            model="m",
            slow_start=slow_start,
            now=NOW,
            batches=len(in_flight),
        )
        if not gate.admit:
            assert in_flight, "with nothing in flight a shard is always tried"
            assert "waiting for quota" in gate.reason
            in_flight.pop(0)
            continue
        if load + amount > limit:
            refusals += 1
            stated = limit if states_limit else None
            record = _apply(
                record,
                quota.after_refusal(record, load=load, amount=amount, stated=stated, now=NOW),
            )
        else:
            admissions += 1
            in_flight.append(queue.pop(0))
            record = _apply(record, quota.after_admission(record, load=load + amount, now=NOW))
        assert record.learned_limit is None or record.learned_limit <= limit
    # One refusal finds the limit; later ones are probes, each further apart than the last.
    assert refusals <= 2 + math.log2(1 + admissions / quota.PROBE_FIRST)
    assert record.refusals == refusals


def test_a_refusal_lowers_the_limit_multiplicatively_and_an_admission_above_raises_it() -> None:
    learned = _apply(QuotaRecord.new(KEY), {"learned_limit": 1000, "how": "refusals"})
    lowered = quota.after_refusal(learned, load=900, amount=50, stated=None, now=NOW)
    assert lowered["learned_limit"] == 700  # under the limit, refused: the limit was too high
    probe = quota.after_refusal(learned, load=1000, amount=50, stated=None, now=NOW)
    assert "learned_limit" not in probe and probe["probe_every"] == 2 * quota.PROBE_FIRST
    raised = quota.after_admission(learned, load=1050, now=NOW)
    assert raised["learned_limit"] == 1050 and raised["how"] == "a batch admitted above it"
    assert quota.after_admission(learned, load=900, now=NOW).get("learned_limit") is None


def test_a_stated_limit_is_taken_as_it_is_and_not_probed_for_a_day() -> None:
    stated = _apply(
        QuotaRecord.new(KEY),
        quota.after_refusal(QuotaRecord.new(KEY), load=3, amount=1, stated=2, now=NOW),
    )
    assert stated.learned_limit == 2 and stated.how == quota.STATED
    due = _apply(stated, {"admissions": 100})
    kwargs: dict[str, Any] = {"load": 2, "amount": 1, "model": "m", "slow_start": False}
    assert not quota.admission(due, now=NOW + dt.timedelta(hours=1), **kwargs).admit
    assert quota.admission(due, now=NOW + dt.timedelta(days=2), **kwargs).probe


@pytest.mark.parametrize(
    ("message", "limit"),
    [
        (
            "token_limit_exceeded: Enqueued token limit reached for gpt-4o-mini in "
            "organization org-fake. Limit: 1,200 enqueued tokens. Please try again later.",
            1200,
        ),
        (
            "Number of Message Batches being processed has exceeded your limit of 2. Please "
            "wait for a batch to end before creating another.",
            2,
        ),
        ("Too many concurrent batch jobs: 3 are pending or running; the limit is 3.", 3),
        (
            "You have exceeded the number of batch inference jobs that can be submitted or in "
            "progress at once for model m (quota: 2). Please try again later.",
            2,
        ),
        ("Enqueued token limit reached. Please try again once some batches completed.", None),
        ("Rate limit exceeded", None),
    ],
)
def test_the_limit_a_provider_states_is_read_from_its_refusal(
    message: str, limit: int | None
) -> None:
    assert quota.stated_limit(message) == limit


def test_the_words_say_how_much_is_in_flight_and_how_the_limit_was_learned() -> None:
    record = QuotaRecord(
        **KEY.model_dump() | {"model_name": "gpt-4.1-mini"},
        learned_limit=140_000,
        refusals=3,
        how="refusals",
        learned_at=dt.datetime(2026, 12, 4, tzinfo=dt.UTC),
    )
    assert quota.words(record, 135_000, "gpt-4.1-mini") == (
        "waiting for quota: 135k of ~140k enqueued tokens of gpt-4.1-mini in flight "
        "(learned 2026-12-04 from 3 refusals)"
    )


# Waking on completion.


def _waiting_shard(waited_since: dt.datetime, not_before: dt.datetime) -> day_model.ShardView:
    return day_model.ShardView(
        shard_id="s1",
        status="created",
        round=0,
        provider_batch_id=None,
        intent=False,
        not_before=not_before,
        raw_status=WAITING_FOR_QUOTA,
        cancelled=False,
        cancel_sent=False,
        online=False,
        busy=False,
        created_at=waited_since - dt.timedelta(hours=1),
        submitted_at=None,
        touched_at=waited_since,
    )


@pytest.mark.parametrize("freed", [None, -5.0, 5.0], ids=["nothing-ended", "ended-before", "ended"])
def test_a_shard_waiting_for_quota_is_sent_as_soon_as_a_batch_of_its_model_ends(
    freed: float | None,
) -> None:
    since = NOW - dt.timedelta(seconds=10)
    shard = _waiting_shard(since, not_before=NOW + dt.timedelta(minutes=1))
    state = day_model.DayState(
        now=NOW,
        has_job=True,
        shards=(shard,),
        job_id="j",
        quota_freed_at=None if freed is None else since + dt.timedelta(seconds=freed),
    )
    decision = lifecycle.decide(state)
    if freed is not None and freed > 0:
        assert decision.has(day_model.Step.SUBMIT)
    else:
        assert not decision.has(day_model.Step.SUBMIT)
        assert decision.wait_until == shard.not_before


def test_polls_follow_how_long_the_model_s_batches_take() -> None:
    shard = dataclasses.replace(
        _waiting_shard(NOW, NOW),
        status="running",
        submitted_at=NOW - dt.timedelta(seconds=60),
        raw_status="in_progress",
    )
    hours_away = lifecycle.next_poll_at(shard, NOW, 600.0, expected=3 * 3600.0)
    assert hours_away == NOW + dt.timedelta(seconds=600)  # far from due: the longest gap
    near = lifecycle.next_poll_at(shard, NOW, 600.0, expected=70.0)
    assert near == NOW + dt.timedelta(seconds=6)  # due soon: a tenth of its age
    unknown = lifecycle.next_poll_at(shard, NOW, 600.0)
    assert unknown == NOW + dt.timedelta(seconds=6)


# Days against the fake servers, several at once.

REVIEWS = 60
"""Six shards of ten a day: thirty shards over five days, three or two admitted at once."""
LIMIT = 1200
"""OpenAI's enqueued-token limit: about three of the day's shards (about 381 tokens each)."""
DAYS = [DAY + dt.timedelta(days=n) for n in range(5)]


def run_days_together(h: Harness, days: list[dt.date]) -> None:
    """The days started at once, each in its own thread (a backfill's runs), each driven to
    its end as `run --wait` drives a day."""
    source_uri = h.settings.resolve_source_uri(h.spec.source.uri)
    for day in days:
        write_day(h.home, day, REVIEWS)
    errors: list[BaseException] = []

    def one(n: int, day: dt.date) -> None:
        # Each run on its own connections, as each of a backfill's runs is a process.
        url = sa.make_url(h.ledger.database_url)
        ledger = LedgerResource(
            database_url=url.update_query_dict(
                {"application_name": f"backfill-{n}"}
            ).render_as_string(hide_password=False)
        )
        ctx = steps.StepContext(
            h.spec, day, ledger, h.storage, h.provider, created_by=f"backfill-{n}"
        )
        driver = steps.DayDriver(ctx, runs=InProcessRuns(source_uri), poll_every=0.0)
        try:
            steps.drive([driver], max_imports=200)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(n, day)) for n, day in enumerate(days)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def assert_every_item_answered_once(h: Harness, days: list[dt.date]) -> int:
    """Every item of every day succeeded on its first attempt; returns the shards sent."""
    shards = 0
    for day in days:
        job = steps.existing_job(h.spec, day, h.ledger)
        counts = h.ledger.refresh_job(job.job_id)
        assert (counts.total, counts.succeeded, counts.open) == (REVIEWS, REVIEWS, 0)
        attempts = {
            item["attempts"]
            for item in h.ledger.iter_items(job.job_id, ["succeeded"], columns=["attempts"])
        }
        assert attempts == {1}
        shards += len(h.ledger.shards(job.job_id))
    return shards


@pytest.fixture
def openai_fake(tmp_path: Path) -> Iterator[FakeOpenAI]:
    with FakeOpenAI(tmp_path / "fake") as fake:
        fake.responder = truthful
        fake.enqueued_token_limit = LIMIT
        yield fake


def _learned(h: Harness, provider: BatchProvider, model: str) -> QuotaRecord:
    return h.ledger.quota_record(
        QuotaKey(
            provider=h.spec.model.provider,
            account=provider.quota_account(),
            model_name=model,
            kind=provider.quota_kind,
        )
    )


@pytest.mark.one_database
@pytest.mark.parametrize("stated", [True, False], ids=["limit-stated", "limit-unstated"])
def test_five_days_at_once_share_one_learned_openai_limit(
    openai_fake: FakeOpenAI, tmp_path: Path, database_url: str, stated: bool
) -> None:
    openai_fake.token_limit_stated = stated
    spec = review_spec("openai", "gpt-4o-mini")
    with open_harness(tmp_path, database_url, spec, provider_for(openai_fake), REVIEWS) as h:
        run_days_together(h, DAYS)

        assert_every_item_answered_once(h, DAYS)
        assert set(openai_fake.billed.values()) == {1}  # nothing paid twice
        assert openai_fake.peak_enqueued_tokens["gpt-4o-mini"] <= LIMIT
        refused = [
            b
            for b in openai_fake.store.all_batches()
            if "token_limit_exceeded" in str(b.get("errors"))
        ]
        at_once = 3
        assert len(refused) < 2 * at_once, "refusals are signals, not a herd"
        learned = _learned(h, h.provider, "gpt-4o-mini")
        assert learned.refusals == len(refused)
        if refused:
            assert learned.learned_limit is not None and learned.learned_limit <= LIMIT


def _refusals_of(calls: list[dict[str, Any]], status: int) -> int:
    return sum(1 for c in calls if c["method"] == "POST" and c["status"] == status)


@pytest.mark.one_database
@pytest.mark.parametrize("kind", ["anthropic", "gemini"])
def test_five_days_at_once_share_one_learned_limit_of_batches(
    tmp_path: Path, database_url: str, kind: str
) -> None:
    at_once = 2
    fakes: dict[str, Callable[[], Any]] = {
        "anthropic": lambda: FakeAnthropic(tmp_path / "fake"),
        "gemini": lambda: FakeGemini(tmp_path / "fake"),
    }
    with fakes[kind]() as fake:
        if kind == "anthropic":
            fake.max_processing_batches = at_once
            fake.quota_retry_after = 0
            model = "claude-haiku-4-5"
        else:
            fake.max_active_batches = at_once
            model = "gemini-2.5-flash"
        spec = review_spec(kind, model)
        with open_harness(tmp_path, database_url, spec, provider_for(fake), REVIEWS) as h:
            run_days_together(h, DAYS)

            shards = assert_every_item_answered_once(h, DAYS)
            refusals = _refusals_of(fake.calls.entries(), 429)
            assert 0 < refusals < 2 * at_once
            learned = _learned(h, h.provider, model)
            assert learned.learned_limit == at_once and learned.how == quota.STATED
            assert learned.refusals == refusals
            if kind == "anthropic":
                ids = fake.submitted_custom_ids()
                assert len(ids) == len(set(ids)) == REVIEWS * len(DAYS)  # each sent once
                assert len(fake.batch_ids()) == shards
            else:
                assert set(fake.billed.values()) == {1}


def test_the_learned_limit_is_shown_and_can_be_reset(tmp_path: Path, database_url: str) -> None:
    ledger = LedgerResource(database_url=database_url)
    key = QuotaKey(
        provider="anthropic", account="x", model_name=f"m-{tmp_path.name}", kind="batches"
    )
    ledger.learn_quota(
        key, lambda r: quota.after_refusal(r, load=2, amount=1, stated=None, now=utcnow())
    )
    assert ledger.quota_record(key).learned_limit == 2
    assert ledger.reset_quotas(provider="anthropic", model=key.model_name) == 1
    assert ledger.quota_record(key).learned_limit is None


def bedrock_jobs_of_30(fake: FakeBedrock) -> tuple[BedrockBatchProvider, dict[str, Any]]:
    """The Bedrock adapter pointed at `fake` (answering truthfully), with short waits, and
    the review spec in jobs of 30 records: a day of 90 reviews is three jobs."""
    from tests.test_bedrock_provider import ROLE, bedrock_spec
    from tests.test_bedrock_provider import truthful as bedrock_truthful

    fake.responder = bedrock_truthful
    provider = BedrockBatchProvider(
        role_arn=ROLE,
        endpoint_url=fake.endpoint_url,
        retry_base_seconds=0.01,
        quota_wait_seconds=0.05,
    )
    spec = bedrock_spec() | {"bedrock": {"min_records_per_job": 30}}
    spec["sharding"] = {"max_requests_per_shard": 30}
    return provider, spec


@pytest.mark.one_database
@pytest.mark.fake_server("bedrock", min_records=30, max_active_jobs=2)
def test_five_days_at_once_share_one_learned_bedrock_job_quota(
    tmp_path: Path, database_url: str, moto_s3: MotoS3, fake: FakeBedrock
) -> None:
    provider, spec = bedrock_jobs_of_30(fake)
    with open_harness(tmp_path, database_url, spec, provider, REVIEWS) as h:
        h.storage = ArtifactStorage(base_url=f"s3://{moto_s3.bucket}/{uuid.uuid4().hex}")
        run_days_together(h, DAYS)

        shards = assert_every_item_answered_once(h, DAYS)
        refused = [
            c
            for c in fake.calls.entries()
            if c.get("operation") == "CreateModelInvocationJob" and c.get("status") == 400
        ]
        assert 0 < len(refused) < 2 * 2
        assert len(fake.jobs()) == shards  # one job per shard: nothing sent twice
        learned = _learned(h, provider, spec["model"]["name"])
        assert learned.learned_limit == 2 and learned.how == quota.STATED


@pytest.mark.one_database
def test_a_shard_waiting_for_quota_is_submitted_when_a_batch_ends_before_its_wait_is_over(
    tmp_path: Path, database_url: str
) -> None:
    with FakeAnthropic(tmp_path / "fake") as fake:
        fake.max_processing_batches = 1
        fake.quota_retry_after = 3600  # the provider's hint: an hour
        fake.polls_per_state = 1000  # the first batch runs until let go
        spec = review_spec("anthropic", "claude-haiku-4-5")
        with open_harness(tmp_path, database_url, spec, provider_for(fake), reviews=20) as h:
            assert h.materialize("input_snapshot", "request_shards", "provider_batches").success
            first, second = h.ledger.shards(h.job_id())
            assert first.provider_batch_id is not None and second.provider_batch_id is None
            assert second.not_before is not None and second.not_before > utcnow()

            fake.polls_per_state = 0  # the first batch ends at its next poll
            h.wait_for_batches()
            ctx = steps.StepContext(h.spec, DAY, h.ledger, h.storage, h.provider)
            result = steps.submit_shards(ctx)

            assert list(result.submitted) == [second.shard_id]  # not an hour later
            refusals = _refusals_of(fake.calls.entries(), 429)
            assert refusals == 1


@pytest.mark.one_database
def test_room_that_frees_goes_to_the_older_day_first(tmp_path: Path, database_url: str) -> None:
    with FakeAnthropic(tmp_path / "fake") as fake:
        fake.max_processing_batches = 2
        fake.quota_retry_after = 0
        fake.polls_per_state = 1000  # batches run until let go
        spec = review_spec("anthropic", "claude-haiku-4-5")
        with open_harness(tmp_path, database_url, spec, provider_for(fake), reviews=30) as h:
            assert h.materialize("input_snapshot", "request_shards", "provider_batches").success
            first, _, waiting = h.ledger.shards(h.job_id())
            assert waiting.raw_status == WAITING_FOR_QUOTA
            later = DAY + dt.timedelta(days=1)
            write_day(h.home, later, 10)
            ctx = steps.StepContext(h.spec, later, h.ledger, h.storage, h.provider)
            steps.take_snapshot(ctx, h.settings.resolve_source_uri(h.spec.source.uri))
            steps.build_shards(ctx)
            fake.polls_per_state = 0
            steps.poll_shards(h.ledger, h.provider, [first])  # one place frees

            held = steps.submit_shards(ctx)
            assert held.submitted == {} and "older days" in (held.quota_reason or "")
            older = steps.submit_shards(
                steps.StepContext(h.spec, DAY, h.ledger, h.storage, h.provider)
            )
            assert list(older.submitted) == [waiting.shard_id]

            # A waiting shard no run has looked at for long holds nothing back.
            assert h.ledger.shards(ctx.job_id)[0].raw_status == WAITING_FOR_QUOTA
            h.wait_for_batches()  # the provider ends the older day's batches
            write_day(h.home, DAY - dt.timedelta(days=1), 10)
            stale = steps.StepContext(
                h.spec, DAY - dt.timedelta(days=1), h.ledger, h.storage, h.provider
            )
            steps.take_snapshot(stale, h.settings.resolve_source_uri(h.spec.source.uri))
            steps.build_shards(stale)
            [old] = h.ledger.shards(stale.job_id)
            long_ago = utcnow() - dt.timedelta(hours=1)
            h.ledger.update_shard(old.shard_id, raw_status=WAITING_FOR_QUOTA, not_before=long_ago)
            with h.ledger.engine.begin() as conn:
                conn.execute(
                    sa.update(shard_table)
                    .where(shard_table.c.shard_id == old.shard_id)
                    .values(updated_at=long_ago)
                )
            assert list(steps.submit_shards(ctx).submitted) == [
                h.ledger.shards(ctx.job_id)[0].shard_id
            ]
