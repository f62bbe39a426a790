"""From snapshot rows to request items, catching bad input before anything is sent.

Bad input never vanishes: every row becomes either a request or an `input` dead letter with
a reason, under a custom_id that is stable across re-runs.
"""

import array
import dataclasses
import datetime as dt
import zoneinfo
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from llm_assets.compliance.policy import (
    BLOCKED_CODE,
    COMPLIANCE,
    UNSCANNED_CODE,
    Screened,
    blocked_message,
    screen,
)
from llm_assets.items import ids
from llm_assets.items.source import SourceRow, parse_date
from llm_assets.items.tokens import TokenCounter, counter_for
from llm_assets.spec.model import PipelineSpec
from llm_assets.util import parallel
from llm_assets.util.fastjson import json_string


class PreparedItem(NamedTuple):
    """A row's outcome: a request line, or an input dead letter with its reason."""

    custom_id: str
    source_id: str | None
    line: bytes | None = None
    """The provider's request line; None for a dead letter."""
    input_tokens: int = 0
    error_code: str | None = None
    error_message: str | None = None
    error_class: str = "input"
    found: tuple[tuple[str, int], ...] | None = None
    """Personal data found in the prompt, as ("entity:action", count) pairs; None: none."""
    pseudonyms: tuple[tuple[str, str], ...] | None = None
    """(placeholder, value) of the pseudonymized values; None: none."""


LineEncoder = Callable[[str, str], bytes]
"""(custom_id, user text) → the provider's request line."""


class TemplateEncoder:
    """A spec's request line split around its custom_id and user text; filling it in encodes
    only those two strings. Here, not with the providers: a worker process that assesses
    rows unpickles it without importing Dagster."""

    def __init__(self, head: str, middle: str, tail: str, id_first: bool) -> None:
        self.head, self.middle, self.tail = head.encode(), middle.encode(), tail.encode()
        self.id_first = id_first

    def __call__(self, custom_id: str, user: str) -> bytes:
        first, second = (custom_id, user) if self.id_first else (user, custom_id)
        return b"".join(
            (self.head, json_string(first), self.middle, json_string(second), self.tail)
        )


@dataclasses.dataclass(frozen=True)
class KnownIds:
    """custom_ids the ledger gave a day's rows already, which they keep whatever the id key
    is now (llm_assets/items/ids.py): by source id, and the ids of rows never sent (a legacy id is
    kept where the ledger has one)."""

    by_source: Mapping[str, str] = dataclasses.field(default_factory=dict)
    unsent: frozenset[str] = frozenset()


def as_text(value: Any) -> str:
    """A record's value as the pipeline reads it into an id or a prompt (0 is not blank)."""
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)


def render(spec: PipelineSpec, record: dict[str, Any]) -> str:
    return spec.prompt.template.format_map({f: as_text(record.get(f)) for f in spec.source.fields})


