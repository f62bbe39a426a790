"""The contract every batch adapter keeps, each against its fake server through the official
SDK (tests/provider_kits.py says how to start each one and inject each fault).

The first half drives an adapter directly (submit, poll, results, cancel): a create is made
once whatever its answer, the control plane's errors go by class, quotas refuse without
creating, batches that end part way keep what they answered. The second half runs a day of
the review pipeline through Dagster and the ledger on each adapter (marked one_database):
what a provider does to a day's items, retries, crashes and files.
"""

import contextlib
import datetime as dt
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from llm_assets.resources.ledger import TERMINAL, utcnow
from llm_assets.resources.providers.base import (
    BatchProvider,
    BatchStatus,
    ItemResult,
    RequestItem,
    ShardFiles,
    ShardState,
    ShardSubmission,
)
from llm_assets.resources.providers.registry import ADAPTERS
from llm_assets.resources.providers.retrying import QuotaRefused
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.results.validation import parse_output
from llm_assets.spec.model import PipelineSpec
from tests.conftest import running_fake
from tests.fakes.common import ControlFault, LostResponseFault, delay_fault
from tests.harness import Harness, open_harness, review_spec
from tests.provider_kits import ProviderKit, kit_cases, kits, storage_for

POLLS = 200
"""The most polls a batch of the fakes takes to end (each poll moves it on)."""
ITEMS = 10


@dataclass
class Rig:
    """An adapter, its fake (None for an in-process adapter) and artifact storage."""

    kit: ProviderKit
    fake: Any
    provider: BatchProvider
    storage: ArtifactStorage
    spec: PipelineSpec

    def shard(self, shard_id: str = "shard-a", count: int = ITEMS) -> ShardSubmission:
        """A shard of `count` reviews (review n says "Order 100n"), written to storage."""
        words = ("good", "awful", "great", "bad")
        lines = (
            self.provider.encode_request(
                self.spec,
                RequestItem(
                    custom_id=f"{shard_id}-{n}",
                    system=self.spec.prompt.system,
                    user=f"The kettle is {words[n % 4]}. Order {1000 + n} arrived.",
                ),
            )
            for n in range(count)
        )
        written = self.storage.write_lines(f"shards/{shard_id}.jsonl", lines)
        return ShardSubmission(
            shard_id=shard_id,
            job_id="job-1",
            pipeline=self.spec.name,
            input_uri=written.uri,
            item_count=count,
            model=self.spec.model.name,
            format=self.provider.request_format(self.spec),
        )

    def wait(
        self, batch_id: str, until: Callable[[BatchStatus], bool] = lambda s: s.ended
    ) -> BatchStatus:
        for _ in range(POLLS):
            status = self.provider.poll(batch_id)
            if until(status):
                return status
        raise AssertionError(f"{batch_id} still {status.raw_status} after {POLLS} polls")

    def run(self, shard: ShardSubmission) -> tuple[str, BatchStatus, list[ItemResult]]:
        """Submit a shard, wait for its batch to end, read its results."""
        batch_id = self.provider.submit(shard, self.storage)
        status = self.wait(batch_id)
        return batch_id, status, list(self.provider.results(batch_id))

    def batches(self) -> list[str]:
        return self.kit.batches(self.fake)

    def faults_seen(self, method: str, path: str) -> list[str]:
        return sorted(
            str(c["fault"])
            for c in self.fake.calls.entries()
            if c["method"] == method and path in c["path"] and c.get("fault")
        )


@pytest.fixture
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rig]:
    kit: ProviderKit = request.param
    with contextlib.ExitStack() as stack:
        fake = None
        if kit.fake_kind is not None:
            fake = stack.enter_context(
                running_fake(kit.fake_kind, request, tmp_path / "fake", dict(kit.knobs))
            )
        yield Rig(
            kit,
            fake,
            kit.adapter(fake, tmp_path / "adapter"),
            storage_for(kit, request, tmp_path),
            PipelineSpec.model_validate(review_spec(kit.name, kit.model, **kit.spec)),
        )


def rigs(where: Callable[[ProviderKit], bool] = lambda kit: True) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("rig", kits(where), indirect=True)


def has_fake(kit: ProviderKit) -> bool:
    return kit.fake_kind is not None


def ids_of(shard: ShardSubmission) -> set[str]:
    return {f"{shard.shard_id}-{n}" for n in range(shard.item_count)}


# The adapter


