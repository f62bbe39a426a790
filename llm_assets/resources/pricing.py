"""The price table: looked up by (provider, model name), never guessed.

A model's prices come from the repo's `prices.yaml` (with the entries of the file
LLM_ASSETS_PRICES names on top) when it has an entry, else from the pinned `genai-prices`
release (`price_library.py`), with the table's per-provider batch discount where the library
has no batch price. Each price says where it came from (`source`, `batch_source`).

Costs are computed in Decimal from the decimal prices, so the arithmetic is exact (10,000
items of 500 input and 100 output tokens at $3/$15 per MTok is $30.00, $15.00 in a batch)
and only becomes a float when it is stored.
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

from llm_assets.resources import price_library
from llm_assets.results.rows import CostOf, scaled_cost_usd

DEFAULT_PRICES = Path(__file__).with_name("prices.yaml")
Tokenizer = Literal["o200k_base", "cl100k_base"]
OPENAI_PROVIDERS = ("openai", "azure_openai")
"""Providers that serve OpenAI's models, whose tokenizers are published."""
_CL100K = ("gpt-3.5", "gpt-35", "gpt-4-", "text-embedding-", "ada", "babbage", "curie", "davinci")
CACHE_WRITE_FACTOR = Decimal("1.25")
"""A cache write's price over plain input where the price gives none (Anthropic's 5-minute
cache)."""
LONG_CACHE_WRITE_FACTOR = Decimal(2)
"""A write to Anthropic's 1-hour cache, over plain input."""


def openai_tokenizer(model: str) -> Tokenizer:
    """The tokenizer of an OpenAI model: cl100k_base for the models before gpt-4o (gpt-3.5,
    gpt-4, gpt-4-turbo, the text-embedding and legacy completion models), o200k_base for
    gpt-4o and every model since (gpt-4.1, gpt-4.5, gpt-5 and later, the o-series, codex,
    gpt-oss), a fine-tune as its base model."""
    name = model.lower().removeprefix("ft:")
    if name == "gpt-4" or name.startswith(_CL100K):
        return "cl100k_base"
    return "o200k_base"


