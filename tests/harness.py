"""A review-labelling pipeline for provider tests: data, spec and a Dagster-driven runner, the
model that labels the reviews truthfully, faults that strike an item once, the adapters
pointed at the fake servers, and the environment of an `llm-assets` process on the same."""

import contextlib
import dataclasses
import datetime as dt
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, overload

import dagster as dg
import sqlalchemy as sa
import yaml

from llm_assets import names, steps
from llm_assets.defs.factory import asset_key, build_pipeline_assets
from llm_assets.defs.runner import DayOutcome, PartitionRunner
from llm_assets.resources.ledger import LedgerResource, ShardRecord, result_table
from llm_assets.resources.providers import provider_resource_key
from llm_assets.resources.providers.anthropic_batch import AnthropicBatchProvider
from llm_assets.resources.providers.base import BatchProvider, BatchStatus, ShardSubmission
from llm_assets.resources.providers.gemini_batch import GeminiBatchProvider
from llm_assets.resources.providers.online import OnlineProvider
from llm_assets.resources.providers.openai_batch import OpenAIBatchProvider
from llm_assets.resources.providers.remote import RemoteBatchProvider
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec.model import PipelineSpec
from llm_assets.util.settings import Settings
from tests.cli_process import CLI as CLI  # the command the tests run, named here too
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.gemini_server import FakeGemini
from tests.fakes.online_server import FakeOnline
from tests.fakes.openai_server import FakeOpenAI, user_text

DAY = dt.date(2026, 11, 2)
POSITIVE = ("good", "great", "love", "excellent")
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

    def runner(self, *, approve_budget: bool = False) -> PartitionRunner:
        """The runner of `llm-assets run`, polling without pause; `approve_budget` as its
        --approve-budget."""
        return PartitionRunner(
            self.settings,
            self.spec,
            self.instance,
            resources=self.resources,
            poll_interval=0.0,
            approve_budget=approve_budget,
        )

    def context(self, day: dt.date = DAY, **fields: Any) -> steps.StepContext:
        """The StepContext of the day with the harness's provider; `fields` as StepContext
        takes them (created_by, log)."""
        return steps.StepContext(self.spec, day, self.ledger, self.storage, self.provider, **fields)

    def run_day(self) -> DayOutcome:
        return self.runner().run_day(DAY, wait=True)

    def wait_for_batches(self, day: dt.date = DAY) -> None:
        """Poll the day's batches, as the lifecycle asks, until none is left in flight."""
        steps.drive(
            [steps.DayDriver(self.context(day), poll_every=0.0)],
            until=lambda decision: not decision.has(steps.Step.POLL) and not decision.others,
        )

    def materialize(self, *step_names: str, day: dt.date = DAY) -> dg.ExecuteInProcessResult:
        return dg.materialize(
            build_pipeline_assets(self.spec, self.settings),
            instance=self.instance,
            resources=self.resources,
            partition_key=day.isoformat(),
            selection=[asset_key(self.spec, s) for s in step_names],
            raise_on_error=False,
        )

    def submit(self) -> list[ShardRecord]:
        """Snapshot, shard and submit the day in one run; returns its shards."""
        assert self.materialize(*names.SUBMIT_ASSETS).success
        return self.ledger.shards(self.job_id())

    def hold_batches(
        self, fake: Any, shards: list[ShardRecord], reached: Callable[[BatchStatus], bool]
    ) -> None:
        """Poll each shard's batch, `fake` moving it on a state a poll, until `reached` holds
        for it; from then on the fake holds its batches where they are."""
        fake.polls_per_state = 1
        for shard in shards:
            while not reached(self.provider.poll(str(shard.provider_batch_id))):
                pass
        fake.polls_per_state = 1000

    def stop_while_sending(
        self, stop: Callable[[], object], answered: int = 4
    ) -> dg.ExecuteInProcessResult:
        """Run provider_batches in a thread of its own and call `stop` once the worker has
        checkpointed `answered` answers; returns the run, once its worker has ended."""
        runs: list[dg.ExecuteInProcessResult] = []
        worker = threading.Thread(target=lambda: runs.append(self.materialize("provider_batches")))
        worker.start()
        while self.ledger.counts(self.job_id()).succeeded < answered:
            assert worker.is_alive(), "the worker ended before it was stopped"
        stop()
        worker.join(timeout=120)
        assert not worker.is_alive()
        [run] = runs
        return run

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

    def cli_env(self, fake: FakeOpenAI | FakeAnthropic | FakeGemini) -> dict[str, str]:
        """The environment of an `llm-assets` process on the harness's home, ledger and spec,
        with a Dagster home of its own beside the harness's instance."""
        spec = self.spec.model_dump(mode="json", by_alias=True, exclude_unset=True)
        home = self.settings.home.parent
        return cli_env(home, self.settings.database_url, spec, fake, home / "dagster-cli")