@pytest.mark.parametrize("page", ["README.md", "docs/providers.md"])
def test_every_provider_has_a_row_in_the_provider_tables(page: str) -> None:
    text = (Path(__file__).parent.parent / page).read_text()
    rows = {line.split("|")[1].strip(" `") for line in text.splitlines() if line.startswith("| `")}
    assert set(ADAPTERS) <= rows


@rigs()
def test_a_shard_runs_to_one_answer_per_request(rig: Rig) -> None:
    shard = rig.shard()
    batch_id = rig.provider.submit(shard, rig.storage)
    seen = [rig.provider.poll(batch_id)]
    seen.append(rig.wait(batch_id))

    assert not seen[0].ended, "a batch is not done when it is created"
    assert seen[-1].state == ShardState.COMPLETED
    if rig.kit.counts_requests:
        assert seen[-1].total == ITEMS
    results = list(rig.provider.results(batch_id))
    assert sorted(r.custom_id for r in results) == sorted(ids_of(shard))
    for result in results:
        assert result.succeeded and result.input_tokens > 0 and result.output_tokens > 0
        assert parse_output(rig.spec, result.output_text, result.finish_reason).ok


@rigs()
def test_create_is_idempotent(rig: Rig) -> None:
    shard = rig.shard()
    before = utcnow() - dt.timedelta(seconds=1)
    batch_id = rig.provider.submit(shard, rig.storage)

    # A second submission, as after a crash that left only the intent in the ledger.
    again = rig.provider.submit(shard.model_copy(update={"intent_at": before}), rig.storage)

    assert again == batch_id
    rig.wait(batch_id)
    if rig.fake is not None:
        assert rig.batches() == [batch_id]
        assert rig.kit.submitted(rig.fake) == Counter(ids_of(shard))


LOST_CREATES: dict[str, Callable[[str, str], ControlFault]] = {
    "reset": lambda method, path: LostResponseFault(method, path),
    "500": lambda method, path: ControlFault(method, path, status=500, after_handling=True),
}


@pytest.mark.parametrize("lost", LOST_CREATES)
@rigs(has_fake)
def test_a_create_whose_answer_is_lost_makes_one_batch(rig: Rig, lost: str) -> None:
    rig.fake.faults.add(LOST_CREATES[lost](*rig.kit.create))
    shard = rig.shard()

    batch_id, status, results = rig.run(shard)

    assert rig.faults_seen(*rig.kit.create) in (["lost_response"], ["500_after_handling"])
    assert rig.batches() == [batch_id]
    assert rig.kit.submitted(rig.fake) == Counter(ids_of(shard))
    assert status.state == ShardState.COMPLETED and len(results) == ITEMS
    if rig.kit.reconciles_by_listing:
        lists = [c for c in rig.fake.calls.entries() if c["method"] == "GET" and c["status"] == 200]
        assert lists, "the lost create was looked for"


@rigs(lambda kit: kit.reconciles_by_listing)
def test_a_create_answered_after_the_client_gave_up_makes_one_batch(rig: Rig) -> None:
    # The create lands a second after the client timed out; the adapter's looks for it,
    # half a second apart and more, must find it before daring another create.
    rig.fake.faults.add(delay_fault(*rig.kit.create, seconds=1.0))
    update = {"timeout_seconds": 0.5, "retry_base_seconds": 0.5, "retry_cap_seconds": 2.0}
    rig.provider = rig.provider.model_copy(update=update)
    shard = rig.shard()

    batch_id, _, results = rig.run(shard)

    rig.fake.calls.wait_for(lambda call: bool(call.get("delayed")))
    assert rig.batches() == [batch_id]
    assert rig.kit.submitted(rig.fake) == Counter(ids_of(shard))
    assert len(results) == ITEMS


@rigs(has_fake)
def test_transient_control_plane_errors_are_retried_without_a_second_batch(rig: Rig) -> None:
    kit = rig.kit
    for method, path in kit.control:
        rig.fake.faults.add(ControlFault(method, path, status=429, retry_after=0))
        rig.fake.faults.add(ControlFault(method, path, status=kit.busy_status))
        rig.fake.faults.add(ControlFault(method, path, reset_connection=True))
    rig.fake.faults.add(ControlFault(*kit.create, status=kit.busy_status))
    rig.fake.faults.add(ControlFault(*kit.create, reset_connection=True))
    if not kit.throttled_create_is_quota:
        rig.fake.faults.add(ControlFault(*kit.create, status=429, times=2, retry_after=0))
    shard = rig.shard()

    batch_id, status, results = rig.run(shard)

    busy = str(kit.busy_status)
    for method, path in kit.control:
        assert rig.faults_seen(method, path) == sorted(["429", busy, "reset"]), path
    throttled = [] if kit.throttled_create_is_quota else ["429", "429"]
    assert rig.faults_seen(*kit.create) == sorted([busy, "reset", *throttled])
    assert rig.batches() == [batch_id]
    assert rig.kit.submitted(rig.fake) == Counter(ids_of(shard))
    assert status.state == ShardState.COMPLETED and len(results) == ITEMS


