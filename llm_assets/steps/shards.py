"""Snapshot rows into request shards with a cost estimate, bad input into dead letters (what
request_shards builds, build.py, whole or in slices); the shard writing and the estimator the
retry and requeue rounds share too."""

import array
import dataclasses
import datetime as dt
import itertools
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from pydantic import BaseModel

from llm_assets.compliance.policy import COMPLIANCE
from llm_assets.items import ids
from llm_assets.items.prepare import Block, KnownIds, PreparedItem, Preparer, prepare_blocks
from llm_assets.items.sharding import split_shards
from llm_assets.resources.ledger import (
    DEAD_LETTER,
    PENDING,
    PRIME_SHARD,
    BackgroundWriter,
    JobRecord,
)
from llm_assets.resources.storage import StagedArtifact, WrittenArtifact
from llm_assets.steps.context import StepContext, artifact_key
from llm_assets.steps.estimate import Estimate, Estimator, ShardEstimate
from llm_assets.steps.priming import priming_items, split_priming
from llm_assets.util.failpoints import failpoint
from llm_assets.util.memory import collector_paused, release_free_memory
from llm_assets.util.parallel import BLOCK_ROWS, numbered_blocks


class ShardsResult(BaseModel):
    job_id: str
    snapshot_rows: int
    new_items: int
    already_known: int
    input_dead_letters: dict[str, int]
    personal_data: dict[str, int] = {}
    """Values found in this run's new prompts, by "entity:action" (e.g. "email:redact")."""
    compliance_dead_letters: int = 0
    shards_created: list[str]
    shard_uris: list[str]
    estimate: Estimate


def shards_for(
    ctx: StepContext, lines: Iterable[tuple[str, bytes]]
) -> Iterator[list[tuple[str, bytes]]]:
    """Request lines grouped into shards under the spec's caps and the provider's minimum."""
    spec = ctx.spec
    return split_shards(
        lines,
        max_requests=spec.sharding.max_requests_per_shard,
        max_bytes=spec.sharding.max_bytes_per_shard,
        min_requests=ctx.batch_provider.min_records_per_shard(spec),
    )


def line_offsets(lines: Sequence[tuple[str, bytes]]) -> list[tuple[str, int]]:
    """(custom_id, byte offset of its line) for the lines of a shard file, in its order, as
    ArtifactStorage.write_lines lays them out (each line and a newline)."""
    offsets = []
    at = 0
    for cid, line in lines:
        offsets.append((cid, at))
        at += len(line) + 1
    return offsets


@dataclasses.dataclass(frozen=True)
class ShardRound:
    """One round of a job's shards (first sends, a retry round, a requeue): where their
    files go, what their ledger rows say, and the thread that records them, if any."""

    ctx: StepContext
    job: JobRecord
    round_no: int
    not_before: dt.datetime | None = None
    writer: BackgroundWriter | None = None
    held_as: str | None = None
    """The raw status its new shards are recorded with: a slice's wait for their join."""

    def shard_id(self, index: int) -> str:
        return ids.shard_id(self.job.job_id, self.round_no, index)

    def write_file(
        self, index: int, lines: Sequence[tuple[str, bytes]], *, name: str = ""
    ) -> WrittenArtifact:
        """The shard's request lines, in order, at the shard's key (or, given a `name`, at
        that name beside it)."""
        return self.stage_file(index, lines, name=name).publish()

    def stage_file(
        self, index: int, lines: Sequence[tuple[str, bytes]], *, name: str = ""
    ) -> StagedArtifact:
        """`write_file` written and hashed, to be published (ArtifactStorage.stage_lines)."""
        key = artifact_key(
            "shards",
            self.ctx.spec.name,
            self.job.partition_date.isoformat(),
            self.job.job_id,
            f"{name or self.shard_id(index)}.jsonl",
        )
        return self.ctx.storage.stage_lines(key, (line for _, line in lines))

    def shard_row(
        self,
        index: int,
        written: WrittenArtifact,
        item_count: int,
        estimate: ShardEstimate,
        kind: str | None = None,
    ) -> dict[str, Any]:
        """The ledger row of the shard written at `index` (of `kind`: the round's own when
        None)."""
        return {
            "shard_id": self.shard_id(index),
            "job_id": self.job.job_id,
            "round": self.round_no,
            "shard_index": index,
            "input_uri": written.uri,
            "item_count": item_count,
            "size_bytes": written.size_bytes,
            "content_sha256": written.sha256,
            "provider": self.ctx.spec.model.provider,
            "not_before": self.not_before,
            **({"raw_status": self.held_as} if self.held_as else {}),
            **({"kind": kind} if kind else {}),
            **estimate.model_dump(),
        }


