"""Provider quotas met by a day: refusals are waited out, never spent as attempts or turned
into dead letters, and the spec's quota section keeps submission under a known quota."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llm_assets.resources.providers.base import WAITING_FOR_QUOTA
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.openai_server import FakeOpenAI
from tests.harness import Harness, open_harness, provider_for, review_spec, truthful

pytestmark = pytest.mark.one_database

REVIEWS = 200
"""Twenty shards of ten."""
LIMIT = 1200
"""Prompt tokens in flight at once: three of the day's shards (about 381 tokens each)."""


def assert_done_in_one_attempt(harness: Harness) -> dict[str, dict[str, Any]]:
    rows = harness.rows()
    assert len(rows) == REVIEWS
    assert {r["status"] for r in rows.values()} == {"succeeded"}
    assert {r["attempts"] for r in rows.values()} == {1}
    assert harness.labels() == harness.truth
    return rows


@pytest.fixture
def openai_day(tmp_path: Path, database_url: str) -> Iterator[tuple[FakeOpenAI, Path, str]]:
    with FakeOpenAI(tmp_path / "fake") as fake:
        fake.responder = truthful
        fake.enqueued_token_limit = LIMIT
        yield fake, tmp_path, database_url


@pytest.mark.parametrize("kept_by_spec", [True, False], ids=["spec-limit", "learned"])
def test_an_enqueued_token_limit_is_waited_out_without_spending_attempts(
    openai_day: tuple[FakeOpenAI, Path, str], kept_by_spec: bool
) -> None:
    fake, tmp_path, database_url = openai_day
    quota = {"quota": {"max_enqueued_tokens": LIMIT}} if kept_by_spec else {}
    spec = review_spec("openai", "gpt-4o-mini", **quota)
    with open_harness(tmp_path, database_url, spec, provider_for(fake), reviews=REVIEWS) as h:
        outcome = h.run_day()

        assert outcome.done and outcome.succeeded == REVIEWS
        assert_done_in_one_attempt(h)
        shards = h.ledger.shards(h.job_id())
        refused = [s for s in shards if s.raw_status == "failed"]
        assert all("token_limit_exceeded" in (s.message or "") for s in refused)
        if kept_by_spec:
            # Submission kept under the limit: the provider never had to refuse a batch.
            assert refused == []
            assert fake.peak_enqueued_tokens["gpt-4o-mini"] <= LIMIT
            assert len(shards) == REVIEWS // 10
        else:
            # Submission started slowly and learned the limit from at most one refusal; a
            # refused batch ran nothing, and its items went again in a later round.
            assert len(refused) <= 1
            assert sum(s.item_count for s in shards if s.kind == "retry") >= sum(
                s.item_count for s in refused
            )
        assert set(fake.billed.values()) == {1}


def test_the_quota_wait_shows_in_the_ledger_and_the_step_metadata(
    tmp_path: Path, database_url: str
) -> None:
    with FakeAnthropic(tmp_path / "fake") as fake:
        fake.max_processing_batches = 1
        fake.quota_retry_after = 30
        fake.polls_per_state = 1000  # the first batch stays in progress
        spec = review_spec("anthropic", "claude-haiku-4-5")
        with open_harness(tmp_path, database_url, spec, provider_for(fake), reviews=30) as h:
            result = h.materialize("input_snapshot", "request_shards", "provider_batches")

            assert result.success
            node = "reviews_anthropic__provider_batches"
            [materialization] = result.asset_materializations_for_node(node)
            metadata = {k: v.value for k, v in materialization.metadata.items()}
            assert metadata["submitted_shards"] == 1
            assert metadata["shards_waiting_for_quota"] == 2
            # What is in flight against what was learned, and how: here the provider said.
            assert metadata["quota"].startswith(
                "waiting for quota: 1 of ~1 batches of claude-haiku-4-5 in flight "
                "(stated by the provider "
            )
            assert "exceeded your limit of 1" in metadata["quota"]
            waiting = [s for s in h.ledger.shards(h.job_id()) if s.provider_batch_id is None]
            assert {s.raw_status for s in waiting} == {WAITING_FOR_QUOTA}
            assert all(s.not_before is not None for s in waiting)
            assert {r["attempts"] for r in h.rows().values()} == {0, 1}
