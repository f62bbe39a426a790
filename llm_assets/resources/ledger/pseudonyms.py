"""Compliance in the ledger: the placeholders of pseudonymized items and the values they
stand for (kept here only, never sent), and how many items the personal-data policy blocked.

An item has one mapping: that of the request line it has now. Placeholders are numbered per
prompt (`<EMAIL_1>`), so a line rendered again from a changed row reuses them for other
values; the new mapping replaces the old one in the transaction that records the item with
its new line (a new shard's items, a requeue), so an item is never pointed at a line while
the ledger holds another line's mapping for it. Validation restores an answer with the
item's mapping, and that is the mapping of the line the answer is to, with no attempt
column:

- a retry round sends the item's line again byte for byte (read back at `request_offset`),
  so its placeholders are the same;
- a line is rendered again only for an item no answer can reach: one never sent (new to the
  ledger), or a dead letter being requeued. A terminal item takes no result (results.py
  `_guard`), and it became a dead letter through the import of the shard it was last sent
  in (or before it was sent), so whatever it takes after the requeue is an answer to the
  new line.
"""

import json
from collections.abc import Mapping, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from llm_assets.resources.ledger import limits
from llm_assets.resources.ledger.records import utcnow
from llm_assets.resources.ledger.schema import dialect_insert
from llm_assets.resources.ledger.tables import pseudonym_table, result_table
from llm_assets.util.parallel import chunked

_p = pseudonym_table.c
_r = result_table.c

Mappings = Mapping[str, Mapping[str, str]]
"""custom_id → {placeholder: value} of items' request lines."""


def record_pseudonyms(
    conn: Connection, job_id: str, mappings: Mappings, rendered: Sequence[str] = ()
) -> None:
    """In the caller's transaction, the one that points the items at their new lines: the
    items of `mappings` get those placeholders, and the items of `rendered` (lines rendered
    anew) lose what an earlier rendering of their line left."""
    for chunk in chunked(rendered, limits.CHUNK):
        conn.execute(sa.delete(pseudonym_table).where(_p.job_id == job_id, _p.custom_id.in_(chunk)))
    if not mappings:
        return
    now = utcnow()
    rows = [
        {"job_id": job_id, "custom_id": cid, "mapping_json": json.dumps(dict(m)), "created_at": now}
        for cid, m in mappings.items()
    ]
    insert = dialect_insert(conn, pseudonym_table)
    conn.execute(
        insert.on_conflict_do_update(
            index_elements=["job_id", "custom_id"],
            set_={"mapping_json": insert.excluded.mapping_json, "created_at": now},
        ),
        rows,
    )


def has_pseudonyms(engine: Engine, job_id: str) -> bool:
    """Whether the ledger holds any mapping of the job's items."""
    query = sa.select(sa.exists().where(_p.job_id == job_id))
    with engine.connect() as conn:
        return bool(conn.execute(query).scalar())


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