def write_shard(
    round_: ShardRound,
    index: int,
    lines: list[tuple[str, bytes]],
    items: list[dict[str, Any]] | None,
    estimate: ShardEstimate,
    pseudonyms: dict[str, dict[str, str]] | None = None,
    *,
    stale_pseudonyms: bool = False,
    kind: str | None = None,
) -> str:
    """Write a shard's file, then record it: with its new `items` and their `pseudonyms`,
    or (None) taking over the items of `lines` from their earlier shards, whose lines and
    so mappings they keep. The file is written here and, on the round's writer thread when
    it has one, made durable and published before the ledger names it: the wait for the
    disk (fsync, a few tenths of a second a shard) is the thread's, not the step's."""
    ledger = round_.ctx.ledger
    staged = round_.stage_file(index, lines)
    shard = round_.shard_row(index, staged.written, len(lines), estimate, kind)

    def record() -> None:
        staged.publish()
        failpoint("retry.after_file" if items is None else "shards.after_file")
        if items is not None:
            ledger.add_shard_with_items(shard, items, pseudonyms, stale_pseudonyms=stale_pseudonyms)
        else:
            ledger.reassign_items_to_shard(round_.job.job_id, shard, line_offsets(lines))
        failpoint("shards.after_record")

    try:
        if round_.writer is None:
            record()
        else:
            round_.writer.submit(record, skipped=staged.discard)
    except BaseException:
        staged.discard()  # nothing once published
        raise
    return staged.written.uri


@dataclasses.dataclass
class _Intake:
    """Snapshot rows on their way into shards: rows the ledger knows are counted and skipped,
    bad input becomes dead letters, the rest become request lines of new items.

    A row with a source id is known by it (whatever custom_id the ledger gave it: a new id
    key derives other ids), a row never sent (no id, a repeated id) by its custom_id."""

    ctx: StepContext
    job: JobRecord
    known_sources: set[str]
    known_unsent: frozenset[str]
    snapshot_rows: int = 0
    already: int = 0
    dead_letters: dict[str, int] = dataclasses.field(default_factory=lambda: defaultdict(int))
    dead_rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    fresh: dict[str, PreparedItem] = dataclasses.field(default_factory=dict)
    personal_data: dict[str, int] = dataclasses.field(default_factory=lambda: defaultdict(int))
    blocked: int = 0

    def dead(self, item: PreparedItem, code: str, message: str) -> None:
        if item.error_class == COMPLIANCE:
            self.blocked += 1
        else:
            self.dead_letters[code] += 1
        self.dead_rows.append(
            {
                "job_id": self.job.job_id,
                "custom_id": item.custom_id,
                "source_id": item.source_id,
                "status": DEAD_LETTER,
                "error_class": item.error_class,
                "error_code": code,
                "error_message": message,
                "model_name": self.ctx.spec.model.name,
            }
        )

    def is_known(self, item: PreparedItem) -> bool:
        if item.source_id is None or item.error_code == ids.DUPLICATE_ID:
            return item.custom_id in self.known_unsent
        return item.source_id in self.known_sources

    def requests(self, items: Iterable[PreparedItem]) -> Iterator[tuple[str, bytes]]:
        """(custom_id, request line) of the items to send; the items are kept until their
        shard takes them (`pending_rows`)."""
        limit = self.ctx.spec.sharding.max_bytes_per_shard
        for item in items:
            self.snapshot_rows += 1
            if self.is_known(item):
                self.already += 1
                continue
            for found, count in item.found or ():
                self.personal_data[found] += count
            encoded = item.line
            if encoded is None:
                self.dead(item, item.error_code or "input", item.error_message or "")
                continue
            if len(encoded) + 1 > limit:
                self.dead(
                    item,
                    "request_too_large",
                    f"the request is {len(encoded)} bytes; a shard takes at most {limit} "
                    "(sharding.max_bytes_per_shard)",
                )
                continue
            self.fresh[item.custom_id] = item
            yield item.custom_id, encoded

    def pending_rows(
        self, shard_id: str, lines: Sequence[tuple[str, bytes]]
    ) -> tuple[list[dict[str, Any]], dict[str, dict[str, str]]]:
        """The ledger rows of a new shard's items, each with where its line starts, and the
        pseudonyms of those that have some."""
        rows = []
        pseudonyms = {}
        for cid, offset in line_offsets(lines):
            item = self.fresh.pop(cid)
            if item.pseudonyms:
                pseudonyms[cid] = dict(item.pseudonyms)
            rows.append(
                {
                    "job_id": self.job.job_id,
                    "custom_id": cid,
                    "source_id": item.source_id,
                    "shard_id": shard_id,
                    "status": PENDING,
                    "model_name": self.ctx.spec.model.name,
                    "estimated_input_tokens": item.input_tokens,
                    "request_offset": offset,
                }
            )
        return rows, pseudonyms


