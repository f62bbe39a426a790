"""Engines and the schema: one engine per URL (and connection limits) per process, tables made
on first use, older ledgers upgraded in place, and a ledger newer than this code refused."""

import contextlib
import dataclasses
import functools
import pathlib
import threading
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from llm_assets.resources.ledger.records import utcnow
from llm_assets.resources.ledger.tables import (
    RESULT_FILLFACTOR,
    metadata,
    output_table,
    result_table,
    schema_version,
)
from llm_assets.util.secrecy import mask_url

SCHEMA_VERSION = 14
TEMP_BUFFERS = "64MB"
"""PostgreSQL temp_buffers of the ledger's sessions: a staged chunk of results stays in memory."""
SQLITE_MIN = (3, 33, 0)
"""The oldest SQLite the ledger runs on: an import applies results with UPDATE ... FROM."""


@dataclasses.dataclass(frozen=True)
class ConnectionLimits:
    """How long a PostgreSQL ledger connection may take to open, how soon a dead server or a
    silently dropped connection is noticed (TCP keepalives: after `keepalives_idle_seconds`
    of silence, `keepalives_count` probes `keepalives_interval_seconds` apart), and how long
    one statement may run before the server cancels it (0: no limit).

    The statement limit is far above the longest legitimate statement (a million-item day's
    bulk statements take tens of seconds): it ends a statement stuck behind a lock or a lost
    server, never a slow import. A setting given in the URL's query wins over these."""

    connect_timeout_seconds: int = 10
    statement_timeout_seconds: float = 900.0
    keepalives_idle_seconds: int = 30
    keepalives_interval_seconds: int = 10
    keepalives_count: int = 3

    def connect_args(self, url: sa.URL) -> dict[str, Any]:
        """The libpq connection parameters of these limits, less those the URL sets."""
        args = {
            "connect_timeout": self.connect_timeout_seconds,
            "keepalives": 1,
            "keepalives_idle": self.keepalives_idle_seconds,
            "keepalives_interval": self.keepalives_interval_seconds,
            "keepalives_count": self.keepalives_count,
        }
        return {name: value for name, value in args.items() if name not in url.query}


DEFAULT_LIMITS = ConnectionLimits()


class LedgerUnavailable(RuntimeError):
    """The ledger's database cannot be reached; the message shows its URL password-masked."""


_engines: dict[tuple[str, ConnectionLimits], Engine] = {}
_engines_lock = threading.Lock()


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _postgres_session(limits: ConnectionLimits, dbapi_connection: Any, _record: Any) -> None:
    """Room for an import's staging table (a chunk of results) in the session's temporary
    buffers, so it is never written out and read back; settable only before a session's
    first temporary table, so it is set when the connection opens. The statement limit is
    set here too, so it does not replace the `options` a URL may carry."""
    cursor = dbapi_connection.cursor()
    cursor.execute(f"SET temp_buffers = '{TEMP_BUFFERS}'")
    cursor.execute(f"SET statement_timeout = {int(limits.statement_timeout_seconds * 1000)}")
    # The ledger's statements read by index, or whole days set-based: JIT compiling them
    # costs more than it saves.
    cursor.execute("SET jit = off")
    # COPY data is sent as UTF-8 bytes, made in worker processes that do not know the session.
    cursor.execute("SET client_encoding = 'UTF8'")
    cursor.close()
    dbapi_connection.commit()


def _check_sqlite_version() -> None:
    import sqlite3

    if sqlite3.sqlite_version_info < SQLITE_MIN:
        raise RuntimeError(
            f"the SQLite ledger needs SQLite {'.'.join(map(str, SQLITE_MIN))} or newer "
            f"(UPDATE ... FROM); this Python's sqlite3 module has {sqlite3.sqlite_version}. "
            "Use a Python built with a newer SQLite, or a PostgreSQL ledger."
        )


POSTGRES_DRIVER = "psycopg"
"""The driver of a PostgreSQL ledger (its bulk writes use psycopg 3's COPY)."""
POSTGRES_FORMS = ("postgresql://", "postgresql+psycopg2://", "postgresql+psycopg://")
"""The forms of a PostgreSQL ledger URL: each one opens the ledger with POSTGRES_DRIVER."""


def ledger_url(url: str) -> sa.URL:
    """The URL the ledger connects with: a PostgreSQL URL in any of POSTGRES_FORMS opens it
    with the ledger's driver; a PostgreSQL URL of another driver is refused before anything
    runs, naming the forms that work."""
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() != "postgresql":
        return parsed
    if parsed.drivername not in {form.removesuffix("://") for form in POSTGRES_FORMS}:
        forms = ", ".join(f"{form}..." for form in POSTGRES_FORMS)
        raise ValueError(
            f"the ledger cannot use the PostgreSQL driver of {parsed.drivername}:// "
            f"(LLM_ASSETS_DATABASE_URL); write the URL as one of {forms} "
            f"(each opens it with {POSTGRES_DRIVER})"
        )
    return parsed.set(drivername=f"postgresql+{POSTGRES_DRIVER}")


