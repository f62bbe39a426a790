"""Prices from the pinned genai-prices release with the repo's table as overrides: a model
only the library knows validates, is estimated, gated and billed at the library's own
numbers through the fake OpenAI server; an override wins and says so; an unpriced model
fails validation with the closest names; `llm-assets prices` shows it all."""

import datetime as dt
import json
import os
import re
import tomllib
from decimal import Decimal
from pathlib import Path

import genai_prices
import pytest
import yaml
from click.testing import CliRunner

from llm_assets import steps
from llm_assets.cli.main import main as cli_main
from llm_assets.resources import price_library
from llm_assets.resources.pricing import (
    DEFAULT_PRICES,
    LibraryPin,
    load_price_table,
    openai_tokenizer,
    price_source,
)
from llm_assets.spec.load import check_specs
from llm_assets.util.settings import REPO_ROOT
from tests import cli_process
from tests.fakes.openai_server import FakeOpenAI
from tests.harness import CLI, DAY, fake_harness, review_spec, truthful
from tests.test_costs import billed_lines, latest_metadata

pytestmark = pytest.mark.fake_server("openai", responder=truthful)
LIBRARY_ONLY = "gpt-5-mini"
"""An OpenAI model the repo's table has no entry for."""
GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("LLM_ASSETS_UPDATE_GOLDEN") == "1"


@pytest.fixture(autouse=True)
def _repo_prices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLM_ASSETS_PRICES", raising=False)


def library_cost(input_tokens: int, output_tokens: int, cached: int = 0) -> Decimal:
    """What genai-prices itself says a batch request of LIBRARY_ONLY costs."""
    usage = genai_prices.Usage(
        input_tokens=input_tokens, cache_read_tokens=cached, output_tokens=output_tokens
    )
    return genai_prices.calc_price(
        usage, LIBRARY_ONLY, provider_id="openai", price_context={"processing": "batch"}
    ).total_price


def test_a_model_only_the_library_knows_is_validated_estimated_gated_and_billed(
    tmp_path: Path, one_database_url: str, fake: FakeOpenAI
) -> None:
    table = load_price_table()
    assert all(m.name != LIBRARY_ONLY for m in table.models)
    spec = review_spec("openai", LIBRARY_ONLY)
    spec_file = tmp_path / "reviews.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    assert check_specs(spec_file)[1] == []

    fake.cached_tokens = 8
    model = {"name": LIBRARY_ONLY}
    keep = {"provider_files": "keep"}
    with fake_harness(tmp_path, one_database_url, fake, model=model, retention=keep) as harness:
        ctx = harness.context()
        steps.take_snapshot(ctx, harness.settings.resolve_source_uri(harness.spec.source.uri))
        steps.build_shards(ctx)
        shards = harness.ledger.shards(harness.job_id())
        estimated_input = sum(s.estimated_input_tokens for s in shards)
        # The upper bound: every item's exact input and max_output_tokens, at batch prices.
        upper = library_cost(estimated_input, 24 * 100)
        committed = harness.ledger.committed_cost(harness.job_id())
        assert committed == pytest.approx(float(upper), rel=1e-9)

        def gate(limit: float) -> bool:
            budget = harness.spec.budget.model_copy(update={"max_usd_per_partition": limit})
            spec = harness.spec.model_copy(update={"budget": budget})
            return steps.budget_gate(
                steps.StepContext(spec, DAY, harness.ledger, harness.storage)
            ).passed

        assert gate(float(upper) * 1.001)
        assert not gate(float(upper) * 0.999)

        outcome = harness.run_day()
        assert outcome.succeeded == 24
        bill = sum(
            library_cost(
                usage["prompt_tokens"],
                usage["completion_tokens"],
                usage["prompt_tokens_details"]["cached_tokens"],
            )
            for lines in billed_lines(fake).values()
            for usage in (line["response"]["body"]["usage"] for line in lines)
        )
        report = steps.cost_report(harness.context())
        assert report.cost_usd == pytest.approx(float(bill), rel=1e-9)
        assert report.cost_usd > 0
        metadata = latest_metadata(harness, "cost_report")
        pin = table.genai_prices
        assert pin is not None
        assert metadata["price_source"] == f"genai-prices {genai_prices.__version__}"
        assert metadata["prices_as_of"] == pin.prices_as_of.isoformat()
        # OpenAI's tokenizer rule picked the model's own BPE: the fake counts the same.
        assert metadata["input_token_estimate_error"] == 0.0


