"""A variant's work priced as the spec's `eval.price_as` models.

Counts are checked against the models' own token counters on the texts, costs against the
price table's numbers, and the prompts against what the pipeline's preparation sends.
"""

import datetime as dt
from decimal import Decimal

import pytest

from llm_assets.evaluation.prices import ItemWork, rendered_work, what_if_prices
from llm_assets.items.ids import custom_id
from llm_assets.items.prepare import KnownIds
from llm_assets.items.tokens import TokenCounter
from llm_assets.resources.pricing import load_price_table
from llm_assets.spec.model import PipelineSpec
from tests.test_spec import good_spec

SYSTEM = "You triage customer support tickets. Return JSON."
MINI = "openai/gpt-4.1-mini"
GPT_4O = "openai/gpt-4o"
HAIKU = "anthropic/claude-haiku-4-5"
KEY = b"the id key of this test, 32 bytes"


@pytest.fixture(autouse=True)
def _default_price_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLM_ASSETS_PRICES", raising=False)


def item(user: str, output: str | None = '{"category": "billing"}', **tokens: int) -> ItemWork:
    measured = {"input_tokens": 40, "output_tokens": 7, **tokens}
    return ItemWork(system=SYSTEM, user=user, output=output, **measured)


WORK = [
    item("Subject: refund\n\nI was charged twice for invoice 8812."),
    item(
        "Subject: login\n\nThe password reset mail never arrives.", '{"category": "account_access"}'
    ),
    item("Subject: parcel\n\nMy package is two weeks late, tracking 55-1290-AB."),
]


def counter(entry: str) -> TokenCounter:
    price = load_price_table().get(*entry.split("/", 1))
    return TokenCounter(price.tokenizer, price.token_factor, chat=True)


def test_an_openai_target_is_counted_exactly_with_its_own_tokenizer() -> None:
    (priced,) = what_if_prices([MINI], WORK)

    exact = counter(MINI)
    assert exact.exact and exact.tokenizer == "o200k_base"
    assert priced.counted == "exact (o200k_base)"
    assert priced.input_tokens == sum(exact.request(SYSTEM, w.user) for w in WORK)
    assert priced.output_tokens == sum(exact.text(w.output or "") for w in WORK)
    # The recount is not the measured count: the items say 40 and 7 each.
    assert (priced.input_tokens, priced.output_tokens) != (120, 21)


def test_a_model_without_an_offline_tokenizer_is_estimated_and_says_so() -> None:
    (priced,) = what_if_prices([HAIKU], WORK)

    price = load_price_table().get("anthropic", "claude-haiku-4-5")
    assert price.token_factor is not None
    assert priced.counted == f"estimated (cl100k_base × {price.token_factor:g})"
    cl100k = TokenCounter("cl100k_base", chat=True)
    raw = sum(cl100k.text(SYSTEM) + cl100k.text(w.user) for w in WORK)
    # Each text's estimate rounds up: at least the factor times the raw tokens, less than one
    # token per text more.
    assert raw * price.token_factor <= priced.input_tokens < raw * price.token_factor + 2 * 3


def test_costs_are_the_price_tables_batch_and_realtime_prices() -> None:
    (priced,) = what_if_prices([MINI], WORK)

    price = load_price_table().get("openai", "gpt-4.1-mini")
    realtime = (
        Decimal(priced.input_tokens) * Decimal("0.40")
        + Decimal(priced.output_tokens) * Decimal("1.60")
    ) / 1_000_000
    assert (price.input_per_mtok, price.output_per_mtok) == (0.40, 1.60)
    assert priced.realtime_cost_usd == pytest.approx(float(realtime), rel=1e-12)
    discount = 1 - price.batch_discount
    assert priced.batch_cost_usd == pytest.approx(priced.realtime_cost_usd * discount, rel=1e-12)
    assert priced.batch_cost_usd < priced.realtime_cost_usd
    per_item = 1000 / len(WORK)
    assert priced.realtime_cost_per_1k_items_usd == pytest.approx(float(realtime) * per_item)
    assert priced.batch_cost_per_1k_items_usd == pytest.approx(priced.batch_cost_usd * per_item)


def test_a_dearer_model_costs_more_for_the_same_work_and_entries_keep_their_order() -> None:
    mini, gpt_4o = what_if_prices([MINI, GPT_4O], WORK)

    assert (mini.price_as, gpt_4o.price_as) == (MINI, GPT_4O)
    # Both count with o200k_base: the same tokens, priced differently.
    assert (mini.input_tokens, mini.output_tokens) == (gpt_4o.input_tokens, gpt_4o.output_tokens)
    assert gpt_4o.realtime_cost_usd > mini.realtime_cost_usd > 0
    assert gpt_4o.batch_cost_usd > mini.batch_cost_usd > 0