@rigs(has_fake)
def test_a_permanent_control_plane_error_is_raised_without_a_retry(rig: Rig) -> None:
    rig.fake.faults.add(ControlFault(*rig.kit.create, status=400, times=5))

    with pytest.raises(Exception) as raised:
        rig.provider.submit(rig.shard(), rig.storage)

    assert not isinstance(raised.value, QuotaRefused)
    assert rig.faults_seen(*rig.kit.create) == ["400"]
    assert rig.batches() == []


@rigs(lambda kit: kit.throttled_create_is_quota and has_fake(kit))
def test_a_throttled_create_is_a_quota_refusal(rig: Rig) -> None:
    rig.fake.faults.add(ControlFault(*rig.kit.create, status=429, retry_after=30))

    with pytest.raises(QuotaRefused) as refused:
        rig.provider.submit(rig.shard(), rig.storage)

    assert refused.value.retry_after_seconds == 30
    assert rig.faults_seen(*rig.kit.create) == ["429"], "a refusal is not asked again at once"
    assert rig.batches() == []


@rigs(lambda kit: bool(kit.quota))
def test_a_quota_refusal_creates_nothing_until_room_frees(rig: Rig) -> None:
    for knob, value in rig.kit.quota.items():
        setattr(rig.fake, knob, value)
    first = rig.provider.submit(rig.shard("shard-a"), rig.storage)
    rig.wait(first, lambda s: s.raw_status == rig.kit.running)  # admitted, counted

    if type(rig.provider).refuses_after_create:
        # The batch is created, then failed while validating: none of it ran.
        refused = rig.provider.submit(rig.shard("shard-b"), rig.storage)
        status = rig.wait(refused)
        assert status.state == ShardState.FAILED
        assert rig.provider.ended_for_quota(status.raw_status, status.message)
        assert list(rig.provider.results(refused)) == []
    else:
        with pytest.raises(QuotaRefused):
            rig.provider.submit(rig.shard("shard-b"), rig.storage)
        assert rig.batches() == [first]

    rig.wait(first)
    _, status, results = rig.run(rig.shard("shard-c"))
    assert status.state == ShardState.COMPLETED and len(results) == ITEMS


@rigs(has_fake)
def test_request_errors_are_classed_transient_or_permanent(rig: Rig) -> None:
    kit = rig.kit
    faults = {n: kind for n, kind in enumerate([*kit.transient, *kit.permanent])}
    rig.kit.strike(
        rig.fake,
        lambda custom_id, text: next(
            (kind for n, kind in faults.items() if f"Order {1000 + n} " in text), None
        ),
    )
    shard = rig.shard()

    _, _, results = rig.run(shard)

    by_id = {r.custom_id: r for r in results}
    assert set(by_id) == ids_of(shard)
    for n, kind in faults.items():
        result = by_id[f"{shard.shard_id}-{n}"]
        assert not result.succeeded, kind
        if kind in kit.transient:
            assert result.error_class == "transient", kind
        else:
            assert (result.error_class, result.error_code) == ("deterministic", kit.permanent[kind])
    assert all(by_id[f"{shard.shard_id}-{n}"].succeeded for n in range(len(faults), ITEMS))


@pytest.mark.parametrize(
    ("rig", "ending"), kit_cases(lambda kit: kit.endings, has_fake), indirect=["rig"]
)
def test_a_batch_that_ends_part_way_keeps_what_it_answered(rig: Rig, ending: Any) -> None:
    rig.kit.end_first_batch(rig.fake, ending.outcome)
    shard = rig.shard()

    _, status, results = rig.run(shard)

    assert status.raw_status == ending.raw_status
    answered = [r.custom_id for r in results if r.succeeded]
    assert len(answered) == len(set(answered)) and set(answered) < ids_of(shard)
    assert bool(answered) == ending.keeps_answers
    assert all(r.error_class != "deterministic" for r in results if not r.succeeded)


