"""The sample of an evaluation: items drawn from a pipeline's past days, seeded, the same for
every variant.

Every item of the days' current input snapshots that the pipeline would send ranks by a hash
of (seed, day, source id); the lowest ranks are the sample, written as one JSONL source file
that every variant reads.
"""

import datetime as dt
import hashlib
import heapq
import zoneinfo
from collections.abc import Iterator

import orjson
from pydantic import BaseModel

from llm_assets import steps
from llm_assets.items.prepare import as_text
from llm_assets.items.source import SourceRow, parse_date
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec.model import PipelineSpec
from llm_assets.steps.context import artifact_key


class Sample(BaseModel):
    """The items of an evaluation: the same for every variant."""

    eval_id: str
    pipeline: str
    days: list[dt.date]
    size: int
    seed: int
    uri: str
    """The sample's rows as a JSONL source file, records as the snapshots hold them."""
    source_ids: dict[dt.date, list[str]]
    """The sampled source ids of each day (a day with none sampled maps to [])."""

    @property
    def items(self) -> int:
        return sum(len(v) for v in self.source_ids.values())


def eval_id_of(pipeline: str, days: list[dt.date], size: int, seed: int) -> str:
    """A short id naming the evaluation: the same pipeline, days, size and seed, the same id."""
    parts = (pipeline, ",".join(d.isoformat() for d in days), str(size), str(seed))
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:12]


def _rank(seed: int, day: dt.date, source_id: str) -> int:
    """Where an item stands in the seeded order: the sample takes the lowest ranks."""
    key = f"{seed}\x1f{day.isoformat()}\x1f{source_id}".encode("utf-8", errors="surrogatepass")
    return int.from_bytes(hashlib.sha256(key).digest()[:16])


def _sampleable(
    spec: PipelineSpec, day: dt.date, storage: ArtifactStorage
) -> Iterator[tuple[str, dict[str, object]]]:
    """(source id, record) of the day's snapshot rows that would be sent: readable, with an
    id, their own date on that day and no blank required field. Duplicates of an id are
    left to the caller (they rank the same)."""
    tz = zoneinfo.ZoneInfo(spec.partitions.timezone)
    source = spec.source
    for line in storage.open_lines(steps.current_snapshot_uri(spec, day, storage)):
        record = SourceRow.from_json(line).record
        if record is None:
            continue
        source_id = as_text(record.get(source.id_field))
        if not source_id.strip() or "\x00" in source_id:
            continue
        if parse_date(record.get(source.date_field), tz) != day:
            continue
        if any(not as_text(record.get(f)).strip() for f in source.non_blank_fields):
            continue
        yield source_id, record


def draw_sample(
    spec: PipelineSpec, days: list[dt.date], storage: ArtifactStorage, *, size: int, seed: int
) -> Sample:
    """Pick `size` items across the days' current input snapshots, the same ones for the same
    seed: every item ranks by a hash of (seed, day, source id), and the lowest ranks are
    taken, so a larger sample holds every item of a smaller one. A day without a snapshot is
    an error (MissingPrerequisite): the eval replays what the pipeline read, so the day's
    input_snapshot is materialized first."""
    if size < 1:
        raise ValueError(f"the sample size must be at least 1, not {size}")
    days = sorted(set(days))
    missing = [d for d in days if not _has_snapshot(spec, d, storage)]
    if missing:
        raise steps.MissingPrerequisite(
            f"no input snapshot for {spec.name} on {', '.join(map(str, missing))}; an eval "
            "replays the days' snapshots: materialize input_snapshot for those days first"
        )
    # A bounded heap of the lowest ranks; the rank is negated to make heapq's min-heap a max-heap.
    kept: list[tuple[int, str, str, bytes]] = []
    chosen: set[tuple[str, str]] = set()
    for day in days:
        for source_id, record in _sampleable(spec, day, storage):
            rank = _rank(seed, day, source_id)
            if (day.isoformat(), source_id) in chosen:
                continue  # a duplicate id: its first row is the one the pipeline sends
            entry = (-rank, day.isoformat(), source_id, orjson.dumps(record))
            if len(kept) < size:
                heapq.heappush(kept, entry)
            elif -kept[0][0] > rank:
                _, old_day, old_id, _ = heapq.heapreplace(kept, entry)
                chosen.discard((old_day, old_id))
            else:
                continue
            chosen.add((day.isoformat(), source_id))
    rows = sorted(kept, key=lambda e: (e[1], -e[0]))
    eval_id = eval_id_of(spec.name, days, size, seed)
    key = artifact_key("eval", spec.name, eval_id, "sample.jsonl")
    uri = storage.write_bytes(key, b"".join(line + b"\n" for *_, line in rows)).uri
    source_ids: dict[dt.date, list[str]] = {day: [] for day in days}
    for _, day_text, source_id, _ in rows:
        source_ids[dt.date.fromisoformat(day_text)].append(source_id)
    return Sample(
        eval_id=eval_id,
        pipeline=spec.name,
        days=days,
        size=size,
        seed=seed,
        uri=uri,
        source_ids=source_ids,
    )


def _has_snapshot(spec: PipelineSpec, day: dt.date, storage: ArtifactStorage) -> bool:
    try:
        steps.current_snapshot_uri(spec, day, storage)
    except steps.MissingPrerequisite:
        return False
    return True