@dataclasses.dataclass(frozen=True)
class BuildPart:
    """What of the snapshot a build takes: all of it, or one slice's rows (steps/build.py),
    whose shards get the indexes `number`, `number + count`, ... and wait for the join."""

    number: int = 0
    count: int = 1
    keys: Sequence[int] | None = None
    """Each row's slice key (snapshot.slice_keys): the slice takes the rows whose key is
    `number` modulo `count`. None: every row."""
    held_as: str | None = None
    """The raw status its shards are recorded with (None: ready to submit)."""
    round_no: int | None = None
    """The round of its shards (None: the job's next)."""
    first_k: int = 0
    """Shards of this slice in the round already (a slice built again after a crash)."""
    beside_shards: Sequence[str] = ()
    """The other slices' shards held for the join: their items are not this part's rows, and
    are not read to know which of its rows the ledger holds."""
    workers: int | None = None
    """Worker processes that render and count its rows (None: llm_assets.util.parallel's
    default)."""

    def shard_index(self, k: int) -> int:
        return self.number + (self.first_k + k) * self.count

    def blocks(self, ctx: StepContext, snapshot_uri: str) -> Iterator[Block]:
        """The snapshot's lines this part takes, in blocks with their positions."""
        if self.keys is None:
            return numbered_blocks(ctx.storage.open_lines(snapshot_uri))
        chunks = ctx.storage.open_line_blocks(snapshot_uri)
        return slice_blocks(chunks, self.keys, self.count, self.number)


