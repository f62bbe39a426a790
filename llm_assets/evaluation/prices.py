"""What a variant's measured work would cost as other models: the spec's `eval.price_as`.

Each item's prompt and answer are counted again with each named model's token counter (exact
where its tokenizer is available offline, the price table's estimate else), so even a
local-model eval shows what the same work costs on the services a team is choosing between.
The counts are priced at the model's batch and realtime prices by the price table; nothing
here does price arithmetic of its own.
"""

import datetime as dt
import zoneinfo
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from llm_assets.evaluation.replay import VariantRun, eval_pipeline_spec
from llm_assets.items.prepare import KnownIds, PreparedItem, Preparer, assess_lines
from llm_assets.items.source import SourceRow, parse_date
from llm_assets.items.tokens import TokenCounter
from llm_assets.resources.ledger import LedgerResource
from llm_assets.resources.pricing import ModelPrice, load_price_table
from llm_assets.spec.model import PipelineSpec

NOT_MEASURED = (0, 0, None)
"""An item the ledger holds nothing for: never sent."""


class ItemWork(BaseModel):
    """One sampled item as a variant handled it."""

    system: str
    """The system prompt as sent."""
    user: str
    """The user message as sent (after the personal-data policy); "" when never sent."""
    output: str | None
    """The answer's text (the validated output JSON text), or None when there is none."""
    input_tokens: int
    """As the variant's provider counted and billed them (the ledger); 0 if never sent."""
    output_tokens: int
    custom_id: str | None = None
    """The item's custom_id in the variant's pipeline, when known."""

    @property
    def sent(self) -> bool:
        return self.input_tokens > 0 or self.output is not None


class WhatIfPrice(BaseModel):
    """A variant's work priced as one `eval.price_as` model."""

    price_as: str
    input_tokens: int
    """The variant's work counted for that model."""
    output_tokens: int
    counted: str
    """How: "exact (o200k_base)", "estimated (cl100k_base × 1.05)" or "as measured", with
    "; output of N items as measured" when items had no output text to count."""
    batch_cost_usd: float
    realtime_cost_usd: float
    batch_cost_per_1k_items_usd: float
    realtime_cost_per_1k_items_usd: float


def rendered_work(
    spec: PipelineSpec,
    records: Sequence[Mapping[str, object]],
    measured: Mapping[str, tuple[int, int, str | None]],
    *,
    id_key: bytes,
    known: Mapping[dt.date, KnownIds] | None = None,
) -> list[ItemWork]:
    """Each sample record as variant `spec` sends it, with its measured tokens and answer.

    Pass the spec the variant ran as (`replay.eval_pipeline_spec`): a record's item is its
    custom_id in that pipeline on the record's own day, the key of `measured`, whose values
    are the ledger's (input_tokens, output_tokens, validated output text). The custom_ids
    are those the ledger gave the items (`known`, by day), else derived with `id_key` (at
    the record's place among the day's records: such an item was never sent). A
    record missing from `measured` was never sent. The prompt goes through the pipeline's
    own preparation (`items.assess_lines`): rendering, the personal-data policy and
    truncation to the model's context window; an item that preparation makes a dead letter
    (blocked, over the context window) is sent as "". ValueError for a record without a
    valid date: samples hold none.
    """
    tz = zoneinfo.ZoneInfo(spec.partitions.timezone)
    by_day: dict[dt.date, list[int]] = {}
    for index, record in enumerate(records):
        day = parse_date(record.get(spec.source.date_field), tz)
        if day is None:
            raise ValueError(
                f"sample record {index} has no valid date in {spec.source.date_field!r}; "
                "rendered_work takes the records of an eval sample, which all have one"
            )
        by_day.setdefault(day, []).append(index)
    context_window = load_price_table().get(spec.model.provider, spec.model.name).context_window
    prepared: dict[int, PreparedItem] = {}
    for day, indexes in by_day.items():
        day_ids = (known or {}).get(day, KnownIds())
        preparer = Preparer(spec, day, context_window, _user_text, id_key, day_ids)
        lines = [SourceRow("sample", i + 1, dict(records[i])).to_json() for i in indexes]
        assessed = assess_lines(preparer, [(0, lines)])
        for index, (_, _, *fields) in zip(indexes, assessed, strict=True):
            prepared[index] = PreparedItem(*fields)
    return [_item_work(spec, prepared[i], measured) for i in range(len(records))]


def _user_text(custom_id: str, user: str) -> bytes:
    """A line encoder that keeps only the user text: what preparation would send."""
    return user.encode("utf-8", errors="surrogatepass")


