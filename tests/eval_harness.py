"""What the eval tests share: reviews with columns the prompt never reads, settings under a
test's tmp_path, and a world of the ledger, artifact storage and the fake OpenAI server that
snapshots days and replays them through variants; besides, result rows of a ledger job and a
command run as a subprocess."""

import datetime as dt
import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from llm_assets import steps
from llm_assets.evaluation.replay import Replay, replay
from llm_assets.resources.ledger import LedgerResource, result_table
from llm_assets.resources.providers import provider_resource_key
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec.model import PipelineSpec
from llm_assets.util.settings import Settings
from tests import cli_process
from tests.fakes.openai_server import FakeOpenAI
from tests.harness import provider_for, write_reviews

Columns = Callable[[int, dict[str, Any], str], dict[str, Any]]
"""Review n's row and true label -> the columns to set in that row."""


def write_reviews_with(home: Path, day: dt.date, count: int, columns: Columns) -> None:
    """The day's `count` reviews (tests.harness.write_reviews), each row updated by `columns`."""
    truth = write_reviews(home, day, count)
    path = home / "reviews" / f"reviews-{day.isoformat()}.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    updated = [{**row, **columns(n, row, truth[row["review_id"]])} for n, row in enumerate(rows)]
    path.write_text("".join(json.dumps(row) + "\n" for row in updated))


def eval_settings(tmp_path: Path, database_url: str) -> Settings:
    """A home at tmp_path/home with its artifacts inside; specs and Dagster beside it."""
    home = tmp_path / "home"
    return Settings(
        home=home,
        database_url=database_url,
        pipelines_dir=tmp_path / "specs",
        storage_url=str(home / "artifacts"),
        dagster_home=tmp_path / "dagster",
    )


@dataclass
class EvalWorld:
    """The settings' ledger and artifact storage, and the fake OpenAI server."""

    settings: Settings
    openai: FakeOpenAI
    ledger: LedgerResource = field(init=False)
    storage: ArtifactStorage = field(init=False)

    def __post_init__(self) -> None:
        self.ledger = LedgerResource(database_url=self.settings.database_url)
        self.storage = ArtifactStorage(base_url=self.settings.storage_url)

    @property
    def home(self) -> Path:
        return self.settings.home

    @property
    def resources(self) -> dict[str, Any]:
        return {
            "ledger": self.ledger,
            "storage": self.storage,
            provider_resource_key("openai"): provider_for(self.openai),
        }

    def take_snapshot(self, spec: PipelineSpec, day: dt.date) -> steps.SnapshotResult:
        """The input_snapshot of `spec`'s day."""
        ctx = steps.StepContext(spec, day, self.ledger, self.storage)
        return steps.take_snapshot(ctx, self.settings.resolve_source_uri(spec.source.uri))

    def run_eval(
        self,
        spec: PipelineSpec,
        variants: dict[str, PipelineSpec],
        days: list[dt.date],
        **options: Any,
    ) -> Replay:
        """The replay of a sample of `spec`'s days through `variants`, polling without pause;
        `options` are replay's (size and seed at least), `resources` the world's unless given."""
        resources = options.pop("resources", self.resources)
        return replay(
            resources, spec, variants, days, created_by="test eval", poll_interval=0.0, **options
        )

    def rows(self, job_id: str) -> list[dict[str, Any]]:
        return result_rows(self.ledger, job_id)

    def cli_env(self) -> dict[str, str]:
        """The environment of the CLI run on this world, its OpenAI pointed at the fake."""
        return {
            **os.environ,
            "LLM_ASSETS_HOME": str(self.home),
            "LLM_ASSETS_DATABASE_URL": self.settings.database_url,
            "LLM_ASSETS_PIPELINES": str(self.settings.pipelines_dir),
            "LLM_ASSETS_STORAGE_URL": self.settings.storage_url,
            "DAGSTER_HOME": str(self.settings.dagster_home),
            "OPENAI_BASE_URL": self.openai.base_url,
            "OPENAI_API_KEY": "test-key",
        }


def result_rows(ledger: LedgerResource, job_id: str) -> list[dict[str, Any]]:
    """Every result row of the job, as a dict."""
    with ledger.engine.connect() as conn:
        query = sa.select(result_table).where(result_table.c.job_id == job_id)
        return [dict(r._mapping) for r in conn.execute(query)]


def run_command(
    args: list[str], env: dict[str, str], timeout: float = 600, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`args` run to the end, its output captured as text; a failure is the caller's to judge."""
    return cli_process.run(
        args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
