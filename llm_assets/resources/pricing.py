"""The price table: looked up by (provider, model name), never guessed.

Costs are computed in Decimal from the table's decimal prices, so the arithmetic is exact
(10,000 items of 500 input and 100 output tokens at $3/$15 per MTok is $30.00, $15.00 in a
batch) and only becomes a float when it is stored.
"""

import datetime as dt
import functools
import math
import os
from decimal import Decimal
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from llm_assets.results.rows import CostOf, scaled_cost_usd

DEFAULT_PRICES = Path(__file__).with_name("prices.yaml")
CACHE_WRITE_FACTOR = Decimal("1.25")
"""A cache write's price over plain input where the table gives none (Anthropic's 5-minute
cache)."""
LONG_CACHE_WRITE_FACTOR = Decimal(2)
"""A write to Anthropic's 1-hour cache, over plain input."""


class ModelPrice(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    provider: str
    name: str
    input_per_mtok: float = Field(ge=0)
    output_per_mtok: float = Field(ge=0)
    cached_input_per_mtok: float | None = Field(default=None, ge=0)
    cache_write_per_mtok: float | None = Field(default=None, ge=0)
    """Input tokens written to the provider's prompt cache (Anthropic's 5-minute cache);
    None: CACHE_WRITE_FACTOR times input_per_mtok. A shard whose spec keeps the cache an
    hour is charged at `for_cache_ttl("1h")`."""
    batch_discount: float = Field(default=0.0, ge=0, lt=1)
    context_window: int = Field(gt=0)
    tokenizer: Literal["o200k_base", "cl100k_base"] = "cl100k_base"
    """The BPE counted with: the model's own for OpenAI, the base of an approximation else."""
    token_factor: float | None = Field(default=None, gt=0)
    """None: `tokenizer` is the model's own, counts are exact. A number: the model's tokenizer
    is not published and counts are `tokenizer` tokens times this (fitted in bench/); models
    of providers other than openai that name no tokenizer get 1.1 when the table does not
    say."""
    as_of: dt.date | None = None
    """When this model's prices were read; the table's prices_as_of when not given."""
    notes: str = ""

    @model_validator(mode="after")
    def _approximate_unpublished(self) -> "ModelPrice":
        named = "tokenizer" in self.model_fields_set
        if self.token_factor is None and self.provider != "openai" and not named:
            object.__setattr__(self, "token_factor", 1.1)
        return self

    def cache_write_price(self) -> Decimal:
        """Per 1M input tokens written to the prompt cache."""
        if self.cache_write_per_mtok is not None:
            return _dec(self.cache_write_per_mtok)
        return _dec(self.input_per_mtok) * CACHE_WRITE_FACTOR

    def for_cache_ttl(self, ttl: str | None) -> "ModelPrice":
        """This price with cache writes at the rate of a cache kept `ttl` ("5m" or "1h"): the
        price a shard is charged at, recorded at its submission."""
        if ttl != "1h":
            return self
        written = _dec(self.input_per_mtok) * LONG_CACHE_WRITE_FACTOR
        return self.model_copy(update={"cache_write_per_mtok": float(written)})

    def cost(
        self,
        input_tokens: int,
        output_tokens: int,
        *,
        batch: bool,
        cached_input_tokens: int = 0,
        cache_write_input_tokens: int = 0,
    ) -> Decimal:
        """Exact cost in USD; of input_tokens, the cached ones at the cached price and those
        written to the cache at the cache-write price."""
        cached = min(max(cached_input_tokens, 0), input_tokens)
        written = min(max(cache_write_input_tokens, 0), input_tokens - cached)
        cached_price = self.cached_input_per_mtok
        if cached_price is None:
            cached_price = self.input_per_mtok
        raw = (
            (input_tokens - cached - written) * _dec(self.input_per_mtok)
            + cached * _dec(cached_price)
            + written * self.cache_write_price()
            + output_tokens * _dec(self.output_per_mtok)
        )
        factor = 1 - _dec(self.batch_discount) if batch else Decimal(1)
        return raw * factor / 1_000_000

    def cost_usd(
        self,
        input_tokens: int,
        output_tokens: int,
        *,
        batch: bool,
        cached_input_tokens: int = 0,
        cache_write_input_tokens: int = 0,
    ) -> float:
        """`cost` as the float stored in the ledger: the nearest float to the exact value."""
        return self.cost_calculator(batch=batch)(
            input_tokens, output_tokens, cached_input_tokens, cache_write_input_tokens
        )

    def cost_calculator(self, *, batch: bool) -> CostOf:
        """cost_usd(input_tokens, output_tokens, cached_input_tokens, cache_write_input_tokens)
        with this price bound, for a call per imported line: done in integers, the nearest
        float to the same exact value (a test checks). Picklable, for worker processes."""
        scaled = _scaled_prices(self, batch)
        if scaled is None:
            return functools.partial(_exact_cost_usd, self, batch)
        return functools.partial(scaled_cost_usd, scaled)


def _exact_cost_usd(
    price: ModelPrice,
    batch: bool,
    input_tokens: int,
    output_tokens: int,
    cached_input_tokens: int,
    cache_write_input_tokens: int,
) -> float:
    return float(
        price.cost(
            input_tokens,
            output_tokens,
            batch=batch,
            cached_input_tokens=cached_input_tokens,
            cache_write_input_tokens=cache_write_input_tokens,
        )
    )


_SCALE = 10**12


@functools.lru_cache(maxsize=1024)
def _scaled_prices(price: ModelPrice, batch: bool) -> tuple[int, int, int, int, int] | None:
    """The per-token prices (discount applied) as integers over one denominator, or None
    when a price has more decimals than the scale holds exactly. The fraction is reduced:
    with every number below 2**53, Python divides them as floats (exact, so correctly
    rounded) instead of in long arithmetic, which is several times slower."""
    cached_price = price.cached_input_per_mtok
    if cached_price is None:
        cached_price = price.input_per_mtok
    factor = 1 - _dec(price.batch_discount) if batch else Decimal(1)
    per_mtok = (
        _dec(price.input_per_mtok),
        _dec(cached_price),
        price.cache_write_price(),
        _dec(price.output_per_mtok),
    )
    scaled = [p * factor * _SCALE for p in per_mtok]
    if any(value != value.to_integral_value() for value in scaled):
        return None
    per_token = [int(value) for value in scaled]
    denominator = _SCALE * 1_000_000
    common = math.gcd(*per_token, denominator)
    per_input, per_cached, per_write, per_output = (p // common for p in per_token)
    return per_input, per_cached, per_write, per_output, denominator // common


@functools.lru_cache(maxsize=1024)
def _dec(value: float) -> Decimal:
    """The decimal the table's author wrote (0.15, not 0.1499999999999999944…)."""
    return Decimal(repr(value))


class PriceTable(BaseModel):
    model_config = ConfigDict(frozen=True)

    prices_as_of: str
    models: list[ModelPrice]

    def find(self, provider: str, name: str) -> ModelPrice | None:
        for price in self.models:
            if price.provider == provider and price.name == name:
                return price
        return None

    def get(self, provider: str, name: str) -> ModelPrice:
        price = self.find(provider, name)
        if price is None:
            raise KeyError(
                f"no price for {provider}/{name}; add it to the price table "
                f"({DEFAULT_PRICES.name} or a file named by LLM_ASSETS_PRICES)"
            )
        return price


def _read(path: Path) -> PriceTable:
    table = PriceTable.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    as_of = dt.date.fromisoformat(table.prices_as_of)
    dated = [m if m.as_of else m.model_copy(update={"as_of": as_of}) for m in table.models]
    return table.model_copy(update={"models": dated})


@functools.cache
def _read_override(override: str) -> PriceTable:
    return _read(Path(override))


@functools.cache
def _load(override: str | None) -> PriceTable:
    table = _read(DEFAULT_PRICES)
    if not override:
        return table
    extra = _read_override(override)
    keys = {(m.provider, m.name) for m in extra.models}
    kept = [m for m in table.models if (m.provider, m.name) not in keys]
    return PriceTable(prices_as_of=extra.prices_as_of, models=[*kept, *extra.models])


def load_price_table() -> PriceTable:
    """The repo's table, with the user's overrides from LLM_ASSETS_PRICES on top."""
    return _load(os.environ.get("LLM_ASSETS_PRICES"))


def zero_price_reason(price: ModelPrice) -> str | None:
    """Why every cost of `price`'s model is $0, naming the price-table file that says so (the
    LLM_ASSETS_PRICES file when it has the entry, else prices.yaml); None when the model's
    tokens cost something."""
    if (
        price.input_per_mtok
        or price.output_per_mtok
        or price.cached_input_per_mtok
        or price.cache_write_per_mtok
    ):
        return None
    source = DEFAULT_PRICES.name
    override = os.environ.get("LLM_ASSETS_PRICES")
    if override and _read_override(override).find(price.provider, price.name):
        source = Path(override).name
    notes = f" ({price.notes})" if price.notes else ""
    return (
        f"{price.provider}/{price.name} is priced at $0 per token in {source}{notes}, so its "
        "tokens cost $0"
    )
