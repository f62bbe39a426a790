"""List prices from `genai-prices` (pydantic's maintained price data), read from the snapshot
the installed release bundles: never fetched, so prices change only with the pinned version.

The library is imported when a model is not in the repo's price table, not before: its data
module is 1.6 MB of Python and takes a fifth of a second to import with the library, which a
command or worker that needs only the table's models never pays. Nothing here imports the
rest of `llm_assets`; `pricing.py` turns a `LibraryPrice` into the project's `ModelPrice`.

How the library's prices are read:

- provider: each of our providers that calls a vendor's API is that vendor's provider in the
  library (`LIBRARY_PROVIDERS`); `azure_openai` is the library's `azure`, which falls back to
  OpenAI's prices for the OpenAI models it does not list. `local` and `online` are priced by
  the repo's table only.
- model: the library's own matching of a model name (it knows dated and aliased names).
- date: the prices in force on the day asked for (the library dates price changes).
- tiers: a price that rises with the prompt's length is read at its base tier, the price of
  prompts up to the first threshold; the threshold and the higher price go in `notes`.
- batch: the library's `processing: batch` prices, when it has them, as a discount off the
  realtime input and output prices (one discount, or none when they differ) and a batch price
  for cached input of its own; else `None`, and the repo's table supplies the discount.
- cache writes: the five-minute write price (`cache_write_mtok`).
"""

import dataclasses
import datetime as dt
import difflib
import functools
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from genai_prices.types import ModelInfo, Provider

PACKAGE = "genai-prices"
LIBRARY_PROVIDERS: dict[str, str] = {
    "openai": "openai",
    "azure_openai": "azure",
    "anthropic": "anthropic",
    "bedrock": "aws",
    "gemini": "google",
}
"""Our provider names and the library's provider ids that price them."""
FALLBACKS: dict[str, tuple[str, ...]] = {"azure_openai": ("openai",)}
"""The library's providers whose models a provider of ours may fall back to, where the
library's own list is wider than what the provider serves: Azure OpenAI's Batch API serves
OpenAI's models, not the other vendors' the library's `azure` also prices."""
_BATCH = {"processing": "batch"}


@dataclasses.dataclass(frozen=True)
class LibraryPrice:
    """A model's prices in USD per 1M tokens as the library has them, mapped by the rules of
    this module's docstring."""

    model_id: str
    input: Decimal
    output: Decimal
    cached_input: Decimal | None
    cache_write: Decimal | None
    context_window: int
    batch_discount: Decimal | None
    """1 - batch price / realtime price of input and output; None: no batch price."""
    batch_cached_input: Decimal | None
    notes: str


@functools.cache
def installed_version() -> str:
    """The installed release of the library (without importing it)."""
    from importlib.metadata import version

    return version(PACKAGE)


def _providers() -> "list[Provider]":
    """The bundled snapshot's providers: the data module is imported here, once."""
    from genai_prices.data_snapshot import get_snapshot

    return get_snapshot().providers


def _provider(provider: str) -> "Provider | None":
    library_id = LIBRARY_PROVIDERS.get(provider)
    return next((p for p in _providers() if p.id == library_id), None)


def _fallbacks(provider: str, found: "Provider") -> list[str]:
    """The library provider ids `provider`'s models may fall back to."""
    allowed = FALLBACKS.get(provider)
    fallbacks = found.fallback_model_providers or []
    return [f for f in fallbacks if allowed is None or f in allowed]


def _find(provider: str, name: str) -> "ModelInfo | None":
    found = _provider(provider)
    if found is None:
        return None
    fallbacks = _fallbacks(provider, found)
    others = [p for p in _providers() if p.id in fallbacks]
    return found.find_model(name, all_providers=others)


