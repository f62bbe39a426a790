"""A review-labelling pipeline for provider tests: data, spec and a Dagster-driven runner, the
model that labels the reviews truthfully, faults that strike an item once, and the adapters
pointed at the fake servers."""

import contextlib
import datetime as dt
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, overload

import dagster as dg
import sqlalchemy as sa

from llm_assets import steps
from llm_assets.defs.factory import asset_key, build_pipeline_assets
from llm_assets.defs.runner import DayOutcome, PartitionRunner
from llm_assets.resources.ledger import LedgerResource, result_table
from llm_assets.resources.providers import provider_resource_key
from llm_assets.resources.providers.anthropic_batch import AnthropicBatchProvider
from llm_assets.resources.providers.base import BatchProvider, ShardSubmission
from llm_assets.resources.providers.gemini_batch import GeminiBatchProvider
from llm_assets.resources.providers.openai_batch import OpenAIBatchProvider
from llm_assets.resources.providers.remote import RemoteBatchProvider
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec.model import PipelineSpec
from llm_assets.util.settings import Settings
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.gemini_server import FakeGemini
from tests.fakes.openai_server import FakeOpenAI, user_text

DAY = dt.date(2026, 11, 2)
POSITIVE = ("good", "great", "love", "excellent")
CLI = str(Path(sys.executable).parent / "llm-assets")
_OPENERS = [
    "The blender is {w} and the motor is quiet.",
    "Delivery was slow but the kettle itself is {w}.",
    "I think the headphones are {w} for the price.",
    "Setup took an hour; overall the router is {w}.",
    "My kids say the tablet case is {w}.",
]
_WORDS = ["good", "terrible", "great", "awful", "excellent", "disappointing", "love-worthy", "bad"]


def write_reviews(home: Path, day: dt.date, count: int) -> dict[str, str]:
    """`count` reviews for `day` under home/reviews; returns review_id -> true label."""
    folder = home / "reviews"
    folder.mkdir(parents=True, exist_ok=True)
    truth: dict[str, str] = {}
    lines = []
    for n in range(count):
        word = _WORDS[n % len(_WORDS)]
        text = _OPENERS[n % len(_OPENERS)].format(w=word) + f" Order {1000 + n} arrived."
        review_id = f"R-{day:%Y%m%d}-{n:04d}"
        truth[review_id] = "positive" if any(p in text.lower() for p in POSITIVE) else "negative"
        stamp = dt.datetime.combine(day, dt.time(0, 0)) + dt.timedelta(seconds=n * 10)
        lines.append(
            json.dumps(
                {"review_id": review_id, "created_at": stamp.isoformat() + "Z", "text": text}
            )
        )
    (folder / f"reviews-{day.isoformat()}.jsonl").write_text("\n".join(lines) + "\n")
    return truth


def review_spec(provider: str, model_name: str, **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": f"reviews_{provider}",
        "source": {
            "kind": "jsonl",
            "uri": "reviews/*.jsonl",
            "id_field": "review_id",
            "date_field": "created_at",
            "fields": ["text"],
        },
        "prompt": {
            "version": "v1",
            "system": "Label the review as positive or negative. Return JSON.",
            "template": "{text}",
        },
        "model": {"provider": provider, "name": model_name, "max_output_tokens": 100},
        "output": {
            "format": "json",
            "schema": {
                "label": {"type": "str", "isin": ["positive", "negative"]},
                "summary": {"type": "str", "min_length": 1, "max_length": 200},
            },
        },
        "retry": {"max_attempts": 3, "backoff_seconds": 0},
        "sharding": {"max_requests_per_shard": 10},
        "partitions": {"start_date": "2026-11-01", "timezone": "UTC"},
    }
    for key, value in overrides.items():
        spec[key] = {**spec.get(key, {}), **value} if isinstance(value, dict) else value
    return spec


