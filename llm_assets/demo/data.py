"""Deterministic, realistic customer-support tickets for `make demo` and the tests.

The demo classifies tickets zero-shot and summarises them extractively, so the text has to read
like real support mail: varied wording, several sentences, details that matter, the odd typo
and the odd second topic mentioned in passing. The true category goes to a separate truth file
so accuracy can be measured without leaking the label into the input. Each good ticket's row
also carries it as `agent_category`, the category the support agent filed the ticket under: a
human label, as a real inbox export has one, which the demo pipeline never sends to the model
(it is not in source.fields) and which its evaluation scores answers against
(eval.reference_field). The deliberately bad rows carry none, as they carry no truth.

The first day's file also carries one of each deliberately bad row (see `BAD_ROW_REASONS`) so
validation, duplicate handling and context-window limits are exercised by a single partition.

Some tickets carry personal data the way customers write it ("you can reach me on ...", "my
card ... was charged twice"), so the personal-data policy has something to redact and to block:
`CONTACT_PERCENT` of a day's tickets give a phone number, an IBAN, an IP address or an e-mail
address, and one ticket in `BLOCKED_EVERY` a card number or, once in the whole run, an API key.
A few problem templates mention the customer's e-mail address too. The truth file and
`GeneratedDemo.personal_data` record which ticket carries which values. These tickets are
picked with a random stream of their own, so every other ticket reads as it would without them.

This module decides how tickets are put together; their words come from the corpus
(corpus.py), so the same seed gives the same bytes only with the same corpus.
"""

import dataclasses
import datetime as dt
import json
import os
import random
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from llm_assets.demo.corpus import CATEGORIES, TONES, Slots, corpus
from llm_assets.demo.personal import BLOCKED_EVERY, CONTACT_PERCENT, Planting, plant_personal_data

__all__ = [
    "BAD_ROW_REASONS",
    "BLOCKED_EVERY",
    "CATEGORIES",
    "CHANNELS",
    "CONTACT_PERCENT",
    "GeneratedDemo",
    "generate_demo_data",
]

CHANNELS: tuple[str, ...] = ("email", "chat", "web", "phone")
BAD_ROW_REASONS: tuple[str, ...] = (
    "empty_body",
    "duplicate_id",
    "missing_date",
    "oversized_body",
    "missing_id",
)
MISSING_ID = "<missing>"
OVERSIZED_BODY_CHARS = 60_000

# Mildly skewed like a real inbox, yet every category shows up whenever tickets_per_day >= 5.
_CATEGORY_WEIGHTS: dict[str, float] = {
    "billing": 0.22,
    "technical_issue": 0.26,
    "account_access": 0.18,
    "shipping": 0.20,
    "product_feedback": 0.14,
}
_CHANNEL_WEIGHTS: tuple[float, ...] = (0.42, 0.25, 0.23, 0.10)
_TONE_WEIGHTS: dict[str, tuple[float, ...]] = {
    "billing": (0.35, 0.40, 0.25),
    "technical_issue": (0.30, 0.40, 0.30),
    "account_access": (0.30, 0.40, 0.30),
    "shipping": (0.30, 0.40, 0.30),
    "product_feedback": (0.60, 0.35, 0.05),
}
_WORD = re.compile(r"\b[a-z]{3,}\b")


class GeneratedDemo(BaseModel):
    """What was written, so callers and tests need not re-derive paths or bad-row ids."""

    model_config = ConfigDict(frozen=True)

    inbox_dir: Path
    files: list[Path]
    truth_path: Path
    days: list[dt.date]
    rows_written: int
    bad_rows: dict[str, list[str]]
    personal_data: dict[str, dict[str, list[str]]]
    """ticket_id → kind (as the compliance detector names it) → the values in its body."""


def _quotas(total: int) -> list[str]:
    """Largest-remainder split, so per-day counts track the weights exactly."""
    raw = {c: total * w for c, w in _CATEGORY_WEIGHTS.items()}
    counts = {c: int(v) for c, v in raw.items()}
    by_remainder = sorted(CATEGORIES, key=lambda c: (counts[c] - raw[c], CATEGORIES.index(c)))
    for c in by_remainder[: total - sum(counts.values())]:
        counts[c] += 1
    return [c for c in CATEGORIES for _ in range(counts[c])]


