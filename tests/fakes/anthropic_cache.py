"""The fake Message Batches API's prompt cache, as the real API's works in a batch.

A request caches the prefix up to and including the system block that carries
`cache_control: {"type": "ephemeral", "ttl": "5m" | "1h"}`, once that prefix is at least the
model's minimum cacheable length (shorter ones are sent uncached, without an error). The real
API caches in a batch on a best-effort basis, requests running concurrently; the fake makes
that deterministic: a batch sees the cache as it was when it started (when it was created),
so every request of a batch whose prefix was not cached then writes it, and a batch started
after it ended, within the TTL, reads it. A read refreshes the entry's lifetime, as on the
real API. Entries live in the state directory, so a restart keeps them.

Usage is reported as the real API reports it: `input_tokens` counts only what was neither
read from nor written to the cache, `cache_creation_input_tokens` and
`cache_read_input_tokens` the rest, and `cache_creation` splits the writes by TTL.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any, Literal

from tests.fakes.anthropic_model import ApiError, approx_tokens, block_text

TTL_SECONDS = {"5m": 300, "1h": 3600}
MIN_CACHEABLE_TOKENS = {
    "claude-haiku-4-5": 4096,
    "claude-opus-4-5": 4096,
    "claude-opus-4-6": 4096,
    "claude-sonnet-4-6": 2048,
    "claude-3-5-haiku": 2048,
    "claude-3-haiku": 2048,
}
"""The shortest cacheable prefix per model family, in tokens; 1024 for any other model
(Sonnet 4.5, Opus 4.1, Sonnet 4, ...)."""
DEFAULT_MIN_CACHEABLE_TOKENS = 1024


def min_cacheable_tokens(model: str) -> int:
    for family, tokens in MIN_CACHEABLE_TOKENS.items():
        if model.startswith(family):
            return tokens
    return DEFAULT_MIN_CACHEABLE_TOKENS


@dataclasses.dataclass(frozen=True)
class Prefix:
    """The cacheable prefix of one request."""

    key: str
    tokens: int
    ttl: str


def check_cache_control(system: Any, label: str) -> None:
    """The create-time check of `cache_control` on system blocks (400 on anything else)."""
    if not isinstance(system, list):
        return
    for position, block in enumerate(system):
        control = block.get("cache_control") if isinstance(block, dict) else None
        if control is None:
            continue
        where = f"{label}.system.{position}.cache_control"
        if not isinstance(control, dict) or control.get("type") != "ephemeral":
            raise ApiError(400, f"{where}.type: Input should be 'ephemeral'")
        if control.get("ttl", "5m") not in TTL_SECONDS:
            raise ApiError(400, f"{where}.ttl: Input should be '5m' or '1h'")


def cacheable_prefix(params: dict[str, Any]) -> Prefix | None:
    """The request's prefix marked for the cache, if it is long enough to be cached."""
    system = params.get("system")
    if not isinstance(system, list):
        return None
    marked = [n for n, b in enumerate(system) if isinstance(b, dict) and b.get("cache_control")]
    if not marked:
        return None
    blocks = system[: marked[-1] + 1]
    tokens = approx_tokens(len(block_text(blocks)))
    if tokens < min_cacheable_tokens(str(params.get("model", ""))):
        return None
    # Cache entries are per model; cache_control itself is not part of the cached content.
    content = [{k: v for k, v in b.items() if k != "cache_control"} for b in blocks]
    digest = hashlib.sha256(json.dumps([params.get("model"), content]).encode()).hexdigest()
    return Prefix(digest, tokens, str(system[marked[-1]]["cache_control"].get("ttl", "5m")))


def cached_usage(
    usage: dict[str, Any], prefix: Prefix, use: Literal["read", "write"]
) -> dict[str, Any]:
    """`usage` of a request with its prefix read from or written to the cache."""
    written = prefix.tokens if use == "write" else 0
    return {
        **usage,
        "input_tokens": max(usage["input_tokens"] - prefix.tokens, 0),
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": prefix.tokens if use == "read" else 0,
        "cache_creation": {
            "ephemeral_5m_input_tokens": written if prefix.ttl == "5m" else 0,
            "ephemeral_1h_input_tokens": written if prefix.ttl == "1h" else 0,
        },
    }


def with_cache(
    usage: dict[str, Any], params: dict[str, Any], batch: dict[str, Any]
) -> tuple[dict[str, Any], Prefix | None]:
    """The usage of a request of `batch` (its meta, with the prefixes cached as it started in
    `cache_at_start`) and the prefix it read or wrote, if any."""
    prefix = cacheable_prefix(params)
    if prefix is None:
        return usage, None
    use: Literal["read", "write"] = (
        "read" if prefix.key in batch.get("cache_at_start", ()) else "write"
    )
    return cached_usage(usage, prefix, use), prefix


class PromptCache:
    """The cache's entries (prefix key → expiry, seconds since the epoch) in `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _entries(self) -> dict[str, float]:
        if not self.path.is_file():
            return {}
        entries: dict[str, float] = json.loads(self.path.read_text())
        return entries

    def live_keys(self) -> list[str]:
        """The prefixes cached now: what a batch starting now sees."""
        now = time.time()
        return sorted(key for key, expiry in self._entries().items() if expiry > now)

    def keep(self, prefixes: list[Prefix]) -> None:
        """Prefixes read or written by a batch that just ended: cached for their TTL from now."""
        entries = self._entries()
        now = time.time()
        for prefix in prefixes:
            expiry = now + TTL_SECONDS[prefix.ttl]
            entries[prefix.key] = max(entries.get(prefix.key, 0.0), expiry)
        tmp = self.path.with_name(f".{self.path.name}.{secrets.token_hex(4)}.tmp")
        tmp.write_text(json.dumps(entries))
        os.replace(tmp, self.path)
