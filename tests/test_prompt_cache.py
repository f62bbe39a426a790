"""The prompt cache: a spec's shared system prompt marked for Anthropic's cache, writes and
reads billed at their own rates, against the fake Message Batches server, whose bill is
priced here from Anthropic's list prices, independently of the price table."""

import datetime as dt
import json
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa

from llm_assets import steps
from llm_assets.resources.ledger import result_table
from tests.fakes.anthropic_server import FakeAnthropic
from tests.harness import DAY, Harness, fake_harness, write_reviews
from tests.test_costs import latest_metadata

pytestmark = pytest.mark.fake_server("anthropic")

# claude-haiku-4-5 list prices per 1M tokens (USD), and the Message Batches discount.
INPUT, OUTPUT, READ = Decimal("1.00"), Decimal("5.00"), Decimal("0.10")
WRITE = {"5m": Decimal("1.25"), "1h": Decimal("2.00")}
BATCH = Decimal("0.5")
MIN_CACHEABLE = 4096
"""claude-haiku-4-5's shortest cacheable prefix, in tokens."""

SYSTEM = "Label the review as positive or negative. Return JSON.\n\nExamples:\n" + "".join(
    f"Review: The item number {n} was {'great' if n % 2 else 'awful'}.\n"
    f'Answer: {{"label": "{"positive" if n % 2 else "negative"}", "summary": "item {n}"}}\n'
    for n in range(260)
)
"""Instructions and a few-shot block long enough to be cached (the fake counts four
characters a token)."""


def cached_spec(**cache: Any) -> dict[str, Any]:
    return {"prompt": {"version": "v1", "system": SYSTEM, "template": "{text}", "cache": cache}}


def billed_usd(entry: dict[str, Any]) -> Decimal:
    """What one request of the fake's bill costs at Anthropic's list prices, in a batch."""
    writes = entry["cache_creation"]
    raw = (
        entry["input_tokens"] * INPUT
        + writes["ephemeral_5m_input_tokens"] * WRITE["5m"]
        + writes["ephemeral_1h_input_tokens"] * WRITE["1h"]
        + entry["cache_read_input_tokens"] * READ
        + entry["output_tokens"] * OUTPUT
    )
    return raw * BATCH / 1_000_000


def ledger_cost(harness: Harness, day: dt.date) -> float:
    job_id = steps.existing_job(harness.spec, day, harness.ledger).job_id
    with harness.ledger.engine.connect() as conn:
        total = conn.execute(
            sa.select(sa.func.sum(result_table.c.cost_usd)).where(result_table.c.job_id == job_id)
        ).scalar()
    return float(total)