class Harness:
    """The pipeline on a real Dagster instance, driven day by day like `run --wait`."""

    def __init__(
        self,
        tmp_path: Path,
        database_url: str,
        instance: dg.DagsterInstance,
        spec: dict[str, Any],
        provider: BatchProvider,
        reviews: int = 24,
    ) -> None:
        self.home = tmp_path / "home"
        self.settings = Settings(
            home=self.home,
            database_url=database_url,
            pipelines_dir=tmp_path / "specs",
            storage_url=str(self.home / "artifacts"),
            dagster_home=tmp_path / "dagster",
        )
        self.spec = PipelineSpec.model_validate(spec)
        self.instance = instance
        self.ledger = LedgerResource(database_url=database_url)
        self.storage = ArtifactStorage(base_url=self.settings.storage_url)
        self.provider = provider
        self.truth = write_reviews(self.home, DAY, reviews)

    @property
    def resources(self) -> dict[str, Any]:
        return {
            "ledger": self.ledger,
            "storage": self.storage,
            provider_resource_key(self.spec.model.provider): self.provider,
        }

    def runner(self) -> PartitionRunner:
        return PartitionRunner(
            self.settings, self.spec, self.instance, resources=self.resources, poll_interval=0.0
        )

    def run_day(self) -> DayOutcome:
        return self.runner().run_day(DAY, wait=True)

    def wait_for_batches(self, day: dt.date = DAY) -> None:
        """Poll the day's batches, as the lifecycle asks, until none is left in flight."""
        ctx = steps.StepContext(self.spec, day, self.ledger, self.storage, self.provider)
        steps.drive(
            [steps.DayDriver(ctx, poll_every=0.0)],
            until=lambda decision: not decision.has(steps.Step.POLL) and not decision.others,
        )

    def materialize(self, *step_names: str) -> dg.ExecuteInProcessResult:
        return dg.materialize(
            build_pipeline_assets(self.spec, self.settings),
            instance=self.instance,
            resources=self.resources,
            partition_key=DAY.isoformat(),
            selection=[asset_key(self.spec, s) for s in step_names],
            raise_on_error=False,
        )

    def job_id(self) -> str:
        return steps.existing_job(self.spec, DAY, self.ledger).job_id

    def submission(self, shard_id: str) -> ShardSubmission:
        """What provider_batches hands the adapter for a shard of the day."""
        shard = self.ledger.get_shard(shard_id)
        assert shard is not None
        return ShardSubmission(
            shard_id=shard.shard_id,
            job_id=self.job_id(),
            pipeline=self.spec.name,
            input_uri=shard.input_uri,
            item_count=shard.item_count,
            model=self.spec.model.name,
            format=self.provider.request_format(self.spec),
        )

    def rows(self) -> dict[str, dict[str, Any]]:
        with self.ledger.engine.connect() as conn:
            query = sa.select(result_table).where(result_table.c.job_id == self.job_id())
            return {r.custom_id: dict(r._mapping) for r in conn.execute(query)}

    def labels(self) -> dict[str, str]:
        """source_id -> label of every succeeded item."""
        return {
            r["source_id"]: json.loads(r["result_json"])["label"]
            for r in self.rows().values()
            if r["status"] == "succeeded"
        }


@contextlib.contextmanager
def open_harness(
    tmp_path: Path,
    database_url: str,
    spec: dict[str, Any],
    provider: BatchProvider,
    reviews: int = 24,
) -> Iterator[Harness]:
    """A Harness on a throwaway Dagster instance under tmp_path/dagster."""
    (tmp_path / "dagster").mkdir(exist_ok=True)
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
        yield Harness(tmp_path, database_url, instance, spec, provider, reviews=reviews)


def make_harness(
    tmp_path: Path, database_url: str, fake: FakeOpenAI, **overrides: Any
) -> Iterator[Harness]:
    """The review pipeline on gpt-4o-mini through the OpenAI adapter pointed at `fake`, with
    `overrides` of the spec as review_spec takes them. A generator, for `for harness in ...`
    and for fixtures' `yield from`."""
    spec = review_spec("openai", "gpt-4o-mini", **overrides)
    with open_harness(tmp_path, database_url, spec, provider_for(fake)) as harness:
        yield harness


@overload
def provider_for(fake: FakeOpenAI) -> OpenAIBatchProvider: ...


@overload
def provider_for(fake: FakeAnthropic) -> AnthropicBatchProvider: ...


@overload
def provider_for(fake: FakeGemini) -> GeminiBatchProvider: ...


def provider_for(fake: FakeOpenAI | FakeAnthropic | FakeGemini) -> RemoteBatchProvider:
    """The batch adapter for `fake`, with short timeouts and retries so faults cost no time."""
    adapters: dict[type, type[RemoteBatchProvider]] = {
        FakeOpenAI: OpenAIBatchProvider,
        FakeAnthropic: AnthropicBatchProvider,
        FakeGemini: GeminiBatchProvider,
    }
    return adapters[type(fake)](
        api_key="test-key",
        base_url=fake.base_url,
        timeout_seconds=5.0,
        retry_base_seconds=0.01,
        retry_cap_seconds=0.05,
        max_retry_after_seconds=0.05,
        quota_wait_seconds=0.05,
    )


def truthful(body: dict[str, Any]) -> str:
    """Answers an OpenAI-shaped request like a good model: the label the review's words imply."""
    text = user_text(body)
    label = "positive" if any(word in text.lower() for word in POSITIVE) else "negative"
    return json.dumps({"label": label, "summary": text.split(".")[0][:200]})


def first_time(
    faults: dict[int, str], text_of: Callable[[dict[str, Any]], str] = user_text
) -> Callable[[str, dict[str, Any]], str | None]:
    """A line or item fault for review n (`faults[n]`) on its first submission only: a fake's
    `line_fault` (OpenAI, Gemini with text_of=request_text) or `item_fault` (Anthropic)."""
    seen: set[str] = set()

    def fault(custom_id: str, body: dict[str, Any]) -> str | None:
        text = text_of(body)
        for n, kind in faults.items():
            if f"Order {1000 + n} " in text and custom_id not in seen:
                seen.add(custom_id)
                return kind
        return None

    return fault
