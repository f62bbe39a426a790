"""Every wait is bounded and interruptible: a Retry-After of hours is waited out for minutes
at most, a stop (SIGTERM) ends a retry wait at once, a batch-status tick ends at its deadline
with calls still running, and ledger connections on PostgreSQL time out."""

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import dagster as dg
import pytest
import sqlalchemy as sa

from llm_assets.defs import sensors
from llm_assets.resources import build_resources
from llm_assets.resources.ledger import LedgerResource, dispose_engines
from llm_assets.resources.providers import retrying
from llm_assets.resources.providers.anthropic_batch import AnthropicBatchProvider
from llm_assets.resources.providers.base import ItemResult
from llm_assets.resources.providers.bedrock import BedrockBatchProvider
from llm_assets.resources.providers.online import OnlineProvider
from llm_assets.resources.providers.openai_batch import OpenAIBatchProvider
from llm_assets.resources.providers.realtime import (
    OnlineSettings,
    OnlineWork,
    RateLimited,
    run_requests,
)
from llm_assets.steps.online import stop_on_sigterm
from llm_assets.util.settings import Settings
from tests import test_sensors
from tests.conftest import DATABASES
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.common import ControlFault, delay_fault
from tests.harness import Harness, open_harness, review_spec

pytestmark = [pytest.mark.one_database, pytest.mark.fake_server("anthropic")]
HOURS = 7200.0


class _Throttled(Exception):
    """A 429 as the SDKs raise it, with a Retry-After header."""

    status_code = 429

    def __init__(self, retry_after: float) -> None:
        super().__init__("rate limited")
        self.response = type("Response", (), {"headers": {"retry-after": str(retry_after)}})()


@pytest.fixture(autouse=True)
def waits_allowed() -> Iterator[None]:
    yield
    retrying.allow_waits()


def test_every_provider_caps_retry_after_at_a_few_minutes() -> None:
    for provider in (OpenAIBatchProvider, AnthropicBatchProvider, OnlineProvider):
        assert 0 < provider.model_construct().max_retry_after_seconds <= 300
    assert 0 < BedrockBatchProvider.model_construct().max_retry_after_seconds <= 300
    assert retrying.backoff_delay(_Throttled(HOURS), 1, 1.0, 60.0, 120.0) == 120.0


