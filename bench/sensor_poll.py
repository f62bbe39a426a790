"""How long one batch-status sensor tick takes with hundreds of OpenAI batches in flight.

Run by hand: `.venv/bin/python bench/sensor_poll.py [--shards 300]`. It starts the fake
OpenAI server from tests/ on loopback, submits N one-request shards through the real
adapter, then times sensor ticks (each makes N status calls) against Dagster's 60 s limit.
"""

import argparse
import datetime as dt
import sys
import tempfile
import time
from pathlib import Path

import dagster as dg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llm_assets import steps  # noqa: E402
from llm_assets.defs.factory import build_pipeline_assets
from llm_assets.defs.sensors import build_batch_status_sensor
from llm_assets.resources.ledger import LedgerResource  # noqa: E402
from llm_assets.resources.providers.openai_batch import OpenAIBatchProvider  # noqa: E402
from llm_assets.resources.storage import ArtifactStorage  # noqa: E402
from llm_assets.spec.model import PipelineSpec
from llm_assets.util.settings import Settings
from tests.fakes.openai_server import FakeOpenAI  # noqa: E402
from tests.harness import DAY, review_spec, write_reviews  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", type=int, default=300)
    parser.add_argument("--ticks", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sensor-bench-"))
    with FakeOpenAI(root / "fake") as fake:
        fake.polls_per_state = 1000
        settings = Settings(
            home=root / "home",
            database_url=f"sqlite:///{root / 'ledger.db'}",
            pipelines_dir=root,
            storage_url=str(root / "artifacts"),
            dagster_home=root / "dagster",
        )
        spec = PipelineSpec.model_validate(
            review_spec("openai", "gpt-4o-mini", sharding={"max_requests_per_shard": 1})
        )
        write_reviews(settings.home, DAY, args.shards)
        ledger = LedgerResource(database_url=settings.database_url)
        storage = ArtifactStorage(base_url=settings.storage_url)
        provider = OpenAIBatchProvider(api_key="bench", base_url=fake.base_url)
        ctx = steps.StepContext(spec, DAY, ledger, storage, provider)
        steps.take_snapshot(ctx, settings.resolve_source_uri(spec.source.uri))
        steps.build_shards(ctx)
        started = time.perf_counter()
        steps.submit_shards(ctx)
        print(f"submitted {args.shards} shards in {time.perf_counter() - started:.1f} s")

        resources = {"ledger": ledger, "storage": storage, "openai_provider": provider}
        sensor = build_batch_status_sensor(spec)
        defs = dg.Definitions(
            assets=build_pipeline_assets(spec, settings), sensors=[sensor], resources=resources
        )
        with dg.instance_for_test() as instance:
            for tick in range(args.ticks):
                context = dg.build_sensor_context(
                    instance=instance,
                    resources=resources,
                    definitions=defs,
                    sensor_name=sensor.name,
                )
                started = time.perf_counter()
                data = sensor.evaluate_tick(context)
                took = time.perf_counter() - started
                print(
                    f"tick {tick}: {len(data.asset_events)} shards polled, "
                    f"{len(data.run_requests)} run requests, {took:.2f} s "
                    f"({took / max(1, len(data.asset_events)) * 1000:.1f} ms per shard)"
                )
    print(f"at {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; state in {root}")


if __name__ == "__main__":
    main()