def get_engine(url: str, limits: ConnectionLimits = DEFAULT_LIMITS) -> Engine:
    """One engine per URL and limits per process, with SQLite set up for concurrent runs and
    PostgreSQL connections under `limits`."""
    with _engines_lock:
        engine = _engines.get((url, limits))
        if engine is None:
            if url.startswith("sqlite"):
                _check_sqlite_version()
                path = sa.engine.make_url(url).database
                if path and path != ":memory:":
                    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
                engine = sa.create_engine(url, connect_args={"timeout": 30})
                sa.event.listen(engine, "connect", _sqlite_pragmas)
            else:
                parsed = ledger_url(url)
                engine = sa.create_engine(
                    parsed, pool_pre_ping=True, connect_args=limits.connect_args(parsed)
                )
                sa.event.listen(engine, "connect", functools.partial(_postgres_session, limits))
            _engines[(url, limits)] = engine
        return engine


def dispose_engines(url: str) -> None:
    """Close and forget this process's engines of `url` (whatever their limits)."""
    with _engines_lock:
        for key in [key for key in _engines if key[0] == url]:
            _engines.pop(key).dispose()


def dialect_insert(conn: Connection, table: sa.Table) -> Any:
    """A dialect insert that supports ON CONFLICT on both SQLite and PostgreSQL."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


@contextlib.contextmanager
def durable_begin(engine: Engine) -> Iterator[Connection]:
    """A transaction whose commit is on disk when the block ends, whatever happens to the
    machine next. PostgreSQL commits that way already. The SQLite ledger runs WAL with
    synchronous=NORMAL, where a power loss can undo the last commits; here its connection
    syncs the WAL at commit (synchronous=FULL) for this one transaction and is set back
    after it, so a write that must outlive what follows it costs one sync and the bulk
    writes none. The pragma goes to the driver's connection directly, outside any
    transaction (SQLite refuses to change it inside one)."""
    with engine.connect() as conn:
        raw = conn.connection.driver_connection if conn.dialect.name == "sqlite" else None
        before = None
        if raw is not None:
            before = raw.execute("PRAGMA synchronous").fetchone()[0]
            raw.execute("PRAGMA synchronous=FULL")
        try:
            with conn.begin():
                yield conn
        finally:
            if raw is not None and before is not None:
                raw.execute(f"PRAGMA synchronous={int(before)}")


_schema_lock = threading.Lock()
"""Threads of one process that open a ledger at once create its tables one after another
(the cache below does not hold them back), so none of them fails on a table the other just
made."""


@functools.cache
def ensure_schema(url: str, limits: ConnectionLimits = DEFAULT_LIMITS) -> bool:
    """Create the tables once per URL and process, upgrading an older ledger in place; a
    database that cannot be reached is LedgerUnavailable, its URL shown password-masked."""
    with _schema_lock:
        return _create_or_upgrade(url, limits)


def _create_or_upgrade(url: str, limits: ConnectionLimits) -> bool:
    engine = get_engine(url, limits)
    try:
        with engine.connect():
            pass
    except sa.exc.OperationalError as exc:
        reason = str(exc.orig).strip() if exc.orig is not None else type(exc).__name__
        raise LedgerUnavailable(
            f"cannot open the ledger at {mask_url(url)} (LLM_ASSETS_DATABASE_URL): {reason}"
        ) from None
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
                f"the ledger at {mask_url(url)} has schema "
                f"version {found}, newer than this code's {SCHEMA_VERSION}; upgrade llm-assets"
            )
        if found is not None and found < SCHEMA_VERSION:
            _add_missing_columns(conn)
            _upgrade_indexes(conn)
        if found is None or found < SCHEMA_VERSION:
            conn.execute(
                dialect_insert(conn, schema_version)
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
    """Version 3 has no status index on items (see result_table) and leaves room in result
    pages; versions 4 and 5 leave more (RESULT_FILLFACTOR; pages written before keep what they
    had). From version 5 items and outputs have no foreign key to their job, and from version
    14 outputs have no surrogate key (SQLite keeps both in tables made before: it cannot drop
    a constraint or a key column without rebuilding the table; there the key is the rowid)."""
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
        conn.execute(sa.text(f"ALTER TABLE {output_table.name} DROP COLUMN IF EXISTS id"))
