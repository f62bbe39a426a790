"""Estimate against actual, per provider: the demo's support tickets for several days through
the local provider (really run here) and the fake OpenAI and Anthropic servers of tests/.

For each day it prints the input-token error (billed over estimated, on the items billed) and
the cost error (billed over the day's estimate); from the second day on, the output estimate
is learned from the earlier days. The fakes count tokens their own way: the OpenAI fake like
the API (the model's BPE plus chat framing), the Anthropic fake four characters a token, so
its row shows our approximation against that rule rather than against Claude's tokenizer (see
bench/token_estimates.py for that).

    .venv/bin/python bench/cost_estimates.py [--days 4 --per-day 60]
"""

import argparse
import contextlib
import datetime as dt
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llm_assets import steps  # noqa: E402
from llm_assets.defs.run_failures import StepFailed
from llm_assets.defs.runner import PartitionRunner
from llm_assets.demo.data import generate_demo_data
from llm_assets.resources.ledger import LedgerResource  # noqa: E402
from llm_assets.resources.providers import provider_resource_key  # noqa: E402
from llm_assets.resources.providers.anthropic_batch import AnthropicBatchProvider  # noqa: E402
from llm_assets.resources.providers.local import LocalProvider  # noqa: E402
from llm_assets.resources.providers.openai_batch import OpenAIBatchProvider  # noqa: E402
from llm_assets.resources.storage import ArtifactStorage  # noqa: E402
from llm_assets.spec.model import PipelineSpec
from llm_assets.util.settings import Settings
from tests.fakes.anthropic_server import FakeAnthropic  # noqa: E402
from tests.fakes.openai_server import FakeOpenAI  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
START = dt.date(2026, 11, 2)
MODELS = {
    "local": "all-MiniLM-L6-v2",
    "openai": "gpt-4o-mini",
    "anthropic": "claude-haiku-4-5",
}


@contextlib.contextmanager
def provider(name: str, state: Path) -> Iterator[Any]:
    fast = {"retry_base_seconds": 0.01, "retry_cap_seconds": 0.05, "max_retry_after_seconds": 0.05}
    if name == "local":
        yield LocalProvider(state_dir=str(state))
    elif name == "openai":
        with FakeOpenAI(state) as fake:
            yield OpenAIBatchProvider(api_key="bench", base_url=fake.base_url, **fast)
    else:
        with FakeAnthropic(state) as fake:
            yield AnthropicBatchProvider(api_key="bench", base_url=fake.base_url, **fast)


def run(name: str, days: int, per_day: int, root: Path) -> list[dict[str, Any]]:
    home = root / name
    generate_demo_data(home / "demo", START, days=days, tickets_per_day=per_day)
    raw = yaml.safe_load((REPO / "pipelines" / "support_tickets.yaml").read_text())
    raw["model"]["provider"], raw["model"]["name"] = name, MODELS[name]
    if name != "local":
        raw["model"].pop("options", None)
    spec = PipelineSpec.model_validate(raw)
    settings = Settings(
        home=home,
        database_url=f"sqlite:///{home / 'ledger.db'}",
        pipelines_dir=REPO / "pipelines",
        storage_url=str(home / "artifacts"),
        dagster_home=home / "dagster",
    )
    ledger = LedgerResource(database_url=settings.database_url)
    rows = []
    with provider(name, home / "fake") as batch_provider:
        resources = {
            "ledger": ledger,
            "storage": ArtifactStorage(base_url=settings.storage_url),
            provider_resource_key(name): batch_provider,
        }
        with dg.DagsterInstance.ephemeral() as instance:
            runner = PartitionRunner(
                settings, spec, instance, resources=resources, poll_interval=0.0, log_level="ERROR"
            )
            for n in range(days):
                day = START + dt.timedelta(days=n)
                try:
                    runner.run_day(day, wait=True)
                except StepFailed as exc:
                    # The fake Anthropic answers free text; quality does not matter for cost.
                    if exc.gate != "quality":
                        raise
                report = steps.cost_report(
                    steps.StepContext(spec, day, ledger, resources["storage"])
                )
                rows.append(
                    {
                        "provider": name,
                        "day": day.isoformat(),
                        "items": report.items,
                        "input_error": report.input_token_estimate_error,
                        "cost_error": report.cost_estimate_error,
                        "upper_over_actual": report.estimated_cost_upper_usd / report.cost_usd
                        if report.cost_usd
                        else None,
                    }
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", type=int, default=4)
    parser.add_argument("--per-day", type=int, default=60)
    args = parser.parse_args()
    print("| provider | day | items | input tokens error | cost error | upper bound / actual |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in MODELS:
            for row in run(name, args.days, args.per_day, Path(tmp)):
                cost = "n/a ($0)" if row["cost_error"] is None else f"{row['cost_error']:+.1%}"
                ratio = row["upper_over_actual"]
                print(
                    f"| {row['provider']} | {row['day']} | {row['items']} | "
                    f"{row['input_error']:+.1%} | {cost} | "
                    f"{'n/a' if ratio is None else f'{ratio:.2f}x'} |"
                )


if __name__ == "__main__":
    main()
