"""Where every identifier is made: jobs, shards and item custom_ids.

A custom_id goes to the provider in every request line, so it carries nothing of the row:
`<yyyymmdd>_<position, 8 hex digits>_<32 hex digits>`, 50 characters of `[0-9a-z_]`, valid
for every provider (Anthropic's `^[a-zA-Z0-9_-]{1,64}$`, Bedrock's recordId, Gemini's key,
OpenAI's custom_id) and safe in paths and SQL. The business key stays in the ledger's
`source_id`.

- An item with a source id (`custom_id`): the 32 hex digits are an HMAC-SHA256 of
  (pipeline, partition date, kind `id`, source id) under the id key, so no one without the
  key can test a guessed id (an e-mail address, say) against the ids a provider saw. The key
  is LLM_ASSETS_ID_KEY, else one the ledger made at random on first use and keeps
  (LedgerResource.item_id_key). The position is the row's in the day's snapshot: ids then
  sort the way items are recorded, so the ledger's unique (job, custom_id) index grows at its
  end as it did with the readable ids of earlier versions (hashes alone scatter its inserts:
  the shards step of a million items took a third longer on SQLite). It tells the provider
  where a request stands among the day's rows, which their order tells it anyway.
- A row that is never sent (`unsent_id`: kind `duplicate`, the n-th repeat of an id, keyed
  `id#n`; kind `row`, a row without a usable id, keyed by file and line): `<yyyymmdd>_<32
  hex digits>`, a plain SHA-256 of the same parts. No provider sees it, and it must not
  change with the key: the ledger cannot find such a row by its source id.

An id is derived only for an item the ledger does not hold yet: an item keeps the custom_id
it was first given (the ledger is asked by source id), whatever the key and its row's
position are now, so a new key applies to items first seen after it, and days built before
keyed ids keep their `legacy_custom_id`s. The same snapshot gives the same ids. `kind` keeps
keys of different origins apart, so no source id can produce another row's custom_id.
"""

import datetime as dt
import functools
import hashlib
import re
from typing import Any

_UNSAFE = re.compile(r"[^A-Za-z0-9]+")
ID_HEX = 32
"""Hex digits of a custom_id's hash: 128 bits."""
ID_KEY_VARIABLE = "LLM_ASSETS_ID_KEY"
"""Where a deployment configures the id key (a secret: see llm_assets/util/secrecy.py)."""
DUPLICATE_ID = "duplicate_id"
"""The error code of a repeated id's row: found by its custom_id, never by its source id
(the first row with that id has it)."""
MIN_KEY_CHARS = 32
"""The shortest id key accepted from the environment."""


def _digest(*parts: str, length: int) -> str:
    joined = "\x1f".join(parts).encode("utf-8", errors="surrogatepass")
    return hashlib.sha256(joined).hexdigest()[:length]


def _encoded(value: str) -> bytes:
    return value.encode("utf-8", errors="surrogatepass")


def slug(value: str, max_len: int) -> str:
    return _UNSAFE.sub("-", value).strip("-")[:max_len].strip("-") or "x"


def custom_id(key: bytes, pipeline: str, date: dt.date, source_id: str, position: int) -> str:
    """An item's custom_id: the date, the row's position in the day's snapshot and the
    HMAC-SHA256, under `key`, of (pipeline, date, `id`, source id) joined by U+001F."""
    inner, outer, day = _keyed_prefix(key, pipeline, date)
    digest = inner.copy()
    digest.update(source_id.encode("utf-8", errors="surrogatepass"))
    keyed = outer.copy()
    keyed.update(digest.digest())
    return f"{day}_{position:08x}_{keyed.hexdigest()[:ID_HEX]}"


def position_bound(date: dt.date, position: int) -> str:
    """Where the custom_ids of the snapshot row at `position` begin: every keyed id of a row
    before it sorts below, every one of a row at or after it at or above (custom_id)."""
    return f"{date:%Y%m%d}_{position:08x}"


def unsent_id(pipeline: str, date: dt.date, row_key: str, kind: str) -> str:
    """The custom_id of a row that is never sent (kind `duplicate` or `row`): the date and
    the SHA-256 of (pipeline, date, kind, row key) joined by U+001F, whatever the id key."""
    return f"{date:%Y%m%d}_{_digest(pipeline, date.isoformat(), kind, row_key, length=ID_HEX)}"


def legacy_custom_id(pipeline: str, date: dt.date, source_key: str, kind: str = "id") -> str:
    """What versions before keyed ids made: `<yyyymmdd>_<readable part of the key>_<hash>`.
    Made only to find rows of days built then, which keep it."""
    hashed, day = _legacy_prefix(pipeline, date, kind)
    digest = hashed.copy()
    digest.update(_encoded(source_key))
    return f"{day}_{slug(source_key, 30)}_{digest.hexdigest()[:20]}"


@functools.lru_cache(maxsize=64)
def _keyed_prefix(key: bytes, pipeline: str, date: dt.date) -> tuple[Any, Any, str]:
    """What every keyed custom_id of one (key, pipeline, day) shares: HMAC's inner hash over
    the keyed pad and the leading parts, its outer hash over the other pad (RFC 2104, as
    `hmac` makes them), and the date; made once, not per item. Copying the two hashes per
    item takes 0.7 µs, an `hmac` object's copy 1.1 µs; a test holds the ids to `hmac.new`."""
    block = hashlib.sha256().block_size
    padded = (hashlib.sha256(key).digest() if len(key) > block else key).ljust(block, b"\0")
    joined = "\x1f".join((pipeline, date.isoformat(), "id", ""))
    inner = hashlib.sha256(bytes(b ^ 0x36 for b in padded) + _encoded(joined))
    outer = hashlib.sha256(bytes(b ^ 0x5C for b in padded))
    return inner, outer, f"{date:%Y%m%d}"


@functools.lru_cache(maxsize=64)
def _legacy_prefix(pipeline: str, date: dt.date, kind: str) -> tuple[Any, str]:
    joined = "\x1f".join((pipeline, date.isoformat(), kind, ""))
    return hashlib.sha256(_encoded(joined)), f"{date:%Y%m%d}"


def id_key_problem(value: str, variable: str) -> str | None:
    """Why `value` (from `variable`) cannot be the id key, or None. Never quotes the value."""
    if len(value) < MIN_KEY_CHARS:
        return (
            f"{variable} is {len(value)} characters; the id key needs at least "
            f"{MIN_KEY_CHARS} (make one with `python -c 'import secrets; "
            "print(secrets.token_hex(32))'`)"
        )
    return None


def job_id(pipeline: str, date: dt.date, prompt_version: str, provider: str, model: str) -> str:
    digest = _digest(pipeline, date.isoformat(), prompt_version, provider, model, length=10)
    return f"{slug(pipeline, 40)}-{date:%Y%m%d}-{digest}"


def shard_id(job: str, round_no: int, index: int) -> str:
    return f"{job}-r{round_no:02d}-s{index:05d}"
