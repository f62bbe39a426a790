"""Bulk writes: many rows per statement without per-row SQLAlchemy work, and the thread that
runs ledger writes while the caller prepares the next chunk.

PostgreSQL (psycopg 3): rows are COPYed into a temporary table, in binary COPY encoded by
psycopg's C code from the ledger's column types, and applied by one set-based statement.
SQLite: one executemany of plain tuples on the raw connection, with datetimes encoded as
SQLAlchemy stores them.
"""

import contextlib
import contextvars
import datetime as dt
import functools
import queue
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast

import psycopg
import sqlalchemy as sa
from psycopg.copy import LibpqWriter
from sqlalchemy.engine import Connection

from llm_assets.resources.ledger.tables import Timestamp
from llm_assets.results.rows import COPY_BINARY_HEADER, COPY_BINARY_TRAILER

COPY_BUFFER = 1 << 22
"""Bytes of COPY data psycopg queues in libpq before it waits for them to reach the server
(1 MB by default): each wait gives up the GIL and takes it again, which keeps the writer
thread waiting behind a busy caller."""
HASH_WORK_MEM = "64MB"
"""PostgreSQL work_mem of a statement that joins a staged chunk to a shard's rows by a hash
table: the table of one shard's rows (or of the chunk) is built in memory, in one batch."""
UNIQUE_VIOLATION = "23505"
"""PostgreSQL's SQLSTATE for a duplicate key."""


def _copy_type(column: sa.Column[Any], dialect: sa.Dialect) -> str:
    """The PostgreSQL type a column's binary COPY field is encoded as."""
    kind = column.type.dialect_impl(dialect)
    if isinstance(kind, sa.BigInteger):
        return "int8"
    if isinstance(kind, sa.Integer):
        return "int4"
    if isinstance(kind, sa.Float):
        return "float8"
    if isinstance(kind, sa.DateTime):
        return "timestamptz" if kind.timezone else "timestamp"
    if isinstance(kind, sa.Date):
        return "date"
    if isinstance(kind, sa.String):
        return "text"
    raise TypeError(f"no binary COPY type for {column.table.name}.{column.name} ({kind})")


