"""Imports of results: normalized or staged result rows applied over items by custom_id, in
chunks, never over a terminal row.

Within an upsert a success beats a failure and the first line wins among equals, so
duplicated output lines change nothing; across chunks and re-imports the WHERE clause of the
update protects rows that are already terminal.
"""

import dataclasses
import datetime as dt
import functools
from collections.abc import Iterable
from typing import Any

from sqlalchemy.engine import Engine

from llm_assets.resources.ledger import limits
from llm_assets.resources.ledger.bulk import BackgroundWriter, Bulk
from llm_assets.resources.ledger.locks import check_fences
from llm_assets.resources.ledger.records import UpsertStats, utcnow
from llm_assets.resources.ledger.tables import result_table
from llm_assets.results.rows import (
    RESULT_COLUMNS,
    SUBMITTED,
    SUCCEEDED,
    TERMINAL,
    ResultStager,
    StagedResults,
)
from llm_assets.util.parallel import chunked

RESULT_DEFAULTS = {
    "input_tokens": 0,
    "cached_input_tokens": 0,
    "cache_write_input_tokens": 0,
    "output_tokens": 0,
    "cost_usd": 0,
}
"""The values of result columns a normalized result may leave out."""


def stage_results(stager: ResultStager, rows: Iterable[dict[str, Any]]) -> Iterable[StagedResults]:
    """Normalized results (dicts of custom_id and RESULT_COLUMNS) as staged chunks."""

    def values(row: dict[str, Any]) -> tuple[Any, ...]:
        given = (row.get(k, RESULT_DEFAULTS.get(k)) for k in RESULT_COLUMNS)
        return (row["custom_id"], *given)

    return (stager(map(values, chunk)) for chunk in chunked(rows, limits.CHUNK))


def upsert_staged(
    engine: Engine,
    job_id: str,
    chunks: Iterable[StagedResults],
    *,
    writer: BackgroundWriter | None = None,
    shard_id: str | None = None,
) -> UpsertStats:
    """Apply staged results by custom_id (see the module).

    The writes run on a writer thread while the next chunk is parsed. Given the caller's
    `writer`, they are only queued on it: the stats are complete once its earlier tasks have
    run, which is when anything queued after them runs.

    `shard_id`: the results are those of one shard's provider batch, so they are matched to
    its items first (see apply_staged); any custom_id of the job is still applied.
    """
    stats = UpsertStats()
    if writer is not None:
        _Picker(engine, job_id, stats, writer, shard_id).take_all(chunks)
        return stats
    with BackgroundWriter() as own:
        _Picker(engine, job_id, stats, own, shard_id).take_all(chunks)
    return stats


