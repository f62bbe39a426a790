"""The online path's RPM/TPM limit shared through Redis: two OS processes pacing through one
window never overfill it, the online provider waits for a window another run filled and for
a rate limit another run met, and a Redis that is not one or cannot be reached stops a shard
before anything is sent.

Needs Redis on 127.0.0.1:6379 (.ci/run starts it). Every test keeps its keys under a prefix
of its own and deletes only those.
"""

import asyncio
import multiprocessing
import random
import socket
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest
import redis

from llm_assets.resources.providers.realtime import (
    TOKEN_SHARE,
    OnlineSettings,
    OnlineStats,
    OnlineWork,
    per_minute,
)
from llm_assets.resources.providers.shared_window import (
    SharedLimitUnavailable,
    SharedPacer,
    connect,
)
from llm_assets.results.rows import ItemResult
from llm_assets.util.settings import Settings

# The pacing processes import this module: what imports Dagster is imported by the tests
# that need it, so that they start in a fraction of a second.
if TYPE_CHECKING:
    from llm_assets.resources.providers.online import OnlineProvider
    from llm_assets.spec.model import PipelineSpec
    from tests.fakes.online_server import FakeOnline

REDIS_URL = "redis://127.0.0.1:6379/0"
SETTINGS = OnlineSettings(concurrency=4, rpm=3000, tpm=600_000, timeout_seconds=5, max_tries=3)
"""Short windows (1.02 s): 50 requests and 9,700 tokens in each, starts 20 ms apart."""
PER_PROCESS = 20


class Start(NamedTuple):
    """A request's start as Redis's clock brackets it: between `before` and `after`."""

    before: float
    after: float
    cost: int