class Bulk:
    """Writes of many rows inside the caller's transaction (see the module)."""

    STAGE = "pg_temp.llm_stage"

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.postgres = conn.dialect.name == "postgresql"
        # PostgreSQL: parameters bound on the client, as one query text, so that settings and
        # the statement they are for go in one round trip (see execute). The cast: a ledger
        # engine on PostgreSQL always has psycopg 3 as its driver (schema.POSTGRES_DRIVER).
        self.cursor = (
            psycopg.ClientCursor(cast(psycopg.Connection[Any], conn.connection.dbapi_connection))
            if self.postgres
            else conn.connection.cursor()
        )
        self._settings = ""
        when = Timestamp.dialect_impl(conn.dialect).bind_processor(conn.dialect)
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

    def execute(self, statement: str, params: Any = None) -> None:
        """Run a statement, after the settings queued for it (sent in the same round trip:
        the thread that writes the ledger takes the GIL again after each one, and waits for
        it behind a busy main thread). The cursor's rowcount is the statement's."""
        if self._settings:
            statement = f"{self._settings}; {statement}"
            self._settings = ""
        with self._errors(statement):
            if not self.postgres:
                self.cursor.execute(statement, params or ())
                return
            self.cursor.execute(statement, params or None)
            # psycopg 3 shows the first result of several statements: move to the last one.
            while self.cursor.nextset():
                pass

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

    def fetch_count(self) -> int:
        """The single number the last statement returned."""
        row = self.cursor.fetchone()
        if row is None:
            raise RuntimeError("the statement returned no row to count")
        return int(row[0])

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
            self.copy(table, columns, rows, into=self.STAGE)

    def copy(
        self,
        table: sa.Table,
        columns: Sequence[str],
        rows: Iterable[Sequence[Any]],
        *,
        into: str | None = None,
    ) -> None:
        """PostgreSQL: COPY rows into `table` (or into `into`, a table of the same column
        types), as binary COPY that psycopg encodes row by row in C from the columns' types:
        no text for the server to parse. Values are of their column's Python type (datetimes
        aware, not text); None is NULL."""
        assert self.postgres
        types = [_copy_type(table.c[name], self.conn.dialect) for name in columns]
        statement = f"COPY {into or table.name} ({', '.join(columns)}) FROM STDIN (FORMAT binary)"
        with self._errors(statement), self._copying(statement) as copy:
            copy.set_types(types)
            write_row = copy.write_row
            for row in rows:
                write_row(row)

    def copy_binary(self, table: str, columns: Sequence[str], tuples: Sequence[bytes]) -> None:
        """PostgreSQL: COPY tuples of binary COPY (made for the table's column types) into a
        table, handed to psycopg as one block with the format's header and trailer."""
        assert self.postgres
        statement = f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT binary)"
        with self._errors(statement), self._copying(statement) as copy:
            copy.write(b"".join((COPY_BINARY_HEADER, *tuples, COPY_BINARY_TRAILER)))

    def _copying(self, statement: str) -> Any:
        """A COPY ... FROM STDIN of the cursor, its data queued in libpq up to COPY_BUFFER."""
        assert isinstance(self.cursor, psycopg.ClientCursor)
        return self.cursor.copy(
            statement, writer=LibpqWriter(self.cursor, flush_threshold=COPY_BUFFER)
        )

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], *, encoded: bool = False) -> int:
        """SQLite: one statement over many tuples; the rows it changed. `encoded`: the rows
        hold no datetimes (or hold them encoded already), so they are passed as they are."""
        if not encoded:
            rows = [tuple(self.value(v) for v in row) for row in rows]
        with self._errors(sql):
            # The cast: on SQLite the raw cursor is sqlite3's, whose executemany streams any
            # iterable (SQLAlchemy's DBAPI protocol asks for a sequence).
            cast(sqlite3.Cursor, self.cursor).executemany(sql, rows)
        return max(self.cursor.rowcount, 0)

    def insert_ignoring_existing(
        self, table: sa.Table, columns: Sequence[str], rows: Sequence[Sequence[Any]], key: str
    ) -> int:
        """Insert rows whose unique `key` constraint is free; returns how many went in. On
        SQLite the rows' datetimes are encoded already (`value`).

        PostgreSQL: callers leave out what the ledger already holds, so the rows are first
        COPYed straight into the table (heap pages written in batches, no speculative
        insertion). Only when one exists after all (a run beside this one wrote it) is that
        undone and the rows staged and inserted by one statement that skips the existing
        ones."""
        names = ", ".join(columns)
        if not self.postgres:
            marks = ", ".join("?" for _ in columns)
            return self.executemany(
                f"INSERT INTO {table.name} ({names}) VALUES ({marks}) ON CONFLICT DO NOTHING",
                rows,
                encoded=True,
            )
        self.execute("SAVEPOINT llm_direct_copy")
        try:
            self.copy(table, columns, rows)
        except sa.exc.IntegrityError as exc:
            if getattr(exc.orig, "sqlstate", None) != UNIQUE_VIOLATION:
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


class BackgroundWriter:
    """Runs ledger writes one after another on a thread of their own, so the database (another
    process, or SQLite's C code, both without the GIL) works while the caller prepares the
    next chunk. At most `depth` writes wait; the first error is raised in the caller, at the
    next submit or at the end, and nothing after it runs."""

    def __init__(self, depth: int = 2) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="ledger-writer", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            queued = self._queue.get()
            if queued is None:
                return
            task, skipped = queued
            if self._error is None:
                try:
                    task()
                except BaseException as exc:  # handed to the caller
                    self._error = exc
            elif skipped is not None:
                with contextlib.suppress(Exception):
                    skipped()

    def submit(self, task: Any, *, skipped: Any = None) -> None:
        """Queue a write; it runs in the caller's context (the locks it holds fence it).
        `skipped` is called instead when an earlier write failed (to clean up after it)."""
        self._raise()
        self._queue.put((functools.partial(contextvars.copy_context().run, task), skipped))

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