class Preparer:
    """Everything a row's outcome depends on except the rows before it (duplicates): so it
    can run in a worker process (it pickles), row by row."""

    def __init__(
        self,
        spec: PipelineSpec,
        partition_date: dt.date,
        context_window: int,
        encode: LineEncoder,
        id_key: bytes,
        known: KnownIds = KnownIds(),
    ) -> None:
        self.spec = spec
        self.partition_date = partition_date
        self.context_window = context_window
        self.encode = encode
        self.id_key = id_key
        self.known = known
        self._counter: TokenCounter | None = None
        self._framing = 0
        self._tz = zoneinfo.ZoneInfo(spec.partitions.timezone)
        self.policy = spec.compliance.pii

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_counter": None}

    def _count(self) -> tuple[TokenCounter, int]:
        """The spec's token counter (built on first use, in the process that uses it) and the
        tokens of the system prompt and chat framing, the same for every item."""
        if self._counter is None:
            self._counter = counter_for(self.spec)
            self._framing = self._counter.request(self.spec.prompt.system, "")
        return self._counter, self._framing

    def item_id(self, source_id: str, position: int) -> str:
        """The custom_id of the item of `source_id`, the row at `position` of the day's
        snapshot: the one the ledger gave it, else one derived with the id key."""
        return self.known.by_source.get(source_id) or ids.custom_id(
            self.id_key, self.spec.name, self.partition_date, source_id, position
        )

    def unsent_id(self, row_key: str, kind: str) -> str:
        """The custom_id of a row never sent; its legacy id when the ledger holds that."""
        made = ids.unsent_id(self.spec.name, self.partition_date, row_key, kind)
        if self.known.unsent and made not in self.known.unsent:
            legacy = ids.legacy_custom_id(self.spec.name, self.partition_date, row_key, kind)
            if legacy in self.known.unsent:
                return legacy
        return made

    def dead(
        self,
        key: str,
        source_id: str | None,
        code: str,
        message: str,
        kind: str = "id",
        position: int = 0,
        **more: Any,
    ) -> PreparedItem:
        """A dead letter; `position` (the row's in the snapshot) makes an item's id."""
        return PreparedItem(
            custom_id=self.item_id(key, position) if kind == "id" else self.unsent_id(key, kind),
            source_id=source_id,
            error_code=code,
            error_message=message,
            **more,
        )

    def check(self, row: SourceRow, position: int) -> tuple[str | None, str, PreparedItem | str]:
        """(the source id to check for duplicates or None, where the row is, its outcome or,
        for a row fit to send, its rendered prompt: `finish` makes that the request), of the
        row at `position` of the snapshot."""
        spec = self.spec
        where = f"{row.file}:{row.line}"
        if row.record is None:
            return (
                None,
                where,
                self.dead(where, None, "invalid_row", f"{where}: {row.error}", "row"),
            )
        record = row.record
        source_id = as_text(record.get(spec.source.id_field))
        if not source_id.strip():
            message = f"{where}: no value in id field {spec.source.id_field!r}"
            return None, where, self.dead(where, None, "missing_id", message, "row")
        if "\x00" in source_id:
            # PostgreSQL stores no NUL in text: the id is named escaped, and kept nowhere.
            message = (
                f"{where}: id {source_id!r} holds a NUL character, which the ledger cannot "
                "store; remove it from the source"
            )
            return None, where, self.dead(where, None, "invalid_id", message, "row")
        if parse_date(record.get(spec.source.date_field), self._tz) is None:
            message = (
                f"{where}: no valid date in {spec.source.date_field!r} "
                f"(got {as_text(record.get(spec.source.date_field))[:40]!r})"
            )
            dead = self.dead(source_id, source_id, "missing_date", message, position=position)
            return source_id, where, dead
        blank = [f for f in spec.source.non_blank_fields if not as_text(record.get(f)).strip()]
        if blank:
            message = f"{where}: empty field{'s' if len(blank) > 1 else ''}: {', '.join(blank)}"
            dead = self.dead(source_id, source_id, "empty_field", message, position=position)
            return source_id, where, dead
        return source_id, where, render(spec, record)

    def finish(self, source_id: str, where: str, screened: Screened, position: int) -> PreparedItem:
        """A rendered prompt after the personal-data policy: its request line, or a dead
        letter when the policy blocks it or it is over the context window."""
        spec = self.spec
        found = screened.found or None
        if screened.text is None:
            message = f"{where}: {blocked_message(screened)}"
            code = UNSCANNED_CODE if screened.unscanned else BLOCKED_CODE
            return self.dead(
                source_id,
                source_id,
                code,
                message,
                position=position,
                error_class=COMPLIANCE,
                found=found,
            )
        user, tokens, over = self._fit(screened.text)
        if over:
            message = (
                f"{where}: {over} input tokens; the model's context window is "
                f"{self.context_window} with {spec.model.max_output_tokens} kept for output"
            )
            return self.dead(
                source_id, source_id, "context_exceeded", message, position=position, found=found
            )
        cid = self.item_id(source_id, position)
        return PreparedItem(
            cid,
            source_id,
            self.encode(cid, user),
            tokens,
            found=found,
            pseudonyms=screened.pseudonyms or None,
        )

    def over_by_length(self, user: str) -> bool:
        """Whether a prompt is over the context window by its length alone, and is not cut to
        fit: it becomes a `context_exceeded` dead letter and is never sent, so it is not
        scanned for personal data either (20 million characters would be blocked unscanned
        as too long, under the wrong reason)."""
        counter, framing = self._count()
        budget = self.context_window - self.spec.model.max_output_tokens
        truncating = self.spec.prompt.truncate_to_context and budget > framing
        return not truncating and framing + counter.fewest(len(user)) > budget

    def _fit(self, user: str) -> tuple[str, int, str]:
        """(the user text to send, its request's input tokens, "" or how far it is over the
        context window). A text whose length alone puts it over is not tokenized: one of
        hundreds of MB would take minutes; truncating cuts it first."""
        counter, framing = self._count()
        budget = self.context_window - self.spec.model.max_output_tokens
        truncating = self.spec.prompt.truncate_to_context and budget > framing
        fewest = framing + counter.fewest(len(user))
        if fewest > budget and not truncating:
            return user, fewest, f"{len(user)} characters: at least {fewest}"
        tokens = framing + counter.text(user) if fewest <= budget else budget + 1
        if tokens > budget and truncating:
            user = counter.truncate(user, budget - framing)
            tokens = framing + counter.text(user)
        if tokens > budget:
            return user, tokens, f"{'' if counter.exact else 'about '}{tokens}"
        return user, tokens, ""