@pytest.fixture
def prefix() -> Iterator[str]:
    """A key prefix of the test's own; its keys are deleted afterwards."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.exceptions.ConnectionError:
        pytest.fail(f"Redis is not running on {REDIS_URL} (.ci/run starts it)")
    name = f"test_shared_rate_limit:{uuid.uuid4().hex}"
    yield name
    keys = list(client.scan_iter(match=f"{name}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def _server_time(pair: tuple[int, int]) -> float:
    return pair[0] + pair[1] / 1_000_000


async def _pace(prefix: str, costs: list[int], ready: Any) -> list[Start]:
    """Each request waits for its turn in the shared window, its start bracketed by Redis's
    clock read just before and just after the turn was granted."""
    client = await connect(REDIS_URL)
    pacer = SharedPacer(client, REDIS_URL, "quota", SETTINGS, prefix)
    ready.wait(timeout=60)  # both processes connected: they pace at the same time
    starts = []
    try:
        for cost in costs:
            while True:
                before = _server_time(await client.time())
                wait = await pacer.claim(cost)
                after = _server_time(await client.time())
                if wait == 0:
                    starts.append(Start(before, after, cost))
                    break
                await asyncio.sleep(wait)
    finally:
        await client.aclose()
    return starts


def _pacing_process(prefix: str, costs: list[int], ready: Any, out: Any) -> None:
    try:
        out.put(asyncio.run(_pace(prefix, costs, ready)))
    except Exception as exc:  # for the test to raise
        out.put(exc)


def surely_inside(starts: list[Start], seconds: float) -> float:
    """The most units started in a rolling window of `seconds`, counting only starts that
    were surely inside it: for each moment t a start may have happened, those that began
    after t - seconds and ended their claim by t."""
    return max(
        sum(s.cost for s in starts if s.after <= t and s.before > t - seconds)
        for t in (s.after for s in starts)
    )


def closest_gap(starts: list[Start], spacing: float) -> float:
    """Of each two starts next to each other, the most time there can have been between them,
    less the spacing the lighter of them asks for; the smallest of these."""
    ordered = sorted(starts, key=lambda s: s.before + s.after)
    return min(
        max(b.after - a.before, a.after - b.before) - spacing * min(a.cost, b.cost)
        for a, b in zip(ordered, ordered[1:], strict=False)
    )


def test_two_processes_share_one_window(prefix: str) -> None:
    """Two OS processes pace through one quota's windows at once. The checks count only what
    surely happened by Redis's clock, so a slow machine cannot fail them; windows kept per
    process, or a script without the spacing or without the capacity check, do."""
    context = multiprocessing.get_context("spawn")
    ready, out = context.Barrier(2), context.Queue()
    # A large request, then small ones: spacing alone would let the small ones fill the
    # token window while the large one is still in it.
    draw = random.Random(7)
    costs = [[3000] + [draw.randint(200, 300) for _ in range(PER_PROCESS - 1)] for _ in range(2)]
    workers = [
        context.Process(target=_pacing_process, args=(prefix, mine, ready, out)) for mine in costs
    ]
    for worker in workers:
        worker.start()
    try:
        paced = [out.get(timeout=60) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()
    for failure in (p for p in paced if isinstance(p, Exception)):
        raise failure
    starts = [start for mine in paced for start in mine]

    assert sorted(s.cost for s in starts) == sorted(costs[0] + costs[1])
    assert SETTINGS.rpm and SETTINGS.tpm
    requests, request_seconds = per_minute(SETTINGS.rpm)
    tokens, token_seconds = per_minute(SETTINGS.tpm, TOKEN_SHARE)
    assert surely_inside([s._replace(cost=1) for s in starts], request_seconds) <= requests
    assert surely_inside(starts, token_seconds) <= tokens
    # Spread as well: each start an even share of the windows after the one before.
    assert closest_gap([s._replace(cost=1) for s in starts], request_seconds / requests) >= 0
    assert closest_gap(starts, token_seconds / tokens) >= 0


def _online(
    fake: "FakeOnline", prefix: str, rpm: int | None = 2
) -> tuple["OnlineProvider", "PipelineSpec"]:
    """The online provider with its windows under `prefix`, and a spec for `fake` at `rpm`
    (2: one request in a window of 30.6 s). The fake answers like a good model."""
    from llm_assets.resources.providers.online import OnlineProvider
    from llm_assets.spec.model import PipelineSpec
    from tests.harness import review_spec, truthful

    fake.responder = truthful
    online = {"base_url": fake.base_url, "timeout_seconds": 5.0, "checkpoint_every": 1}
    if rpm is not None:
        online["rpm"] = rpm
    spec = PipelineSpec.model_validate(review_spec("online", "gpt-4o-mini", online=online))
    return OnlineProvider(rate_limit_prefix=prefix), spec


def _one_request(custom_id: str, delivered: list[ItemResult], patience: float) -> OnlineWork:
    """One chat request; the work asks to stop once `patience` seconds have passed."""
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Order 1001. Fine."}]}
    until = time.monotonic() + patience
    return OnlineWork(
        requests=[(custom_id, body, 50)],
        deliver=delivered.extend,
        checkpoint_every=1,
        stop=lambda: time.monotonic() > until,
    )


@pytest.mark.fake_server("online")
def test_the_online_provider_waits_for_a_window_another_run_filled(
    fake: "FakeOnline", prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLM_ASSETS_RATE_LIMIT_REDIS", REDIS_URL)
    provider, spec = _online(fake, prefix)
    delivered: list[ItemResult] = []

    first = provider.run(spec, _one_request("first", delivered, patience=60))
    # A run of its own (as on another worker): its windows start empty in this process, but
    # the endpoint's window in Redis holds the first run's request for 30 s.
    second = provider.run(spec, _one_request("second", delivered, patience=1))

    assert first.sent == 1 and [r.custom_id for r in delivered] == ["first"]
    assert second == OnlineStats(interrupted=True, elapsed_seconds=second.elapsed_seconds)
    assert [c.request_id for c in fake.calls()] == ["first"]


@pytest.mark.fake_server("online")
def test_a_rate_limit_one_run_met_pauses_another_run(
    fake: "FakeOnline", prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLM_ASSETS_RATE_LIMIT_REDIS", REDIS_URL)
    # No RPM or TPM of our own: the endpoint's 429 is all that says to slow down.
    provider, spec = _online(fake, prefix, rpm=None)
    fake.fault_retry_after_seconds = 30.0
    fake.fault = lambda request_id, body: "429" if request_id == "first" else None
    delivered: list[ItemResult] = []

    first = provider.run(spec, _one_request("first", delivered, patience=1))
    # Another worker's run, its own process state fresh: the quota's pause in Redis holds it.
    second = provider.run(spec, _one_request("second", delivered, patience=1))

    assert first.rate_limited == 1 and first.interrupted and delivered == []
    assert second == OnlineStats(interrupted=True, elapsed_seconds=second.elapsed_seconds)
    assert [c.request_id for c in fake.calls()] == ["first"]
    # The pause is the quota's: it ends with the Retry-After, and its key with it.
    with redis.Redis.from_url(REDIS_URL) as client:
        [key] = client.scan_iter(match=f"{prefix}:*:pause")
        ttl = client.pttl(key)
    assert 25_000 < ttl <= 30_001, ttl


@pytest.mark.fake_server("online")
def test_an_unreachable_redis_stops_the_shard_before_anything_is_sent(
    fake: "FakeOnline", prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        url = f"redis://:hunter2@127.0.0.1:{closed.getsockname()[1]}/0"
        monkeypatch.setenv("LLM_ASSETS_RATE_LIMIT_REDIS", url)
        provider, spec = _online(fake, prefix)

        with pytest.raises(SharedLimitUnavailable) as raised:
            provider.run(spec, _one_request("never", [], patience=60))

    message = str(raised.value)
    assert "LLM_ASSETS_RATE_LIMIT_REDIS" in message and "hunter2" not in message
    assert fake.calls() == []


def test_the_variable_must_be_a_redis_url() -> None:
    environ = {"LLM_ASSETS_RATE_LIMIT_REDIS": "postgresql://u:hunter2@db:5432/limits"}
    with pytest.raises(ValueError, match="LLM_ASSETS_RATE_LIMIT_REDIS=") as raised:
        Settings.from_env(environ)
    assert "not a Redis URL" in str(raised.value) and "hunter2" not in str(raised.value)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"LLM_ASSETS_RATE_LIMIT_REDIS": "rediss://limits:6380/2"}, "rediss://limits:6380/2"),
        (
            {"LLM_ASSETS_EXECUTOR": "celery", "LLM_ASSETS_CELERY_BACKEND": "redis://r:6379/0"},
            "redis://r:6379/0",
        ),
        (
            {
                "LLM_ASSETS_EXECUTOR": "celery",
                "LLM_ASSETS_CELERY_BACKEND": "redis://r:6379/0",
                "LLM_ASSETS_RATE_LIMIT_REDIS": "redis://limits:6379/1",
            },
            "redis://limits:6379/1",
        ),
        ({"LLM_ASSETS_EXECUTOR": "celery", "LLM_ASSETS_CELERY_BACKEND": "rpc://"}, None),
        ({"LLM_ASSETS_CELERY_BACKEND": "redis://r:6379/0"}, None),  # one process: its own
    ],
)
def test_which_redis_holds_the_limit(environ: dict[str, str], expected: str | None) -> None:
    assert Settings.from_env(environ).rate_limit_redis == expected
