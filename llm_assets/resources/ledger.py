"""The SQL ledger: the source of truth for jobs, shards and every item's state.

SQLAlchemy Core on SQLite (default) or PostgreSQL. Every write is either an insert that
ignores what already exists or an upsert keyed by `(job_id, custom_id)` that never touches a
terminal row, so re-running any step adds nothing twice and loses nothing.
"""

import contextlib
import dataclasses
import datetime as dt
import fcntl
import functools
import hashlib
import io
import os
import pickle
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any

import dagster as dg
import sqlalchemy as sa
from pydantic import AfterValidator, BaseModel, ConfigDict, PrivateAttr
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from llm_assets.parallel import chunked
from llm_assets.result_rows import (
    COPY_BINARY_HEADER,
    COPY_BINARY_TRAILER,
    DEAD_LETTER,
    PENDING,
    RESULT_COLUMNS,
    RETRY,
    SUBMITTED,
    SUCCEEDED,
    TERMINAL,
    ResultStager,
    StagedResults,
    copy_line,
    copy_text,
)

SCHEMA_VERSION = 5
CHUNK = 5_000
BULK_CHUNK = 50_000
"""Rows per COPY / executemany: large enough that per-statement costs vanish."""
COPY_BUFFER = 1 << 22
"""Bytes handed to a COPY per read of its buffer. psycopg2 reads 8 KB at a time by default,
taking the GIL for each read: behind a busy main thread, that kept the writer waiting."""
TEMP_BUFFERS = "64MB"
"""PostgreSQL temp_buffers of the ledger's sessions: a staged chunk of results stays in memory."""
HASH_JOIN_ROWS = 1_000
"""Fewer staged rows of a shard than this are matched by the unique index: reading all of a
large shard's rows would cost more than their descents."""
HASH_WORK_MEM = "64MB"
"""PostgreSQL work_mem of a statement that joins a staged chunk to a shard's rows by a hash
table: the table of one shard's rows (or of the chunk) is built in memory, in one batch."""
UNIQUE_VIOLATION = "23505"
"""PostgreSQL's SQLSTATE for a duplicate key."""
RESULT_FILLFACTOR = 36
"""Percent of each llm_batch_result page filled on insert; the rest is for in-place updates.
An item's row is rewritten twice (submitted, then its result, about twice as wide): at 70 the
first rewrite used the room and 40% of the second moved to other pages, with new entries in
every index; at 40 both stayed in place until version 5 made each row 8 bytes wider (7% of
the results moved); at 36 all of them stay (see docs/decisions.md)."""

_BILLED = {"input_tokens", "cached_input_tokens", "output_tokens", "cost_usd"}
"""The columns of an item's bill."""
_RESULT_DEFAULTS = {"input_tokens": 0, "cached_input_tokens": 0, "output_tokens": 0, "cost_usd": 0}

# Why a shard was made: an item's first send, a retry round, or an operator's requeue. Cost of
# `retry` and `requeue` shards is the retry overhead.
FIRST = "first"
RETRY_SHARD = "retry"
REQUEUE_SHARD = "requeue"

metadata = sa.MetaData()
_BigInt = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_Now = sa.DateTime(timezone=True)

schema_version = sa.Table(
    "llm_schema_version",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("applied_at", _Now, nullable=False),
)

job_table = sa.Table(
    "llm_batch_job",
    metadata,
    sa.Column("job_id", sa.String(128), primary_key=True),
    sa.Column("pipeline", sa.String(128), nullable=False),
    sa.Column("partition_date", sa.Date, nullable=False),
    sa.Column("task_type", sa.String(32), nullable=False),
    sa.Column("provider", sa.String(32), nullable=False),
    sa.Column("model_name", sa.String(128), nullable=False),
    sa.Column("prompt_version", sa.String(64), nullable=False),
    sa.Column("code_version", sa.String(128), nullable=False),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("total_items", sa.Integer, nullable=False, server_default="0"),
    sa.Column("succeeded_items", sa.Integer, nullable=False, server_default="0"),
    sa.Column("failed_items", sa.Integer, nullable=False, server_default="0"),
    sa.Column("expired_items", sa.Integer, nullable=False, server_default="0"),
    sa.Column("input_tokens", _BigInt, nullable=False, server_default="0"),
    sa.Column("output_tokens", _BigInt, nullable=False, server_default="0"),
    sa.Column("cost_usd", sa.Float, nullable=False, server_default="0"),
    sa.Column("estimated_cost_usd", sa.Float, nullable=True),
    sa.Column("snapshot_uri", sa.Text, nullable=True),
    sa.Column("budget_approved_usd", sa.Float, nullable=True),
    sa.Column("budget_approved_by", sa.String(128), nullable=True),
    sa.Column("budget_approved_at", _Now, nullable=True),
    sa.Column("created_by", sa.String(128), nullable=False),
    sa.Column("created_at", _Now, nullable=False),
    sa.Column("updated_at", _Now, nullable=False),
    sa.UniqueConstraint(
        "pipeline", "partition_date", "prompt_version", "provider", "model_name", name="uq_job_key"
    ),
)

shard_table = sa.Table(
    "llm_batch_shard",
    metadata,
    sa.Column("shard_id", sa.String(160), primary_key=True),
    sa.Column("job_id", sa.String(128), sa.ForeignKey("llm_batch_job.job_id"), nullable=False),
    sa.Column("round", sa.Integer, nullable=False),
    sa.Column("shard_index", sa.Integer, nullable=False),
    sa.Column("input_uri", sa.Text, nullable=False),
    sa.Column("item_count", sa.Integer, nullable=False),
    sa.Column("size_bytes", _BigInt, nullable=False),
    sa.Column("content_sha256", sa.String(64), nullable=False),
    sa.Column("provider", sa.String(32), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False, server_default=FIRST),
    sa.Column("provider_batch_id", sa.String(256), nullable=True),
    sa.Column("estimated_input_tokens", _BigInt, nullable=False, server_default="0"),
    sa.Column("estimated_output_tokens", _BigInt, nullable=False, server_default="0"),
    sa.Column("estimated_cost_usd", sa.Float, nullable=False, server_default="0"),
    sa.Column("estimated_cost_upper_usd", sa.Float, nullable=False, server_default="0"),
    sa.Column("price_json", sa.Text, nullable=True),
    sa.Column("actual_input_tokens", _BigInt, nullable=True),
    sa.Column("actual_output_tokens", _BigInt, nullable=True),
    sa.Column("actual_cost_usd", sa.Float, nullable=True),
    sa.Column("output_uri", sa.Text, nullable=True),
    sa.Column("error_uri", sa.Text, nullable=True),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("raw_status", sa.String(64), nullable=True),
    sa.Column("message", sa.Text, nullable=True),
    sa.Column("retry_count", sa.Integer, nullable=False, server_default="0"),
    sa.Column("completed_requests", sa.Integer, nullable=False, server_default="0"),
    sa.Column("failed_requests", sa.Integer, nullable=False, server_default="0"),
    sa.Column("not_before", _Now, nullable=True),
    sa.Column("submit_intent_at", _Now, nullable=True),
    sa.Column("submitted_at", _Now, nullable=True),
    sa.Column("ended_at", _Now, nullable=True),
    sa.Column("imported_at", _Now, nullable=True),
    sa.Column("created_at", _Now, nullable=False),
    sa.Column("updated_at", _Now, nullable=False),
    sa.Index("ix_shard_job_status", "job_id", "status"),
)