@dataclasses.dataclass
class _Picker:
    """Picks the rows one upsert writes from its staged chunks and queues them on the writer
    in chunks of BULK_CHUNK rows; a success that arrives after a failure of the same item
    was queued is queued again as an override."""

    engine: Engine
    job_id: str
    stats: UpsertStats
    writer: BackgroundWriter
    shard_id: str | None
    now: dt.datetime = dataclasses.field(default_factory=utcnow)
    written: dict[str, str] = dataclasses.field(default_factory=dict)
    """The status each custom_id was given by this upsert (queued, not necessarily written)."""
    rows: list[Any] = dataclasses.field(default_factory=list)
    statuses: list[str] = dataclasses.field(default_factory=list)
    at: dict[str, int] = dataclasses.field(default_factory=dict)
    overrides: list[Any] = dataclasses.field(default_factory=list)

    def take_all(self, chunks: Iterable[StagedResults]) -> None:
        for chunk in chunks:
            self.stats.received += len(chunk.custom_ids)
            if self._is_fresh(chunk.custom_ids):
                self._take_whole(chunk)
            else:
                self._take_lines(chunk)
            if len(self.rows) >= limits.BULK_CHUNK:
                self._flush()
        self._flush()

    def _is_fresh(self, ids: list[str]) -> bool:
        """No custom_id seen before or twice here (almost every chunk)."""
        return (
            self.written.keys().isdisjoint(ids)
            and self.at.keys().isdisjoint(ids)
            and len(set(ids)) == len(ids)
        )

    def _take_whole(self, chunk: StagedResults) -> None:
        ids = chunk.custom_ids
        first = len(self.rows)
        self.at.update(zip(ids, range(first, first + len(ids)), strict=True))
        self.rows.extend(chunk.rows)
        self.statuses.extend(chunk.statuses)

    def _take_lines(self, chunk: StagedResults) -> None:
        for cid, status, row in zip(*chunk, strict=True):
            earlier = self.written.get(cid)
            if earlier is not None:
                # A duplicate of a line queued earlier in this upsert: a success still
                # replaces the failure written then, nothing else changes.
                self.stats.note_duplicate(cid)
                if status == SUCCEEDED and earlier != SUCCEEDED:
                    self.overrides.append(row)
                    self.written[cid] = SUCCEEDED
                continue
            index = self.at.get(cid)
            if index is None:
                self.at[cid] = len(self.rows)
                self.rows.append(row)
                self.statuses.append(status)
                continue
            self.stats.note_duplicate(cid)
            if status == SUCCEEDED and self.statuses[index] != SUCCEEDED:
                self.rows[index] = row
                self.statuses[index] = status

    def _flush(self) -> None:
        if self.overrides:
            self.writer.submit(functools.partial(self._apply, self.overrides, None, None))
        if self.rows:
            # Counted as written when queued: a later duplicate's override is guarded by the
            # time it expects, so it changes nothing where this chunk was not applied.
            self.written.update(zip(self.at, self.statuses, strict=True))
            self.writer.submit(functools.partial(self._apply, self.rows, self.stats, self.shard_id))
        self.rows, self.statuses, self.at, self.overrides = [], [], {}, []

    def _apply(self, rows: list[Any], stats: UpsertStats | None, shard_id: str | None) -> None:
        """Apply staged rows (stats given) or the overrides of a failure (stats None)."""
        with self.engine.begin() as conn:
            check_fences(conn)
            applied = apply_staged(
                Bulk(conn), self.job_id, rows, self.now, override=stats is None, shard_id=shard_id
            )
        if stats is not None:
            stats.applied += applied.count
            stats.unknown += applied.unknown
            stats.already_terminal += len(rows) - applied.count - applied.unknown


@dataclasses.dataclass
class Applied:
    """How many rows of a chunk of results were applied, and how many were not in the ledger."""

    count: int = 0
    unknown: int = 0


def apply_staged(
    bulk: Bulk,
    job_id: str,
    rows: list[Any],
    now: Any,
    *,
    override: bool = False,
    shard_id: str | None = None,
) -> Applied:
    """Write staged result rows over items that are not terminal yet, set-based.

    With `override`, the rows are successes that replace a failure this same upsert wrote (at
    `now`): the only writes over a terminal row, and never over one terminal before it.

    `shard_id`: the rows are that shard's results, so almost all of them are its items. On
    PostgreSQL those are matched by reading the shard's rows (by its index, in file order)
    into a hash table, instead of one descent of the unique index per row; what the shard
    does not hold (items moved to another shard since) is then matched by the unique index.
    """
    if bulk.postgres:
        return _apply_postgres(bulk, job_id, rows, now, override, shard_id)
    if override:
        return _override_sqlite(bulk, job_id, rows, now)
    return _apply_sqlite(bulk, job_id, rows, now, shard_id)


def _guard(override: bool, r: str, now: str, shard: str | None = None) -> str:
    """Which rows may be written: `r` is the table's alias, `now` the time's parameter and
    `shard` the parameter of the shard whose results these are (None: any shard).

    A success is taken by any item that is not terminal yet. A failure changes an item only
    while it is `submitted` in that same shard: a late or repeated failure never takes back
    an item already planned into a retry shard or sent again."""
    if override:
        return f"{r}status <> '{SUCCEEDED}' AND {r}updated_at = {now}"
    terminal = ", ".join(f"'{s}'" for s in TERMINAL)
    sent_here = f"{r}status = '{SUBMITTED}'"
    if shard is not None:
        sent_here += f" AND {r}shard_id = {shard}"
    return f"{r}status NOT IN ({terminal}) AND (s.status = '{SUCCEEDED}' OR ({sent_here}))"


_SETS = ", ".join(f"{k} = s.{k}" for k in RESULT_COLUMNS)
_TABLE = result_table.name


