"""Day summaries sent: one row per (pipeline, day, fingerprint), claimed before it is sent.

Every process that may announce a day (the notification sensors of any daemon, on any tick,
for any run) claims the summary's fingerprint here first; the unique key makes the claim
atomic on SQLite and PostgreSQL alike, and only the process whose insert made the row sends
it. A summary is claimed, then sent: a process that dies in between loses that one
notification rather than sending it twice.
"""

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from llm_assets.resources.ledger.records import utcnow
from llm_assets.resources.ledger.schema import dialect_insert
from llm_assets.resources.ledger.tables import notification_table

_n = notification_table.c


def claim_notification(
    engine: Engine,
    *,
    pipeline: str,
    partition_date: dt.date,
    fingerprint: str,
    outcome: str,
    text: str,
    job_id: str | None = None,
    run_id: str | None = None,
) -> bool:
    """Record the day's summary of this fingerprint; True only for the one caller whose
    insert made the row (it sends the summary), False when it was claimed before."""
    with engine.begin() as conn:
        insert = (
            dialect_insert(conn, notification_table)
            .values(
                pipeline=pipeline,
                partition_date=partition_date,
                job_id=job_id,
                fingerprint=fingerprint,
                outcome=outcome,
                run_id=run_id,
                text=text,
                created_at=utcnow(),
            )
            .on_conflict_do_nothing(index_elements=["pipeline", "partition_date", "fingerprint"])
        )
        if conn.dialect.name == "postgresql":
            # The driver reports no row count for this insert; the id it returns tells.
            return conn.execute(insert.returning(_n.id)).first() is not None
        return conn.execute(insert).rowcount == 1


def record_delivery(
    engine: Engine, pipeline: str, partition_date: dt.date, fingerprint: str, error: str | None
) -> None:
    """When the claimed summary was sent, or why it could not be (the webhook's answer)."""
    with engine.begin() as conn:
        conn.execute(
            sa.update(notification_table)
            .where(
                _n.pipeline == pipeline,
                _n.partition_date == partition_date,
                _n.fingerprint == fingerprint,
            )
            .values(delivered_at=utcnow(), delivery_error=error)
        )


def sent_notifications(
    engine: Engine, pipeline: str, partition_date: dt.date
) -> list[dict[str, Any]]:
    """The day's summaries sent, oldest first."""
    query = (
        sa.select(notification_table)
        .where(_n.pipeline == pipeline, _n.partition_date == partition_date)
        .order_by(_n.id)
    )
    with engine.connect() as conn:
        return [dict(row._mapping) for row in conn.execute(query)]