def by_batch(bill: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    batches: dict[str, list[dict[str, Any]]] = {}
    for entry in bill:
        batches.setdefault(entry["batch_id"], []).append(entry)
    return batches


def test_the_prefix_is_long_enough_to_be_cached() -> None:
    assert len(SYSTEM) // 4 >= MIN_CACHEABLE


def test_concurrent_batches_each_write_and_the_next_day_reads(
    tmp_path: Any, database_url: str, fake: FakeAnthropic
) -> None:
    """Without priming the day's batches start together: each request writes the prefix (the
    fake's in-batch model); the next day's batches, within the TTL, read it. The ledger's
    cost equals the fake's bill priced at Anthropic's list prices."""
    with fake_harness(tmp_path, database_url, fake, **cached_spec(ttl="5m")) as harness:
        shard = harness.storage.open_lines
        first = harness.run_day()
        assert first.succeeded == 24
        shards = harness.ledger.shards(harness.job_id())
        assert len(shards) == 3
        line = json.loads(next(iter(shard(shards[0].input_uri))))
        assert line["params"]["system"] == [
            {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral", "ttl": "5m"}}
        ]
        day_one = fake.bill()
        assert len(day_one) == 24
        assert all(e["cache_creation_input_tokens"] >= MIN_CACHEABLE for e in day_one)
        assert all(e["cache_read_input_tokens"] == 0 for e in day_one)
        rows = [r for r in harness.rows().values() if r["status"] == "succeeded"]
        assert all(r["cache_write_input_tokens"] >= MIN_CACHEABLE for r in rows)
        assert sum(r["cache_write_input_tokens"] for r in rows) == sum(
            e["cache_creation_input_tokens"] for e in day_one
        )
        bill = sum(map(billed_usd, day_one), Decimal(0))
        assert ledger_cost(harness, DAY) == pytest.approx(float(bill), abs=1e-9)
        report = steps.cost_report(harness.context())
        assert report.cost_usd == pytest.approx(float(bill), abs=1e-9)
        # Only writes: the cache cost the day what it wrote over plain input.
        writes = sum(e["cache_creation"]["ephemeral_5m_input_tokens"] for e in day_one)
        extra = writes * (WRITE["5m"] - INPUT) * BATCH / 1_000_000
        assert (report.cache_read_tokens, report.cache_write_tokens) == (0, writes)
        assert report.cache_saved_usd == pytest.approx(-float(extra), abs=1e-9)

        later = DAY + dt.timedelta(days=1)
        write_reviews(harness.home, later, 24)
        assert harness.runner().run_day(later, wait=True).succeeded == 24
        day_two = fake.bill()[24:]
        assert len(day_two) == 24
        assert all(e["cache_read_input_tokens"] >= MIN_CACHEABLE for e in day_two)
        assert all(e["cache_creation_input_tokens"] == 0 for e in day_two)
        bill = sum(map(billed_usd, day_two), Decimal(0))
        assert ledger_cost(harness, later) == pytest.approx(float(bill), abs=1e-9)


def test_a_primed_day_writes_once_and_reads_after_across_a_restart(
    tmp_path: Any, database_url: str, fake: FakeAnthropic
) -> None:
    """With priming, the day's first shard (three items) is sent alone; the run that sent it
    stops there (a restart). The next run waits for it to end, then sends the rest, which
    read what it wrote: one batch of writes at the 1-hour rate, reads after, nothing sent
    twice, and the ledger's cost equal to the fake's bill."""
    spec = cached_spec(ttl="1h", prime=True, prime_items=3)
    with fake_harness(tmp_path, database_url, fake, **spec) as harness:
        harness.submit()
        first_estimate = latest_metadata(harness, "request_shards")["cache_estimate_basis"]
        assert first_estimate.startswith("no cache hits")
        shards = harness.ledger.shards(harness.job_id())
        assert [(s.kind, s.item_count) for s in shards] == [
            ("prime", 3),
            ("first", 10),
            ("first", 10),
            ("first", 1),
        ]
        assert [s.provider_batch_id is not None for s in shards] == [True, False, False, False]
        assert {s.raw_status for s in shards[1:]} == {"priming"}
        assert len(fake.batch_ids()) == 1

        assert harness.run_day().succeeded == 24
        assert sorted(fake.submitted_custom_ids()) == sorted(harness.rows())
        batches = by_batch(fake.bill())
        primer, *rest = batches.values()
        assert len(primer) == 3 and len(rest) == 3
        assert all(e["cache_creation"]["ephemeral_1h_input_tokens"] > 0 for e in primer)
        after = [e for entries in rest for e in entries]
        assert all(e["cache_read_input_tokens"] >= MIN_CACHEABLE for e in after)
        assert all(e["cache_creation_input_tokens"] == 0 for e in after)
        bill = sum(map(billed_usd, fake.bill()), Decimal(0))
        assert ledger_cost(harness, DAY) == pytest.approx(float(bill), abs=1e-9)
        # The cost report shows the cache's tokens and what it saved on the fake's bill: the
        # reads' price under plain input, less the writes' over it, in a batch.
        report = steps.cost_report(harness.context())
        reads = sum(e["cache_read_input_tokens"] for e in fake.bill())
        writes = sum(e["cache_creation"]["ephemeral_1h_input_tokens"] for e in fake.bill())
        saved = (reads * (INPUT - READ) - writes * (WRITE["1h"] - INPUT)) * BATCH / 1_000_000
        assert (report.cache_read_tokens, report.cache_write_tokens) == (reads, writes)
        assert report.cache_saved_usd == pytest.approx(float(saved), abs=1e-9)
        assert report.cache_saved_usd > 0
        assert f"| prompt cache: saved | ${float(saved):.4f} |" in report.markdown(
            harness.spec, DAY
        )
        assert latest_metadata(harness, "cost_report")["cache_read_tokens"] == reads

        # The next day's estimate takes the hit rate measured on this one, and says so.
        rows = [r for r in harness.rows().values() if r["status"] == "succeeded"]
        tokens = sum(r["input_tokens"] for r in rows)
        read = sum(r["cached_input_tokens"] for r in rows) / tokens
        written = sum(r["cache_write_input_tokens"] for r in rows) / tokens
        later = DAY + dt.timedelta(days=1)
        write_reviews(harness.home, later, 24)
        assert harness.materialize("input_snapshot", "request_shards", day=later).success
        basis = latest_metadata(harness, "request_shards")["cache_estimate_basis"]
        assert basis == (
            f"cache hit rate of 1 earlier partition(s): {read:.1%} of input read from the "
            f"cache, {written:.1%} written to it"
        )
        price = steps.price_for(harness.spec)
        job_id = steps.existing_job(harness.spec, later, harness.ledger).job_id
        for shard in harness.ledger.shards(job_id):
            tokens_in = shard.estimated_input_tokens
            expected = price.cost_usd(
                tokens_in,
                shard.estimated_output_tokens,
                batch=True,
                cached_input_tokens=round(tokens_in * read),
                cache_write_input_tokens=round(tokens_in * written),
            )
            assert shard.estimated_cost_usd == pytest.approx(expected)
            uncached = price.cost_usd(tokens_in, shard.estimated_output_tokens, batch=True)
            assert shard.estimated_cost_usd < uncached / 2


@pytest.mark.one_database
def test_the_rest_go_without_a_primed_cache_when_priming_answered_nothing(
    tmp_path: Any, database_url: str, fake: FakeAnthropic
) -> None:
    first_batch: set[str] = set()

    def fail_priming(custom_id: str, params: dict[str, Any]) -> str | None:
        if len(first_batch) < 3 or custom_id in first_batch:
            first_batch.add(custom_id)
            return "api_error" if len(fake.batch_ids()) == 1 else None
        return None

    fake.item_fault = fail_priming
    spec = cached_spec(prime=True, prime_items=3)
    with fake_harness(tmp_path, database_url, fake, **spec) as harness:
        assert harness.run_day().succeeded == 24
        metadata = latest_metadata(harness, "provider_batches")
        assert "with no answer" in metadata["priming"]
        assert "without a primed cache" in metadata["priming"]
        # The day's other shards started together, without a primed cache: each wrote it.
        _, *rest = by_batch(fake.bill()).values()
        assert all(e["cache_creation_input_tokens"] > 0 for e in rest[0] + rest[1] + rest[2])


@pytest.mark.one_database
def test_a_day_built_in_slices_is_primed_once(
    tmp_path: Any, database_url: str, fake: FakeAnthropic
) -> None:
    """Slices build a day's shards apart; one priming shard is made for the day, sent alone,
    and the shards of every slice wait for it and read what it wrote."""
    spec = {**cached_spec(ttl="1h", prime=True, prime_items=3), "sharding": {"slices": 2}}
    with fake_harness(tmp_path, database_url, fake, **spec) as harness:
        assert harness.run_day().succeeded == 24
        shards = harness.ledger.shards(harness.job_id())
        assert [s.item_count for s in shards if s.kind == "prime"] == [3]
        assert sum(s.item_count for s in shards) == 24
        primer, *rest = by_batch(fake.bill()).values()
        assert len(primer) == 3 and len(rest) == len(shards) - 1
        assert all(e["cache_creation"]["ephemeral_1h_input_tokens"] > 0 for e in primer)
        after = [e for entries in rest for e in entries]
        assert all(e["cache_read_input_tokens"] >= MIN_CACHEABLE for e in after)
        assert all(e["cache_creation_input_tokens"] == 0 for e in after)
        assert sorted(fake.submitted_custom_ids()) == sorted(harness.rows())


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("openai", marks=pytest.mark.fake_server("openai")),
        pytest.param("gemini", marks=pytest.mark.fake_server("gemini")),
    ],
)
def test_openai_and_gemini_read_the_repeated_prefix_by_themselves(
    kind: str, tmp_path: Any, database_url: str, fake: Any
) -> None:
    """OpenAI and Gemini cache a long repeated prefix unasked (their fakes: once the batch
    that first sent it has ended). The day's lines keep the system prompt first and the same
    in every line, so the batches after the first read it; the ledger bills those tokens at
    the cached price and the cost report counts them and what they saved."""
    with fake_harness(tmp_path, database_url, fake, **cached_spec()) as harness:
        assert harness.run_day().succeeded == 24
        rows = [r for r in harness.rows().values() if r["status"] == "succeeded"]
        by_shard: dict[str, set[int]] = {}
        for row in rows:
            by_shard.setdefault(row["shard_id"], set()).add(row["cached_input_tokens"])
        # The first batch to run wrote the prefix; each later one read all of it.
        assert sorted(len(v) for v in by_shard.values()) == [1, 1, 1]
        reads = sorted(next(iter(v)) for v in by_shard.values())
        assert reads[0] == 0 and reads[1] == reads[2] >= 1024, reads
        price = steps.price_for(harness.spec)
        expected = sum(
            Decimal(
                repr(
                    price.cost_usd(
                        r["input_tokens"],
                        r["output_tokens"],
                        batch=True,
                        cached_input_tokens=r["cached_input_tokens"],
                    )
                )
            )
            for r in rows
        )
        assert ledger_cost(harness, DAY) == pytest.approx(float(expected), abs=1e-9)
        report = steps.cost_report(harness.context())
        plain, cached, _, _ = price.per_mtok(batch=True)
        read = sum(r["cached_input_tokens"] for r in rows)
        assert (report.cache_read_tokens, report.cache_write_tokens) == (read, 0)
        assert report.cache_saved_usd == pytest.approx(float(read * (plain - cached) / 10**6))
        # Gemini's batch price for cached input is under its batch input price; OpenAI's
        # (genai-prices' batch prices of gpt-4o-mini) is the same: a read saves nothing there.
        assert (report.cache_saved_usd > 0) == (plain > cached) == (kind == "gemini")