def test_an_override_wins_over_the_library_and_says_where_it_comes_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    library = load_price_table().get("openai", LIBRARY_ONLY)
    assert library.source == f"genai-prices {genai_prices.__version__}"
    override = tmp_path / "negotiated.yaml"
    entry = {"provider": "openai", "name": LIBRARY_ONLY, "context_window": 400000}
    entry |= {"input_per_mtok": 0.2, "output_per_mtok": 1.5, "batch_discount": 0.5}
    override.write_text(yaml.safe_dump({"prices_as_of": "2026-12-01", "models": [entry]}))
    monkeypatch.setenv("LLM_ASSETS_PRICES", str(override))
    price = load_price_table().get("openai", LIBRARY_ONLY)
    assert (price.input_per_mtok, price.source, price_source(price)) == (
        0.2,
        "negotiated.yaml",
        "negotiated.yaml",
    )
    assert price.tokenizer == "o200k_base" and price.token_factor is None
    assert price.cost(1_000_000, 1_000_000, batch=True) == Decimal("0.85")


def test_the_library_is_read_by_the_documented_rules() -> None:
    table = load_price_table()
    # Tiered: the base tier, the higher one named in the notes.
    sonnet = table.get("anthropic", "claude-sonnet-4-5")
    assert (sonnet.input_per_mtok, sonnet.output_per_mtok) == (3.0, 15.0)
    assert "over 200,000 input tokens" in sonnet.notes
    # Cache writes at the five-minute price, batch prices from the library's batch variant.
    assert sonnet.cache_write_per_mtok == 3.75
    assert sonnet.cost(1000, 0, batch=False, cache_write_input_tokens=1000) == Decimal("0.00375")
    assert (sonnet.batch_discount, sonnet.batch_source) == (0.5, "")
    assert sonnet.token_factor == table.token_factors["claude"]
    # No batch price in the library (Bedrock): the table's default for the provider.
    nova = table.get("bedrock", "amazon.nova-lite-v1:0")
    assert (nova.batch_discount, nova.batch_source) == (0.5, f"{DEFAULT_PRICES.name} for bedrock")
    # Azure OpenAI falls back to OpenAI's prices, counted with OpenAI's tokenizer.
    azure = table.get("azure_openai", "gpt-4o-mini")
    assert (azure.input_per_mtok, azure.tokenizer, azure.token_factor) == (0.15, "o200k_base", None)
    # ... and to OpenAI's only: the library's Azure also prices other vendors' models, which
    # Azure OpenAI's Batch API does not serve.
    assert table.find("anthropic", "claude-haiku-4-5") is not None
    assert table.find("azure_openai", "claude-haiku-4-5") is None
    # A dated price change is in force from its date on.
    opus = [table.find("anthropic", "claude-opus-4-6", on=dt.date(y, 1, 1)) for y in (2026, 2027)]
    assert all(p is not None for p in opus)


def test_the_pin_is_the_installed_release_and_a_mismatch_prices_nothing() -> None:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    pins = [d for d in pyproject["project"]["dependencies"] if d.startswith("genai-prices")]
    table = load_price_table()
    assert table.genai_prices is not None
    assert pins == [f"genai-prices=={table.genai_prices.version}"]
    assert price_library.installed_version() == table.genai_prices.version
    other = table.model_copy(
        update={"genai_prices": LibraryPin(version="0.0.1", prices_as_of=dt.date(2026, 1, 1))}
    )
    assert other.find("openai", LIBRARY_ONLY) is None
    assert "is installed but the price table is written for 0.0.1" in other.missing(
        "openai", LIBRARY_ONLY
    )


