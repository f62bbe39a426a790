"""Compliance in the ledger: the placeholders of pseudonymized items and the values they
stand for (kept here only, never sent), and how many items the personal-data policy blocked.
"""

import json
from collections.abc import Mapping, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from llm_assets.resources.ledger.records import utcnow
from llm_assets.resources.ledger.schema import dialect_insert
from llm_assets.resources.ledger.tables import pseudonym_table, result_table

_p = pseudonym_table.c
_r = result_table.c


def add_pseudonyms(engine: Engine, job_id: str, mappings: Mapping[str, Mapping[str, str]]) -> None:
    """Record items' placeholders and values, by custom_id; an item recorded before (a re-run
    renders the same placeholders) is left as it is."""
    if not mappings:
        return
    now = utcnow()
    rows = [
        {"job_id": job_id, "custom_id": cid, "mapping_json": json.dumps(dict(m)), "created_at": now}
        for cid, m in mappings.items()
    ]
    with engine.begin() as conn:
        conn.execute(
            dialect_insert(conn, pseudonym_table).on_conflict_do_nothing(
                index_elements=["job_id", "custom_id"]
            ),
            rows,
        )


def pseudonyms(
    engine: Engine, job_id: str, custom_ids: Sequence[str] | None = None
) -> dict[str, dict[str, str]]:
    """custom_id → {placeholder: value} of the job's pseudonymized items (of `custom_ids` only,
    when given)."""
    query = sa.select(_p.custom_id, _p.mapping_json).where(_p.job_id == job_id)
    if custom_ids is not None:
        query = query.where(_p.custom_id.in_(list(custom_ids)))
    with engine.connect() as conn:
        return {cid: json.loads(mapping) for cid, mapping in conn.execute(query)}


def compliance_counts(engine: Engine, job_id: str) -> tuple[int, int]:
    """(items the personal-data policy blocked, all items) of the job."""
    query = sa.select(
        sa.func.count().filter(_r.error_class == "compliance"), sa.func.count()
    ).where(_r.job_id == job_id)
    with engine.connect() as conn:
        blocked, total = conn.execute(query).one()
    return int(blocked), int(total)
