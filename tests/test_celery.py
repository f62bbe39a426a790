"""More than one worker: a date backfill launched through the daemon, its steps Celery tasks
(LLM_ASSETS_EXECUTOR=celery) on the RabbitMQ broker and Redis result backend of the test
machine, a day's shard building sliced across two workers, and workers SIGKILLed in the
middle of a step.

`dagster dev` (webserver and daemon) runs on the production dagster.yaml's PostgreSQL
instance (one run at a time), the ledger in PostgreSQL too. A backfill of three days,
launched the way the UI does, submits each day through the fake OpenAI server (the real SDK
over HTTP, from the workers), and the batch-status sensor imports, validates and reports
each day once its batches end. Every step of every run is a task that a worker
(`dagster-celery worker start`, what `make worker` runs) takes. Each day is built in two slices
(sharding.slices), steps of their own: two idle workers, one task at a time each, take one
slice each. The first worker dies with its whole process group in its slice, after recording
the slice's shards and before reporting it built; the broker gives its unacknowledged task
to the second, which builds the slice again (finding its rows known) and goes on alone. It
dies in turn right after the provider created the first batch and before the ledger recorded
it -- the moment that pays twice if a repeat creates it again -- as a lost machine would. A
third worker, started after, runs that step again: it finds the batch instead of creating
another, and the backfill and the three days finish on it. The fake's own records are the
witness: every item once and terminal, nothing sent beyond the ledger's attempts, no batch
the ledger does not hold, every request billed once.

Needs RabbitMQ on 127.0.0.1:5672 and Redis on 127.0.0.1:6379 (.ci/run starts them) and the
suite's PostgreSQL; without them the test is skipped with the reason, and under CI=true it
fails.
"""

import contextlib
import datetime as dt
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from llm_assets import steps
from llm_assets.resources.ledger import JobCounts, LedgerResource
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec.model import PipelineSpec
from llm_assets.util.settings import REPO_ROOT
from tests.conftest import IN_CI, PG_URL
from tests.dagster_dev import dagster_dev
from tests.fakes.openai_server import FakeOpenAI
from tests.harness import review_spec, truthful, write_reviews
from tests.test_crash import assert_provider_invariants

pytestmark = [pytest.mark.slow, pytest.mark.fake_server("openai", responder=truthful)]

BROKER = "pyamqp://guest@127.0.0.1:5672//"
BACKEND = "redis://127.0.0.1:6379/0"
DAYS = 3
REVIEWS = 24
SHARD = 10
SLICES = 2
KILL_IN_SLICE = "slices.after_build"
"""Where the first worker dies: its slice's shards recorded, the slice not reported built."""
KILL_AT_CREATE = "submit.after_create"
"""Where the second worker dies: the provider made the batch, the ledger has only the intent."""
FIRST = dt.date(2026, 11, 2)
DATES = [FIRST + dt.timedelta(days=n) for n in range(DAYS)]
BIN = Path(sys.executable).parent
PIPELINE = "reviews_openai"
SUBMIT = ("input_snapshot", "request_shards", "provider_batches")
"""What the backfill materializes; the batch-status sensor takes each day on from there."""


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _require(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"CI=true: {reason}")
    pytest.skip(reason)