@functools.lru_cache(maxsize=256)
def library_price(provider: str, name: str, on: dt.date) -> LibraryPrice | str | None:
    """The library's prices of `provider`'s model `name` in force on `on`; a sentence saying
    why the library cannot price a model it knows; None when it does not know the model."""
    if provider not in LIBRARY_PROVIDERS:
        return None
    model = _find(provider, name)
    if model is None:
        return None
    when = dt.datetime.combine(on, dt.time(12), dt.UTC)
    realtime = model.get_prices(when)
    batch = model.get_prices(when, _BATCH)
    known = f"{PACKAGE} {installed_version()} has {model.id} for {name!r}"
    input_price, output_price = _base(realtime.input_mtok), _base(realtime.output_mtok)
    if input_price is None:
        return f"{known} but no price per input token"
    if not model.context_window:
        return f"{known} but not its context window"
    discount, batch_cached = _batch(realtime, batch)
    return LibraryPrice(
        model_id=model.id,
        input=input_price,
        output=output_price or Decimal(0),
        cached_input=_base(realtime.cache_read_mtok),
        cache_write=_base(realtime.cache_write_mtok),
        context_window=model.context_window,
        batch_discount=discount,
        batch_cached_input=batch_cached,
        notes=_tier_notes(realtime),
    )


def _base(price: Any) -> Decimal | None:
    """A price's base tier (the price itself when it has no tiers)."""
    if price is None:
        return None
    base = getattr(price, "base", price)
    assert isinstance(base, Decimal)
    return base


def _batch(realtime: Any, batch: Any) -> tuple[Decimal | None, Decimal | None]:
    """(discount, cached-input price) in a batch; (None, None) when the library has no batch
    price or its input and output are not discounted alike."""
    pairs = [
        (_base(realtime.input_mtok), _base(batch.input_mtok)),
        (_base(realtime.output_mtok), _base(batch.output_mtok)),
    ]
    ratios = {b / r for r, b in pairs if r and b is not None}
    if len(ratios) != 1:
        return None, None
    (ratio,) = ratios
    if ratio >= 1:
        return None, None
    return 1 - ratio, _base(batch.cache_read_mtok)


def _tier_notes(realtime: Any) -> str:
    tiers = getattr(realtime.input_mtok, "tiers", None)
    if not tiers:
        return ""
    first = tiers[0]
    output = _tier_price(realtime.output_mtok, first.start)
    higher = f"${first.price} input" + (f", ${output} output" if output is not None else "")
    return (
        f"tiered: priced at the base tier; prompts over {first.start:,} input tokens are "
        f"billed {higher} per MTok"
    )


def _tier_price(price: Any, start: int) -> Decimal | None:
    for tier in getattr(price, "tiers", []):
        if tier.start == start:
            assert isinstance(tier.price, Decimal)
            return tier.price
    return None


def library_names(provider: str) -> list[str]:
    """The names the library knows `provider`'s models by (with the models of the providers
    it falls back to): each model's id and the names its matching takes whole or as a
    prefix. Not every one of them is matched (an id may not be): see `knows`."""
    found = _provider(provider)
    if found is None:
        return []
    models = list(found.models)
    for fallback in _fallbacks(provider, found):
        models += [m for p in _providers() if p.id == fallback for m in p.models]
    names = []
    for model in models:
        names.append(model.id)
        clauses: list[Any] = [model.match]
        while clauses:
            clause = clauses.pop()
            for attribute in ("equals", "starts_with"):
                value = getattr(clause, attribute, None)
                if isinstance(value, str) and not value.endswith(("-", ".", ":", "_")):
                    names.append(value)
            clauses.extend(getattr(clause, "or_", []))
    return list(dict.fromkeys(names))


def knows(provider: str, name: str) -> bool:
    """Whether the library matches `name` to one of `provider`'s models."""
    return _find(provider, name) is not None


def close_names(name: str, candidates: list[str], count: int = 30) -> list[str]:
    """The candidates most like `name` (difflib's ratio), most alike first."""
    return difflib.get_close_matches(name, candidates, n=count, cutoff=0.6)
