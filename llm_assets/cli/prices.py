"""`prices [PIPELINE]`: what a pipeline's models cost per 1M tokens, realtime and in a batch,
and where each price comes from (the price table or the pinned genai-prices), with the date
of each source's prices. The models are the pipeline's own, its variants' and its
`eval.price_as` entries; without PIPELINE, every pipeline's."""

import json
import sys
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import click

from llm_assets.cli.args import EXIT_ERROR, load_settings, pipeline_spec
from llm_assets.cli.console import console, print_error, say
from llm_assets.cli.tables import WORDS, Col, FittedTable
from llm_assets.spec.load import SpecError, load_specs

if TYPE_CHECKING:
    from llm_assets.resources.pricing import ModelPrice, PriceTable
    from llm_assets.spec.model import PipelineSpec

Priced = tuple[str, str, "ModelPrice"]
"""(pipeline, what the model is used as, its price)."""
_COLUMNS = (
    Col("model", WORDS),
    Col("used as", WORDS, keep=20),
    Col("input", right=True),
    Col("cached", right=True, keep=30),
    Col("output", right=True),
    Col("batch input", right=True),
    Col("batch output", right=True),
    Col("source", WORDS, keep=40),
)


@click.command()
@click.argument("pipeline", required=False)
@click.option("--json", "as_json", is_flag=True, help="The prices and their sources as JSON.")
def prices(pipeline: str | None, as_json: bool) -> None:
    """What a pipeline's models cost per 1M tokens, realtime and batch, and where each price
    comes from (every pipeline's when none is named)."""
    from llm_assets.resources.pricing import load_price_table

    settings = load_settings()
    if pipeline:
        specs = [pipeline_spec(settings, pipeline)]
    else:
        try:
            specs = load_specs(settings.pipelines_dir)
        except SpecError as exc:
            for problem in exc.problems:
                print_error(str(problem))
            sys.exit(EXIT_ERROR)
    table = load_price_table()
    priced: list[Priced] = []
    for spec in specs:
        for used_as, provider, name in _models(spec):
            price = table.find(provider, name)
            if price is None:
                why = table.missing(provider, name)
                print_error(f"{spec.name}: no price for {provider}/{name}: {why}")
                sys.exit(EXIT_ERROR)
            priced.append((spec.name, used_as, price))
    if as_json:
        click.echo(json.dumps(_report(table, priced), indent=2))
        return
    if not priced:
        say(f"no pipelines in {settings.pipelines_dir}")
        return
    _print(table, priced, several=len(specs) > 1)


def _models(spec: "PipelineSpec") -> list[tuple[str, str, str]]:
    """(used as, provider, model) of the pipeline's model, variants and price_as entries."""
    from llm_assets.evaluation.variants import variant_spec

    models = [("model", spec.model.provider, spec.model.name)]
    for name in spec.variants:
        model = variant_spec(spec, name).model
        models.append((f"variant {name}", model.provider, model.name))
    for entry in spec.eval.price_as:
        provider, _, name = entry.partition("/")
        models.append(("price_as", provider, name))
    return models


def _json(pipeline: str, used_as: str, price: "ModelPrice") -> dict[str, Any]:
    input_, cached, write, output = price.per_mtok(batch=False)
    batch_input, batch_cached, batch_write, batch_output = price.per_mtok(batch=True)
    return {
        "pipeline": pipeline,
        "used_as": used_as,
        "provider": price.provider,
        "model": price.name,
        "source": price.source,
        "batch_source": price.batch_source or price.source,
        "prices_as_of": price.as_of.isoformat() if price.as_of else None,
        "per_mtok_usd": {
            "input": float(input_),
            "cached_input": float(cached),
            "cache_write": float(write),
            "output": float(output),
            "batch_input": float(batch_input),
            "batch_cached_input": float(batch_cached),
            "batch_cache_write": float(batch_write),
            "batch_output": float(batch_output),
        },
        "batch_discount": price.batch_discount,
        "context_window": price.context_window,
        "tokenizer": price.tokenizer,
        "token_factor": price.token_factor,
        "notes": price.notes,
    }


def _report(table: "PriceTable", priced: list[Priced]) -> dict[str, Any]:
    pin = table.genai_prices
    library = (
        {"version": pin.version, "prices_as_of": pin.prices_as_of.isoformat()} if pin else None
    )
    return {
        "genai_prices": library,
        "models": [_json(*entry) for entry in priced],
    }


def mtok(value: Decimal) -> str:
    """A price per 1M tokens: cents always, and every digit it has beyond them."""
    if value == value.quantize(Decimal("0.01")):
        return f"${value:,.2f}"
    return f"${value.normalize():f}"


def _print(table: "PriceTable", priced: list[Priced], *, several: bool) -> None:
    """The table of prices, the date of each source's prices, then each model's notes: where
    its batch discount comes from when not from its source, how a tiered price is read."""
    cells = []
    for pipeline, used_as, price in priced:
        input_, cached, _, output = price.per_mtok(batch=False)
        batch_input, _, _, batch_output = price.per_mtok(batch=True)
        cells.append(
            [
                f"{price.provider}/{price.name}",
                f"{pipeline} {used_as}" if several else used_as,
                *(mtok(v) for v in (input_, cached, output, batch_input, batch_output)),
                price.source,
            ]
        )
    title = "USD per 1M tokens" + ("" if several else f", {priced[0][0]}")
    console.print(FittedTable(_COLUMNS, cells, title=title, hint="prices --json has them"))
    dates: dict[str, set[str]] = {}
    for _, _, price in priced:
        dates.setdefault(price.source, set()).add(str(price.as_of or table.prices_as_of))
    lines = [f"{source}: prices as of {', '.join(sorted(d))}" for source, d in dates.items()]
    for _, _, price in priced:
        model = f"{price.provider}/{price.name}"
        if price.batch_source:
            lines.append(
                f"{model}: batch discount {price.batch_discount:.0%} from {price.batch_source}"
            )
        if price.notes:
            lines.append(f"{model}: {price.notes}")
    for line in dict.fromkeys(lines):
        say(line)
