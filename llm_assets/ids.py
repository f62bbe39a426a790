"""Where every identifier is made: jobs, shards and item custom_ids.

custom_ids are deterministic from (pipeline, partition date, source id) and use only
`[A-Za-z0-9_-]`, at most 64 characters, so the same id is valid for every provider and safe
in paths and SQL. The business key stays in the ledger's `source_id`.
"""

import datetime as dt
import functools
import hashlib
import re
from typing import Any

_UNSAFE = re.compile(r"[^A-Za-z0-9]+")


def _digest(*parts: str, length: int) -> str:
    joined = "\x1f".join(parts).encode("utf-8", errors="surrogatepass")
    return hashlib.sha256(joined).hexdigest()[:length]


def slug(value: str, max_len: int) -> str:
    return _UNSAFE.sub("-", value).strip("-")[:max_len].strip("-") or "x"


def custom_id(pipeline: str, date: dt.date, source_key: str, kind: str = "id") -> str:
    """`<yyyymmdd>_<readable part of the id>_<hash>`, at most 64 characters.

    `kind` keeps keys of different origins apart (a real id, the n-th duplicate of an id, a
    row without an id), so no source id can ever produce another row's custom_id.
    """
    hashed, day = _custom_id_prefix(pipeline, date, kind)
    digest = hashed.copy()
    digest.update(source_key.encode("utf-8", errors="surrogatepass"))
    return f"{day}_{slug(source_key, 30)}_{digest.hexdigest()[:20]}"


@functools.lru_cache(maxsize=64)
def _custom_id_prefix(pipeline: str, date: dt.date, kind: str) -> tuple[Any, str]:
    """What every custom_id of one (pipeline, day, kind) shares: the hash of the leading
    parts (as `_digest` joins them) and the date; made once, not per item."""
    joined = "\x1f".join((pipeline, date.isoformat(), kind, "")).encode(
        "utf-8", errors="surrogatepass"
    )
    return hashlib.sha256(joined), f"{date:%Y%m%d}"


def job_id(pipeline: str, date: dt.date, prompt_version: str, provider: str, model: str) -> str:
    digest = _digest(pipeline, date.isoformat(), prompt_version, provider, model, length=10)
    return f"{slug(pipeline, 40)}-{date:%Y%m%d}-{digest}"


def shard_id(job: str, round_no: int, index: int) -> str:
    return f"{job}-r{round_no:02d}-s{index:05d}"
