"""The online path's RPM and TPM windows kept in Redis, so that every process sending to the
same quota -- Celery workers on several machines -- keeps to the provider's limit together
instead of each using all of it.

The windows keep `RollingWindow`'s contract (at most `capacity` units started in any rolling
window, starts an even share of the window apart) in one Lua script that runs atomically on
the Redis server: it reads the server's clock (`TIME`, so machines with skewed clocks agree),
drops the starts that left the windows, and either records the start in every window and
answers 0, or records nothing and answers how many microseconds to wait. A quota is named by
what identifies the provider's limit (provider, endpoint, model), hashed, so a URL's
credentials never reach a key. The keys expire a second after their window: nothing is left
behind.

A rate limit (a 429's Retry-After, or the endpoint's word that its window is empty) is the
quota's, not the process's: the sender that meets it sets the quota's pause on the same
server clock, and every process's next claim waits it out before it looks at the windows.

The Redis comes from LLM_ASSETS_RATE_LIMIT_REDIS (or the Celery result backend,
`settings.rate_limit_redis_url`); a Redis that cannot be reached fails the shard instead of
falling back to a limit per process, which would overrun the provider.
"""

import contextlib
import hashlib
from collections.abc import AsyncIterator
from typing import Any

from llm_assets.resources.providers.realtime import (
    TOKEN_SHARE,
    LocalPacer,
    OnlineSettings,
    Pacer,
    per_minute,
)
from llm_assets.util.secrecy import mask_url

KEY_PREFIX = "llm_assets:rate_limit"
TIMEOUT_SECONDS = 5.0
"""How long connecting to Redis, or one answer from it, may take."""
VARIABLES = "LLM_ASSETS_RATE_LIMIT_REDIS (or LLM_ASSETS_CELERY_BACKEND with Celery)"

# KEYS: the windows' sorted sets (score: start in microseconds of server time; member:
# "start:sequence:cost"), the sequence counter, then the pause (until when, in microseconds of
# server time, every sender waits after a rate limit). ARGV: per window its capacity, length
# in microseconds and this request's cost. Answers 0 (started, recorded) or microseconds to
# wait.
CLAIM = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local windows = #KEYS - 2
local paused = tonumber(redis.call('GET', KEYS[windows + 2]) or '0')
if paused > now then
  return math.ceil(paused - now)
end
if windows == 0 then
  return 0