@pytest.fixture
def env(tmp_path: Path, fake: FakeOpenAI) -> Iterator[dict[str, str]]:
    """The environment of the code location, the CLI and the workers: the production
    dagster.yaml on a new PostgreSQL database, a new ledger database, the Celery executor."""
    if PG_URL is None:
        _require("LLM_ASSETS_TEST_DATABASE_URL is not set: the Celery mode needs PostgreSQL")
    for port, what in ((5672, "RabbitMQ"), (6379, "Redis")):
        if not _listening(port):
            _require(f"no {what} on 127.0.0.1:{port} (.ci/run starts it)")
    url = sa.engine.make_url(PG_URL)
    suffix = uuid.uuid4().hex[:10]
    databases = (f"celery_dagster_{suffix}", f"celery_ledger_{suffix}")
    admin = sa.create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        for database in databases:
            conn.execute(sa.text(f'CREATE DATABASE "{database}"'))
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    # One run at a time, taken off the queue every second: the backfill's days go one after
    # the other, so the first day's two slices meet two idle workers.
    instance = yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text())
    instance["concurrency"]["runs"]["max_concurrent_runs"] = 1
    instance["run_coordinator"] = {
        "module": "dagster",
        "class": "QueuedRunCoordinator",
        "config": {"dequeue_interval_seconds": 1, "dequeue_use_threads": True},
    }
    (dagster_home / "dagster.yaml").write_text(yaml.safe_dump(instance))
    home = tmp_path / "home"
    for day in DATES:
        write_reviews(home, day, REVIEWS)
    specs = tmp_path / "specs"
    specs.mkdir()
    sharding = {"max_requests_per_shard": SHARD, "slices": SLICES}
    # The backfill submits the days, not the new-data sensor.
    spec = review_spec(
        "openai", "gpt-4o-mini", sharding=sharding, automation={"new_data_sensor": False}
    )
    (specs / f"{PIPELINE}.yaml").write_text(yaml.safe_dump(spec))
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LLM_ASSETS_", "DAGSTER_")) and k != "PATH"
    }
    ledger = url.set(drivername="postgresql+psycopg", database=databases[1])
    try:
        environment = base | {
            # dagster-celery starts `celery` by name.
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "DAGSTER_HOME": str(dagster_home),
            "DAGSTER_PG_HOST": url.host or "127.0.0.1",
            "DAGSTER_PG_USER": url.username or "postgres",
            "DAGSTER_PG_PASSWORD": url.password or "",
            "DAGSTER_PG_DB": databases[0],
            "LLM_ASSETS_HOME": str(home),
            "LLM_ASSETS_PIPELINES": str(specs),
            "LLM_ASSETS_DATABASE_URL": ledger.render_as_string(hide_password=False),
            "OPENAI_BASE_URL": fake.base_url,
            "OPENAI_API_KEY": "test-key",
            "LLM_ASSETS_EXECUTOR": "celery",
            "LLM_ASSETS_CELERY_BROKER": BROKER,
            "LLM_ASSETS_CELERY_BACKEND": BACKEND,
            "LLM_ASSETS_SENSOR_INTERVAL_SECONDS": "1",
        }
        # Dagster's tables made once, before the workers and `dagster dev` start together
        # (docs/operations.md): each would create them on its first connection, and two at
        # the same moment collide.
        subprocess.run(
            [str(BIN / "dagster"), "instance", "migrate"],
            env=environment,
            capture_output=True,
            check=True,
            timeout=120,
        )
        yield environment
    finally:
        with admin.connect() as conn:
            for database in databases:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        admin.dispose()


def _purge_queue() -> None:
    """Tasks a killed earlier run left in the broker's queue are not this test's."""
    from amqp.exceptions import NotFound
    from kombu import Connection

    with Connection(BROKER) as connection, contextlib.suppress(NotFound):  # no queue: nothing
        connection.default_channel.queue_purge("dagster")


def _worker(env: dict[str, str], name: str, log: Path) -> subprocess.Popen[bytes]:
    """`make worker`'s command, one task at a time, in a process group of its own (a killed
    worker takes its pool and step processes with it)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(BIN / "dagster-celery"), "worker", "start", "-A", "dagster_celery.app"]
            + ["-y", "celery.yaml", "--name", name, "--", "--concurrency=1"],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        os.killpg(worker.pid, 15)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, 9)
            worker.wait(timeout=30)


def _killed(env: dict[str, str], point: str) -> dict[str, str]:
    return env | {"LLM_ASSETS_FAILPOINT": point, "LLM_ASSETS_FAILPOINT_SCOPE": "group"}


def _finished(env: dict[str, str]) -> list[JobCounts] | None:
    """Each day's item counts once every day has no open item and its cost report (the
    sensor's last run of the day) is written, else None."""
    spec = PipelineSpec.model_validate(
        yaml.safe_load((Path(env["LLM_ASSETS_PIPELINES"]) / f"{PIPELINE}.yaml").read_text())
    )
    ledger = LedgerResource(database_url=env["LLM_ASSETS_DATABASE_URL"])
    storage = ArtifactStorage(base_url=str(Path(env["LLM_ASSETS_HOME"]) / "artifacts"))
    counts = []
    for day in DATES:
        try:
            job = steps.existing_job(spec, day, ledger)
        except steps.MissingPrerequisite:
            return None
        report = storage.uri(f"reports/{PIPELINE}/{day.isoformat()}/{job.job_id}.cost.json")
        day_counts = ledger.refresh_job(job.job_id)
        if day_counts.open or not storage.exists(report):
            return None
        counts.append(day_counts)
    return counts