@contextlib.contextmanager
def open_harness(
    tmp_path: Path,
    database_url: str,
    spec: dict[str, Any],
    provider: BatchProvider,
    reviews: int = 24,
) -> Iterator[Harness]:
    """A Harness on an in-memory Dagster instance: materializations, checks and sensor
    ticks as on disk, without the SQLite files and commits that would take a third of an
    end-to-end test's time (the on-disk instance has tests of its own: the CLI's, the
    daemon's, the UI's). tmp_path/dagster is DAGSTER_HOME for the CLI it runs."""
    (tmp_path / "dagster").mkdir(exist_ok=True)
    with dg.DagsterInstance.ephemeral() as instance:
        yield Harness(tmp_path, database_url, instance, spec, provider, reviews=reviews)


@dataclasses.dataclass(frozen=True)
class _Kind:
    """What the tests use of a batch provider with a fake server: its adapter, the model its
    review pipeline runs on, and the SDK variables that hold its key and endpoint."""

    provider: str
    model: str
    adapter: type[RemoteBatchProvider]
    key_variable: str
    url_variable: str


_KINDS: dict[type, _Kind] = {
    FakeOpenAI: _Kind(
        "openai", "gpt-4o-mini", OpenAIBatchProvider, "OPENAI_API_KEY", "OPENAI_BASE_URL"
    ),
    FakeAnthropic: _Kind(
        "anthropic",
        "claude-haiku-4-5",
        AnthropicBatchProvider,
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
    ),
    FakeGemini: _Kind(
        "gemini",
        "gemini-2.5-flash",
        GeminiBatchProvider,
        "GEMINI_API_KEY",
        "GOOGLE_GEMINI_BASE_URL",
    ),
}


@contextlib.contextmanager
def fake_harness(
    tmp_path: Path,
    database_url: str,
    fake: FakeOpenAI | FakeAnthropic | FakeGemini,
    reviews: int = 24,
    **overrides: Any,
) -> Iterator[Harness]:
    """The review pipeline on the fake's provider and model (gpt-4o-mini, claude-haiku-4-5,
    gemini-2.5-flash) through the adapter pointed at `fake`, with `overrides` of the spec as
    review_spec takes them."""
    kind = _KINDS[type(fake)]
    spec = review_spec(kind.provider, kind.model, **overrides)
    with open_harness(tmp_path, database_url, spec, provider_for(fake), reviews) as harness:
        yield harness


def make_harness(
    tmp_path: Path, database_url: str, fake: FakeOpenAI, **overrides: Any
) -> Iterator[Harness]:
    """fake_harness as a generator, for `for harness in ...` and for fixtures' `yield from`."""
    with fake_harness(tmp_path, database_url, fake, **overrides) as harness:
        yield harness


@overload
def provider_for(fake: FakeOpenAI) -> OpenAIBatchProvider: ...


@overload
def provider_for(fake: FakeAnthropic) -> AnthropicBatchProvider: ...


@overload
def provider_for(fake: FakeGemini) -> GeminiBatchProvider: ...


def provider_for(fake: FakeOpenAI | FakeAnthropic | FakeGemini) -> RemoteBatchProvider:
    """The batch adapter for `fake`, with short timeouts and retries so faults cost no time."""
    return _KINDS[type(fake)].adapter(
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


def cli_env(
    tmp_path: Path,
    database_url: str,
    spec: dict[str, Any],
    fake: FakeOpenAI | FakeAnthropic | FakeGemini,
    dagster_home: Path | None = None,
) -> dict[str, str]:
    """The environment of an `llm-assets` process on the layout a Harness makes under tmp_path
    (reviews in home/, `spec` written to specs/), the ledger at `database_url` and Dagster's
    home at dagster_home (tmp_path/dagster unless given), its provider's SDK pointed at `fake`
    with the key the fakes accept. The test process's failpoint, storage and Google key stay
    behind (GOOGLE_API_KEY would win over GEMINI_API_KEY)."""
    specs = tmp_path / "specs"
    specs.mkdir(exist_ok=True)
    (specs / "reviews.yaml").write_text(yaml.safe_dump(spec))
    kind = _KINDS[type(fake)]
    env = {
        **os.environ,
        "LLM_ASSETS_HOME": str(tmp_path / "home"),
        "LLM_ASSETS_DATABASE_URL": database_url,
        "LLM_ASSETS_PIPELINES": str(specs),
        "DAGSTER_HOME": str(dagster_home or tmp_path / "dagster"),
        kind.key_variable: "test-key",
        kind.url_variable: fake.base_url,
    }
    for name in ("GOOGLE_API_KEY", "LLM_ASSETS_FAILPOINT", "LLM_ASSETS_STORAGE_URL"):
        env.pop(name, None)
    return env


@contextlib.contextmanager
def online_shard(
    tmp_path: Path, database_url: str, fake: FakeOnline, reviews: int = 60
) -> Iterator[Harness]:
    """All `reviews` reviews in one shard for the online provider at `fake`, which answers each
    after 50 ms; the worker sends one request at a time and checkpoints every two answers. The
    day's snapshot and shard are made."""
    from tests.test_online_provider import online_spec

    fake.latency_seconds = 0.05
    provider = OnlineProvider(base_url=fake.base_url, backoff_base_seconds=0.01)
    spec = online_spec(concurrency=1, checkpoint_every=2) | {
        "sharding": {"max_requests_per_shard": 100}
    }
    with open_harness(tmp_path, database_url, spec, provider, reviews) as harness:
        assert harness.materialize("input_snapshot", "request_shards").success
        yield harness
