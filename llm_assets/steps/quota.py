"""Provider quotas nobody declared: how much a provider admits in flight for one model,
learned from what it does, and shards admitted by it one at a time.

A quota counts either prompt tokens enqueued (OpenAI's) or batches in progress (Anthropic's
processing batches, Gemini's batches, Bedrock's jobs per model); each provider says which it
meets (`BatchProvider.quota_kind`). What the ledger learned of it (`QuotaRecord`, one per provider,
account, model and kind) is shared by every run, day and process, and changes only by these
rules, pure functions of the record and what was observed:

- **Admission.** A shard is sent when the amount in flight plus its own stays within the
  learned limit and within the spec's declared quota (an upper bound never passed). With
  nothing in flight, one shard is always tried. Where the provider refuses batches after
  creating them (OpenAI), until a refusal says where the limit is, submission starts slowly:
  `INITIAL_SHARDS` shards, then at most twice the most seen started at once, so a day of
  twenty shards meets one refusal, not seventeen, while the limit is found. After
  `probe_every` admissions at the limit one shard more is tried (a probe); a refused probe
  doubles the admissions before the next. A limit the provider stated is not probed for a
  day (`STATED_TRUST`).
- **A refusal** is the learner's signal, never an attempt of the shard's items: the first
  one sets the limit to what was in flight (all of it admitted); a later one, not a probe,
  lowers it multiplicatively (`DECREASE`); a provider that states its limit in the refusal
  sets it outright.
- **An admission above the limit** (a probe, or a limit that grew) raises it to what is in
  flight now: additive, one shard at a time.

Shards wait for room in a stable order (oldest day first, then the day's shards in order: a
run stops at the first that does not fit, and gives way while an older day's shards wait) and
are admitted again as soon as a batch of the model ends (lifecycle: `quota_freed_at`), not
after a fixed wait.
"""

import dataclasses
import datetime as dt
import re
from typing import Any

from llm_assets.resources.ledger import QuotaKey, QuotaRecord

TOKENS = "tokens"
"""A quota of prompt tokens enqueued (in flight) at once."""
BATCHES = "batches"
"""A quota of batches in progress at once."""
DECREASE = 0.7
"""A refusal at or under the learned limit lowers it to this share (or to what was in flight,
whichever is lower)."""
INITIAL_SHARDS = 4
"""Until a refusal shows the limit, a provider that refuses batches after creating them is
sent this many shards to begin with, then at most twice the most seen started at once."""
PROBE_FIRST = 8
"""Admissions at the limit before one shard more is tried."""
PROBE_MOST = 512
STATED = "stated by the provider"
STATED_TRUST = dt.timedelta(days=1)
"""How long a limit the provider stated in a refusal is taken as it is, without probes."""

_STATED = re.compile(
    r"(?:\blimit\b|\bquota\b)\s*(?:of|is|:|=)?\s*\(?\s*(?:quota\s*:\s*)?(\d[\d,]*)", re.IGNORECASE
)


@dataclasses.dataclass(frozen=True)
class Admission:
    """Whether a shard may be sent now, and, when not, why in an operator's words."""

    admit: bool
    probe: bool = False
    reason: str = ""


def stated_limit(message: str) -> int | None:
    """The limit a provider states in its refusal ("Limit: 1,200,000 enqueued tokens",
    "(quota: 2)"), or None."""
    found = _STATED.search(message)
    if found is None:
        return None
    value = int(found.group(1).replace(",", ""))
    return value if value > 0 else None


def amount_of(kind: str, batches: int, tokens: int) -> int:
    return tokens if kind == TOKENS else batches


def admission(
    record: QuotaRecord,
    *,
    load: int,
    amount: int,
    model: str,
    slow_start: bool,
    now: dt.datetime,
    batches: int = 0,
) -> Admission:
    """Whether a shard of `amount` may be sent with `load` (`batches`) in flight (see the
    module rules); `slow_start` where the provider refuses batches after creating them."""
    if load == 0:
        return Admission(True)
    limit = record.learned_limit
    if limit is None:
        opening = batches < INITIAL_SHARDS
        if not slow_start or opening or load + amount <= 2 * record.admitted_peak:
            return Admission(True)
        return Admission(False, reason=words(record, load, model))
    if load + amount <= limit:
        return Admission(True)
    if load <= limit and record.admissions >= record.probe_every and not _trusted(record, now):
        return Admission(True, probe=True)
    return Admission(False, reason=words(record, load, model))