def test_a_backfill_survives_workers_killed_mid_step_and_pays_for_nothing_twice(
    env: dict[str, str], fake: FakeOpenAI, tmp_path: Path
) -> None:
    _purge_queue()
    logs = {name: tmp_path / f"{name}.log" for name in ("w1", "w2", "w3")}
    first = _worker(_killed(env, KILL_IN_SLICE), "w1", logs["w1"])
    second = _worker(_killed(env, KILL_AT_CREATE), "w2", logs["w2"])
    third = None
    try:
        with dagster_dev(env, tmp_path / "dagster_dev.log") as dev:
            backfill_id = dev.launch_asset_backfill(
                [day.isoformat() for day in DATES], [[PIPELINE, step] for step in SUBMIT]
            )
            # The first worker dies in its slice of a day; the second builds that slice
            # again, joins the day and dies inside its submission.
            assert first.wait(timeout=300) == -9, logs["w1"].read_text()[-3000:]
            assert second.wait(timeout=300) == -9, logs["w2"].read_text()[-3000:]
            created = len(fake.store.all_batches())
            assert created == 1, created
            third = _worker(env, "w3", logs["w3"])
            backfill = dev.wait_for_backfill(backfill_id, timeout=600)
            # The backfill's runs waited for the steps the killed workers left, and succeeded.
            assert {run["status"] for run in backfill["runs"]} == {"SUCCESS"}, backfill["runs"]
            assert backfill["status"] == "COMPLETED_SUCCESS", backfill
            counts = dev.wait_for("the sensor to finish every day", lambda: _finished(env), 600)
    finally:
        for worker in (first, second, third):
            if worker is not None:
                _stop(worker)

    for day_counts in counts:
        assert day_counts.total == REVIEWS and day_counts.succeeded == REVIEWS, day_counts
    first_log, second_log, third_log = (logs[w].read_text() for w in ("w1", "w2", "w3"))
    # A day's slices ran on both workers at once; the second ran the first's again.
    slice_steps = [f"{PIPELINE}__slice_{n}_of_{SLICES}" for n in range(1, SLICES + 1)]
    in_first = [step for step in slice_steps if step in first_log]
    assert len(in_first) == 1, in_first
    assert all(step in second_log for step in slice_steps)
    # The submission killed on the second worker was the third's to run again, with the rest.
    assert second_log.count(f"{PIPELINE}__provider_batches") >= 1
    assert third_log.count(f"{PIPELINE}__provider_batches") >= DAYS
    truth = {
        review_id for day in DATES for review_id in write_reviews(tmp_path / "again", day, REVIEWS)
    }
    ledger_url = env["LLM_ASSETS_DATABASE_URL"]
    numbers = assert_provider_invariants(ledger_url, fake, truth)
    assert numbers["items"] == DAYS * REVIEWS
    # One batch a shard: the repeated submission made none.
    engine = sa.create_engine(ledger_url)
    with engine.connect() as conn:
        shards = conn.execute(sa.text("SELECT count(*) FROM llm_batch_shard")).scalar_one()
    engine.dispose()
    assert len(fake.store.all_batches()) == shards
    # Nothing billed twice: each request answered once by the provider.
    assert set(fake.billed.values()) == {1} and len(fake.billed) == DAYS * REVIEWS