def _add_typos(text: str, rng: random.Random) -> str:
    """One or two slips of the keyboard; never inside an email address."""
    misspellings = corpus().misspellings
    words = [
        m
        for m in _WORD.finditer(text)
        if (len(m.group()) >= 4 or m.group() in misspellings)
        and "@" not in text[text.rfind(" ", 0, m.start()) + 1 : m.end()]
        and text[m.end() : m.end() + 1] not in ("@", ".", "'")
    ]
    if not words:
        return text
    chosen = rng.sample(words, k=min(len(words), rng.randint(1, 2)))
    for match in sorted(chosen, key=lambda m: -m.start()):
        word = match.group()
        if word in misspellings:
            typo = misspellings[word]
        else:
            i = rng.randint(1, len(word) - 3)
            typo = word[:i] + word[i + 1] + word[i] + word[i + 2 :]
        text = text[: match.start()] + typo + text[match.end() :]
    return text


def _body_sentences(
    category: str, tone: str, channel: str, slots: Slots, rng: random.Random
) -> tuple[list[str], tuple[str, ...]]:
    """Problem first when filling, so follow-up sentences reuse its order, product, ..."""
    words = corpus()
    chosen = rng.choice(words.problems[category])
    problem = chosen.text.format_map(slots)
    opener: str | None = None
    if rng.random() < (0.25 if channel == "chat" else 0.5):
        pool = words.tone_openers[tone] if rng.random() < 0.5 else words.category_openers[category]
        opener = rng.choice(pool).format_map(slots)
    picked = rng.sample(words.details[category], k=rng.choice((0, 1, 1, 2)))
    details = [d.format_map(slots) for d in picked]
    tried = (
        rng.choice(words.tried[category]).format_map(slots)
        if rng.random() < (0.35 if category == "product_feedback" else 0.55)
        else None
    )
    closers = words.feedback_closers if category == "product_feedback" else words.closers
    closer = rng.choice(closers[tone]).format_map(slots) if rng.random() < 0.7 else None
    aside: str | None = None
    if rng.random() < 0.12:
        other = rng.choice([c for c in CATEGORIES if c != category])
        aside = rng.choice(words.asides[other])

    if not details and tried is None and closer is None:
        details.append(rng.choice(words.details[category]).format_map(slots))
    limit = 4 if channel == "chat" else 6

    def assemble() -> list[str]:
        middle = [s for s in (tried, aside) if s is not None]
        return [s for s in (opener, problem, *details, *middle, closer) if s is not None]

    sentences = assemble()
    # An aside only stays when the main topic still has at least three sentences of its own.
    if aside is not None and len(sentences) < 4:
        aside = None
        sentences = assemble()
    while len(sentences) > limit:
        if details:
            details.pop()
        elif aside is not None:
            aside = None
        elif opener is not None:
            opener = None
        else:
            closer = None
        sentences = assemble()
    return sentences, chosen.subjects


def _subject(
    category: str, tone: str, own: tuple[str, ...], slots: Slots, rng: random.Random
) -> str:
    pool = corpus().subjects[category] if rng.random() < 0.15 else own
    subject = rng.choice(pool).format_map(slots)
    roll = rng.random()
    if tone == "frustrated" and roll < 0.3:
        return f"URGENT: {subject}" if roll < 0.15 else f"{subject}!!"
    if roll < 0.06:
        return f"Re: {subject}"
    if roll < 0.16:
        return subject.lower()
    return subject


def _good_ticket(
    category: str, day: dt.date, rng: random.Random, seen_bodies: set[str]
) -> dict[str, Any]:
    """One ticket whose body is new across the whole run; a collision simply draws again."""
    words = corpus()
    for _ in range(100):
        first, last = rng.choice(words.first_names), rng.choice(words.last_names)
        channel = rng.choices(CHANNELS, weights=_CHANNEL_WEIGHTS)[0]
        tone = rng.choices(TONES, weights=_TONE_WEIGHTS[category])[0]
        slots = Slots(rng, day, first, last)
        sentences, subjects = _body_sentences(category, tone, channel, slots, rng)
        body = " ".join(sentences)
        if rng.random() < (0.25 if tone == "frustrated" else 0.1):
            body = _add_typos(body, rng)
        if body in seen_bodies:
            continue
        seen_bodies.add(body)
        row: dict[str, Any] = {
            "customer": f"{first} {last}",
            "channel": channel,
            "subject": _subject(category, tone, subjects, slots, rng),
            "body": body,
        }
        # dict.get: asking a Slots for a missing key would draw a new value.
        email = dict.get(slots, "email")
        if email is not None and email in body:
            row["personal_data"] = {"email": [email]}
        return row
    raise RuntimeError("could not draw a unique ticket body; the template pools are too small")


