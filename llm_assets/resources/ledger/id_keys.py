"""The ledger's own id key: what custom_ids are derived with when no key is configured (the
demo, tests, a fresh machine). Made at random once per ledger, never a fixed default, and
kept, so every run and process of the ledger derives the same ids."""

import secrets

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from llm_assets.resources.ledger.records import utcnow
from llm_assets.resources.ledger.schema import dialect_insert
from llm_assets.resources.ledger.tables import id_key_table

CUSTOM_ID_KEY = "custom_id"
_k = id_key_table.c


def ledger_id_key(engine: Engine) -> str:
    """The ledger's key for custom_ids, made on first use. Two processes that make one at
    once both read the one that was stored first."""
    query = sa.select(_k.key).where(_k.name == CUSTOM_ID_KEY)
    with engine.connect() as conn:
        found = conn.execute(query).scalar()
    if found is not None:
        return str(found)
    with engine.begin() as conn:
        conn.execute(
            dialect_insert(conn, id_key_table)
            .values(name=CUSTOM_ID_KEY, key=secrets.token_hex(32), created_at=utcnow())
            .on_conflict_do_nothing()
        )
        return str(conn.execute(query).scalar_one())