@rigs()
def test_cancel_keeps_what_was_answered(rig: Rig) -> None:
    if rig.fake is not None:
        rig.fake.polls_per_state = 2
    shard = rig.shard()
    batch_id = rig.provider.submit(shard, rig.storage)
    running = rig.wait(batch_id, lambda s: s.raw_status == rig.kit.running)

    cancelling = rig.provider.cancel(batch_id)
    ended = rig.wait(batch_id)

    assert cancelling.raw_status == rig.kit.cancelling
    assert ended.ended and rig.provider.poll(batch_id) == ended, "an ended batch stays put"
    results = list(rig.provider.results(batch_id))
    answered = [r.custom_id for r in results if r.succeeded]
    assert len(answered) == len(set(answered)) and 0 < len(answered) < ITEMS
    assert set(answered) < ids_of(shard)
    if rig.fake is None:  # in process: what the last poll before the cancel had run
        assert len(results) == running.completed + running.failed


@rigs(has_fake)
def test_a_server_restart_mid_batch_loses_nothing(rig: Rig) -> None:
    rig.fake.polls_per_state = 2
    shard = rig.shard()
    batch_id = rig.provider.submit(shard, rig.storage)
    rig.provider.poll(batch_id)

    rig.fake.restart()

    status = rig.wait(batch_id)
    assert status.state == ShardState.COMPLETED
    assert sorted(r.custom_id for r in rig.provider.results(batch_id)) == sorted(ids_of(shard))
    assert rig.batches() == [batch_id]


# A day of the review pipeline on each adapter


DayOn = Callable[..., contextlib.AbstractContextManager[tuple[Harness, Any]]]


@pytest.fixture
def day_on(request: pytest.FixtureRequest, tmp_path: Path, database_url: str) -> DayOn:
    """`day_on(kit, **spec)`: the review pipeline on the kit's adapter and fake, as
    (harness, fake); `spec` overrides sections of the review spec."""

    @contextlib.contextmanager
    def open_day(kit: ProviderKit, **spec: Any) -> Iterator[tuple[Harness, Any]]:
        assert kit.fake_kind is not None
        with running_fake(kit.fake_kind, request, tmp_path / "fake", dict(kit.knobs)) as fake:
            pipeline = review_spec(kit.name, kit.model, **{**kit.spec, **spec})
            provider = kit.adapter(fake, tmp_path / "adapter")
            with open_harness(tmp_path, database_url, pipeline, provider) as harness:
                harness.storage = storage_for(kit, request, tmp_path)
                yield harness, fake

    return open_day


def shard_ids(harness: Harness, shard_id: str) -> set[str]:
    """The custom_ids of a shard's request lines."""
    shard = harness.ledger.get_shard(shard_id)
    assert shard is not None
    field = type(harness.provider).line_id_field
    return {json.loads(line)[field] for line in harness.storage.open_lines(shard.input_uri)}


day_kits = pytest.mark.parametrize("kit", kits(has_fake))


@pytest.mark.one_database
@day_kits
def test_a_day_retries_only_the_requests_that_failed_transiently(
    kit: ProviderKit, day_on: DayOn
) -> None:
    once = [*kit.transient, *kit.unanswered, *([kit.duplicate] if kit.duplicate else [])]
    first_time = dict(enumerate(once, start=1))
    dead = {len(once) + 1 + n: kind for n, kind in enumerate(kit.permanent)}
    struck: set[str] = set()

    def faults(custom_id: str, text: str) -> str | None:
        for n, kind in dead.items():
            if f"Order {1000 + n} " in text:
                return kind
        for n, kind in first_time.items():
            if f"Order {1000 + n} " in text and custom_id not in struck:
                struck.add(custom_id)
                return kind
        return None

    with day_on(kit) as (harness, fake):
        kit.strike(fake, faults)

        outcome = harness.run_day()

        assert outcome.open_items == 0
        rows = harness.rows()
        assert len(rows) == len(harness.truth)
        assert all(r["status"] in TERMINAL for r in rows.values())
        by_source = {r["source_id"]: r for r in rows.values()}
        for n, kind in dead.items():
            row = by_source[f"R-20261102-{n:04d}"]
            assert (row["status"], row["error_class"], row["attempts"]) == (
                "dead_letter",
                "deterministic",
                1,
            ), kind
            assert row["error_code"] == kit.permanent[kind]
        retried = {f"R-20261102-{n:04d}" for n, kind in first_time.items() if kind != "duplicate"}
        assert {s for s, r in by_source.items() if r["attempts"] == 2} == retried
        submitted = kit.submitted(fake)
        for custom_id, row in rows.items():
            assert submitted[custom_id] == (2 if row["source_id"] in retried else 1)
        labels = harness.labels()
        assert len(labels) == len(harness.truth) - len(dead)
        assert all(labels[s] == harness.truth[s] for s in labels)
        succeeded = [r for r in rows.values() if r["status"] == "succeeded"]
        assert all(r["input_tokens"] > 0 and r["output_tokens"] > 0 for r in succeeded)
        assert all(r["cost_usd"] > 0 for r in succeeded)
        shards = harness.ledger.shards(harness.job_id())
        assert sorted(kit.batches(fake)) == sorted(str(s.provider_batch_id) for s in shards)