def _log_paste(day: dt.date, rng: random.Random) -> str:
    """A pasted app log: realistic, token-dense, and far beyond an 8k-token context window."""
    words = corpus()
    lines = ["The app crashes every time I open the live view, here is the full log from my phone:"]
    size = len(lines[0])
    millis = rng.randint(8, 20) * 3_600_000
    device = f"cam-{rng.randint(1000, 9999)}"
    while size < OVERSIZED_BODY_CHARS:
        millis += rng.randint(1, 900)
        seconds, ms = divmod(millis, 1000)
        stamp = f"{day.isoformat()}T{seconds // 3600:02d}:{seconds // 60 % 60:02d}:"
        stamp += f"{seconds % 60:02d}.{ms:03d}Z"
        message = rng.choice(words.log_messages).format(
            a=rng.randint(1, 5), dev=device, ms=rng.randint(40, 4000), line=rng.randint(40, 900)
        )
        line = f"{stamp} {rng.choice(words.log_levels)} {rng.choice(words.log_sources)}: {message}"
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)[:OVERSIZED_BODY_CHARS]


def _timestamps(day: dt.date, count: int, rng: random.Random) -> list[str]:
    """Mostly waking hours, some overnight; sorted so each file reads as an inbox."""
    seconds = sorted(
        rng.randint(7 * 3600, 23 * 3600 - 1) if rng.random() < 0.8 else rng.randint(0, 86_399)
        for _ in range(count)
    )
    return [f"{day.isoformat()}T{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}Z" for s in seconds]


def _write_atomic(path: Path, text: str) -> None:
    """Readers (or a crashed run) never see a half-written inbox file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.chmod(0o644)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _jsonl(rows: Sequence[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


@dataclasses.dataclass
class _Entry:
    """One row of a day's file before ids and timestamps are given out in file order."""

    kind: str  # "good" or one of BAD_ROW_REASONS
    row: dict[str, Any]
    category: str | None = None  # the truth, for good rows only
    duplicate_of: "_Entry | None" = None  # the row whose ticket_id a duplicate_id row reuses


def _day_entries(
    day: dt.date,
    tickets_per_day: int,
    rng: random.Random,
    seen_bodies: set[str],
    plan: Planting,
    *,
    bad: bool,
) -> list[_Entry]:
    categories = _quotas(tickets_per_day)
    rng.shuffle(categories)
    entries = [_Entry("good", _good_ticket(c, day, rng, seen_bodies), c) for c in categories]
    plant_personal_data(entries, tickets_per_day, plan)
    if bad:
        _insert_bad_rows(entries, day, rng, seen_bodies)
    return entries


