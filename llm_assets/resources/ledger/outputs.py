"""Validated outputs: a job's set replaced as a whole, and the latest days' read back."""

import contextlib
import datetime as dt
import functools
import pickle
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from llm_assets.resources.ledger import limits
from llm_assets.resources.ledger.bulk import BackgroundWriter, Bulk
from llm_assets.resources.ledger.records import utcnow
from llm_assets.resources.ledger.tables import job_table, output_table
from llm_assets.util.parallel import chunked

OUTPUT_KEYS = ("custom_id", "source_id", "prompt_version", "model_name", "output_json")
"""The values of an output row, in the order replacing_outputs takes them."""

OutputWriter = Callable[[list[tuple[Any, ...]]], None]


@contextlib.contextmanager
def replacing_outputs(engine: Engine, job_id: str) -> Iterator[OutputWriter]:
    """Replace a job's validated outputs as a whole: the block hands over batches of
    OUTPUT_KEYS tuples and the new set replaces the old in one transaction, committed when
    the block ends without error.

    On PostgreSQL a thread of its own copies each batch in while the caller makes the next
    one. SQLite takes one writer at a time and the caller writes the ledger too, so there the
    batches are spooled to a file and written when the block ends.
    """
    if engine.dialect.name != "postgresql":
        with tempfile.TemporaryFile() as spool:
            yield lambda batch: pickle.dump(batch, spool)
            replace_outputs(engine, job_id, _spooled(spool))
        return
    now = utcnow()
    columns = [*OUTPUT_KEYS, "job_id", "created_at"]
    with engine.connect() as conn, conn.begin():
        conn.execute(sa.delete(output_table).where(output_table.c.job_id == job_id))
        bulk = Bulk(conn)

        def copy(batch: list[tuple[Any, ...]]) -> None:
            bulk.copy(output_table, columns, ((*row, job_id, now) for row in batch))

        with BackgroundWriter() as writer:
            yield lambda batch: writer.submit(functools.partial(copy, batch))


def _spooled(spool: Any) -> Iterator[dict[str, Any]]:
    """The output rows of the batches pickled into a spool file (our own file)."""
    spool.seek(0)
    while True:
        try:
            batch = pickle.load(spool)
        except EOFError:
            return
        for values in batch:
            yield dict(zip(OUTPUT_KEYS, values, strict=True))


def replace_outputs(engine: Engine, job_id: str, rows: Iterable[dict[str, Any]]) -> int:
    """The validated outputs of a job (string values), replaced as a whole in one
    transaction."""
    now = utcnow()
    written = 0
    with engine.begin() as conn:
        conn.execute(sa.delete(output_table).where(output_table.c.job_id == job_id))
        bulk = Bulk(conn)
        # Outputs are strings; the one timestamp is encoded once, not per row (SQLite).
        stamp = bulk.value(now)
        for chunk in chunked(rows, limits.BULK_CHUNK):
            keys = list(chunk[0])
            columns = [*keys, "job_id", "created_at"]
            values = ([row.get(k) for k in keys] + [job_id, stamp] for row in chunk)
            if bulk.postgres:
                bulk.copy(output_table, columns, values)
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
    engine: Engine, pipeline: str, before: dt.date, partitions: int
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
    with engine.connect() as conn:
        for row in conn.execution_options(yield_per=limits.CHUNK).execute(query):
            yield dict(row._mapping)


def job_outputs(engine: Engine, job_id: str) -> Iterator[tuple[str, str]]:
    """(custom_id, output_json) of each validated output of a job."""
    query = sa.select(output_table.c.custom_id, output_table.c.output_json).where(
        output_table.c.job_id == job_id
    )
    with engine.connect() as conn:
        for row in conn.execution_options(yield_per=limits.CHUNK).execute(query):
            yield row.custom_id, row.output_json