def test_an_item_without_output_text_keeps_its_measured_output_tokens() -> None:
    answered, failed = (
        item("Subject: a\n\nfirst"),
        item("Subject: b\n\nsecond", None, output_tokens=13),
    )

    (priced,) = what_if_prices([MINI], [answered, failed])

    exact = counter(MINI)
    assert priced.output_tokens == exact.text(answered.output or "") + 13
    assert priced.input_tokens == exact.request(SYSTEM, answered.user) + exact.request(
        SYSTEM, failed.user
    )
    assert priced.counted == "exact (o200k_base); output of 1 item as measured"


def test_an_item_never_sent_counts_nothing_but_is_one_of_the_items() -> None:
    sent = item("Subject: a\n\nfirst")
    never = item("", None, input_tokens=0, output_tokens=0)

    alone, both = (what_if_prices([MINI], work)[0] for work in ([sent], [sent, never]))

    assert (both.input_tokens, both.output_tokens) == (alone.input_tokens, alone.output_tokens)
    assert both.counted == "exact (o200k_base)"
    assert both.realtime_cost_per_1k_items_usd == pytest.approx(
        alone.realtime_cost_per_1k_items_usd / 2
    )


def test_the_variants_own_model_keeps_the_measured_counts() -> None:
    mini, haiku = what_if_prices([MINI, HAIKU], WORK, measured_as=MINI)

    assert (mini.input_tokens, mini.output_tokens, mini.counted) == (120, 21, "as measured")
    assert mini.realtime_cost_usd == load_price_table().get("openai", "gpt-4.1-mini").cost_usd(
        120, 21, batch=False
    )
    assert haiku.counted.startswith("estimated")


def test_an_entry_missing_from_the_price_table_is_named() -> None:
    with pytest.raises(
        ValueError,
        match="'openai/gpt-0-nano' has no price: neither the price table nor genai-prices",
    ):
        what_if_prices([MINI, "openai/gpt-0-nano"], WORK)


def test_empty_work_costs_nothing() -> None:
    (priced,) = what_if_prices([MINI], [])

    assert (priced.input_tokens, priced.output_tokens) == (0, 0)
    assert priced.batch_cost_usd == priced.realtime_cost_usd == 0.0
    assert priced.batch_cost_per_1k_items_usd == priced.realtime_cost_per_1k_items_usd == 0.0


def openai_spec(model: str = "gpt-4.1-mini", **prompt: object) -> PipelineSpec:
    spec = good_spec()
    spec["model"] = {"provider": "openai", "name": model, "max_output_tokens": 200}
    spec["prompt"].update(prompt)
    return PipelineSpec.model_validate(spec)


def record(ticket: str, body: str, created_at: str = "2026-03-02T10:00:00Z") -> dict[str, object]:
    return {"ticket_id": ticket, "created_at": created_at, "subject": "help", "body": body}


def test_rendered_work_is_the_prompt_the_pipeline_sends_keyed_by_custom_id() -> None:
    spec = openai_spec()
    records = [
        record("T-1", "Mail me at ann@example.com about the refund."),
        record("T-2", "Card 4111 1111 1111 1111 was charged twice.", "2026-03-03T09:00:00Z"),
        record("T-3", "The app does not load."),
    ]
    # T-1's item has the id its job gave it (under an earlier key, say); the others' are
    # derived with the key.
    first = "20260302_given_by_the_ledger"
    measured = {first: (31, 6, '{"category": "billing"}')}
    known = {dt.date(2026, 3, 2): KnownIds({"T-1": first})}

    work = rendered_work(spec, records, measured, id_key=KEY, known=known)

    assert [w.custom_id for w in work] == [
        first,
        custom_id(KEY, spec.name, dt.date(2026, 3, 3), "T-2", 0),
        custom_id(KEY, spec.name, dt.date(2026, 3, 2), "T-3", 1),  # the day's second record
    ]
    # The email is redacted as the policy sends it; the card blocks the item, so it is not sent.
    assert work[0].user == "Subject: help\n\nMail me at <EMAIL_1> about the refund."
    assert (work[0].input_tokens, work[0].output_tokens) == (31, 6)
    assert work[0].output == '{"category": "billing"}'
    assert work[1].user == "" and not work[1].sent
    assert work[2].user == "Subject: help\n\nThe app does not load."
    assert (work[2].input_tokens, work[2].output, work[2].sent) == (0, None, False)
    assert {w.system for w in work} == {spec.prompt.system}


def test_rendered_work_truncates_as_the_pipeline_does() -> None:
    spec = openai_spec("gpt-4o", truncate_to_context=True)
    long = "word " * 140_000  # past gpt-4o's context window of 128,000 tokens

    (work,) = rendered_work(spec, [record("T-1", long)], {}, id_key=KEY)

    window = load_price_table().get("openai", "gpt-4o").context_window
    budget = window - spec.model.max_output_tokens
    assert 0 < len(work.user) < len(long)
    assert counter(GPT_4O).request(spec.prompt.system, work.user) <= budget


def test_rendered_work_takes_dated_records_only() -> None:
    with pytest.raises(ValueError, match="sample record 0 has no valid date in 'created_at'"):
        rendered_work(openai_spec(), [record("T-1", "body", created_at="soon")], {}, id_key=KEY)