def _insert_bad_rows(
    entries: list[_Entry], day: dt.date, rng: random.Random, seen_bodies: set[str]
) -> None:
    """One row of each of BAD_ROW_REASONS at a random place; a duplicate follows its original."""
    original = entries[rng.randrange(max(1, len(entries) // 2))]
    extra_category = rng.choice(CATEGORIES)
    words = corpus()
    bad = [
        _Entry(
            "empty_body", {**_good_ticket(extra_category, day, rng, seen_bodies), "body": "   "}
        ),
        _Entry(
            "duplicate_id",
            _good_ticket(rng.choice(CATEGORIES), day, rng, seen_bodies),
            duplicate_of=original,
        ),
        _Entry("missing_date", _good_ticket(rng.choice(CATEGORIES), day, rng, seen_bodies)),
        _Entry(
            "oversized_body",
            {
                "customer": f"{rng.choice(words.first_names)} {rng.choice(words.last_names)}",
                "channel": "email",
                "subject": "App crash log attached",
                "body": _log_paste(day, rng),
            },
        ),
        _Entry("missing_id", _good_ticket(rng.choice(CATEGORIES), day, rng, seen_bodies)),
    ]
    for entry in bad:
        if entry.duplicate_of is not None:
            after = next(i for i, e in enumerate(entries) if e is entry.duplicate_of)
            position = rng.randint(after + 1, len(entries))
        else:
            position = rng.randint(0, len(entries))
        entries.insert(position, entry)


def _inbox_lines(
    day: dt.date, entries: list[_Entry], rng: random.Random
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[tuple[str, str]]]:
    """The day's file rows with ids and timestamps in file order, its truth and its bad rows."""
    stamps = iter(_timestamps(day, len(entries), rng))
    seq = 0
    lines: list[dict[str, Any]] = []
    truth: list[dict[str, Any]] = []
    bad: list[tuple[str, str]] = []
    for entry in entries:
        created_at = next(stamps)
        if entry.duplicate_of is not None:
            ticket_id: str | None = entry.duplicate_of.row["ticket_id"]
        elif entry.kind == "missing_id":
            ticket_id = None
        else:
            seq += 1
            ticket_id = f"T-{day:%Y%m%d}-{seq:04d}"
        line: dict[str, Any] = {}
        if ticket_id is not None:
            line["ticket_id"] = ticket_id
            entry.row["ticket_id"] = ticket_id
        if entry.kind != "missing_date":
            line["created_at"] = created_at
        line.update({k: entry.row[k] for k in ("customer", "channel", "subject", "body")})
        lines.append(line)
        if entry.kind == "good":
            assert entry.category is not None and ticket_id is not None
            line["agent_category"] = entry.category
            truth.append({"ticket_id": ticket_id, "category": entry.category})
            if "personal_data" in entry.row:
                truth[-1]["personal_data"] = entry.row["personal_data"]
        else:
            bad.append((entry.kind, ticket_id or MISSING_ID))
    return lines, truth, bad


def generate_demo_data(
    out_dir: Path,
    start: dt.date,
    days: int = 3,
    tickets_per_day: int = 120,
    seed: int = 7,
) -> GeneratedDemo:
    """Write `days` daily inbox files plus truth.jsonl under `out_dir`; same inputs, same bytes.

    Each day holds `tickets_per_day` good tickets; the first day also holds the five bad rows,
    which are not in the truth file. A truth row is the ticket's id and category, and the
    personal data in its body when it has any; a good ticket's inbox row holds the same
    category as `agent_category`.
    """
    if days < 1:
        raise ValueError(f"days must be >= 1, got {days}")
    if tickets_per_day < 1:
        raise ValueError(f"tickets_per_day must be >= 1, got {tickets_per_day}")

    rng = random.Random(seed)
    plan = Planting(random.Random(f"personal data {seed}"))
    out_dir = Path(out_dir)
    inbox_dir = out_dir / "inbox"
    seen_bodies: set[str] = set()
    truth: list[dict[str, Any]] = []
    files: list[Path] = []
    day_list = [start + dt.timedelta(days=i) for i in range(days)]
    bad_rows: dict[str, list[str]] = {}
    rows_written = 0
    for index, day in enumerate(day_list):
        entries = _day_entries(day, tickets_per_day, rng, seen_bodies, plan, bad=index == 0)
        lines, day_truth, day_bad = _inbox_lines(day, entries, rng)
        truth += day_truth
        for kind, ticket_id in day_bad:
            bad_rows.setdefault(kind, []).append(ticket_id)
        path = inbox_dir / f"tickets-{day.isoformat()}.jsonl"
        _write_atomic(path, _jsonl(lines))
        files.append(path)
        rows_written += len(lines)

    truth_path = out_dir / "truth.jsonl"
    _write_atomic(truth_path, _jsonl(truth))
    return GeneratedDemo(
        inbox_dir=inbox_dir,
        files=files,
        truth_path=truth_path,
        days=day_list,
        rows_written=rows_written,
        bad_rows={reason: bad_rows[reason] for reason in BAD_ROW_REASONS},
        personal_data={
            row["ticket_id"]: row["personal_data"] for row in truth if "personal_data" in row
        },
    )