end
local moment, ttl = now, 0
for i = 1, windows do
  local capacity = tonumber(ARGV[3 * i - 2])
  local length = tonumber(ARGV[3 * i - 1])
  local cost = tonumber(ARGV[3 * i])
  ttl = math.max(ttl, length)
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - length)
  local starts = redis.call('ZRANGE', KEYS[i], 0, -1, 'WITHSCORES')
  local total, used = 0, {}
  for j = 1, #starts, 2 do
    used[j] = tonumber(string.match(starts[j], ':([^:]+)$'))
    total = total + used[j]
  end
  if #starts > 0 and capacity > 0 then
    moment = math.max(moment, tonumber(starts[#starts]) + length / capacity * cost)
  end
  for j = 1, #starts, 2 do
    if total + cost <= capacity then break end
    total = total - used[j]
    moment = math.max(moment, tonumber(starts[j + 1]) + length)
  end
end
if moment > now then
  return math.ceil(moment - now)
end
local sequence = redis.call('INCR', KEYS[windows + 1])
local expire = math.ceil(ttl / 1000) + 1000
redis.call('PEXPIRE', KEYS[windows + 1], expire)
for i = 1, windows do
  local member = string.format('%.0f:%d:', now, sequence) .. ARGV[3 * i]
  redis.call('ZADD', KEYS[i], now, member)
  redis.call('PEXPIRE', KEYS[i], expire)
end
return 0
"""

# KEYS: the pause. ARGV: how long to pause, in microseconds from the server's now. A longer
# pause already set stands; the key expires with the pause.
HOLD_OFF = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local until_ = now + tonumber(ARGV[1])
local paused = tonumber(redis.call('GET', KEYS[1]) or '0')
if until_ > paused then
  local expire = math.ceil(tonumber(ARGV[1]) / 1000) + 1
  redis.call('SET', KEYS[1], string.format('%.0f', until_), 'PX', expire)
end
return 0
"""


class SharedLimitUnavailable(Exception):
    """The Redis that holds the shared RPM/TPM windows did not answer."""


def quota_name(*parts: str | None) -> str:
    """The name of a provider's quota in Redis keys: a hash of what identifies it (provider,
    endpoint, model)."""
    return hashlib.sha256("\x1f".join(p or "" for p in parts).encode()).hexdigest()[:32]


class SharedPacer:
    """The RPM and TPM windows of one quota in Redis, and its pause after a rate limit, shared
    by every process that uses the same Redis, quota and `prefix`."""

    def __init__(
        self,
        client: Any,
        url: str,
        quota: str,
        settings: OnlineSettings,
        prefix: str = KEY_PREFIX,
    ) -> None:
        self.client = client
        self.url = mask_url(url)
        self.script = client.register_script(CLAIM)
        self.hold_script = client.register_script(HOLD_OFF)
        # Every key of a quota in one hash slot ({quota}), so a Redis Cluster runs the script.
        base = f"{prefix}:{{{quota}}}"
        self.windows: list[tuple[str, float, float, bool]] = []
        if settings.rpm:
            self.windows.append((f"{base}:requests", *per_minute(settings.rpm), False))
        if settings.tpm:
            self.windows.append((f"{base}:tokens", *per_minute(settings.tpm, TOKEN_SHARE), True))
        self.pause_key = f"{base}:pause"
        self.keys = [key for key, *_ in self.windows] + [f"{base}:sequence", self.pause_key]

    async def claim(self, tokens: int) -> float:
        args: list[float] = []
        for _, capacity, seconds, by_tokens in self.windows:
            args += [capacity, round(seconds * 1_000_000), tokens if by_tokens else 1]
        wait = await self._run(self.script, self.keys, args)
        return int(wait) / 1_000_000

    async def hold_off(self, seconds: float) -> None:
        """Every process of this quota waits `seconds` from now (a longer pause stands)."""
        await self._run(self.hold_script, [self.pause_key], [max(1, round(seconds * 1_000_000))])

    async def _run(self, script: Any, keys: list[str], args: list[float]) -> Any:
        from redis.exceptions import RedisError

        try:
            return await script(keys=keys, args=args)
        except (RedisError, OSError) as exc:
            raise SharedLimitUnavailable(
                f"the Redis of the shared RPM/TPM limit ({self.url}, from {VARIABLES}) stopped "
                f"answering: {exc}; the shard's unsent items stay open for the next run"
            ) from exc


async def connect(url: str) -> Any:
    """A `redis.asyncio` client for `url` that has answered a PING, or
    SharedLimitUnavailable saying which variable to fix."""
    import redis.asyncio
    from redis.exceptions import RedisError

    client = redis.asyncio.Redis.from_url(
        url, socket_connect_timeout=TIMEOUT_SECONDS, socket_timeout=TIMEOUT_SECONDS
    )
    try:
        await client.ping()
    except (RedisError, OSError) as exc:
        await client.aclose()
        raise SharedLimitUnavailable(
            f"cannot reach the Redis of the shared RPM/TPM limit at {mask_url(url)} (from "
            f"{VARIABLES}): {exc}. Start it, or point the variable at one that runs; without "
            "it every process would use the whole limit, so nothing was sent"
        ) from exc
    return client


@contextlib.asynccontextmanager
async def open_pacer(
    settings: OnlineSettings,
    quota: tuple[str | None, ...],
    redis_url: str | None,
    prefix: str = KEY_PREFIX,
) -> AsyncIterator[Pacer]:
    """The windows and the rate-limit pause a run paces its requests under: in the Redis at
    `redis_url` under `prefix`, shared by every process sending to `quota` (provider,
    endpoint, model), when one is configured (a 429 on one worker pauses them all, whether or
    not the spec sets an RPM or TPM limit); else this process's own."""
    if not redis_url:
        yield LocalPacer(settings.rpm, settings.tpm)
        return
    client = await connect(redis_url)
    try:
        yield SharedPacer(client, redis_url, quota_name(*quota), settings, prefix)
    finally:
        await client.aclose()
