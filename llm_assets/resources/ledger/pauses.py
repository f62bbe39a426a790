"""Pipeline pauses: one row per pipeline an operator ever paused, set while it is paused.

Pausing and resuming are idempotent and atomic on SQLite and PostgreSQL alike: a pause only
takes a row that is not paused (the first pause's who, when and why stay), and a resume only
clears one that is, so two operators doing the same at once get one pause or one resume.
"""

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from llm_assets.resources.ledger.records import PipelinePause, utcnow
from llm_assets.resources.ledger.schema import dialect_insert
from llm_assets.resources.ledger.tables import pipeline_state_table

_p = pipeline_state_table.c
_PAUSE = sa.select(pipeline_state_table).where(
    _p.pipeline == sa.bindparam("pipeline"), _p.paused_at.is_not(None)
)
"""Built once: every look at a day asks whether its pipeline is paused."""


def pipeline_pause(engine: Engine, pipeline: str) -> PipelinePause | None:
    """The pause in force for the pipeline, None when it is not paused."""
    with engine.connect() as conn:
        row = conn.execute(_PAUSE, {"pipeline": pipeline}).first()
    return PipelinePause.model_validate(row._mapping) if row else None


def pause_pipeline(
    engine: Engine, pipeline: str, *, paused_by: str, reason: str = ""
) -> tuple[PipelinePause, bool]:
    """Pause the pipeline; returns the pause in force and whether this call made it (False
    when it was paused already: that pause is kept as it was)."""
    values = {"paused_at": utcnow(), "paused_by": paused_by[:128], "reason": reason}
    with engine.begin() as conn:
        insert = dialect_insert(conn, pipeline_state_table).values(pipeline=pipeline, **values)
        upsert = insert.on_conflict_do_update(
            index_elements=["pipeline"],
            set_={**values, "resumed_at": None, "resumed_by": None},
            where=_p.paused_at.is_(None),
        )
        if conn.dialect.name == "postgresql":
            # The driver reports no row count for this statement; the key it returns tells.
            made = conn.execute(upsert.returning(_p.pipeline)).first() is not None
        else:
            made = conn.execute(upsert).rowcount == 1
    pause = pipeline_pause(engine, pipeline)
    assert pause is not None
    return pause, made


def resume_pipeline(engine: Engine, pipeline: str, *, resumed_by: str) -> PipelinePause | None:
    """Resume the pipeline; returns the pause this call ended, None when it was not paused."""
    with engine.begin() as conn:
        row = conn.execute(
            sa.select(pipeline_state_table).where(
                _p.pipeline == pipeline, _p.paused_at.is_not(None)
            )
        ).first()
        if row is None:
            return None
        ended = conn.execute(
            sa.update(pipeline_state_table)
            .where(_p.pipeline == pipeline, _p.paused_at.is_not(None))
            .values(
                paused_at=None,
                paused_by=None,
                reason=None,
                resumed_at=utcnow(),
                resumed_by=resumed_by[:128],
            )
        ).rowcount
    return PipelinePause.model_validate(row._mapping) if ended else None
