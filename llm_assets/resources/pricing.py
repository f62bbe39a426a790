"""The price table: looked up by (provider, model name), never guessed."""

import functools
import os
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

DEFAULT_PRICES = Path(__file__).with_name("prices.yaml")


class ModelPrice(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    provider: str
    name: str
    input_per_mtok: float = Field(ge=0)
    output_per_mtok: float = Field(ge=0)
    cached_input_per_mtok: float | None = Field(default=None, ge=0)
    batch_discount: float = Field(default=0.0, ge=0, lt=1)
    context_window: int = Field(gt=0)
    notes: str = ""

    def cost_usd(self, input_tokens: int, output_tokens: int, *, batch: bool) -> float:
        factor = (1.0 - self.batch_discount) if batch else 1.0
        raw = input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok
        return raw * factor / 1_000_000


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
    return PriceTable.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))


@functools.cache
def _load(override: str | None) -> PriceTable:
    table = _read(DEFAULT_PRICES)
    if not override:
        return table
    extra = _read(Path(override))
    keys = {(m.provider, m.name) for m in extra.models}
    kept = [m for m in table.models if (m.provider, m.name) not in keys]
    return PriceTable(prices_as_of=extra.prices_as_of, models=[*kept, *extra.models])


def load_price_table() -> PriceTable:
    """The repo's table, with the user's overrides from LLM_ASSETS_PRICES on top."""
    return _load(os.environ.get("LLM_ASSETS_PRICES"))