@pytest.mark.parametrize(
    ("model", "tokenizer"),
    [
        ("gpt-4o-mini", "o200k_base"),
        ("gpt-4.1", "o200k_base"),
        ("gpt-5-mini-2025-08-07", "o200k_base"),
        ("gpt-6-luna", "o200k_base"),
        ("o3", "o200k_base"),
        ("o4-mini", "o200k_base"),
        ("ft:gpt-4o-mini:team::abc", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-turbo", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("text-embedding-3-small", "cl100k_base"),
    ],
)
def test_openai_models_get_their_tokenizer_by_one_rule(model: str, tokenizer: str) -> None:
    assert openai_tokenizer(model) == tokenizer


def test_an_unpriced_model_fails_validation_with_the_closest_names(tmp_path: Path) -> None:
    library = f"genai-prices {genai_prices.__version__}"
    cases = {
        ("openai", "gpt-5-mimi"): f"gpt-5-mini ({library})",
        ("online", "llama-3.1-8b"): f"llama-3.1-8b-instruct ({DEFAULT_PRICES.name})",
    }
    for (provider, name), closest in cases.items():
        spec = review_spec(provider, name)
        path = tmp_path / f"{provider}.yaml"
        path.write_text(yaml.safe_dump(spec))
        result = CliRunner().invoke(cli_main, ["validate-spec", str(path)])
        assert result.exit_code == 1
        text = " ".join(result.output.split())
        assert f"model.name: no price for {provider} model {name!r}" in text
        assert f"closest names: {closest}" in text


def _prices_env(tmp_path: Path) -> dict[str, str]:
    specs = tmp_path / "specs"
    specs.mkdir()
    spec = review_spec("openai", LIBRARY_ONLY)
    spec["variants"] = {"sonnet": {"model": {"provider": "anthropic", "name": "claude-sonnet-4-5"}}}
    spec["eval"] = {"price_as": ["bedrock/amazon.nova-lite-v1:0", "gemini/gemini-2.5-pro"]}
    (specs / "reviews.yaml").write_text(yaml.safe_dump(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("LLM_ASSETS_PRICES", "FORCE_COLOR")}
    return env | {"LLM_ASSETS_HOME": str(tmp_path / "home"), "LLM_ASSETS_PIPELINES": str(specs)}


@pytest.mark.slow
def test_prices_lists_each_model_with_its_source_as_a_table_and_as_json(tmp_path: Path) -> None:
    env = _prices_env(tmp_path)
    for columns in (80, 200):
        done = cli_process.run(
            [CLI, "prices", "reviews_openai"],
            env=env | {"COLUMNS": str(columns)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        path = GOLDEN / f"prices_{columns}.txt"
        if UPDATE:
            path.write_text(done.stdout)
        assert done.stdout == path.read_text(), f"prices differs from {path}"

    result = CliRunner().invoke(cli_main, ["prices", "reviews_openai", "--json"], env=env)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["genai_prices"]["version"] == genai_prices.__version__
    rows = {r["model"]: r for r in report["models"]}
    assert [r["used_as"] for r in report["models"]] == [
        "model",
        "variant sonnet",
        "price_as",
        "price_as",
    ]
    mini = load_price_table().get("openai", LIBRARY_ONLY)
    assert rows[LIBRARY_ONLY]["per_mtok_usd"]["input"] == mini.input_per_mtok
    assert rows[LIBRARY_ONLY]["per_mtok_usd"]["batch_output"] == mini.output_per_mtok / 2
    assert rows["gemini-2.5-pro"]["source"] == DEFAULT_PRICES.name
    assert rows["amazon.nova-lite-v1:0"]["batch_source"] == f"{DEFAULT_PRICES.name} for bedrock"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", rows[LIBRARY_ONLY]["prices_as_of"])


def test_every_model_of_the_examples_and_docs_has_a_price_with_its_source() -> None:
    table = load_price_table()
    specs = [yaml.safe_load(p.read_text()) for p in (REPO_ROOT / "pipelines").glob("*.yaml")]
    models = {(s["model"]["provider"], s["model"]["name"]) for s in specs}
    pattern = re.compile(r"provider: (\w+),? *\n?\s*name: ([\w.:-]+)")
    for doc in [REPO_ROOT / "README.md", *(REPO_ROOT / "docs").glob("*.md")]:
        models |= set(pattern.findall(doc.read_text()))
    assert ("openai", "gpt-4.1-mini") in models
    unpriced = [m for m in models if table.find(*m) is None and "gpt-9" not in m[1]]
    assert unpriced == []
    assert all(table.get(*m).source for m in models if "gpt-9" not in m[1])