def _apply_postgres(
    bulk: Bulk, job_id: str, rows: list[Any], now: Any, override: bool, shard_id: str | None
) -> Applied:
    bulk.stage(result_table, ["custom_id", *RESULT_COLUMNS], (), binary=rows)
    params = {"now": now, "job": job_id, "shard": shard_id}
    update = (
        f"UPDATE {_TABLE} AS r SET {_SETS}, updated_at = %(now)s FROM {bulk.STAGE} AS s "
        f"WHERE r.job_id = %(job)s AND r.custom_id = s.custom_id "
        f"AND {_guard(override, 'r.', '%(now)s', '%(shard)s' if shard_id else None)}"
    )
    applied = Applied()
    left = len(rows)
    if shard_id is not None and not override and left >= limits.HASH_JOIN_ROWS:
        left = _apply_in_shard(bulk, update, params, applied, left)
        if not left:
            return applied
    bulk.join_by_index()
    bulk.execute(update, params)
    written = int(bulk.cursor.rowcount)
    applied.count += written
    if written < left and not override:
        # Some rows were not applied: already terminal, or not in the ledger at all.
        bulk.execute(
            f"SELECT count(*) FROM {bulk.STAGE} AS s WHERE NOT EXISTS (SELECT 1 FROM "
            f"{_TABLE} AS r WHERE r.job_id = %(job)s AND r.custom_id = s.custom_id)",
            params,
        )
        applied.unknown = bulk.fetch_count()
    return applied


def _apply_in_shard(
    bulk: Bulk, update: str, params: dict[str, Any], applied: Applied, left: int
) -> int:
    """PostgreSQL: apply the staged rows that are items of the shard by a hash join with its
    rows; returns how many staged rows are left to match by the unique index (0: none)."""
    bulk.join_by_hash()
    bulk.execute(f"{update} AND r.shard_id = %(shard)s", params)
    applied.count = int(bulk.cursor.rowcount)
    if applied.count == left:
        return 0
    # The shard's items are done with (written, or terminal already). When they are the whole
    # chunk (a re-import), counting them is enough; otherwise they are taken out and the rest
    # of the chunk is matched by the unique index.
    in_shard = "r.job_id = %(job)s AND r.shard_id = %(shard)s AND r.custom_id = s.custom_id"
    bulk.execute(f"SELECT count(*) FROM {bulk.STAGE} AS s, {_TABLE} AS r WHERE {in_shard}", params)
    if bulk.fetch_count() == left:
        return 0
    bulk.execute(f"DELETE FROM {bulk.STAGE} AS s USING {_TABLE} AS r WHERE {in_shard}", params)
    return left - int(bulk.cursor.rowcount)


def _override_sqlite(bulk: Bulk, job_id: str, rows: list[Any], now: Any) -> Applied:
    """SQLite: the few overrides row by row, each guarded by the time it expects."""
    sets = ", ".join(f"{k} = ?" for k in RESULT_COLUMNS)
    update = (
        f"UPDATE {_TABLE} SET {sets}, updated_at = ? WHERE job_id = ? AND custom_id = ? "
        f"AND {_guard(True, '', '?')}"
    )
    stamp = bulk.value(now)
    params = [row[1:] + (stamp, job_id, row[0], stamp) for row in rows]
    return Applied(count=bulk.executemany(update, params, encoded=True))


def _apply_sqlite(
    bulk: Bulk, job_id: str, rows: list[Any], now: Any, shard_id: str | None
) -> Applied:
    """SQLite: the chunk into a temporary table, applied by one statement (SQLite works
    without the GIL for all of it, not between per-row binds of an executemany)."""
    columns = ["custom_id", *RESULT_COLUMNS]
    stage = "temp.llm_stage"
    bulk.execute(f"DROP TABLE IF EXISTS {stage}")
    bulk.execute(f"CREATE TABLE {stage} ({', '.join(columns)})")
    marks = ", ".join("?" for _ in columns)
    # Result values are strings and numbers; the one datetime is encoded below.
    bulk.executemany(f"INSERT INTO {stage} VALUES ({marks})", rows, encoded=True)
    bulk.execute(
        f"UPDATE {_TABLE} AS r SET {_SETS}, updated_at = ? FROM {stage} AS s "
        f"WHERE r.job_id = ? AND r.custom_id = s.custom_id "
        f"AND {_guard(False, 'r.', '?', '?' if shard_id else None)}",
        (bulk.value(now), job_id, *([shard_id] if shard_id else [])),
    )
    applied = Applied(count=max(bulk.cursor.rowcount, 0))
    if applied.count < len(rows):
        bulk.execute(
            f"SELECT count(*) FROM {stage} AS s WHERE NOT EXISTS (SELECT 1 FROM "
            f"{_TABLE} AS r WHERE r.job_id = ? AND r.custom_id = s.custom_id)",
            (job_id,),
        )
        applied.unknown = bulk.fetch_count()
    bulk.execute(f"DROP TABLE {stage}")
    return applied