class ModelPrice(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    provider: str
    name: str
    input_per_mtok: float = Field(ge=0)
    output_per_mtok: float = Field(ge=0)
    cached_input_per_mtok: float | None = Field(default=None, ge=0)
    """Input tokens read from the provider's prompt cache; the input price when None."""
    cache_write_per_mtok: float | None = Field(default=None, ge=0)
    """Input tokens written to the provider's prompt cache (Anthropic's 5-minute cache);
    None: CACHE_WRITE_FACTOR times input_per_mtok. A shard whose spec keeps the cache an
    hour is charged at `for_cache_ttl("1h")`."""
    batch_discount: float = Field(default=0.0, ge=0, lt=1)
    batch_cached_input_per_mtok: float | None = Field(default=None, ge=0)
    """Cached input in a batch, when it is not the cached price less the batch discount."""
    context_window: int = Field(gt=0)
    tokenizer: Tokenizer = "cl100k_base"
    """The BPE counted with: the model's own for OpenAI (`openai_tokenizer` when not named),
    the base of an approximation else."""
    token_factor: float | None = Field(default=None, gt=0)
    """None: `tokenizer` is the model's own, counts are exact. A number: the model's tokenizer
    is not published and counts are `tokenizer` tokens times this (fitted in bench/); models
    of providers other than OpenAI's that name no tokenizer get 1.1 when the table does not
    say."""
    as_of: dt.date | None = None
    """When this model's prices were read; the table's prices_as_of when not given."""
    source: str = ""
    """Where the prices come from: a price-table file's name or `genai-prices <version>`."""
    batch_source: str = ""
    """Where the batch discount comes from, when not from `source`."""
    notes: str = ""

    @model_validator(mode="after")
    def _tokenizer_by_provider(self) -> "ModelPrice":
        if "tokenizer" in self.model_fields_set:
            return self
        if self.provider in OPENAI_PROVIDERS:
            object.__setattr__(self, "tokenizer", openai_tokenizer(self.name))
        elif self.token_factor is None:
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
        per_input, per_cached, per_write, per_output = self.per_mtok(batch=batch)
        return (
            (input_tokens - cached - written) * per_input
            + cached * per_cached
            + written * per_write
            + output_tokens * per_output
        ) / 1_000_000

    def per_mtok(self, *, batch: bool) -> tuple[Decimal, Decimal, Decimal, Decimal]:
        """(input, cached input, cache write, output) USD per 1M tokens, in a batch or not."""
        factor = _factor(self, batch)
        if batch and self.batch_cached_input_per_mtok is not None:
            cached = _dec(self.batch_cached_input_per_mtok)
        else:
            cached_price = self.cached_input_per_mtok
            cached = _dec(self.input_per_mtok if cached_price is None else cached_price) * factor
        return (
            _dec(self.input_per_mtok) * factor,
            cached,
            self.cache_write_price() * factor,
            _dec(self.output_per_mtok) * factor,
        )

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


def _factor(price: ModelPrice, batch: bool) -> Decimal:
    return 1 - _dec(price.batch_discount) if batch else Decimal(1)


@functools.lru_cache(maxsize=1024)
def _scaled_prices(price: ModelPrice, batch: bool) -> tuple[int, int, int, int, int] | None:
    """The per-token prices (discount applied) as integers over one denominator, or None
    when a price has more decimals than the scale holds exactly. The fraction is reduced:
    with every number below 2**53, Python divides them as floats (exact, so correctly
    rounded) instead of in long arithmetic, which is several times slower."""
    scaled = [p * _SCALE for p in price.per_mtok(batch=batch)]
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


class ProviderDefaults(BaseModel):
    """What a provider's models priced by genai-prices take from the table."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    batch_discount: float = Field(default=0.0, ge=0, lt=1)
    """Used when the library has no batch price for the model."""
    source: str = ""
    """The price-table file that says so (set when read)."""


class LibraryPin(BaseModel):
    """The genai-prices release the table is written for (pinned in pyproject.toml)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str
    prices_as_of: dt.date
    """The newest date the release's data says its prices were checked."""

    @property
    def label(self) -> str:
        return f"{price_library.PACKAGE} {self.version}"


class PriceTable(BaseModel):
    model_config = ConfigDict(frozen=True)

    prices_as_of: str
    models: list[ModelPrice]
    defaults: dict[str, ProviderDefaults] = {}
    """Per provider, for its models priced by genai-prices."""
    token_factors: dict[str, float] = {}
    """Per model family (a word in the model's name), the `token_factor` of a model priced
    by genai-prices whose tokenizer is not published."""
    genai_prices: LibraryPin | None = None
    """The release that prices models the table has no entry for; None: none does."""

    def find(self, provider: str, name: str, *, on: dt.date | None = None) -> ModelPrice | None:
        """The table's entry, else genai-prices' prices in force on `on` (today, UTC)."""
        for price in self.models:
            if price.provider == provider and price.name == name:
                return price
        found = self._library(provider, name, on or dt.datetime.now(dt.UTC).date())
        return found if isinstance(found, ModelPrice) else None

    def get(self, provider: str, name: str) -> ModelPrice:
        price = self.find(provider, name)
        if price is None:
            raise KeyError(f"no price for {provider}/{name}: {self.missing(provider, name)}")
        return price

    def missing(self, provider: str, name: str) -> str:
        """Why no source prices the model, its closest known names and what to do."""
        label = self.genai_prices.label if self.genai_prices else price_library.PACKAGE
        found = self._library(provider, name, dt.datetime.now(dt.UTC).date())
        if isinstance(found, str):
            why = found
        elif provider in price_library.LIBRARY_PROVIDERS and self.genai_prices:
            why = f"neither the price table nor {label} knows it"
        else:
            why = f"the price table does not know it ({label} does not price {provider!r})"
        names = [(p.name, p.source) for p in self.models if p.provider == provider]
        if self.genai_prices and not isinstance(found, str) and self._pinned() is None:
            names += [(n, label) for n in price_library.library_names(provider)]
        sources = dict(reversed(names))
        close = [
            n
            for n in price_library.close_names(name, list(sources))
            if sources[n] != label or price_library.knows(provider, n)
        ][:5]
        nearest = "; closest names: " + ", ".join(f"{n} ({sources[n]})" for n in close)
        return (
            f"{why}{nearest if close else ''}; add it to the price table ({DEFAULT_PRICES.name}"
            " or a file named by LLM_ASSETS_PRICES) so cost is never a silent zero"
        )

    def _pinned(self) -> str | None:
        """Why the installed genai-prices is not the table's; None when it is."""
        pin = self.genai_prices
        installed = price_library.installed_version()
        if pin is None or installed == pin.version:
            return None
        return (
            f"{price_library.PACKAGE} {installed} is installed but the price table is written "
            f"for {pin.version} (install {price_library.PACKAGE}=={pin.version}, as "
            "pyproject.toml pins it)"
        )

    def _library(self, provider: str, name: str, on: dt.date) -> ModelPrice | str | None:
        if self.genai_prices is None or provider not in price_library.LIBRARY_PROVIDERS:
            return None
        wrong = self._pinned()
        if wrong:
            return wrong
        found = price_library.library_price(provider, name, on)
        if not isinstance(found, price_library.LibraryPrice):
            return found
        return _from_library(self, self.genai_prices, provider, name, found)


def _from_library(
    table: PriceTable,
    pin: LibraryPin,
    provider: str,
    name: str,
    found: price_library.LibraryPrice,
) -> ModelPrice | str:
    """The project's price of a model from the library's, with the table's batch discount
    when the library has none and the family's token factor; a sentence when a price has
    more digits than a float keeps."""
    prices = {
        "input_per_mtok": found.input,
        "output_per_mtok": found.output,
        "cached_input_per_mtok": found.cached_input,
        "cache_write_per_mtok": found.cache_write,
        "batch_cached_input_per_mtok": found.batch_cached_input,
    }
    fields: dict[str, object] = {}
    defaults = table.defaults.get(provider, ProviderDefaults())
    if found.batch_discount is None:
        prices["batch_discount"] = Decimal(repr(defaults.batch_discount))
        fields["batch_source"] = f"{defaults.source or DEFAULT_PRICES.name} for {provider}"
    else:
        prices["batch_discount"] = found.batch_discount
    for field, value in prices.items():
        if value is None:
            continue
        if Decimal(repr(float(value))) != value:
            return f"{pin.label} prices {found.model_id} at {value}, more digits than kept"
        fields[field] = float(value)
    family = next((f for f in table.token_factors if f in name.lower()), None)
    if family is not None and provider not in OPENAI_PROVIDERS:
        fields["token_factor"] = table.token_factors[family]
    priced_as = f"priced as {found.model_id}" if found.model_id != name else ""
    notes = "; ".join(n for n in (priced_as, found.notes) if n)
    return ModelPrice(
        provider=provider,
        name=name,
        context_window=found.context_window,
        as_of=pin.prices_as_of,
        source=pin.label,
        notes=notes,
        **fields,  # type: ignore[arg-type]
    )


def _read(path: Path) -> PriceTable:
    table = PriceTable.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    as_of = dt.date.fromisoformat(table.prices_as_of)
    update = {"as_of": as_of, "source": path.name}
    models = [
        m.model_copy(update={k: v for k, v in update.items() if not getattr(m, k)})
        for m in table.models
    ]
    defaults = {k: d.model_copy(update={"source": path.name}) for k, d in table.defaults.items()}
    return table.model_copy(update={"models": models, "defaults": defaults})


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
    return table.model_copy(
        update={
            "prices_as_of": extra.prices_as_of,
            "models": [*kept, *extra.models],
            "defaults": {**table.defaults, **extra.defaults},
            "token_factors": {**table.token_factors, **extra.token_factors},
        }
    )


def load_price_table() -> PriceTable:
    """The repo's table, with the user's overrides from LLM_ASSETS_PRICES on top; models it
    has no entry for are priced by the pinned genai-prices (the repo's table's pin)."""
    return _load(os.environ.get("LLM_ASSETS_PRICES"))


def zero_price_reason(price: ModelPrice) -> str | None:
    """Why every cost of `price`'s model is $0, naming where the price comes from (the
    LLM_ASSETS_PRICES file when it has the entry, else prices.yaml, else genai-prices); None
    when the model's tokens cost something."""
    if (
        price.input_per_mtok
        or price.output_per_mtok
        or price.cached_input_per_mtok
        or price.cache_write_per_mtok
    ):
        return None
    source = price.source or DEFAULT_PRICES.name
    notes = f" ({price.notes})" if price.notes else ""
    return (
        f"{price.provider}/{price.name} is priced at $0 per token in {source}{notes}, so its "
        "tokens cost $0"
    )


def price_source(price: ModelPrice) -> str:
    """Where a price comes from, in words: its source, and its batch discount's when that
    is another."""
    source = price.source or DEFAULT_PRICES.name
    return f"{source} (batch discount: {price.batch_source})" if price.batch_source else source