@pytest.mark.one_database
@day_kits
def test_a_crash_between_create_and_record_is_reconciled(kit: ProviderKit, day_on: DayOn) -> None:
    with day_on(kit) as (harness, fake):
        assert harness.materialize("input_snapshot", "request_shards").success
        first = harness.ledger.shards(harness.job_id())[0]
        # What a crash leaves behind: the intent is recorded, the batch exists, its id is not.
        harness.ledger.update_shard(first.shard_id, submit_intent_at=utcnow())
        created = harness.provider.submit(harness.submission(first.shard_id), harness.storage)

        outcome = harness.run_day()

        assert outcome.succeeded == len(harness.truth)
        assert harness.ledger.get_shard(first.shard_id).provider_batch_id == created
        shards = harness.ledger.shards(harness.job_id())
        assert sorted(kit.batches(fake)) == sorted(str(s.provider_batch_id) for s in shards)
        assert kit.submitted(fake) == Counter({cid: 1 for cid in harness.rows()})


@pytest.mark.one_database
@pytest.mark.parametrize("kit", kits(lambda kit: bool(kit.quota)))
def test_a_quota_refusal_is_waited_out_without_spending_attempts(
    kit: ProviderKit, day_on: DayOn
) -> None:
    with day_on(kit) as (harness, fake):
        for knob, value in kit.quota.items():
            setattr(fake, knob, value)

        outcome = harness.run_day()

        assert outcome.done and outcome.succeeded == len(harness.truth)
        rows = harness.rows()
        assert {r["attempts"] for r in rows.values()} == {1}
        shards = harness.ledger.shards(harness.job_id())
        if type(harness.provider).refuses_after_create:
            # Refused batches ran nothing; their requests went again in a later round.
            refused = [s for s in shards if s.raw_status == "failed"]
            assert refused, "the quota was met"
            resent = sum(n - 1 for n in kit.submitted(fake).values())
            assert resent == sum(s.item_count for s in refused)
        else:
            creates = [
                c
                for c in fake.calls.entries()
                if c["method"] == kit.create[0] and kit.create[1] in c["path"]
            ]
            assert any(c["status"] in (400, 429) for c in creates), "the quota was met"
            assert len(kit.batches(fake)) == len(shards)
            assert kit.submitted(fake) == Counter({cid: 1 for cid in rows})


@pytest.mark.one_database
@pytest.mark.parametrize(("kit", "ending"), kit_cases(lambda kit: kit.endings, has_fake))
def test_a_batch_that_ends_part_way_resends_only_what_has_no_answer(
    kit: ProviderKit, ending: Any, day_on: DayOn
) -> None:
    keep = {"retention": {"provider_files": "keep"}}
    with day_on(kit, **keep) as (harness, fake):
        first = kit.end_first_batch(fake, ending.outcome)

        outcome = harness.run_day()

        assert outcome.succeeded == len(harness.truth)
        [ended] = [
            s for s in harness.ledger.shards(harness.job_id()) if s.provider_batch_id == first[0]
        ]
        assert ended.raw_status == ending.raw_status
        answered = {r.custom_id for r in harness.provider.results(first[0]) if r.succeeded}
        rows = harness.rows()
        again = {cid for cid, r in rows.items() if r["attempts"] == 2}
        assert again == shard_ids(harness, ended.shard_id) - answered
        assert bool(answered) == ending.keeps_answers
        assert {r["attempts"] for r in rows.values()} <= {1, 2}
        assert {r["error_class"] for r in rows.values()} == {None}
        assert kit.submitted(fake) == Counter({cid: 2 if cid in again else 1 for cid in rows})