def test_a_retry_after_of_hours_from_the_server_is_waited_out_for_the_cap(
    fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real SDK error of the fake's 429 with `retry-after: 7200`: the wait asked for is
    the cap (recorded, not slept)."""
    waits: list[float] = []
    monkeypatch.setattr(retrying, "pause", waits.append)
    fake.faults.add(ControlFault("GET", "/v1/messages/batches/", status=429, retry_after=HOURS))
    provider = AnthropicBatchProvider(
        api_key="k", base_url=fake.base_url, max_attempts=2, max_retry_after_seconds=90.0
    )

    with pytest.raises(anthropic.NotFoundError):
        provider.poll("msgbatch_unknown")

    assert waits == [90.0]


def _transient_until_stopped(called: threading.Event) -> Any:
    def call() -> None:
        called.set()
        raise _Throttled(HOURS)

    return call


def test_a_stop_ends_a_retry_wait_at_once() -> None:
    called, outcome = threading.Event(), []

    def waiting() -> None:
        try:
            retrying.call_with_retries(
                _transient_until_stopped(called),
                attempts=5,
                base_seconds=1.0,
                cap_seconds=60.0,
            )
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=waiting)
    worker.start()
    assert called.wait(30)
    retrying.stop_waits()
    worker.join(timeout=30)

    assert not worker.is_alive()
    [stopped] = outcome
    assert isinstance(stopped, retrying.WaitInterrupted)


def test_sigterm_during_a_step_ends_its_retry_wait() -> None:
    """A real SIGTERM while `stop_on_sigterm` handles it (an online worker's step): the retry
    wait of a control-plane call in the main thread ends with WaitInterrupted."""
    called, stopping = threading.Event(), threading.Event()

    def terminate() -> None:
        if called.wait(30):
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terminate, daemon=True).start()
    started = time.monotonic()
    with (
        stop_on_sigterm(stopping, active=True),
        pytest.raises(retrying.WaitInterrupted),
    ):
        retrying.call_with_retries(
            _transient_until_stopped(called), attempts=5, base_seconds=1.0, cap_seconds=60.0
        )

    assert stopping.is_set()
    assert time.monotonic() - started < 60  # the wait asked for was 120 s
    retrying.pause(0)  # waits are allowed again once the stop is handled


def _work(stop: threading.Event, delivered: list[ItemResult]) -> OnlineWork:
    return OnlineWork(
        requests=[("c0", {}, 10)],
        deliver=delivered.extend,
        checkpoint_every=1,
        stop=stop.is_set,
    )


SETTINGS = OnlineSettings(concurrency=1, rpm=None, tpm=None, timeout_seconds=5, max_tries=3)


def test_the_online_worker_caps_a_rate_limit_pause() -> None:
    sends: list[str] = []

    async def send(custom_id: str, body: dict[str, Any]) -> tuple[ItemResult, float | None]:
        sends.append(custom_id)
        if len(sends) == 1:
            raise RateLimited(HOURS)
        return ItemResult(custom_id=custom_id, succeeded=True), None

    delivered: list[ItemResult] = []
    stats = asyncio.run(
        run_requests(
            SETTINGS,
            _work(threading.Event(), delivered),
            send,
            backoff_base_seconds=0.01,
            backoff_cap_seconds=0.01,
            max_retry_after_seconds=0.05,
        )
    )

    assert [r.custom_id for r in delivered] == ["c0"] and stats.rate_limited == 1
    assert stats.paused_seconds <= 0.06


def test_a_stop_ends_the_online_workers_rate_limit_pause() -> None:
    """Rate limited for hours (capped at the default two minutes): the stop ends the pause,
    the request is not sent again and nothing is delivered for it."""
    limited, stop = threading.Event(), threading.Event()

    async def send(custom_id: str, body: dict[str, Any]) -> tuple[ItemResult, float | None]:
        limited.set()
        raise RateLimited(HOURS)

    threading.Thread(target=lambda: limited.wait(30) and stop.set(), daemon=True).start()
    delivered: list[ItemResult] = []
    started = time.monotonic()
    stats = asyncio.run(
        run_requests(
            SETTINGS, _work(stop, delivered), send, backoff_base_seconds=1, backoff_cap_seconds=1
        )
    )

    assert stats.interrupted and delivered == [] and stats.sent == 1
    assert time.monotonic() - started < 30


# The batch-status sensor's tick


@pytest.fixture
def harness(tmp_path: Path, database_url: str, fake: FakeAnthropic) -> Iterator[Harness]:
    spec = review_spec("anthropic", "claude-haiku-4-5")
    provider = AnthropicBatchProvider(api_key="k", base_url=fake.base_url, timeout_seconds=60.0)
    with open_harness(tmp_path, database_url, spec, provider) as harness:
        yield harness


def test_a_slow_status_call_is_cut_by_the_short_per_call_timeout(
    harness: Harness, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The provider's own timeout is a minute; in a tick each status call gets one try of
    POLL_CALL_TIMEOUT_SECONDS, and a call that times out is logged and left for the next."""
    fake.polls_per_state = 5
    assert harness.materialize("input_snapshot", "request_shards", "provider_batches").success
    slow = delay_fault("GET", "/v1/messages/batches/", seconds=5.0, times=100)
    fake.faults.add(slow)
    monkeypatch.setattr(sensors, "POLL_CALL_TIMEOUT_SECONDS", 0.5)
    monkeypatch.setattr(sensors, "POLL_DEADLINE_SECONDS", 20.0)

    before = harness.ledger.shards(harness.job_id())
    started = time.monotonic()
    test_sensors.tick(harness)

    assert time.monotonic() - started < 5.0
    assert harness.ledger.shards(harness.job_id()) == before  # no poll got an answer
    assert 100 - slow.times == 3  # one try per shard, none retried


def test_the_deadline_bounds_the_tick_with_calls_still_running(
    harness: Harness, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Status calls that never answer within the tick (held here until the test ends): the
    tick returns at its deadline, not when they end."""
    fake.polls_per_state = 5
    assert harness.materialize("input_snapshot", "request_shards", "provider_batches").success
    release, entered = threading.Event(), threading.Event()

    def stuck(provider_batch_id: str, timeout_seconds: float) -> Any:
        entered.set()
        release.wait(60)
        raise TimeoutError

    monkeypatch.setattr(AnthropicBatchProvider, "poll_briefly", lambda self, b, t: stuck(b, t))
    monkeypatch.setattr(sensors, "POLL_CALL_TIMEOUT_SECONDS", 0.1)
    monkeypatch.setattr(sensors, "POLL_DEADLINE_SECONDS", 1.0)
    before = harness.ledger.shards(harness.job_id())
    try:
        started = time.monotonic()
        test_sensors.tick(harness)
        took = time.monotonic() - started
    finally:
        release.set()

    assert entered.is_set()
    assert took < 3.0
    assert harness.ledger.shards(harness.job_id()) == before  # no poll got an answer


# Ledger connections on PostgreSQL


@pytest.fixture
def postgres_url(database_url: str) -> Iterator[str]:
    yield database_url
    dispose_engines(database_url)


pg_only = pytest.mark.parametrize("database_url", [DATABASES[1]], indirect=True)


@pg_only
def test_a_postgresql_ledger_connects_with_timeouts_and_keepalives(postgres_url: str) -> None:
    ledger = LedgerResource(database_url=postgres_url)
    with ledger.engine.connect() as conn:
        assert conn.execute(sa.text("SHOW statement_timeout")).scalar() == "15min"
        dsn = conn.connection.driver_connection.info.get_parameters()  # type: ignore[union-attr]
        # The URL's own options (the test schema's search_path) are kept.
        search_path = conn.execute(sa.text("SHOW search_path")).scalar()
    assert dsn["connect_timeout"] == "10"
    assert (dsn["keepalives"], dsn["keepalives_idle"]) == ("1", "30")
    assert (dsn["keepalives_interval"], dsn["keepalives_count"]) == ("10", "3")
    assert search_path == sa.engine.make_url(postgres_url).query["options"].split("=", 1)[1]


@pg_only
def test_a_statement_over_the_limit_is_cancelled(postgres_url: str) -> None:
    ledger = LedgerResource(database_url=postgres_url, statement_timeout_seconds=0.2)
    started = time.monotonic()
    with (
        pytest.raises(sa.exc.OperationalError, match="statement timeout"),
        ledger.engine.connect() as conn,
    ):
        conn.execute(sa.text("SELECT pg_sleep(5)"))
    assert time.monotonic() - started < 4.0
    with ledger.engine.connect() as conn:
        assert conn.execute(sa.text("SHOW statement_timeout")).scalar() == "200ms"


@pg_only
def test_connection_limits_come_from_the_environment_and_the_url(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LLM_ASSETS_LEDGER_STATEMENT_TIMEOUT_SECONDS", "30")
    monkeypatch.setenv("LLM_ASSETS_LEDGER_CONNECT_TIMEOUT_SECONDS", "4")
    with_query = sa.engine.make_url(postgres_url).update_query_dict({"connect_timeout": "7"})
    url = with_query.render_as_string(hide_password=False)
    monkeypatch.setenv("LLM_ASSETS_DATABASE_URL", url)
    ledger = build_resources(Settings.from_env())["ledger"]
    assert isinstance(ledger.database_url, dg.EnvVar)
    assert (ledger.statement_timeout_seconds, ledger.connect_timeout_seconds) == (30.0, 4)
    try:
        with ledger.engine.connect() as conn:
            assert conn.execute(sa.text("SHOW statement_timeout")).scalar() == "30s"
            dsn = conn.connection.driver_connection.info.get_parameters()  # type: ignore[union-attr]
        assert dsn["connect_timeout"] == "7"  # the URL's own setting wins
    finally:
        dispose_engines(url)