def slice_blocks(
    chunks: Iterable[bytes], keys: Sequence[int], count: int, number: int
) -> Iterator[Block]:
    """The lines whose slice key is `number` modulo `count`, in blocks with their positions,
    from a file's chunks of whole lines (ArtifactStorage.open_line_blocks). Only those lines
    are cut out of a chunk, where numpy finds its newlines: a slice reads the whole
    snapshot, and splitting all of its lines cost each slice of a 10M-row day more than
    twice as much (7.5 s against 2.9)."""
    import numpy as np

    mine = np.asarray(keys) % count == number
    at = 0
    positions: array.array[int] = array.array("I")
    lines: list[bytes] = []
    for chunk in chunks:
        if not chunk:
            continue
        ends = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == ord("\n"))
        if not chunk.endswith(b"\n"):  # the file's last line, without its newline
            ends = np.append(ends, len(chunk))
        if at + len(ends) > len(mine):
            raise ValueError(
                f"the snapshot has more rows than its slice keys ({len(mine)}); take it again"
            )
        chosen = np.flatnonzero(mine[at : at + len(ends)])
        starts = np.concatenate(([0], ends[:-1] + 1))[chosen].tolist()
        lines.extend(map(chunk.__getitem__, map(slice, starts, ends[chosen].tolist())))
        positions.extend((chosen + at).tolist())
        at += len(ends)
        while len(lines) >= BLOCK_ROWS:
            yield positions[:BLOCK_ROWS], lines[:BLOCK_ROWS]
            del positions[:BLOCK_ROWS], lines[:BLOCK_ROWS]
    if lines:
        yield positions, lines


def build_rows(
    ctx: StepContext, job: JobRecord, snapshot_uri: str, part: BuildPart
) -> tuple[ShardsResult, dict[str, int]]:
    """The shards and input dead letters of the snapshot's rows (`part` of them) the ledger
    has not seen, recorded; with the personal data found in their new prompts."""
    spec, ledger = ctx.spec, ctx.ledger
    estimator = Estimator(ctx)
    estimate = estimator.empty()
    # What the ledger holds of the day, read once (not per chunk or item): the rows it knows
    # are skipped, so only new items get ids derived with the current key.
    sources, unsent = ledger.known_items(job.job_id, beside_shards=part.beside_shards)
    intake = _Intake(ctx, job, sources, frozenset(unsent))
    preparer = Preparer(
        spec,
        ctx.day,
        ctx.price().context_window,
        ctx.batch_provider.line_encoder(spec),
        ledger.item_id_key(),
        KnownIds(unsent=intake.known_unsent),
    )
    prepared = prepare_blocks(preparer, part.blocks(ctx, snapshot_uri), part.workers)
    requests = intake.requests(prepared)
    round_no = ledger.next_round(job.job_id) if part.round_no is None else part.round_no
    # Mappings of items never recorded can only be left by versions that wrote them apart
    # from their items; only a job with some has them dropped as its new items are recorded.
    stale = ledger.has_pseudonyms(job.job_id)
    created: list[str] = []
    uris: list[str] = []
    # The database records shard k while shard k+1 is rendered, counted and written.
    with collector_paused(), BackgroundWriter(depth=1) as writer:
        round_ = ShardRound(ctx, job, round_no, writer=writer, held_as=part.held_as)
        primed, requests = split_priming(
            requests, priming_items(spec, round_no, part.shard_index(0))
        )
        for k, shard_lines in enumerate(
            itertools.chain(shards_for(ctx, primed), shards_for(ctx, requests))
        ):
            index = part.shard_index(k)
            shard_id = round_.shard_id(index)
            items, pseudonyms = intake.pending_rows(shard_id, shard_lines)
            shard_estimate = estimator.shard(
                sum(i["estimated_input_tokens"] for i in items), len(items)
            )
            estimate.add(shard_estimate, len(items))
            uris.append(
                write_shard(
                    round_,
                    index,
                    shard_lines,
                    items,
                    shard_estimate,
                    pseudonyms,
                    stale_pseudonyms=stale,
                    kind=PRIME_SHARD if primed and k == 0 else None,
                )
            )
            created.append(shard_id)
            release_free_memory()
    ledger.add_items(intake.dead_rows)
    result = ShardsResult(
        job_id=job.job_id,
        snapshot_rows=intake.snapshot_rows,
        new_items=estimate.requests + sum(intake.dead_letters.values()) + intake.blocked,
        already_known=intake.already,
        input_dead_letters=dict(intake.dead_letters),
        personal_data=dict(sorted(intake.personal_data.items())),
        compliance_dead_letters=intake.blocked,
        shards_created=created,
        shard_uris=uris,
        estimate=estimate,
    )
    return result, dict(intake.personal_data)
