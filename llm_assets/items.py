"""From snapshot rows to request items, catching bad input before anything is sent.

Bad input never vanishes: every row becomes either a request or an `input` dead letter with
a reason, under a custom_id that is stable across re-runs.
"""

import datetime as dt
import zoneinfo
from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import BaseModel

from llm_assets.ids import custom_id
from llm_assets.resources.providers.base import RequestItem
from llm_assets.source import SourceRow, parse_date
from llm_assets.spec import PipelineSpec
from llm_assets.tokens import counter_for


class PreparedItem(BaseModel):
    custom_id: str
    source_id: str | None
    request: RequestItem | None = None
    input_tokens: int = 0
    error_code: str | None = None
    error_message: str | None = None


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)


def render(spec: PipelineSpec, record: dict[str, Any]) -> str:
    return spec.prompt.template.format_map({f: _as_text(record.get(f)) for f in spec.source.fields})


def prepare_items(
    spec: PipelineSpec, partition_date: dt.date, rows: Iterable[SourceRow], context_window: int
) -> Iterator[PreparedItem]:
    tz = zoneinfo.ZoneInfo(spec.partitions.timezone)
    first_seen: dict[str, str] = {}
    duplicates: dict[str, int] = {}
    budget = context_window - spec.model.max_output_tokens
    counter = counter_for(spec)
    system = spec.prompt.system
    framing = counter.request(system, "")

    def dead(
        key: str, source_id: str | None, code: str, message: str, kind: str = "id"
    ) -> PreparedItem:
        return PreparedItem(
            custom_id=custom_id(spec.name, partition_date, key, kind),
            source_id=source_id,
            error_code=code,
            error_message=message,
        )

    for row in rows:
        where = f"{row.file}:{row.line}"
        if row.record is None:
            yield dead(where, None, "invalid_row", f"{where}: {row.error}", kind="row")
            continue
        source_id = _as_text(row.record.get(spec.source.id_field))
        if not source_id.strip():
            yield dead(
                where,
                None,
                "missing_id",
                f"{where}: no value in id field {spec.source.id_field!r}",
                kind="row",
            )
            continue
        if source_id in first_seen:
            duplicates[source_id] = duplicates.get(source_id, 0) + 1
            yield dead(
                f"{source_id}#{duplicates[source_id]}",
                source_id,
                "duplicate_id",
                f"{where}: id {source_id!r} already seen at {first_seen[source_id]}; the first "
                "row is kept",
                kind="duplicate",
            )
            continue
        first_seen[source_id] = where
        if parse_date(row.record.get(spec.source.date_field), tz) is None:
            yield dead(
                source_id,
                source_id,
                "missing_date",
                f"{where}: no valid date in {spec.source.date_field!r} "
                f"(got {_as_text(row.record.get(spec.source.date_field))[:40]!r})",
            )
            continue
        blank = [f for f in spec.source.non_blank_fields if not _as_text(row.record.get(f)).strip()]
        if blank:
            yield dead(source_id, source_id, "empty_field", f"{where}: empty field(s) {blank}")
            continue
        user = render(spec, row.record)
        # The system prompt and the framing are the same for every item: counted once.
        tokens = framing + counter.text(user)
        if tokens > budget and spec.prompt.truncate_to_context and budget > framing:
            user = counter.truncate(user, budget - framing)
            tokens = framing + counter.text(user)
        if tokens > budget:
            about = "" if counter.exact else "about "
            yield dead(
                source_id,
                source_id,
                "context_exceeded",
                f"{where}: {about}{tokens} input tokens; the model's context window is "
                f"{context_window} with {spec.model.max_output_tokens} kept for output",
            )
            continue
        cid = custom_id(spec.name, partition_date, source_id)
        yield PreparedItem(
            custom_id=cid,
            source_id=source_id,
            request=RequestItem(custom_id=cid, system=spec.prompt.system, user=user),
            input_tokens=tokens,
        )