Block = tuple["int | array.array[int]", list[bytes]]
"""Snapshot lines with their positions in the snapshot: the first's (consecutive lines), or
each one's (a slice's lines, steps/build.py) as a compact array."""


def assess_lines(preparer: Preparer, blocks: Sequence[Block]) -> list[tuple[Any, ...]]:
    """Blocks of snapshot lines, each with the position of its first line in the snapshot
    (or of each line) → assessed rows: the unit of work of a worker process. Each is one flat
    tuple, (source id, where, *PreparedItem): named tuples inside tuples cost several times
    as much to pickle and unpickle as the flat ones (and a position per block, not a tuple
    per line, goes to the worker)."""
    positions = [
        p
        for start, block in blocks
        for p in (range(start, start + len(block)) if isinstance(start, int) else start)
    ]
    lines = [line for _, block in blocks for line in block]
    checked = [
        preparer.check(SourceRow.from_json(line), p)
        for p, line in zip(positions, lines, strict=True)
    ]
    # The prompts of a chunk are screened for personal data together: one scan, not one each.
    # A prompt over the context window by its length alone is dead-lettered by finish, unscanned.
    over = [isinstance(c, str) and preparer.over_by_length(c) for _, _, c in checked]
    prompts = [
        c for (_, _, c), o in zip(checked, over, strict=True) if isinstance(c, str) and not o
    ]
    compliance = preparer.spec.compliance
    screened = iter(
        screen(prompts, preparer.policy, compliance.phone_regions, compliance.max_scanned_chars)
    )
    assessed = []
    for position, (source_id, where, outcome), unsent in zip(positions, checked, over, strict=True):
        if isinstance(outcome, str):
            assert source_id is not None
            screened_text = Screened(outcome) if unsent else next(screened)
            outcome = preparer.finish(source_id, where, screened_text, position)
        assessed.append((source_id, where, *outcome))
    return assessed


def prepare_items(preparer: Preparer, lines: Iterable[bytes]) -> Iterator[PreparedItem]:
    """Snapshot lines → one outcome per row, in order (`prepare_blocks`)."""
    return prepare_blocks(preparer, parallel.numbered_blocks(lines))


def prepare_blocks(
    preparer: Preparer, blocks: Iterable[Block], workers: int | None = None
) -> Iterator[PreparedItem]:
    """Blocks of snapshot lines → one outcome per row, in order; rows are assessed in worker
    processes when the day is large (llm_assets.util.parallel: `workers` of them, None for
    its default). Of rows sharing a source id the first is kept and the others are
    `duplicate_id` dead letters, whatever else is wrong with them."""
    # Where each id was first seen, as file number << 32 | line: a million ids take a third
    # of the memory that their "file:line" strings would.
    first_seen: dict[str, int] = {}
    files: dict[str, int] = {}
    duplicates: dict[str, int] = {}
    assessing = parallel.ordered_map(
        assess_lines, preparer, blocks, workers=workers, weight=_block_size
    )
    for assessed in assessing:
        for row in assessed:
            # The item is the rest of the flat row, made a PreparedItem without the call of
            # its __new__ (three times the cost, for every item of the day, in this process).
            source_id, where, item = row[0], row[1], _new_tuple(PreparedItem, row[2:])
            if source_id is None:
                yield item
                continue
            seen = first_seen.get(source_id)
            if seen is not None:
                duplicates[source_id] = duplicates.get(source_id, 0) + 1
                first = f"{next(f for f, n in files.items() if n == seen >> 32)}:{seen & _LINE}"
                yield preparer.dead(
                    f"{source_id}#{duplicates[source_id]}",
                    source_id,
                    ids.DUPLICATE_ID,
                    f"{where}: id {source_id!r} already seen at {first}; the first row is kept",
                    kind="duplicate",
                )
                continue
            file, _, line = where.rpartition(":")
            number = files.setdefault(file, len(files))
            first_seen[source_id] = number << 32 | int(line)
            yield item


_LINE = (1 << 32) - 1
_new_tuple = tuple.__new__


def _block_size(block: Block) -> int:
    return len(block[1])