result_table = sa.Table(
    "llm_batch_result",
    metadata,
    sa.Column("id", _BigInt, primary_key=True, autoincrement=True),
    # No foreign key to llm_batch_job: PostgreSQL checks one per inserted row (about 10 µs,
    # 10 s for a million items); the job row is always made first (get_or_create_job).
    sa.Column("job_id", sa.String(128), nullable=False),
    sa.Column("custom_id", sa.String(64), nullable=False),
    sa.Column("source_id", sa.Text, nullable=True),
    sa.Column("shard_id", sa.String(160), nullable=True),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("error_class", sa.String(32), nullable=True),
    sa.Column("error_code", sa.String(128), nullable=True),
    sa.Column("error_message", sa.Text, nullable=True),
    sa.Column("model_name", sa.String(128), nullable=True),
    sa.Column("estimated_input_tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Column("input_tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Column("cached_input_tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Column("output_tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Column("cost_usd", sa.Float, nullable=False, server_default="0"),
    sa.Column("prior_cost_usd", sa.Float, nullable=False, server_default="0"),
    sa.Column("finish_reason", sa.String(64), nullable=True),
    sa.Column("result_json", sa.Text, nullable=True),
    # Where the item's request line starts in its shard's input file, in bytes: a retry round
    # reads the lines it sends again there (null in rows of ledgers before version 5).
    sa.Column("request_offset", _BigInt, nullable=True),
    sa.Column("created_at", _Now, nullable=False),
    sa.Column("updated_at", _Now, nullable=False),
    sa.UniqueConstraint("job_id", "custom_id", name="uq_result_job_custom_id"),
    sa.Index("ix_result_shard", "shard_id"),
    # No index on status: an import changes every row's status, and with no indexed column
    # changing (and room left in each page) PostgreSQL updates rows in place (HOT), without
    # touching any index. Queries by job and status read the job's rows by the unique index.
)
sa.event.listen(
    result_table,
    "after_create",
    sa.DDL(f"ALTER TABLE llm_batch_result SET (fillfactor = {RESULT_FILLFACTOR})").execute_if(
        dialect="postgresql"
    ),
)


output_table = sa.Table(
    "llm_batch_output",
    metadata,
    sa.Column("id", _BigInt, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(128), nullable=False),  # no foreign key: see result_table
    sa.Column("custom_id", sa.String(64), nullable=False),
    sa.Column("source_id", sa.Text, nullable=True),
    sa.Column("prompt_version", sa.String(64), nullable=False),
    sa.Column("model_name", sa.String(128), nullable=False),
    sa.Column("output_json", sa.Text, nullable=False),
    sa.Column("created_at", _Now, nullable=False),
    sa.UniqueConstraint("job_id", "custom_id", name="uq_output_job_custom_id"),
)


reservation_table = sa.Table(
    "llm_budget_reservation",
    metadata,
    sa.Column("shard_id", sa.String(160), primary_key=True),
    sa.Column("pipeline", sa.String(128), nullable=False),
    sa.Column("job_id", sa.String(128), nullable=False),
    sa.Column("spend_date", sa.Date, nullable=False),
    sa.Column("reserved_usd", sa.Float, nullable=False),
    sa.Column("actual_usd", sa.Float, nullable=True),
    sa.Column("created_at", _Now, nullable=False),
    sa.Column("settled_at", _Now, nullable=True),
    sa.Index("ix_reservation_pipeline_date", "pipeline", "spend_date"),
)

budget_lock_table = sa.Table(
    "llm_budget_lock",
    metadata,
    sa.Column("pipeline", sa.String(128), primary_key=True),
    sa.Column("touched_at", _Now, nullable=False),
)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def as_utc(moment: dt.datetime) -> dt.datetime:
    """SQLite hands timestamps back without a zone; the ledger always writes UTC."""
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


UtcDatetime = Annotated[dt.datetime, AfterValidator(as_utc)]


class JobRecord(BaseModel):
    model_config = ConfigDict(frozen=True, from_attributes=True)

    job_id: str
    pipeline: str
    partition_date: dt.date
    task_type: str
    provider: str
    model_name: str
    prompt_version: str
    code_version: str
    status: str
    total_items: int
    succeeded_items: int
    failed_items: int
    expired_items: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    estimated_cost_usd: float | None
    snapshot_uri: str | None
    budget_approved_usd: float | None = None
    budget_approved_by: str | None = None
    budget_approved_at: UtcDatetime | None = None
    created_by: str
    created_at: UtcDatetime
    updated_at: UtcDatetime


class ShardRecord(BaseModel):
    model_config = ConfigDict(frozen=True, from_attributes=True)

    shard_id: str
    job_id: str
    round: int
    shard_index: int
    input_uri: str
    item_count: int
    size_bytes: int
    content_sha256: str
    provider: str
    kind: str = FIRST
    provider_batch_id: str | None
    estimated_input_tokens: int = 0
    estimated_output_tokens: int = 0
    estimated_cost_usd: float = 0.0
    estimated_cost_upper_usd: float = 0.0
    price_json: str | None = None
    actual_input_tokens: int | None = None
    actual_output_tokens: int | None = None
    actual_cost_usd: float | None = None
    output_uri: str | None
    error_uri: str | None
    status: str
    raw_status: str | None
    message: str | None
    retry_count: int
    completed_requests: int
    failed_requests: int
    not_before: UtcDatetime | None
    submit_intent_at: UtcDatetime | None
    submitted_at: UtcDatetime | None
    ended_at: UtcDatetime | None
    imported_at: UtcDatetime | None


class JobCounts(BaseModel):
    """Item counts of one job, by status and by error class."""

    total: int = 0
    by_status: dict[str, int] = {}
    dead_letters_by_class: dict[str, int] = {}
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    @property
    def succeeded(self) -> int:
        return self.by_status.get(SUCCEEDED, 0)

    @property
    def dead_letters(self) -> int:
        return self.by_status.get(DEAD_LETTER, 0)

    @property
    def terminal(self) -> int:
        return self.succeeded + self.dead_letters

    @property
    def open(self) -> int:
        return self.total - self.terminal


class UpsertStats(BaseModel):
    received: int = 0
    applied: int = 0
    duplicates: int = 0
    unknown: int = 0
    already_terminal: int = 0
    duplicate_ids: list[str] = []
    """Up to 100 custom_ids seen more than once in the import, for the duplicates check."""

    def note_duplicate(self, custom_id: str) -> None:
        self.duplicates += 1
        if len(self.duplicate_ids) < 100 and custom_id not in self.duplicate_ids:
            self.duplicate_ids.append(custom_id)


_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _postgres_session(dbapi_connection: Any, _record: Any) -> None:
    """Room for an import's staging table (a chunk of results) in the session's temporary
    buffers: with the default 8 MB it was written out by COPY and read back by the UPDATE,
    for every chunk. Taken only as used; settable only before a session's first temporary
    table, so it is set when the connection opens."""
    cursor = dbapi_connection.cursor()
    cursor.execute(f"SET temp_buffers = '{TEMP_BUFFERS}'")
    # The ledger's statements read by index, or whole days set-based; JIT compiled the counts
    # of a million items for 70 ms of their 400 and made them no faster.
    cursor.execute("SET jit = off")
    cursor.close()
    dbapi_connection.commit()
    # COPY data is sent as UTF-8 bytes, made in worker processes that do not know the session.
    dbapi_connection.set_client_encoding("UTF8")


SQLITE_MIN = (3, 33, 0)
"""The oldest SQLite the ledger runs on: an import applies results with UPDATE ... FROM."""


def _check_sqlite_version() -> None:
    import sqlite3

    if sqlite3.sqlite_version_info < SQLITE_MIN:
        raise RuntimeError(
            f"the SQLite ledger needs SQLite {'.'.join(map(str, SQLITE_MIN))} or newer "
            f"(UPDATE ... FROM); this Python's sqlite3 module has {sqlite3.sqlite_version}. "
            "Use a Python built with a newer SQLite, or a PostgreSQL ledger."
        )


def get_engine(url: str) -> Engine:
    """One engine per URL per process, with SQLite set up for concurrent runs."""
    with _engines_lock:
        engine = _engines.get(url)
        if engine is None:
            if url.startswith("sqlite"):
                _check_sqlite_version()
                path = sa.engine.make_url(url).database
                if path and path != ":memory:":
                    import pathlib

                    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
                engine = sa.create_engine(url, connect_args={"timeout": 30})
                sa.event.listen(engine, "connect", _sqlite_pragmas)
            else:
                engine = sa.create_engine(url, pool_pre_ping=True)
                sa.event.listen(engine, "connect", _postgres_session)
            _engines[url] = engine
        return engine


@functools.cache
def _schema_ready(url: str) -> bool:
    engine = get_engine(url)
    for attempt in range(3):
        try:
            metadata.create_all(engine, checkfirst=True)
            break
        except sa.exc.DBAPIError:
            # Two processes racing to create the same table: the loser retries and finds it.
            if attempt == 2:
                raise
    with engine.begin() as conn:
        found = conn.execute(sa.select(sa.func.max(schema_version.c.version))).scalar()
        if found is not None and found > SCHEMA_VERSION:
            raise RuntimeError(
                f"the ledger at {engine.url.render_as_string(hide_password=True)} has schema "
                f"version {found}, newer than this code's {SCHEMA_VERSION}; upgrade llm-assets"
            )
        if found is not None and found < SCHEMA_VERSION:
            _add_missing_columns(conn)
            _upgrade_indexes(conn)
        if found is None or found < SCHEMA_VERSION:
            conn.execute(
                _insert(conn, schema_version)
                .values(version=SCHEMA_VERSION, applied_at=utcnow())
                .on_conflict_do_nothing()
            )
    return True


def _add_missing_columns(conn: Connection) -> None:
    """Upgrade an older ledger in place: every later version only adds nullable or defaulted
    columns (and tables, which create_all makes), so adding what is missing is the migration."""
    inspector = sa.inspect(conn)
    for table in metadata.sorted_tables:
        present = {c["name"] for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name in present:
                continue
            ddl = f"{column.name} {column.type.compile(dialect=conn.dialect)}"
            if column.server_default is not None:
                ddl += f" DEFAULT '{column.server_default.arg}'"  # type: ignore[attr-defined]
            if not column.nullable:
                ddl += " NOT NULL"
            conn.execute(sa.text(f"ALTER TABLE {table.name} ADD COLUMN {ddl}"))


def _upgrade_indexes(conn: Connection) -> None:
    """Version 3: the status index is gone (see result_table) and result pages keep room;
    versions 4 and 5: more room (RESULT_FILLFACTOR). Pages written before keep what they had.
    Version 5: items and outputs no longer have a foreign key to their job (SQLite keeps it
    in tables made before: it cannot drop a constraint without rebuilding the table)."""
    conn.execute(sa.text("DROP INDEX IF EXISTS ix_result_job_status"))
    if conn.dialect.name == "postgresql":
        conn.execute(
            sa.text(f"ALTER TABLE {result_table.name} SET (fillfactor = {RESULT_FILLFACTOR})")
        )
        for table in (result_table, output_table):
            conn.execute(
                sa.text(
                    f"ALTER TABLE {table.name} DROP CONSTRAINT IF EXISTS {table.name}_job_id_fkey"
                )
            )


def _spent_since(conn: Connection, pipeline: str, since: dt.date) -> float:
    """A pipeline's reservations since a date: actual cost once settled, else the bound."""
    spent = sa.func.coalesce(reservation_table.c.actual_usd, reservation_table.c.reserved_usd)
    query = sa.select(sa.func.coalesce(sa.func.sum(spent), 0.0)).where(
        reservation_table.c.pipeline == pipeline, reservation_table.c.spend_date >= since
    )
    return float(conn.execute(query).scalar() or 0.0)


def _status_in(statuses: Iterable[str]) -> Any:
    """`status IN (...)` with inline constants, usable inside executemany statements."""
    known = {PENDING, SUBMITTED, RETRY, SUCCEEDED, DEAD_LETTER}
    unknown = set(statuses) - known
    if unknown:
        raise ValueError(f"unknown item status {sorted(unknown)}")
    return result_table.c.status.in_([sa.literal_column(f"'{s}'") for s in statuses])


def _insert(conn: Connection, table: sa.Table) -> Any:
    """A dialect insert that supports ON CONFLICT on both SQLite and PostgreSQL."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


class _Bulk:
    """Writes of many rows without per-row SQLAlchemy work, inside the caller's transaction.

    PostgreSQL: the rows are COPYed into a temporary table and applied by one set-based
    statement. SQLite: one executemany of plain tuples on the raw connection, with datetimes
    encoded as SQLAlchemy stores them.
    """

    STAGE = "pg_temp.llm_stage"

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.postgres = conn.dialect.name == "postgresql"
        self.cursor = conn.connection.cursor()
        self._settings = ""
        when = _Now.dialect_impl(conn.dialect).bind_processor(conn.dialect)
        self._when = when or (lambda value: value)

    @contextlib.contextmanager
    def _errors(self, statement: str) -> Iterator[None]:
        """Driver errors as SQLAlchemy raises them (IntegrityError, OperationalError, ...)."""
        try:
            yield
        except self.conn.dialect.loaded_dbapi.Error as exc:
            raise sa.exc.DBAPIError.instance(
                statement, None, exc, self.conn.dialect.loaded_dbapi.Error
            ) from exc

    def execute(self, statement: str, params: Any = ()) -> None:
        """Run a statement, after the settings queued for it (sent in the same round trip:
        the thread that writes the ledger takes the GIL again after each one, and waits for
        it behind a busy main thread). The cursor's rowcount is the statement's."""
        if self._settings:
            statement = f"{self._settings}; {statement}"
            self._settings = ""
        with self._errors(statement):
            self.cursor.execute(statement, params)

    def join_by_index(self) -> None:
        """PostgreSQL, from the next statement to the end of this transaction (or until
        join_by_hash): join staged rows to the ledger by its unique index. A hash join would
        read the whole table for every chunk, and JIT only costs time on statements like
        these."""
        assert self.postgres
        self._settings = (
            "SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off; "
            "SET LOCAL enable_nestloop = on; SET LOCAL enable_seqscan = on; SET LOCAL jit = off"
        )

    def join_by_hash(self) -> None:
        """PostgreSQL, from the next statement to the end of this transaction (or until
        join_by_index): join staged rows to ledger rows read by another condition (one
        shard's, by its index) through a hash table in memory, never by a scan of the whole
        ledger."""
        assert self.postgres
        self._settings = (
            "SET LOCAL enable_hashjoin = on; SET LOCAL enable_mergejoin = off; "
            "SET LOCAL enable_nestloop = off; SET LOCAL enable_seqscan = off; "
            f"SET LOCAL work_mem = '{HASH_WORK_MEM}'; SET LOCAL jit = off"
        )

    def value(self, value: Any) -> Any:
        return self._when(value) if isinstance(value, dt.datetime) else value

    def stage(
        self,
        table: sa.Table,
        columns: Sequence[str],
        rows: Iterable[Sequence[Any]],
        *,
        binary: Sequence[bytes] | None = None,
    ) -> None:
        """PostgreSQL: a temporary table of `columns` (typed as in `table`) filled by COPY,
        from rows or from tuples of binary COPY made already (result rows, ResultStager)."""
        assert self.postgres
        names = ", ".join(columns)
        self.execute(
            f"DROP TABLE IF EXISTS {self.STAGE}; CREATE TEMP TABLE {self.STAGE} ON COMMIT DROP "
            f"AS SELECT {names} FROM {table.name} WITH NO DATA"
        )
        # Not analysed: the planner sizes a fresh table by its pages, and joins to the ledger
        # are pinned to its unique index (join_by_index), so statistics would change nothing.
        if binary is not None:
            self.copy_binary(self.STAGE, columns, binary)
        else:
            self.copy(self.STAGE, columns, rows)

    def copy(
        self,
        table: str,
        columns: Sequence[str],
        rows: Iterable[Sequence[Any]],
    ) -> None:
        """PostgreSQL: COPY rows into a table, as COPY text.

        The data goes to the driver as bytes: a str buffer of a chunk (12 MB) took three
        times as long to make, on the thread that writes the ledger, holding the GIL."""
        assert self.postgres
        lines = [copy_line(row) for row in rows]
        buffer = io.BytesIO(("\n".join(lines) + "\n").encode() if lines else b"")
        statement = f"COPY {table} ({', '.join(columns)}) FROM STDIN"
        with self._errors(statement):
            self.cursor.copy_expert(statement, buffer, size=COPY_BUFFER)

    def copy_binary(self, table: str, columns: Sequence[str], tuples: Sequence[bytes]) -> None:
        """PostgreSQL: COPY tuples of binary COPY (made for the table's column types) into a
        table."""
        assert self.postgres
        buffer = io.BytesIO(b"".join((COPY_BINARY_HEADER, *tuples, COPY_BINARY_TRAILER)))
        statement = f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT binary)"
        with self._errors(statement):
            self.cursor.copy_expert(statement, buffer, size=COPY_BUFFER)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], *, encoded: bool = False) -> int:
        """SQLite: one statement over many tuples; the rows it changed. `encoded`: the rows
        hold no datetimes (or hold them encoded already), so they are passed as they are."""
        if not encoded:
            rows = [tuple(self.value(v) for v in row) for row in rows]
        with self._errors(sql):
            self.cursor.executemany(sql, rows)
        return max(self.cursor.rowcount, 0)

    def insert_ignoring_existing(
        self, table: sa.Table, columns: Sequence[str], rows: list[Sequence[Any]], key: str
    ) -> int:
        """Insert rows whose unique `key` constraint is free; returns how many went in. On
        SQLite the rows' datetimes are encoded already (`value`).

        PostgreSQL: callers leave out what the ledger already holds, so the rows are first
        COPYed straight into the table (heap pages written in batches, no speculative
        insertion: two thirds of the time of staging them and inserting with ON CONFLICT).
        Only when one exists after all (a run beside this one wrote it) is that undone and
        the rows staged and inserted by one statement that skips the existing ones."""
        names = ", ".join(columns)
        if self.postgres:
            self.execute("SAVEPOINT llm_direct_copy")
            try:
                self.copy(table.name, columns, rows)
            except sa.exc.IntegrityError as exc:
                if getattr(exc.orig, "pgcode", None) != UNIQUE_VIOLATION:
                    raise
                self.execute("ROLLBACK TO SAVEPOINT llm_direct_copy")
            else:
                self.execute("RELEASE SAVEPOINT llm_direct_copy")
                return len(rows)
            self.stage(table, columns, rows)
            self.execute(
                f"INSERT INTO {table.name} ({names}) SELECT {names} FROM {self.STAGE} "
                f"ON CONFLICT ON CONSTRAINT {key} DO NOTHING"
            )
            return int(self.cursor.rowcount)
        marks = ", ".join("?" for _ in columns)
        return self.executemany(
            f"INSERT INTO {table.name} ({names}) VALUES ({marks}) ON CONFLICT DO NOTHING",
            rows,
            encoded=True,
        )


@dataclasses.dataclass
class _Applied:
    """How many rows of a chunk of results were applied, and how many were not in the ledger."""

    count: int = 0
    unknown: int = 0


def _apply_staged(
    bulk: _Bulk,
    job_id: str,
    rows: list[Any],
    now: Any,
    *,
    override: bool = False,
    shard_id: str | None = None,
) -> _Applied:
    """Write staged result rows over items that are not terminal yet, set-based.

    With `override`, the rows are successes that replace a failure this same upsert wrote (at
    `now`): the only writes over a terminal row, and never over one terminal before it.

    `shard_id`: the rows are that shard's results, so almost all of them are its items. On
    PostgreSQL those are matched by reading the shard's rows (by its index, in file order)
    into a hash table, instead of one descent of the unique index per row; what the shard
    does not hold (items moved to another shard since) is then matched by the unique index.
    """
    table = result_table.name
    columns = ["custom_id", *RESULT_COLUMNS]
    terminal = ", ".join(f"'{s}'" for s in TERMINAL)

    def guard(r: str, now: str) -> str:
        """Which rows may be written: `r` is the table's alias, `now` the time's parameter."""
        if override:
            return f"{r}status <> '{SUCCEEDED}' AND {r}updated_at = {now}"
        return f"{r}status NOT IN ({terminal})"

    applied = _Applied()
    if bulk.postgres:
        bulk.stage(result_table, columns, (), binary=rows)
        sets = ", ".join(f"{k} = s.{k}" for k in RESULT_COLUMNS)
        params = {"now": now, "job": job_id, "shard": shard_id}
        update = (
            f"UPDATE {table} AS r SET {sets}, updated_at = %(now)s FROM {bulk.STAGE} AS s "
            f"WHERE r.job_id = %(job)s AND r.custom_id = s.custom_id AND {guard('r.', '%(now)s')}"
        )
        left = len(rows)
        if shard_id is not None and not override and left >= HASH_JOIN_ROWS:
            bulk.join_by_hash()
            bulk.execute(f"{update} AND r.shard_id = %(shard)s", params)
            applied.count = int(bulk.cursor.rowcount)
            if applied.count == left:
                return applied
            # The shard's items are done with (written, or terminal already). When they are
            # the whole chunk (a re-import), counting them is enough; otherwise they are taken
            # out and the rest of the chunk is matched by the unique index below.
            in_shard = "r.job_id = %(job)s AND r.shard_id = %(shard)s AND r.custom_id = s.custom_id"
            bulk.execute(
                f"SELECT count(*) FROM {bulk.STAGE} AS s, {table} AS r WHERE {in_shard}", params
            )
            if int(bulk.cursor.fetchone()[0]) == left:
                return applied
            bulk.execute(
                f"DELETE FROM {bulk.STAGE} AS s USING {table} AS r WHERE {in_shard}", params
            )
            left -= int(bulk.cursor.rowcount)
        bulk.join_by_index()
        bulk.execute(update, params)
        written = int(bulk.cursor.rowcount)
        applied.count += written
        if written < left and not override:
            # Some rows were not applied: already terminal, or not in the ledger at all.
            bulk.execute(
                f"SELECT count(*) FROM {bulk.STAGE} AS s WHERE NOT EXISTS (SELECT 1 FROM "
                f"{table} AS r WHERE r.job_id = %(job)s AND r.custom_id = s.custom_id)",
                params,
            )
            applied.unknown = int(bulk.cursor.fetchone()[0])
        return applied
    if override:
        # SQLite: the few overrides row by row, each guarded by the time it expects.
        sets = ", ".join(f"{k} = ?" for k in RESULT_COLUMNS)
        update = (
            f"UPDATE {table} SET {sets}, updated_at = ? WHERE job_id = ? AND custom_id = ? "
            f"AND {guard('', '?')}"
        )
        stamp = bulk.value(now)
        return _Applied(
            count=bulk.executemany(
                update, [row[1:] + (stamp, job_id, row[0], stamp) for row in rows], encoded=True
            )
        )
    # SQLite: the chunk into a temporary table, applied by one statement (SQLite works
    # without the GIL for all of it, not between per-row binds of an executemany).
    stage = "temp.llm_stage"
    bulk.execute(f"DROP TABLE IF EXISTS {stage}")
    bulk.execute(f"CREATE TABLE {stage} ({', '.join(columns)})")
    marks = ", ".join("?" for _ in columns)
    # Result values are strings and numbers; the one datetime is encoded below.
    bulk.executemany(f"INSERT INTO {stage} VALUES ({marks})", rows, encoded=True)
    sets = ", ".join(f"{k} = s.{k}" for k in RESULT_COLUMNS)
    bulk.execute(
        f"UPDATE {table} AS r SET {sets}, updated_at = ? FROM {stage} AS s "
        f"WHERE r.job_id = ? AND r.custom_id = s.custom_id AND {guard('r.', '?')}",
        (bulk.value(now), job_id),
    )
    applied.count = max(bulk.cursor.rowcount, 0)
    if applied.count < len(rows):
        bulk.execute(
            f"SELECT count(*) FROM {stage} AS s WHERE NOT EXISTS (SELECT 1 FROM "
            f"{table} AS r WHERE r.job_id = ? AND r.custom_id = s.custom_id)",
            (job_id,),
        )
        applied.unknown = int(bulk.cursor.fetchone()[0])
    bulk.execute(f"DROP TABLE {stage}")
    return applied


class BackgroundWriter:
    """Runs ledger writes one after another on a thread of their own, so the database (another
    process, or SQLite's C code, both without the GIL) works while the caller prepares the
    next chunk. At most `depth` writes wait; the first error is raised in the caller, at the
    next submit or at the end, and nothing after it runs."""

    def __init__(self, depth: int = 2) -> None:
        import queue

        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="ledger-writer", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            task = self._queue.get()
            if task is None:
                return
            if self._error is None:
                try:
                    task()
                except BaseException as exc:  # handed to the caller
                    self._error = exc

    def submit(self, task: Any) -> None:
        self._raise()
        self._queue.put(task)

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def __enter__(self) -> "BackgroundWriter":
        return self

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        """Finish what was queued; a write's error is raised unless the caller already
        failed (then the caller's error is the one that propagates)."""
        self._queue.put(None)
        self._thread.join()
        if kind is None:
            self._raise()


class LedgerResource(dg.ConfigurableResource):
    """Typed access to the ledger tables; creates them on first use."""

    database_url: str

    _ready: bool = PrivateAttr(default=False)

    @property
    def engine(self) -> Engine:
        if not self._ready:
            _schema_ready(self.database_url)
            self._ready = True
        return get_engine(self.database_url)

    def begin(self) -> Any:
        return self.engine.begin()

    def schema_version(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.max(schema_version.c.version))).scalar())

    def get_or_create_job(
        self,
        *,
        job_id: str,
        pipeline: str,
        partition_date: dt.date,
        task_type: str,
        provider: str,
        model_name: str,
        prompt_version: str,
        code_version: str,
        created_by: str,
    ) -> JobRecord:
        now = utcnow()
        with self.begin() as conn:
            conn.execute(
                _insert(conn, job_table)
                .values(
                    job_id=job_id,
                    pipeline=pipeline,
                    partition_date=partition_date,
                    task_type=task_type,
                    provider=provider,
                    model_name=model_name,
                    prompt_version=prompt_version,
                    code_version=code_version,
                    status="created",
                    created_by=created_by,
                    created_at=now,
                    updated_at=now,
                )
                .on_conflict_do_nothing(index_elements=["job_id"])
            )
        job = self.get_job(job_id)
        assert job is not None
        return job

    def get_job(self, job_id: str) -> JobRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(job_table).where(job_table.c.job_id == job_id)).first()
        return JobRecord.model_validate(row._mapping) if row else None

    def jobs_for_partition(self, pipeline: str, partition_date: dt.date) -> list[JobRecord]:
        query = (
            sa.select(job_table)
            .where(job_table.c.pipeline == pipeline, job_table.c.partition_date == partition_date)
            .order_by(job_table.c.created_at)
        )
        with self.engine.connect() as conn:
            return [JobRecord.model_validate(r._mapping) for r in conn.execute(query)]

    def jobs_for_pipeline(self, pipeline: str) -> list[JobRecord]:
        query = (
            sa.select(job_table)
            .where(job_table.c.pipeline == pipeline)
            .order_by(job_table.c.partition_date, job_table.c.created_at)
        )
        with self.engine.connect() as conn:
            return [JobRecord.model_validate(r._mapping) for r in conn.execute(query)]

    def update_job(self, job_id: str, **values: Any) -> None:
        with self.begin() as conn:
            conn.execute(
                sa.update(job_table)
                .where(job_table.c.job_id == job_id)
                .values(**values, updated_at=utcnow())
            )

    def known_custom_ids(self, job_id: str) -> set[str]:
        query = sa.select(result_table.c.custom_id).where(result_table.c.job_id == job_id)
        with self.engine.connect() as conn:
            return set(conn.execute(query).scalars())

    def add_shard_with_items(self, shard: dict[str, Any], items: Sequence[dict[str, Any]]) -> int:
        """Record a new shard and its items in one transaction; returns items inserted.

        Items already in the ledger are left alone, so a crash between writing the shard
        file and this call is repaired by simply running the step again.
        """
        now = utcnow()
        inserted = 0
        with self.begin() as conn:
            conn.execute(
                _insert(conn, shard_table)
                .values(**shard, status="created", created_at=now, updated_at=now)
                .on_conflict_do_nothing()
            )
            inserted += self._insert_items(conn, items, now)
        return inserted

    def add_items(self, items: Iterable[dict[str, Any]]) -> int:
        """Insert item rows (e.g. input dead letters); existing (job_id, custom_id) are kept."""
        now = utcnow()
        inserted = 0
        for chunk in chunked(items, CHUNK):
            with self.begin() as conn:
                inserted += self._insert_items(conn, chunk, now)
        return inserted

    def _insert_items(self, conn: Connection, items: Sequence[dict[str, Any]], now: Any) -> int:
        if not items:
            return 0
        bulk = _Bulk(conn)
        keys = list(items[0])
        columns = [*keys, "created_at", "updated_at"]
        inserted = 0
        # The item's datetimes are these two stamps, encoded once (not per row and value).
        stamp = copy_text(now) if bulk.postgres else bulk.value(now)
        for chunk in chunked(items, BULK_CHUNK):
            rows = [[item.get(k) for k in keys] + [stamp, stamp] for item in chunk]
            inserted += bulk.insert_ignoring_existing(
                result_table, columns, rows, "uq_result_job_custom_id"
            )
        return inserted

    def analyze(self) -> None:
        """Fresh planner statistics after a large load (PostgreSQL). Without them a day's
        first updates can be planned as scans of the whole job, one per row."""
        with self.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(sa.text(f"ANALYZE {result_table.name}"))

    def shards(self, job_id: str, statuses: Iterable[str] | None = None) -> list[ShardRecord]:
        query = sa.select(shard_table).where(shard_table.c.job_id == job_id)
        if statuses is not None:
            query = query.where(shard_table.c.status.in_(list(statuses)))
        query = query.order_by(shard_table.c.round, shard_table.c.shard_index)
        with self.engine.connect() as conn:
            return [ShardRecord.model_validate(r._mapping) for r in conn.execute(query)]

    def shards_in_states(
        self, statuses: Iterable[str], pipeline: str | None = None
    ) -> list[ShardRecord]:
        query = sa.select(shard_table).where(shard_table.c.status.in_(list(statuses)))
        if pipeline is not None:
            query = query.join(job_table, job_table.c.job_id == shard_table.c.job_id).where(
                job_table.c.pipeline == pipeline
            )
        with self.engine.connect() as conn:
            return [ShardRecord.model_validate(r._mapping) for r in conn.execute(query)]

    def get_shard(self, shard_id: str) -> ShardRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(shard_table).where(shard_table.c.shard_id == shard_id)
            ).first()
        return ShardRecord.model_validate(row._mapping) if row else None

    def next_round(self, job_id: str) -> int:
        with self.engine.connect() as conn:
            found = conn.execute(
                sa.select(sa.func.max(shard_table.c.round)).where(shard_table.c.job_id == job_id)
            ).scalar()
        return 0 if found is None else int(found) + 1

    def update_shard(
        self, shard_id: str, *, expect_status: Iterable[str] | None = None, **values: Any
    ) -> bool:
        """Compare-and-set on the shard's status; returns whether the row changed."""
        query = sa.update(shard_table).where(shard_table.c.shard_id == shard_id)
        if expect_status is not None:
            query = query.where(shard_table.c.status.in_(list(expect_status)))
        with self.begin() as conn:
            return conn.execute(query.values(**values, updated_at=utcnow())).rowcount > 0

    @contextlib.contextmanager
    def submission_lock(self, shard_id: str) -> Iterator[bool]:
        """Hold the right to submit one shard; yields False when another process holds it.

        Two runs of the same day (a sensor's and a backfill's) must not both create a batch
        for a shard. The lock dies with its holder, so a crashed run never blocks the next
        one, which then reconciles from the recorded intent: a PostgreSQL advisory lock on
        its own connection, or an flock beside a SQLite ledger file. Advisory locks belong
        to the whole database, so the key includes the ledger's schema: two ledgers in one
        database never block each other's shards.
        """
        engine = self.engine
        if engine.dialect.name == "postgresql":
            with engine.connect() as conn:
                schema = conn.execute(sa.select(sa.func.current_schema())).scalar() or ""
                scoped = hashlib.sha256(f"{schema}\0{shard_id}".encode()).digest()
                key = int.from_bytes(scoped[:8], "big", signed=True)
                got = bool(conn.execute(sa.select(sa.func.pg_try_advisory_lock(key))).scalar())
                conn.commit()
                try:
                    yield got
                finally:
                    if got:
                        conn.execute(sa.select(sa.func.pg_advisory_unlock(key)))
                        conn.commit()
            return
        database = engine.url.database
        if not database or database == ":memory:":
            yield True
            return
        digest = hashlib.sha256(shard_id.encode()).digest()
        folder = Path(f"{database}.submission-locks")
        folder.mkdir(exist_ok=True)
        fd = os.open(folder / f"{digest.hex()[:32]}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def mark_submitted(self, shard_id: str, provider_batch_id: str, status: str) -> None:
        """Record the provider batch and count an attempt for each item, atomically."""
        now = utcnow()
        with self.begin() as conn:
            changed = conn.execute(
                sa.update(shard_table)
                .where(
                    shard_table.c.shard_id == shard_id, shard_table.c.provider_batch_id.is_(None)
                )
                .values(
                    provider_batch_id=provider_batch_id,
                    status=status,
                    submitted_at=now,
                    updated_at=now,
                )
            ).rowcount
            if changed:
                conn.execute(
                    sa.update(result_table)
                    .where(result_table.c.shard_id == shard_id, result_table.c.status == PENDING)
                    .values(
                        status=SUBMITTED,
                        attempts=result_table.c.attempts + 1,
                        updated_at=now,
                    )
                )

    def result_stager(self) -> ResultStager:
        """Turns result rows into this ledger's bulk format; picklable, for worker processes."""
        return ResultStager(binary_copy=self.engine.dialect.name == "postgresql")

    def upsert_results(
        self,
        job_id: str,
        rows: Iterable[dict[str, Any]],
        *,
        writer: "BackgroundWriter | None" = None,
        shard_id: str | None = None,
    ) -> UpsertStats:
        """Apply normalized results (dicts of custom_id and RESULT_COLUMNS) by custom_id;
        see upsert_staged."""
        stager = self.result_stager()

        def values(row: dict[str, Any]) -> tuple[Any, ...]:
            given = (row.get(k, _RESULT_DEFAULTS.get(k)) for k in RESULT_COLUMNS)
            return (row["custom_id"], *given)

        staged = (stager(map(values, chunk)) for chunk in chunked(rows, CHUNK))
        return self.upsert_staged(job_id, staged, writer=writer, shard_id=shard_id)

    def upsert_staged(
        self,
        job_id: str,
        chunks: Iterable[StagedResults],
        *,
        writer: "BackgroundWriter | None" = None,
        shard_id: str | None = None,
    ) -> UpsertStats:
        """Apply staged results by custom_id, in chunks, never over a terminal row.

        Within a chunk a success beats a failure and the first line wins among equals, so
        duplicated output lines change nothing; across chunks and re-imports the WHERE clause
        of the upsert protects rows that are already terminal.

        The writes run on a writer thread while the next chunk is parsed. Given the caller's
        `writer`, they are only queued on it: the stats are complete once its earlier tasks
        have run, which is when anything queued after them runs.

        `shard_id`: the results are those of one shard's provider batch, so they are matched
        to its items first (see _apply_staged); any custom_id of the job is still applied.
        """
        stats = UpsertStats()
        now = utcnow()
        if writer is not None:
            self._upsert_chunks(job_id, chunks, stats, now, writer, shard_id)
            return stats
        with BackgroundWriter() as own:
            self._upsert_chunks(job_id, chunks, stats, now, own, shard_id)
        return stats

    def _upsert_chunks(
        self,
        job_id: str,
        chunks: Iterable[StagedResults],
        stats: UpsertStats,
        now: Any,
        writer: "BackgroundWriter",
        shard_id: str | None,
    ) -> None:
        # The status each custom_id was given by this upsert (queued, not necessarily written).
        written: dict[str, str] = {}
        rows: list[Any] = []
        statuses: list[str] = []
        at: dict[str, int] = {}
        overrides: list[Any] = []

        def flush() -> None:
            nonlocal rows, statuses, at, overrides
            if overrides:
                writer.submit(
                    functools.partial(self._apply_chunk, job_id, overrides, now, None, None)
                )
            if rows:
                # Counted as written when queued: a later duplicate's override is guarded by
                # the time it expects, so it changes nothing where this chunk was not applied.
                written.update(zip(at, statuses, strict=True))
                writer.submit(
                    functools.partial(self._apply_chunk, job_id, rows, now, stats, shard_id)
                )
            rows, statuses, at, overrides = [], [], {}, []

        for chunk in chunks:
            ids = chunk.custom_ids
            stats.received += len(ids)
            if (
                written.keys().isdisjoint(ids)
                and at.keys().isdisjoint(ids)
                and len(set(ids)) == len(ids)
            ):
                # No custom_id seen before or twice here (almost every chunk): taken whole,
                # by set operations instead of the per-line steps below.
                at.update(zip(ids, range(len(rows), len(rows) + len(ids)), strict=True))
                rows.extend(chunk.rows)
                statuses.extend(chunk.statuses)
            else:
                for cid, status, row in zip(*chunk, strict=True):
                    earlier = written.get(cid)
                    if earlier is not None:
                        # A duplicate of a line applied earlier in this upsert: a success still
                        # replaces the failure written then, nothing else changes.
                        stats.note_duplicate(cid)
                        if status == SUCCEEDED and earlier != SUCCEEDED:
                            overrides.append(row)
                            written[cid] = SUCCEEDED
                        continue
                    index = at.get(cid)
                    if index is None:
                        at[cid] = len(rows)
                        rows.append(row)
                        statuses.append(status)
                        continue
                    stats.note_duplicate(cid)
                    if status == SUCCEEDED and statuses[index] != SUCCEEDED:
                        rows[index] = row
                        statuses[index] = status
            if len(rows) >= BULK_CHUNK:
                flush()
        flush()

    def _apply_chunk(
        self,
        job_id: str,
        rows: list[Any],
        now: Any,
        stats: UpsertStats | None,
        shard_id: str | None,
    ) -> None:
        """Apply staged rows (stats given) or the overrides of a failure (stats None)."""
        with self.begin() as conn:
            applied = _apply_staged(
                _Bulk(conn), job_id, rows, now, override=stats is None, shard_id=shard_id
            )
        if stats is not None:
            stats.applied += applied.count
            stats.unknown += applied.unknown
            stats.already_terminal += len(rows) - applied.count - applied.unknown

    def set_item_status(
        self, job_id: str, custom_ids: Iterable[str], *, from_status: Sequence[str], **values: Any
    ) -> int:
        """Move items from one of `from_status` to new values, in chunks; returns rows moved."""
        moved = 0
        now = utcnow()
        for chunk in chunked(custom_ids, CHUNK):
            with self.begin() as conn:
                moved += conn.execute(
                    sa.update(result_table)
                    .where(
                        result_table.c.job_id == job_id,
                        result_table.c.custom_id.in_(chunk),
                        result_table.c.status.in_(list(from_status)),
                    )
                    .values(**values, updated_at=now)
                ).rowcount
        return moved

    def set_item_errors(
        self, job_id: str, rows: Iterable[dict[str, Any]], *, from_status: Sequence[str]
    ) -> int:
        """Per-item updates (different values per row), guarded by the current status."""
        statuses = list(from_status)
        _status_in(statuses)  # only known statuses reach the SQL below
        allowed = ", ".join(f"'{s}'" for s in statuses)
        table = result_table.name
        moved = 0
        now = utcnow()
        for chunk in chunked(rows, BULK_CHUNK):
            keys = [k for k in chunk[0] if k != "custom_id"]
            with self.begin() as conn:
                bulk = _Bulk(conn)
                if bulk.postgres:
                    bulk.stage(
                        result_table,
                        ["custom_id", *keys],
                        ([row["custom_id"]] + [row.get(k) for k in keys] for row in chunk),
                    )
                    sets = ", ".join(f"{k} = s.{k}" for k in keys)
                    bulk.join_by_index()
                    bulk.execute(
                        f"UPDATE {table} AS r SET {sets}, updated_at = %(now)s "
                        f"FROM {bulk.STAGE} AS s WHERE r.job_id = %(job)s "
                        f"AND r.custom_id = s.custom_id AND r.status IN ({allowed})",
                        {"now": now, "job": job_id},
                    )
                    moved += int(bulk.cursor.rowcount)
                else:
                    sets = ", ".join(f"{k} = ?" for k in keys)
                    moved += bulk.executemany(
                        f"UPDATE {table} SET {sets}, updated_at = ? WHERE job_id = ? "
                        f"AND custom_id = ? AND status IN ({allowed})",
                        (
                            [row.get(k) for k in keys] + [now, job_id, row["custom_id"]]
                            for row in chunk
                        ),
                    )
        return moved

    def iter_items(
        self,
        job_id: str,
        statuses: Iterable[str] | None = None,
        *,
        shard_id: str | None = None,
        columns: Sequence[str] | None = None,
        few: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Stream item rows in custom_id order without loading them all.

        `few`: the caller expects about that many rows at most (the items to retry among a
        day's, say). Up to that many are read by one query, which PostgreSQL can spread over
        its parallel workers (it reads a cursor in one process: 0.7 s instead of 0.3 s for a
        million rows); only when there are more is the rest streamed, after the last
        custom_id read. The rows also hold their custom_id then."""
        if few is not None and few < 1:
            raise ValueError(f"few must be 1 or more, got {few}")
        key = result_table.c.custom_id
        cols = [result_table.c[c] for c in columns] if columns else [result_table]
        if few is not None and columns and "custom_id" not in columns:
            cols.append(key)
        query = sa.select(*cols).where(result_table.c.job_id == job_id)
        if statuses is not None:
            query = query.where(result_table.c.status.in_(list(statuses)))
        if shard_id is not None:
            query = query.where(result_table.c.shard_id == shard_id)
        query = query.order_by(key)
        with self.engine.connect() as conn:
            if few is not None:
                result = conn.execute(query.limit(few + 1))
                keys = list(result.keys())
                rows = result.all()
                for row in rows[:few]:
                    yield dict(zip(keys, row, strict=True))
                if len(rows) <= few:
                    return
                query = query.where(key > rows[few - 1].custom_id)
            result = conn.execution_options(yield_per=CHUNK).execute(query)
            keys = list(result.keys())
            for row in result:
                yield dict(zip(keys, row, strict=True))

    def counts(self, job_id: str) -> JobCounts:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(
                    result_table.c.status,
                    result_table.c.error_class,
                    sa.func.count(),
                    sa.func.coalesce(sa.func.sum(result_table.c.input_tokens), 0),
                    sa.func.coalesce(sa.func.sum(result_table.c.output_tokens), 0),
                    sa.func.coalesce(
                        sa.func.sum(result_table.c.cost_usd + result_table.c.prior_cost_usd), 0.0
                    ),
                )
                .where(result_table.c.job_id == job_id)
                .group_by(result_table.c.status, result_table.c.error_class)
            ).all()
        counts = JobCounts()
        by_status: dict[str, int] = {}
        by_class: dict[str, int] = {}
        for status, error_class, n, tin, tout, cost in rows:
            counts.total += n
            by_status[status] = by_status.get(status, 0) + n
            if status == DEAD_LETTER:
                key = error_class or "unknown"
                by_class[key] = by_class.get(key, 0) + n
            counts.input_tokens += int(tin)
            counts.output_tokens += int(tout)
            counts.cost_usd += float(cost)
        counts.by_status = by_status
        counts.dead_letters_by_class = by_class
        return counts

    def refresh_job(self, job_id: str) -> JobCounts:
        """Recompute a job's totals and status from its items."""
        counts = self.counts(job_id)
        shards = self.shards(job_id)
        if counts.total and counts.open == 0:
            status = "completed"
        elif any(s.provider_batch_id for s in shards):
            status = "running"
        else:
            status = "created"
        self.update_job(
            job_id,
            status=status,
            total_items=counts.total,
            succeeded_items=counts.succeeded,
            failed_items=counts.dead_letters,
            expired_items=counts.dead_letters_by_class.get("expired", 0),
            input_tokens=counts.input_tokens,
            output_tokens=counts.output_tokens,
            cost_usd=counts.cost_usd,
        )
        return counts

    def reassign_items_to_shard(
        self, job_id: str, shard: dict[str, Any], lines: Sequence[tuple[str, int]]
    ) -> int:
        """Record a retry shard and move its items (from `retry`) into it, atomically; `lines`
        are (custom_id, request_offset in the new shard's file)."""
        return self._move_into_shard(job_id, {**shard, "kind": RETRY_SHARD}, lines, RETRY)

    def requeue_into_shard(
        self, job_id: str, shard: dict[str, Any], lines: Sequence[tuple[str, int]]
    ) -> int:
        """Send dead letters back: a new shard, the items pending in it, atomically."""
        return self._move_into_shard(job_id, {**shard, "kind": REQUEUE_SHARD}, lines, DEAD_LETTER)

    def _move_into_shard(
        self,
        job_id: str,
        shard: dict[str, Any],
        lines: Sequence[tuple[str, int]],
        from_status: str,
    ) -> int:
        _status_in([from_status])  # only known statuses reach the SQL below
        now = utcnow()
        table = result_table.name
        # The last attempt's cost stays with the shard that paid it.
        sets = (
            f"status = '{PENDING}', prior_cost_usd = r.prior_cost_usd + r.cost_usd, cost_usd = 0, "
        )
        moved = 0
        with self.begin() as conn:
            conn.execute(
                _insert(conn, shard_table)
                .values(**shard, status="created", created_at=now, updated_at=now)
                .on_conflict_do_nothing()
            )
            bulk = _Bulk(conn)
            for chunk in chunked(lines, BULK_CHUNK):
                if bulk.postgres:
                    bulk.stage(result_table, ["custom_id", "request_offset"], chunk)
                    bulk.join_by_index()
                    bulk.execute(
                        f"UPDATE {table} AS r SET {sets}shard_id = %(shard)s, "
                        "request_offset = s.request_offset, updated_at = %(now)s "
                        f"FROM {bulk.STAGE} AS s WHERE r.job_id = %(job)s "
                        f"AND r.custom_id = s.custom_id AND r.status = '{from_status}'",
                        {"shard": shard["shard_id"], "now": now, "job": job_id},
                    )
                    moved += int(bulk.cursor.rowcount)
                    continue
                moved += bulk.executemany(
                    f"UPDATE {table} AS r SET {sets}shard_id = ?, request_offset = ?, "
                    f"updated_at = ? WHERE job_id = ? AND custom_id = ? AND status = ?",
                    [
                        (shard["shard_id"], offset, bulk.value(now), job_id, cid, from_status)
                        for cid, offset in chunk
                    ],
                    encoded=True,
                )
        return moved

    def set_shard_items(self, shard_id: str, *, from_status: Sequence[str], **values: Any) -> int:
        """Move every item of a shard that is still in one of `from_status`."""
        with self.begin() as conn:
            return conn.execute(
                sa.update(result_table)
                .where(
                    result_table.c.shard_id == shard_id,
                    result_table.c.status.in_(list(from_status)),
                )
                .values(**values, updated_at=utcnow())
            ).rowcount

    def count_new_attempt(self, shard_id: str) -> int:
        """A shard's items still `submitted` take one more attempt (a worker that died with
        them open may have sent some)."""
        return self.set_shard_items(
            shard_id, from_status=[SUBMITTED], attempts=result_table.c.attempts + 1
        )

    def _live_shard_totals(self, job_id: str) -> Any:
        """Per shard, the items now in it and their last attempt's tokens and cost."""
        return (
            sa.select(
                result_table.c.shard_id,
                sa.func.count().label("item_rows"),
                sa.func.sum(sa.case((result_table.c.status == SUCCEEDED, 1), else_=0)).label(
                    "succeeded"
                ),
                sa.func.coalesce(sa.func.sum(result_table.c.input_tokens), 0).label("input_tokens"),
                sa.func.coalesce(sa.func.sum(result_table.c.output_tokens), 0).label(
                    "output_tokens"
                ),
                sa.func.coalesce(sa.func.sum(result_table.c.cost_usd), 0.0).label("cost_usd"),
            )
            .where(result_table.c.job_id == job_id, result_table.c.shard_id.is_not(None))
            .group_by(result_table.c.shard_id)
            .subquery()
        )

    def shard_totals(self, job_id: str) -> list[dict[str, Any]]:
        """Per shard: its state, estimate and the tokens and cost it was billed.

        Billed numbers are frozen when the shard is imported (`close_shard`), because items
        may later move to retry or requeue shards; before that they are the live sums.
        """
        live = self._live_shard_totals(job_id)
        query = (
            sa.select(
                shard_table.c.shard_id,
                shard_table.c.kind,
                shard_table.c.round,
                shard_table.c.status,
                shard_table.c.provider_batch_id,
                shard_table.c.item_count,
                sa.func.coalesce(live.c.item_rows, 0),
                sa.func.coalesce(live.c.succeeded, 0),
                shard_table.c.estimated_input_tokens,
                sa.func.coalesce(shard_table.c.actual_input_tokens, live.c.input_tokens, 0),
                sa.func.coalesce(shard_table.c.actual_output_tokens, live.c.output_tokens, 0),
                shard_table.c.estimated_cost_usd,
                shard_table.c.estimated_cost_upper_usd,
                sa.func.coalesce(shard_table.c.actual_cost_usd, live.c.cost_usd, 0.0),
            )
            .select_from(shard_table.outerjoin(live, live.c.shard_id == shard_table.c.shard_id))
            .where(shard_table.c.job_id == job_id)
            .order_by(shard_table.c.round, shard_table.c.shard_index)
        )
        names = [
            "shard_id",
            "kind",
            "round",
            "status",
            "provider_batch_id",
            "requests",
            "items_now",
            "succeeded",
            "estimated_input_tokens",
            "input_tokens",
            "output_tokens",
            "estimated_cost_usd",
            "estimated_cost_upper_usd",
            "cost_usd",
        ]
        with self.engine.connect() as conn:
            return [dict(zip(names, row, strict=True)) for row in conn.execute(query)]

    def close_shard(
        self,
        shard_id: str,
        *,
        from_status: Sequence[str],
        items: dict[str, Any],
        expect_status: Iterable[str] | None = None,
        **values: Any,
    ) -> tuple[int, bool]:
        """End a shard in one transaction: its items still in one of `from_status` get
        `items` (what its batch did not answer), what it was billed is frozen and its budget
        reservation settled, and the shard gets `values` if its status is in `expect_status`.
        Returns how many items moved and whether the shard row changed."""
        if _BILLED & items.keys():
            raise ValueError(f"closing a shard does not change what was billed: {sorted(items)}")
        now = utcnow()
        still_open = result_table.c.status.in_(list(from_status))
        in_shard = result_table.c.shard_id == shard_id
        move = sa.update(result_table).values(**items, updated_at=now)
        billed = [
            sa.func.coalesce(sa.func.sum(result_table.c.input_tokens), 0),
            sa.func.coalesce(sa.func.sum(result_table.c.output_tokens), 0),
            sa.func.coalesce(sa.func.sum(result_table.c.cost_usd), 0.0),
        ]
        with self.begin() as conn:
            if conn.dialect.name == "postgresql":
                # One read of the shard's rows gives both its bill and its open items (none
                # or a few after an import), which are then moved by id. Moving them leaves
                # the bill as it was.
                *totals, ids = conn.execute(
                    sa.select(
                        *billed, sa.func.array_agg(result_table.c.id).filter(still_open)
                    ).where(in_shard)
                ).one()
                if not ids:
                    moved = 0
                elif len(ids) <= CHUNK:
                    moved = conn.execute(
                        move.where(result_table.c.id.in_(ids), still_open)
                    ).rowcount
                else:
                    moved = conn.execute(move.where(in_shard, still_open)).rowcount
            else:
                moved = conn.execute(move.where(in_shard, still_open)).rowcount
                totals = list(conn.execute(sa.select(*billed).where(in_shard)).one())
            self._settle(conn, shard_id, totals, now)
            query = sa.update(shard_table).where(shard_table.c.shard_id == shard_id)
            if expect_status is not None:
                query = query.where(shard_table.c.status.in_(list(expect_status)))
            changed = conn.execute(query.values(**values, updated_at=now)).rowcount > 0
        return moved, changed

    def _settle(
        self, conn: Connection, shard_id: str, totals: Sequence[Any], now: dt.datetime
    ) -> None:
        """Freeze what an ended shard was billed (its items' last attempts, all from this
        shard's batch: input tokens, output tokens, cost) and settle its budget reservation;
        safe to repeat until the shard is marked imported, as nothing moves its items before
        that."""
        tin, tout, cost = totals
        conn.execute(
            sa.update(shard_table)
            .where(shard_table.c.shard_id == shard_id)
            .values(
                actual_input_tokens=int(tin),
                actual_output_tokens=int(tout),
                actual_cost_usd=float(cost),
                updated_at=now,
            )
        )
        conn.execute(
            sa.update(reservation_table)
            .where(reservation_table.c.shard_id == shard_id)
            .values(actual_usd=float(cost), settled_at=now)
        )

    def estimate_accuracy(self, job_id: str) -> float | None:
        """Billed over estimated input tokens, minus one, over the items that were billed
        (their last attempt): how far the token count before submission was off."""
        query = sa.select(
            sa.func.coalesce(sa.func.sum(result_table.c.estimated_input_tokens), 0),
            sa.func.coalesce(sa.func.sum(result_table.c.input_tokens), 0),
        ).where(
            result_table.c.job_id == job_id,
            result_table.c.input_tokens > 0,
            result_table.c.estimated_input_tokens > 0,
        )
        with self.engine.connect() as conn:
            estimated, billed = conn.execute(query).one()
        return int(billed) / int(estimated) - 1 if estimated else None

    def committed_cost(self, job_id: str) -> float:
        """What a job has spent or may still spend: billed cost of settled shards plus the
        upper bound of every other shard."""
        query = sa.select(
            sa.func.coalesce(
                sa.func.sum(
                    sa.func.coalesce(
                        shard_table.c.actual_cost_usd, shard_table.c.estimated_cost_upper_usd
                    )
                ),
                0.0,
            )
        ).where(shard_table.c.job_id == job_id)
        with self.engine.connect() as conn:
            return float(conn.execute(query).scalar() or 0.0)

    def reserve_budget(
        self,
        *,
        pipeline: str,
        job_id: str,
        shards: dict[str, float],
        max_per_day: float | None,
        max_per_month: float | None,
    ) -> str | None:
        """Reserve the upper bounds of a partition's shards (shard_id -> USD) against the
        pipeline's daily and monthly caps, all or none.

        Returns None when reserved (shards reserved by an earlier attempt count as reserved)
        and the reason otherwise. Reservations of one pipeline are serialized by a row lock,
        so concurrent partitions see each other's reservations and cannot overspend
        together; a settled reservation counts its actual cost instead of its bound.
        """
        now = utcnow()
        today = now.date()
        with self.begin() as conn:
            conn.execute(
                _insert(conn, budget_lock_table)
                .values(pipeline=pipeline, touched_at=now)
                .on_conflict_do_nothing()
            )
            # Taking the row lock first serializes every reservation of this pipeline (on
            # SQLite the write takes the database's write lock).
            conn.execute(
                sa.update(budget_lock_table)
                .where(budget_lock_table.c.pipeline == pipeline)
                .values(touched_at=now)
            )
            held = set(
                conn.execute(
                    sa.select(reservation_table.c.shard_id).where(
                        reservation_table.c.shard_id.in_(list(shards))
                    )
                ).scalars()
            )
            wanted = {sid: usd for sid, usd in shards.items() if sid not in held}
            if not wanted:
                return None
            amount = sum(wanted.values())
            for cap, since, period in (
                (max_per_day, today, f"day {today} (UTC)"),
                (max_per_month, today.replace(day=1), f"month {today:%Y-%m}"),
            ):
                if cap is None:
                    continue
                used = _spent_since(conn, pipeline, since)
                if used + amount > cap:
                    return (
                        f"pipeline {pipeline} has ${used:.4f} spent or reserved for the {period}; "
                        f"{len(wanted)} shard(s) of {job_id} need up to ${amount:.4f} more, over "
                        f"the cap of ${cap:.4f}"
                    )
            conn.execute(
                sa.insert(reservation_table),
                [
                    {
                        "shard_id": sid,
                        "pipeline": pipeline,
                        "job_id": job_id,
                        "spend_date": today,
                        "reserved_usd": usd,
                        "created_at": now,
                    }
                    for sid, usd in wanted.items()
                ],
            )
        return None

    def spend(self, pipeline: str, since: dt.date) -> float:
        """Spent or reserved by a pipeline since a date (what the caps count)."""
        with self.engine.connect() as conn:
            return _spent_since(conn, pipeline, since)

    def earlier_jobs(self, pipeline: str, before: dt.date, partitions: int) -> list[JobRecord]:
        """Completed jobs on the `partitions` latest days before `before`, the last created
        per day: the history that estimates and drift checks learn from."""
        query = (
            sa.select(job_table)
            .where(
                job_table.c.pipeline == pipeline,
                job_table.c.partition_date < before,
                job_table.c.status == "completed",
            )
            .order_by(job_table.c.partition_date.desc(), job_table.c.created_at.desc())
        )
        latest: dict[dt.date, JobRecord] = {}
        with self.engine.connect() as conn:
            for row in conn.execution_options(yield_per=100).execute(query):
                job = JobRecord.model_validate(row._mapping)
                if job.partition_date not in latest:
                    if len(latest) == partitions:
                        break
                    latest[job.partition_date] = job
        return list(latest.values())

    def output_tokens_per_billed_item(self, job_ids: Sequence[str]) -> dict[str, float]:
        """Per job, output tokens over the items that were billed (their last attempt), those
        that later failed the quality gate included: what an item's answer costs."""
        query = (
            sa.select(
                result_table.c.job_id, sa.func.sum(result_table.c.output_tokens), sa.func.count()
            )
            .where(result_table.c.job_id.in_(list(job_ids)), result_table.c.input_tokens > 0)
            .group_by(result_table.c.job_id)
        )
        with self.engine.connect() as conn:
            return {job: int(out) / n for job, out, n in conn.execute(query) if n}

    def job_cost_rows(
        self, pipeline: str, start: dt.date | None = None, end: dt.date | None = None
    ) -> list[dict[str, Any]]:
        """Per job of a pipeline (one per day, prompt version and model): items, billed tokens
        and cost, retry overhead and the estimate, from the shards' settled numbers."""
        jobs = sa.select(job_table.c.job_id).where(job_table.c.pipeline == pipeline)
        live = (
            sa.select(
                result_table.c.job_id,
                sa.func.count().label("n_items"),
                sa.func.sum(sa.case((result_table.c.status == SUCCEEDED, 1), else_=0)).label(
                    "succeeded"
                ),
                sa.func.sum(sa.case((result_table.c.status == DEAD_LETTER, 1), else_=0)).label(
                    "dead_letters"
                ),
                sa.func.sum(result_table.c.cost_usd + result_table.c.prior_cost_usd).label(
                    "cost_usd"
                ),
            )
            .where(result_table.c.job_id.in_(jobs))
            .group_by(result_table.c.job_id)
            .subquery()
        )
        billed = (
            sa.select(
                shard_table.c.job_id,
                sa.func.sum(sa.func.coalesce(shard_table.c.actual_input_tokens, 0)).label("tin"),
                sa.func.sum(sa.func.coalesce(shard_table.c.actual_output_tokens, 0)).label("tout"),
                sa.func.sum(
                    sa.case((shard_table.c.kind != FIRST, shard_table.c.actual_cost_usd), else_=0.0)
                ).label("retry_cost"),
                sa.func.sum(shard_table.c.estimated_input_tokens).label("est_in"),
                sa.func.sum(shard_table.c.estimated_cost_usd).label("est"),
                sa.func.sum(shard_table.c.estimated_cost_upper_usd).label("upper"),
            )
            .where(shard_table.c.job_id.in_(jobs))
            .group_by(shard_table.c.job_id)
            .subquery()
        )
        query = (
            sa.select(
                job_table.c.partition_date,
                job_table.c.job_id,
                job_table.c.provider,
                job_table.c.model_name,
                job_table.c.prompt_version,
                sa.func.coalesce(live.c.n_items, 0),
                sa.func.coalesce(live.c.succeeded, 0),
                sa.func.coalesce(live.c.dead_letters, 0),
                sa.func.coalesce(billed.c.est_in, 0),
                sa.func.coalesce(billed.c.tin, 0),
                sa.func.coalesce(billed.c.tout, 0),
                sa.func.coalesce(live.c.cost_usd, 0.0),
                sa.func.coalesce(billed.c.retry_cost, 0.0),
                sa.func.coalesce(billed.c.est, 0.0),
                sa.func.coalesce(billed.c.upper, 0.0),
            )
            .select_from(
                job_table.outerjoin(live, live.c.job_id == job_table.c.job_id).outerjoin(
                    billed, billed.c.job_id == job_table.c.job_id
                )
            )
            .where(job_table.c.pipeline == pipeline)
            .order_by(job_table.c.partition_date, job_table.c.created_at)
        )
        if start is not None:
            query = query.where(job_table.c.partition_date >= start)
        if end is not None:
            query = query.where(job_table.c.partition_date <= end)
        names = [
            "date",
            "job_id",
            "provider",
            "model",
            "prompt_version",
            "items",
            "succeeded",
            "dead_letters",
            "estimated_input_tokens",
            "input_tokens",
            "output_tokens",
            "cost_usd",
            "retry_cost_usd",
            "estimated_cost_usd",
            "estimated_cost_upper_usd",
        ]
        with self.engine.connect() as conn:
            rows = [dict(zip(names, row, strict=True)) for row in conn.execute(query)]
        for row in rows:
            row["date"] = row["date"].isoformat()
            for key in (
                "items",
                "succeeded",
                "dead_letters",
                "input_tokens",
                "output_tokens",
                "estimated_input_tokens",
            ):
                row[key] = int(row[key])
            for key in (
                "cost_usd",
                "retry_cost_usd",
                "estimated_cost_usd",
                "estimated_cost_upper_usd",
            ):
                row[key] = float(row[key])
        return rows

    def pipeline_shards(
        self, pipeline: str, statuses: Iterable[str]
    ) -> list[tuple[ShardRecord, dt.date]]:
        """Shards of a pipeline in some states with their partition date, least recently
        touched first, so a poller cut short by its deadline continues where it stopped."""
        query = (
            sa.select(shard_table, job_table.c.partition_date)
            .join(job_table, job_table.c.job_id == shard_table.c.job_id)
            .where(job_table.c.pipeline == pipeline, shard_table.c.status.in_(list(statuses)))
            .order_by(shard_table.c.updated_at, shard_table.c.shard_id)
        )
        with self.engine.connect() as conn:
            return [
                (ShardRecord.model_validate(row._mapping), row.partition_date)
                for row in conn.execute(query)
            ]

    def finished_jobs(
        self, pipeline: str, since: dt.datetime
    ) -> list[tuple[JobRecord, int, dt.datetime]]:
        """Completed jobs whose shards are all imported, the last import since `since`, with
        their shard count and last import time: the days ready to be validated and reported.
        Bounded by `since` so the sensor's work does not grow with the pipeline's history."""
        imported = sa.func.sum(sa.case((shard_table.c.status == "imported", 1), else_=0))
        query = (
            sa.select(
                job_table,
                sa.func.count(shard_table.c.shard_id).label("n_shards"),
                sa.func.max(shard_table.c.imported_at).label("last_imported"),
            )
            .join(shard_table, shard_table.c.job_id == job_table.c.job_id)
            .where(job_table.c.pipeline == pipeline, job_table.c.status == "completed")
            .group_by(*job_table.c)
            .having(
                sa.and_(
                    imported == sa.func.count(shard_table.c.shard_id),
                    sa.func.max(shard_table.c.imported_at) >= since,
                )
            )
            .order_by(job_table.c.partition_date)
        )
        with self.engine.connect() as conn:
            return [
                (
                    JobRecord.model_validate(row._mapping),
                    int(row.n_shards),
                    as_utc(row.last_imported),
                )
                for row in conn.execute(query)
            ]

    def recent_provider_batch_ids(self, provider: str, since: dt.datetime) -> frozenset[str]:
        """Provider batch ids recorded for shards submitted since `since`."""
        query = sa.select(shard_table.c.provider_batch_id).where(
            shard_table.c.provider == provider,
            shard_table.c.provider_batch_id.is_not(None),
            shard_table.c.submitted_at >= since,
        )
        with self.engine.connect() as conn:
            return frozenset(conn.execute(query).scalars())

    def missing_results(self, job_id: str, limit: int = 1000) -> list[str]:
        """Items sent but never answered: dead letters that ran out of attempts without a
        result, and items still `submitted` although their shard was imported."""
        orphaned = sa.and_(
            result_table.c.status == SUBMITTED,
            result_table.c.shard_id.in_(
                sa.select(shard_table.c.shard_id).where(
                    shard_table.c.job_id == job_id, shard_table.c.status == "imported"
                )
            ),
        )
        never_answered = sa.and_(
            result_table.c.status == DEAD_LETTER,
            result_table.c.error_code.like("missing_result%"),
        )
        query = (
            sa.select(result_table.c.custom_id)
            .where(result_table.c.job_id == job_id, sa.or_(orphaned, never_answered))
            .order_by(result_table.c.custom_id)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return list(conn.execute(query).scalars())

    def iter_dead_letters(self, job_id: str) -> Iterator[dict[str, Any]]:
        """Dead letters with the provider batch of their last attempt, in custom_id order."""
        query = (
            sa.select(
                result_table.c.custom_id,
                result_table.c.source_id,
                result_table.c.error_class,
                result_table.c.error_code,
                result_table.c.error_message,
                result_table.c.attempts,
                shard_table.c.provider_batch_id.label("last_provider_batch"),
            )
            .select_from(
                result_table.outerjoin(
                    shard_table, shard_table.c.shard_id == result_table.c.shard_id
                )
            )
            .where(result_table.c.job_id == job_id, result_table.c.status == DEAD_LETTER)
            .order_by(result_table.c.custom_id)
        )
        with self.engine.connect() as conn:
            for row in conn.execution_options(yield_per=CHUNK).execute(query):
                yield dict(row._mapping)

    @contextlib.contextmanager
    def replacing_outputs(self, job_id: str) -> Iterator[Callable[[list[tuple[Any, ...]]], None]]:
        """Replace a job's validated outputs as a whole: the block hands over batches of
        (custom_id, source_id, prompt_version, model_name, output_json) and the new set
        replaces the old in one transaction, committed when the block ends without error.

        On PostgreSQL a thread of its own copies each batch in while the caller makes the
        next one. SQLite takes one writer at a time and the caller writes the ledger too, so
        there the batches are spooled to a file and written when the block ends.
        """
        keys = ("custom_id", "source_id", "prompt_version", "model_name", "output_json")
        if self.engine.dialect.name != "postgresql":
            with tempfile.TemporaryFile() as spool:

                def spooled() -> Iterator[dict[str, Any]]:
                    spool.seek(0)
                    while True:
                        try:
                            batch = pickle.load(spool)  # our own file, written below
                        except EOFError:
                            return
                        for values in batch:
                            yield dict(zip(keys, values, strict=True))

                yield lambda batch: pickle.dump(batch, spool)
                self.replace_outputs(job_id, spooled())
            return
        now = copy_text(utcnow())  # once, not per row
        columns = [*keys, "job_id", "created_at"]
        with self.engine.connect() as conn, conn.begin():
            conn.execute(sa.delete(output_table).where(output_table.c.job_id == job_id))
            bulk = _Bulk(conn)

            def copy(batch: list[tuple[Any, ...]]) -> None:
                bulk.copy(output_table.name, columns, ((*row, job_id, now) for row in batch))

            with BackgroundWriter() as writer:
                yield lambda batch: writer.submit(functools.partial(copy, batch))

    def replace_outputs(self, job_id: str, rows: Iterable[dict[str, Any]]) -> int:
        """The validated outputs of a job (string values), replaced as a whole in one
        transaction."""
        now = utcnow()
        written = 0
        with self.begin() as conn:
            conn.execute(sa.delete(output_table).where(output_table.c.job_id == job_id))
            bulk = _Bulk(conn)
            # Outputs are strings; the one timestamp is encoded once, not per row.
            stamp = copy_text(now) if bulk.postgres else bulk.value(now)
            for chunk in chunked(rows, BULK_CHUNK):
                keys = list(chunk[0])
                columns = [*keys, "job_id", "created_at"]
                values = ([row.get(k) for k in keys] + [job_id, stamp] for row in chunk)
                if bulk.postgres:
                    bulk.copy(output_table.name, columns, values)
                else:
                    marks = ", ".join("?" for _ in columns)
                    bulk.executemany(
                        f"INSERT INTO {output_table.name} ({', '.join(columns)}) VALUES ({marks})",
                        values,
                        encoded=True,
                    )
                written += len(chunk)
        return written

    def recent_outputs(
        self, pipeline: str, before: dt.date, partitions: int
    ) -> Iterator[dict[str, Any]]:
        """Validated outputs of the pipeline's latest jobs on the `partitions` days before."""
        days = (
            sa.select(job_table.c.partition_date)
            .where(job_table.c.pipeline == pipeline, job_table.c.partition_date < before)
            .distinct()
            .order_by(job_table.c.partition_date.desc())
            .limit(partitions)
        ).subquery()
        query = (
            sa.select(output_table.c.output_json)
            .join(job_table, job_table.c.job_id == output_table.c.job_id)
            .where(job_table.c.partition_date.in_(sa.select(days.c.partition_date)))
        )
        with self.engine.connect() as conn:
            for row in conn.execution_options(yield_per=CHUNK).execute(query):
                yield dict(row._mapping)