def _item_work(
    spec: PipelineSpec, item: PreparedItem, measured: Mapping[str, tuple[int, int, str | None]]
) -> ItemWork:
    input_tokens, output_tokens, output = measured.get(item.custom_id, NOT_MEASURED)
    user = "" if item.line is None else item.line.decode("utf-8", errors="surrogatepass")
    return ItemWork(
        system=spec.prompt.system,
        user=user,
        output=output,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        custom_id=item.custom_id,
    )


def what_if_prices(
    entries: Sequence[str], work: Sequence[ItemWork], *, measured_as: str | None = None
) -> list[WhatIfPrice]:
    """`work` priced as each `provider/model` entry of the price table, in order.

    Each sent item's request (system and user as a chat request) and output text are counted
    with the entry's token counter; an item without output text keeps its measured output
    tokens, and an item never sent counts nothing. The entry `measured_as` (the variant's own
    `provider/model`, when given) keeps the measured counts: they are what its provider
    billed. Per-1k-items costs are over all of `work`. ValueError for an entry the price
    table does not have.
    """
    table = load_price_table()
    priced = []
    for entry in entries:
        provider, _, name = entry.partition("/")
        price = table.find(provider, name)
        if price is None:
            why = table.missing(provider, name)
            raise ValueError(f"price_as entry {entry!r} has no price: {why}")
        if entry == measured_as:
            counts = _measured(work)
        else:
            counts = _recounted(TokenCounter(price.tokenizer, price.token_factor, chat=True), work)
        priced.append(_priced(entry, price, *counts, items=len(work)))
    return priced


def _measured(work: Sequence[ItemWork]) -> tuple[int, int, str]:
    return sum(i.input_tokens for i in work), sum(i.output_tokens for i in work), "as measured"


def _recounted(counter: TokenCounter, work: Sequence[ItemWork]) -> tuple[int, int, str]:
    """(input tokens, output tokens, how they were counted) of the sent items of `work`."""
    input_tokens = output_tokens = kept = 0
    for item in work:
        if not item.sent:
            continue
        input_tokens += counter.request(item.system, item.user)
        if item.output is None:
            output_tokens += item.output_tokens
            kept += 1
        else:
            output_tokens += counter.text(item.output)
    if counter.exact:
        counted = f"exact ({counter.tokenizer})"
    else:
        counted = f"estimated ({counter.tokenizer} × {counter.factor:g})"
    if kept:
        counted += f"; output of {kept} item{'' if kept == 1 else 's'} as measured"
    return input_tokens, output_tokens, counted


def _priced(
    entry: str, price: ModelPrice, input_tokens: int, output_tokens: int, counted: str, items: int
) -> WhatIfPrice:
    batch = price.cost_usd(input_tokens, output_tokens, batch=True)
    realtime = price.cost_usd(input_tokens, output_tokens, batch=False)
    return WhatIfPrice(
        price_as=entry,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        counted=counted,
        batch_cost_usd=batch,
        realtime_cost_usd=realtime,
        batch_cost_per_1k_items_usd=batch / items * 1000 if items else 0.0,
        realtime_cost_per_1k_items_usd=realtime / items * 1000 if items else 0.0,
    )


def variant_what_if(
    spec: PipelineSpec,
    run: VariantRun,
    variant: PipelineSpec,
    records: list[dict[str, Any]],
    outputs: Mapping[str, str],
    ledger: LedgerResource,
) -> list[WhatIfPrice]:
    """A replayed variant's sampled items (`records`, the sample's rows), as it sent them,
    priced as each of the pipeline's `eval.price_as` models, with the ledger's token counts
    and its validated `outputs` (custom_id → JSON text). ValueError when the variant's
    configuration changed since it ran."""
    ran_as = eval_pipeline_spec(spec.name, run.variant, variant)
    if ran_as.name != run.pipeline:
        raise ValueError(
            f"variant {run.variant} ran as {run.pipeline}, its spec now as {ran_as.name}: its "
            "configuration changed since the eval; run the eval again"
        )
    measured: dict[str, tuple[int, int, str | None]] = {}
    known: dict[dt.date, KnownIds] = {}
    columns = ["custom_id", "input_tokens", "output_tokens"]
    for day in run.days:
        if day.job_id is None:
            continue
        known[day.day] = KnownIds(ledger.custom_ids_by_source(day.job_id))
        for item in ledger.iter_items(day.job_id, None, columns=columns):
            custom_id = item["custom_id"]
            tokens = (item["input_tokens"] or 0, item["output_tokens"] or 0)
            measured[custom_id] = (*tokens, outputs.get(custom_id))
    work = rendered_work(ran_as, records, measured, id_key=ledger.item_id_key(), known=known)
    return what_if_prices(spec.eval.price_as, work, measured_as=f"{run.provider}/{run.model}")