def _trusted(record: QuotaRecord, now: dt.datetime) -> bool:
    """A limit the provider stated is not probed for STATED_TRUST after it said so."""
    return (
        record.how == STATED
        and record.learned_at is not None
        and now - record.learned_at < STATED_TRUST
    )


def after_refusal(
    record: QuotaRecord, *, load: int, amount: int, stated: int | None, now: dt.datetime
) -> dict[str, Any]:
    """What a refusal of a shard of `amount`, with `load` in flight besides it, teaches."""
    values: dict[str, Any] = {"refusals": record.refusals + 1, "admissions": 0}
    limit = record.learned_limit
    if stated is not None and stated != record.stated_limit:
        return values | {
            "learned_limit": stated,
            "stated_limit": stated,
            "how": STATED,
            "learned_at": now,
        }
    if limit is None:
        if load == 0:
            return values  # someone else's load, or a passing limit: nothing learned yet
        new = load
    elif load + amount > limit:
        # A probe above the limit, refused: the limit stands, the next probe comes later.
        return values | {"probe_every": min(record.probe_every * 2, PROBE_MOST)}
    else:
        new = min(load, int(limit * DECREASE))
    return values | {
        "learned_limit": new,
        "how": "refusals",
        "learned_at": now,
        "probe_every": PROBE_FIRST if limit is None else record.probe_every,
    }


def after_admission(record: QuotaRecord, *, load: int, now: dt.datetime) -> dict[str, Any]:
    """What an admission teaches, `load` in flight with the admitted batch."""
    values: dict[str, Any] = {
        "admissions": record.admissions + 1,
        "admitted_peak": max(record.admitted_peak, load),
    }
    limit = record.learned_limit
    if limit is not None and load > limit:
        values |= {
            "learned_limit": load,
            "how": "a batch admitted above it",
            "learned_at": now,
            "admissions": 0,
            "probe_every": PROBE_FIRST,
        }
    return values


def _amount_words(kind: str, value: int) -> str:
    if kind == TOKENS:
        return short(value)
    return str(value)


def short(value: int) -> str:
    """A token count as an operator reads it: 1,200, 135k, 2.5M."""
    if value >= 10_000_000:
        return f"{value / 1_000_000:.0f}M"
    if value >= 1_000_000:
        return f"{value / 1_000_000:.1f}M"
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    return f"{value:,}"


def words(record: QuotaRecord, load: int, model: str) -> str:
    """ "waiting for quota: 135k of ~140k enqueued tokens of gpt-4.1-mini in flight (learned
    2026-12-04 from 3 refusals)"."""
    what = "enqueued tokens" if record.kind == TOKENS else "batches"
    if record.learned_limit is None:
        return (
            f"waiting for quota: {_amount_words(record.kind, load)} {what} of {model} in flight; "
            f"at most twice the {_amount_words(record.kind, record.admitted_peak)} seen "
            "started at once is sent until the provider refuses one (learning its limit)"
        )
    return (
        f"waiting for quota: {_amount_words(record.kind, load)} of "
        f"~{_amount_words(record.kind, record.learned_limit)} {what} of {model} in flight "
        f"({source(record)})"
    )


def source(record: QuotaRecord) -> str:
    """How the limit was learned: "learned 2026-12-04 from 3 refusals"."""
    when = f"{record.learned_at:%Y-%m-%d}" if record.learned_at else "earlier"
    if record.how == STATED:
        return f"stated by the provider {when}"
    if record.how == "a batch admitted above it":
        return f"raised {when} by a batch admitted above it; {record.refusals} refusals so far"
    refusals = f"{record.refusals} refusal{'s' if record.refusals != 1 else ''}"
    return f"learned {when} from {refusals}"


def key_name(key: QuotaKey) -> str:
    """The quota's name for its admission lock."""
    return f"{key.provider}\0{key.account}\0{key.model_name}\0{key.kind}"


def as_row(record: QuotaRecord, in_flight: tuple[int, int]) -> dict[str, Any]:
    """One learned quota as `llm-assets quotas` shows it."""
    limit = record.learned_limit
    return {
        "provider": record.provider,
        "account": record.account,
        "model": record.model_name,
        "kind": "enqueued tokens" if record.kind == TOKENS else "batches",
        "in_flight": _amount_words(record.kind, amount_of(record.kind, *in_flight)),
        "limit": None if limit is None else f"~{_amount_words(record.kind, limit)}",
        "how": source(record)
        if limit is not None
        else f"not refused yet; {_amount_words(record.kind, record.admitted_peak)} "
        "seen admitted at once",
        "refusals": record.refusals,
        "learned_at": record.learned_at,
    }