@pytest.mark.one_database
@day_kits
def test_cancel_keeps_the_answered_requests_and_resends_the_rest(
    kit: ProviderKit, day_on: DayOn
) -> None:
    with day_on(kit) as (harness, fake):
        fake.polls_per_state = 2
        assert harness.materialize("input_snapshot", "request_shards", "provider_batches").success
        first = harness.ledger.shards(harness.job_id())[0]
        assert first.provider_batch_id is not None
        for _ in range(POLLS):
            if harness.provider.poll(first.provider_batch_id).raw_status == kit.running:
                break

        cancelling = harness.provider.cancel(first.provider_batch_id)
        outcome = harness.run_day()

        assert cancelling.raw_status == kit.cancelling

        assert outcome.succeeded == len(harness.truth)
        submitted = kit.submitted(fake)
        assert sorted(submitted.values()).count(2) == first.item_count - first.item_count // 2
        assert max(submitted.values()) == 2


@pytest.mark.one_database
@pytest.mark.parametrize("kit", kits(lambda kit: kit.reconciles_by_listing))
def test_two_candidate_batches_stop_submission_until_one_is_cancelled(
    kit: ProviderKit, day_on: DayOn
) -> None:
    with day_on(kit) as (harness, fake):
        assert harness.materialize("input_snapshot", "request_shards").success
        first = harness.ledger.shards(harness.job_id())[0]
        harness.ledger.update_shard(
            first.shard_id, submit_intent_at=utcnow() - dt.timedelta(seconds=1)
        )
        shard = harness.submission(first.shard_id)
        provider: Any = harness.provider
        created = [provider.create_batch(shard, harness.storage) for _ in range(2)]
        before = sorted(kit.batches(fake))

        result = harness.materialize("provider_batches")

        assert not result.success
        failure = next(e for e in result.all_events if e.is_step_failure)
        description = failure.step_failure_data.user_failure_data.description
        assert "stopped to avoid paying twice" in description
        assert first.shard_id in description and "cancel" in description.lower()
        assert sorted(kit.batches(fake)) == before
        assert harness.ledger.get_shard(first.shard_id).provider_batch_id is None

        if not kit.cancel_settles_ambiguity:
            return
        # What the message asks for: cancel the batch that is not this shard's. The other one
        # is then adopted; only the day's other shards get new batches.
        harness.provider.cancel(created[0])
        assert harness.materialize("provider_batches").success
        assert harness.ledger.get_shard(first.shard_id).provider_batch_id == created[1]
        shards = harness.ledger.shards(harness.job_id())
        assert len(kit.batches(fake)) == len(before) + len(shards) - 1


RETENTION_LOGGER = "llm_assets.compliance.retention"


@pytest.mark.one_database
@pytest.mark.parametrize("keep", [False, True], ids=["delete_after_import", "keep"])
@day_kits
def test_provider_files_are_deleted_after_import_unless_the_spec_keeps_them(
    kit: ProviderKit, keep: bool, day_on: DayOn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=RETENTION_LOGGER)
    retention = {"retention": {"provider_files": "keep" if keep else "delete_after_import"}}
    with day_on(kit, **retention) as (harness, fake):
        if not keep:  # a failed request leaves an error file where the provider writes one
            [permanent, *_] = kit.permanent
            kit.strike(fake, lambda cid, text: permanent if "Order 1003 " in text else None)

        assert harness.run_day().open_items == 0

        shards = harness.ledger.shards(harness.job_id())
        assert shards and all(s.status == "imported" for s in shards)
        held = kit.held_files(fake)
        if keep:
            assert len(held) == kit.files_per_batch * len(shards)
            assert all(s.provider_files_deleted_at is None for s in shards)
        else:
            assert held == []
            assert all(s.provider_files_deleted_at is not None for s in shards)
            messages = [r.getMessage() for r in caplog.records if r.name == RETENTION_LOGGER]
            for shard in shards:
                why = f"delete_after_import, shard {shard.shard_id} imported"
                assert any(why in m and str(shard.provider_batch_id) in m for m in messages)
            # Deleting again finds nothing to delete and does not fail.
            files = ShardFiles(
                shard_id=shards[0].shard_id,
                provider_batch_id=str(shards[0].provider_batch_id),
                input_uri=shards[0].input_uri,
            )
            assert harness.provider.delete_files(files) == []
        # The ledger keeps its results and our shard files.
        assert len(harness.labels()) == len(harness.truth) - (0 if keep else 1)
        assert all(harness.storage.exists(s.input_uri) for s in shards)
