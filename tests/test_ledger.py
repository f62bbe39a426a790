"""The SQL ledger on SQLite and PostgreSQL: schema, idempotent writes and the item state machine.

Every test takes the `database_url` fixture (through `ledger`), so each one runs against a fresh
SQLite file and a fresh PostgreSQL schema.
"""

import concurrent.futures
import datetime as dt
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from llm_assets.resources import ledger as L
from llm_assets.resources.ledger import (
    DEAD_LETTER,
    PENDING,
    RETRY,
    SCHEMA_VERSION,
    SUBMITTED,
    SUCCEEDED,
    JobRecord,
    LedgerResource,
    ShardMismatch,
    UpsertStats,
    limits,
    schema,
    tables,
)
from llm_assets.resources.ledger import items as items_module
from llm_assets.resources.ledger.bulk import Bulk
from llm_assets.resources.ledger.results import RESULT_DEFAULTS
from llm_assets.util.parallel import chunked
from tests.conftest import DATABASES
from tests.ledger_helpers import schema_version, set_item_status, shards_in_states

DAY = dt.date(2024, 5, 1)
JOB = "reviews-20240501-abc"
TABLES = {"llm_batch_job", "llm_batch_shard", "llm_batch_result", "llm_schema_version"}
SMALL_CHUNK = 7


# --------------------------------------------------------------------------- fixtures / helpers


@pytest.fixture
def ledger(database_url: str) -> Iterator[LedgerResource]:
    yield LedgerResource(database_url=database_url)
    # The engine cache is per process; drop this test's engine so no pool outlives the test.
    L.dispose_engines(database_url)


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> int:
    """Make every chunked loop of the ledger work in chunks of SMALL_CHUNK rows."""
    monkeypatch.setattr(limits, "CHUNK", SMALL_CHUNK)
    monkeypatch.setattr(limits, "BULK_CHUNK", SMALL_CHUNK)
    # The ledger passes CHUNK or BULK_CHUNK to `chunked` at each call, so these two reach it.
    assert [len(c) for c in chunked(range(2 * SMALL_CHUNK + 1), limits.CHUNK)] == [
        SMALL_CHUNK,
        SMALL_CHUNK,
        1,
    ]
    return SMALL_CHUNK


def job_kwargs(job_id: str = JOB, **over: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "job_id": job_id,
        "pipeline": "reviews",
        "partition_date": DAY,
        "task_type": "classify",
        "provider": "openai",
        "model_name": "gpt-test",
        "prompt_version": "v1",
        "code_version": "code-1",
        "created_by": "tests",
    }
    values.update(over)
    return values


def make_job(ledger: LedgerResource, job_id: str = JOB, **over: Any) -> JobRecord:
    return ledger.get_or_create_job(**job_kwargs(job_id, **over))


def shard_id(round_no: int, index: int, job_id: str = JOB) -> str:
    return f"{job_id}-r{round_no:02d}-s{index:05d}"


def shard_row(
    round_no: int = 0, index: int = 0, *, item_count: int = 0, job_id: str = JOB
) -> dict[str, Any]:
    sid = shard_id(round_no, index, job_id)
    return {
        "shard_id": sid,
        "job_id": job_id,
        "round": round_no,
        "shard_index": index,
        "input_uri": f"file:///shards/{sid}.jsonl",
        "item_count": item_count,
        "size_bytes": 100 * item_count,
        "content_sha256": "0" * 64,
        "provider": "openai",
    }


def cid(n: int) -> str:
    return f"20240501_item-{n:03d}"


def item_row(
    custom_id: str,
    *,
    shard: str | None = None,
    status: str = PENDING,
    job_id: str = JOB,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "custom_id": custom_id,
        "source_id": f"src-{custom_id}",
        "shard_id": shard,
        "status": status,
        "model_name": "gpt-test",
        **extra,
    }


def result_row(
    custom_id: str,
    status: str,
    *,
    text: str | None = None,
    error_class: str | None = None,
    error_code: str | None = None,
    input_tokens: int = 0,
    output_tokens: int = 0,
    cost_usd: float = 0.0,
) -> dict[str, Any]:
    """A normalized provider result, with the same keys the import step writes."""
    return {
        "custom_id": custom_id,
        "status": status,
        "error_class": error_class,
        "error_code": error_code,
        "error_message": f"{error_code} for {custom_id}" if error_code else None,
        "model_name": "gpt-test",
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cost_usd": cost_usd,
        "finish_reason": "stop" if status == SUCCEEDED else None,
        "result_json": text,
    }


def ok(custom_id: str, text: str = "fine", tokens: int = 10, cost: float = 0.25) -> dict[str, Any]:
    return result_row(
        custom_id,
        SUCCEEDED,
        text=text,
        input_tokens=tokens,
        output_tokens=tokens // 2,
        cost_usd=cost,
    )


def dead(custom_id: str, code: str = "bad_request", cls: str = "deterministic") -> dict[str, Any]:
    return result_row(custom_id, DEAD_LETTER, error_class=cls, error_code=code)


def retry(custom_id: str, code: str = "server_error") -> dict[str, Any]:
    return result_row(custom_id, RETRY, error_class="transient", error_code=code)


def add_submitted_shard(
    ledger: LedgerResource,
    n: int,
    *,
    round_no: int = 0,
    index: int = 0,
    first: int = 0,
    batch_id: str = "batch-0",
) -> str:
    """A shard of n items (cid(first)..), uploaded to the provider: items are `submitted`."""
    sid = shard_id(round_no, index)
    ids = [cid(i) for i in range(first, first + n)]
    ledger.add_shard_with_items(
        shard_row(round_no, index, item_count=n), [item_row(c, shard=sid) for c in ids]
    )
    ledger.mark_submitted(sid, batch_id, SUBMITTED)
    return sid


def job_with_shard(ledger: LedgerResource, n: int) -> str:
    """A new job whose shard 0 holds n submitted items, cid(0) to cid(n - 1): the shard's id."""
    make_job(ledger)
    return add_submitted_shard(ledger, n)


def engine_of(url: str) -> sa.Engine:
    return L.get_engine(url)


def table_rows(url: str, table: sa.Table) -> list[dict[str, Any]]:
    order = list(table.primary_key.columns)
    with engine_of(url).connect() as conn:
        return [dict(r._mapping) for r in conn.execute(sa.select(table).order_by(*order))]


def snapshot(url: str) -> dict[str, list[dict[str, Any]]]:
    """Every row of every ledger table, timestamps included: equal snapshots = nothing changed."""
    return {t.name: table_rows(url, t) for t in (L.job_table, L.shard_table, L.result_table)}


def items_by_id(url: str, job_id: str = JOB) -> dict[str, dict[str, Any]]:
    return {r["custom_id"]: r for r in table_rows(url, L.result_table) if r["job_id"] == job_id}


def item_states(url: str, numbers: Iterable[int]) -> list[tuple[str, str | None]]:
    """(status, error_class) of the item cid(n) for each of `numbers`, in their order."""
    items = items_by_id(url)
    return [(items[cid(n)]["status"], items[cid(n)]["error_class"]) for n in numbers]


def state(row: dict[str, Any]) -> dict[str, Any]:
    """An item's business fields, without surrogate keys and timestamps."""
    drop = {"id", "job_id", "created_at", "updated_at"}
    return {k: v for k, v in row.items() if k not in drop}


def table_names(url: str) -> set[str]:
    return set(sa.inspect(engine_of(url)).get_table_names())


def upgraded_from(database_url: str, version: int, *statements: str) -> LedgerResource:
    """The ledger at `database_url` made an older one (`statements` run, `version` recorded)
    and opened again: this code upgrades it to the current schema."""
    with engine_of(database_url).begin() as conn:
        for statement in statements:
            conn.execute(sa.text(statement))
        conn.execute(sa.delete(tables.schema_version))
        conn.execute(
            sa.insert(tables.schema_version).values(version=version, applied_at=L.utcnow())
        )
    schema.ensure_schema.cache_clear()

    upgraded = LedgerResource(database_url=database_url)

    assert schema_version(upgraded) == SCHEMA_VERSION == 14
    return upgraded


def assert_accounted(stats: UpsertStats) -> None:
    """Every received line is applied, a duplicate, unknown or blocked by a terminal row."""
    assert (
        stats.applied + stats.duplicates + stats.unknown + stats.already_terminal == stats.received
    )


# ------------------------------------------------------------------------------------- schema


def test_schema_is_created_on_first_use(ledger: LedgerResource, database_url: str) -> None:
    assert not table_names(database_url) & TABLES
    assert schema_version(ledger) == SCHEMA_VERSION
    assert table_names(database_url) >= TABLES
    versions = table_rows(database_url, tables.schema_version)
    assert [v["version"] for v in versions] == [SCHEMA_VERSION]
    # Items and outputs name their job without a foreign key (a check per inserted row).
    inspector = sa.inspect(engine_of(database_url))
    assert inspector.get_foreign_keys("llm_batch_result") == []
    assert inspector.get_foreign_keys("llm_batch_output") == []
    # An output is its (job_id, custom_id): no serial key to fill per copied row.
    assert [c["name"] for c in inspector.get_columns("llm_batch_output")][:2] == [
        "job_id",
        "custom_id",
    ]
    assert inspector.get_pk_constraint("llm_batch_output")["constrained_columns"] == []
    unique = inspector.get_unique_constraints("llm_batch_output")
    assert [u["column_names"] for u in unique] == [["job_id", "custom_id"]]


def test_schema_creation_is_idempotent(ledger: LedgerResource, database_url: str) -> None:
    make_job(ledger)
    schema.ensure_schema.cache_clear()  # make the second resource really run the creation again
    second = LedgerResource(database_url=database_url)
    assert schema_version(second) == SCHEMA_VERSION
    assert second.get_job(JOB) == ledger.get_job(JOB)
    assert [v["version"] for v in table_rows(database_url, tables.schema_version)] == [
        SCHEMA_VERSION
    ]


def test_newer_schema_version_is_refused(ledger: LedgerResource, database_url: str) -> None:
    assert schema_version(ledger) == SCHEMA_VERSION
    with engine_of(database_url).begin() as conn:
        conn.execute(
            sa.insert(tables.schema_version).values(
                version=SCHEMA_VERSION + 1, applied_at=L.utcnow()
            )
        )
    schema.ensure_schema.cache_clear()
    with pytest.raises(RuntimeError, match="newer than this code") as raised:
        schema_version(LedgerResource(database_url=database_url))
    assert f"schema version {SCHEMA_VERSION + 1}" in str(raised.value)
    assert f"this code's {SCHEMA_VERSION}" in str(raised.value)
    schema.ensure_schema.cache_clear()


def test_result_unique_constraint_is_in_the_database(
    ledger: LedgerResource, database_url: str
) -> None:
    make_job(ledger)
    make_job(ledger, "other-job", prompt_version="v2")
    now = L.utcnow()
    raw = {"custom_id": cid(1), "status": PENDING, "created_at": now, "updated_at": now}
    with engine_of(database_url).begin() as conn:
        conn.execute(sa.insert(L.result_table).values(job_id=JOB, **raw))
        conn.execute(sa.insert(L.result_table).values(job_id="other-job", **raw))
    with pytest.raises(sa.exc.IntegrityError), engine_of(database_url).begin() as conn:
        conn.execute(sa.insert(L.result_table).values(job_id=JOB, **raw))
    assert len(table_rows(database_url, L.result_table)) == 2


# --------------------------------------------------------------------------------------- jobs


def test_get_or_create_job_returns_the_same_row(ledger: LedgerResource, database_url: str) -> None:
    first = make_job(ledger)
    assert first.status == "created"
    assert (first.total_items, first.succeeded_items, first.cost_usd) == (0, 0, 0.0)
    again = make_job(ledger, code_version="code-2", created_by="someone-else")
    assert again == first  # the existing row wins, nothing is overwritten
    assert len(table_rows(database_url, L.job_table)) == 1
    assert ledger.get_job("no-such-job") is None


def test_job_key_is_unique(ledger: LedgerResource, database_url: str) -> None:
    make_job(ledger)
    variants = {
        "pipeline": "other-pipeline",
        "partition_date": DAY + dt.timedelta(days=1),
        "prompt_version": "v2",
        "provider": "anthropic",
        "model_name": "other-model",
    }
    for n, (field, value) in enumerate(variants.items()):
        assert make_job(ledger, f"job-{n}", **{field: value}).job_id == f"job-{n}"
    assert len(table_rows(database_url, L.job_table)) == 1 + len(variants)

    # Same five-part key under another job_id: refused by the database...
    now = L.utcnow()
    clash = {**job_kwargs("clash"), "status": "created", "created_at": now, "updated_at": now}
    with pytest.raises(sa.exc.IntegrityError), engine_of(database_url).begin() as conn:
        conn.execute(sa.insert(L.job_table).values(**clash))
    # ...and by get_or_create_job, which must not hand back a job it did not store.
    with pytest.raises((AssertionError, ValueError, sa.exc.IntegrityError)):
        make_job(ledger, "clash", task_type="summarize")
    assert ledger.get_job("clash") is None
    assert len(table_rows(database_url, L.job_table)) == 1 + len(variants)
    same_day = {j.job_id for j in ledger.jobs_for_partition("reviews", DAY)}
    assert same_day == {JOB, "job-2", "job-3", "job-4"}


# ------------------------------------------------------------------------------ shards, items


def test_add_shard_with_items_is_idempotent(ledger: LedgerResource, database_url: str) -> None:
    make_job(ledger)
    sid = shard_id(0, 0)
    items = [item_row(cid(i), shard=sid) for i in range(3)]
    assert ledger.add_shard_with_items(shard_row(item_count=3), items) == 3

    shard = ledger.get_shard(sid)
    assert shard is not None
    assert (shard.status, shard.item_count, shard.provider_batch_id) == ("created", 3, None)
    rows = items_by_id(database_url)
    assert sorted(rows) == [cid(0), cid(1), cid(2)]
    for c, row in rows.items():
        assert (row["shard_id"], row["status"], row["attempts"]) == (sid, PENDING, 0)
        assert row["source_id"] == f"src-{c}"
    assert ledger.known_items(JOB) == ({f"src-{c}" for c in rows}, set())

    # The shard moves on; replaying the same call (a run that did not hold the day) is
    # refused and changes nothing.
    assert ledger.update_shard(sid, status="uploaded")
    before = snapshot(database_url)
    with pytest.raises(ShardMismatch, match="in the ledger already"):
        ledger.add_shard_with_items(shard_row(item_count=3), items)
    assert snapshot(database_url) == before


def test_a_submit_intent_is_committed_to_disk_and_other_writes_are_not_slowed(
    ledger: LedgerResource, database_url: str
) -> None:
    """The intent tells a later run to look for a batch the provider may have made before a
    crash, so it must outlive the machine dying right after the create call. On SQLite (WAL,
    synchronous=NORMAL) its commit syncs the WAL: the UPDATE runs with synchronous=FULL (2),
    and the connection is back to NORMAL (1) for the writes after it."""
    make_job(ledger)
    sid = shard_id(0, 0)
    ledger.add_shard_with_items(shard_row(item_count=1), [item_row(cid(0), shard=sid)])
    engine = engine_of(database_url)
    on_sqlite = engine.dialect.name == "sqlite"
    seen: list[tuple[str, int | None]] = []

    def level(conn: sa.Connection, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE LLM_BATCH_SHARD"):
            raw = conn.connection.driver_connection
            synchronous = raw.execute("PRAGMA synchronous").fetchone()[0] if on_sqlite else None
            seen.append((statement, synchronous))

    sa.event.listen(engine, "before_cursor_execute", level)
    try:
        ledger.record_submit_intent(sid, '{"input_per_mtok": 1.0}')
        assert ledger.update_shard(sid, status="uploaded")
    finally:
        sa.event.remove(engine, "before_cursor_execute", level)

    shard = ledger.get_shard(sid)
    assert shard is not None and shard.submit_intent_at is not None
    assert shard.price_json == '{"input_per_mtok": 1.0}'
    [(intent, intent_level), (_, later_level)] = seen
    assert "submit_intent_at" in intent
    if on_sqlite:
        assert (intent_level, later_level) == (2, 1)


def test_a_shard_is_recorded_only_with_exactly_its_items(
    ledger: LedgerResource, database_url: str
) -> None:
    """New items go in at once (PostgreSQL: COPYed straight into the table); when one of
    them is in the ledger already (another run wrote it), the shard's transaction rolls
    back: no shard row, none of its items, the other run's item as it was."""
    make_job(ledger)
    first, second = shard_id(0, 0), shard_id(0, 1)
    ledger.add_shard_with_items(shard_row(item_count=1), [item_row(cid(0), shard=first)])
    before = items_by_id(database_url)

    items = [item_row(c, shard=second) for c in (cid(1), cid(0), cid(2))]
    with pytest.raises(ShardMismatch, match="1 of them are in the ledger already"):
        ledger.add_shard_with_items(shard_row(0, 1, item_count=3), items)
    assert ledger.get_shard(second) is None
    assert items_by_id(database_url) == before


def test_add_shard_with_items_is_one_transaction(ledger: LedgerResource, database_url: str) -> None:
    make_job(ledger)
    bad = [item_row(cid(0), shard=shard_id(0, 0)), item_row(cid(1), status=None)]
    with pytest.raises(sa.exc.IntegrityError):
        ledger.add_shard_with_items(shard_row(item_count=2), bad)
    assert ledger.get_shard(shard_id(0, 0)) is None
    assert table_rows(database_url, L.result_table) == []


def test_add_items_keeps_existing_rows(
    ledger: LedgerResource, database_url: str, small_chunks: int
) -> None:
    sid = job_with_shard(ledger, 3)
    before = items_by_id(database_url)

    # Input dead letters: two new ids and two that already exist with other values.
    new = [cid(i) for i in range(10, 10 + 2 * small_chunks + 1)]
    rows = [
        item_row(c, status=DEAD_LETTER, error_class="input", error_code="too_long")
        for c in [cid(0), *new, cid(2)]
    ]
    assert ledger.add_items(rows) == len(new)
    after = items_by_id(database_url)
    for c in (cid(0), cid(1), cid(2)):
        assert after[c] == before[c]
        assert (after[c]["status"], after[c]["shard_id"]) == (SUBMITTED, sid)
    for c in new:
        assert (after[c]["status"], after[c]["error_class"], after[c]["shard_id"]) == (
            DEAD_LETTER,
            "input",
            None,
        )
    assert ledger.add_items(rows) == 0
    assert ledger.add_items([]) == 0
    assert items_by_id(database_url) == after


def test_mark_submitted_counts_one_attempt_once(ledger: LedgerResource, database_url: str) -> None:
    make_job(ledger)
    s0, s1 = shard_id(0, 0), shard_id(0, 1)
    ledger.add_shard_with_items(
        shard_row(0, 0, item_count=3), [item_row(cid(i), shard=s0) for i in range(3)]
    )
    ledger.add_shard_with_items(shard_row(0, 1, item_count=1), [item_row(cid(9), shard=s1)])
    ledger.add_items([item_row(cid(8), status=DEAD_LETTER, error_class="input")])
    # An item of the shard that is no longer pending is not counted as sent again.
    assert set_item_status(ledger, JOB, [cid(2)], from_status=[PENDING], status=RETRY) == 1

    ledger.mark_submitted(s0, "batch-A", SUBMITTED)
    shard = ledger.get_shard(s0)
    assert shard is not None
    assert (shard.provider_batch_id, shard.status) == ("batch-A", SUBMITTED)
    assert shard.submitted_at is not None
    items = items_by_id(database_url)
    assert [(items[c]["status"], items[c]["attempts"]) for c in (cid(0), cid(1))] == [
        (SUBMITTED, 1),
        (SUBMITTED, 1),
    ]
    assert (items[cid(2)]["status"], items[cid(2)]["attempts"]) == (RETRY, 0)
    assert (items[cid(9)]["status"], items[cid(9)]["attempts"]) == (PENDING, 0)  # other shard
    assert (items[cid(8)]["status"], items[cid(8)]["attempts"]) == (DEAD_LETTER, 0)

    # A second call (a retried step, or a second upload) never records another batch.
    before = snapshot(database_url)
    ledger.mark_submitted(s0, "batch-A", SUBMITTED)
    ledger.mark_submitted(s0, "batch-B", "in_progress")
    assert snapshot(database_url) == before
    assert ledger.shards(JOB, [SUBMITTED])[0].provider_batch_id == "batch-A"


# ------------------------------------------------------------------------------------ results


def test_upsert_applies_results_by_custom_id(ledger: LedgerResource, database_url: str) -> None:
    job_with_shard(ledger, 6)
    rows = [
        ok(cid(0), "zero", tokens=10, cost=0.25),
        dead(cid(1), "invalid_request"),
        retry(cid(2), "rate_limited"),
        ok(cid(3), "three", tokens=20, cost=0.5),
        dead(cid(4), "content_filter", cls="refused"),
        retry(cid(5)),
    ]
    stats = ledger.upsert_results(JOB, reversed(rows))
    assert stats == UpsertStats(received=6, applied=6)
    items = items_by_id(database_url)
    for row in rows:
        item = items[row["custom_id"]]
        assert {k: item[k] for k in row} == row
        assert item["attempts"] == 1  # results never touch attempts or the shard
        assert item["shard_id"] == shard_id(0, 0)


def test_upsert_result_is_independent_of_line_order(
    ledger: LedgerResource, database_url: str
) -> None:
    rows = [ok(cid(0)), dead(cid(1)), retry(cid(2)), ok(cid(3), "three"), dead(cid(4), "x")]
    orders = {"job-fwd": rows, "job-rev": rows[::-1], "job-mix": rows[1::2] + rows[::2]}
    for n, (job_id, ordered) in enumerate(orders.items()):
        make_job(ledger, job_id, prompt_version=f"v{n}")
        ledger.add_items([item_row(r["custom_id"], status=SUBMITTED, job_id=job_id) for r in rows])
        assert ledger.upsert_results(job_id, ordered).applied == len(rows)
    states = [
        {c: state(r) for c, r in items_by_id(database_url, job_id).items()} for job_id in orders
    ]
    assert states[0] == states[1] == states[2]
    assert states[0][cid(3)]["result_json"] == "three"


def test_upsert_never_overwrites_terminal_rows(ledger: LedgerResource, database_url: str) -> None:
    job_with_shard(ledger, 4)
    first = [ok(cid(0), "kept"), dead(cid(1), "kept_code")]
    assert ledger.upsert_results(JOB, first) == UpsertStats(received=2, applied=2)

    before = snapshot(database_url)
    # Re-importing the same lines is a no-op...
    stats = ledger.upsert_results(JOB, first)
    assert stats == UpsertStats(received=2, already_terminal=2)
    assert snapshot(database_url) == before
    # ...and a later failure (or a later different success) never replaces a terminal row.
    later = [dead(cid(0), "late_failure"), retry(cid(0)), ok(cid(1), "late_success")]
    stats = ledger.upsert_results(JOB, later)
    assert (stats.applied, stats.already_terminal, stats.unknown) == (0, 2, 0)
    assert_accounted(stats)
    assert snapshot(database_url) == before


def test_upsert_duplicate_lines_success_wins(ledger: LedgerResource, database_url: str) -> None:
    job_with_shard(ledger, 5)
    rows = [
        dead(cid(0), "first_failure"),
        ok(cid(0), "success after failure"),
        ok(cid(1), "success before failure"),
        dead(cid(1), "late_failure"),
        retry(cid(1)),
        dead(cid(2), "first"),
        dead(cid(2), "second"),
        ok(cid(3), "first"),
        ok(cid(3), "second"),
        retry(cid(4), "first"),
        retry(cid(4), "second"),
        ok(cid(4), "finally"),
    ]
    stats = ledger.upsert_results(JOB, rows)
    assert stats == UpsertStats(
        received=12,
        applied=5,
        duplicates=7,
        duplicate_ids=[cid(0), cid(1), cid(2), cid(3), cid(4)],
    )
    items = items_by_id(database_url)
    got = {c: (r["status"], r["result_json"] or r["error_code"]) for c, r in items.items()}
    assert got == {
        cid(0): (SUCCEEDED, "success after failure"),
        cid(1): (SUCCEEDED, "success before failure"),
        cid(2): (DEAD_LETTER, "first"),  # among equals the first line wins
        cid(3): (SUCCEEDED, "first"),
        cid(4): (SUCCEEDED, "finally"),
    }
    assert items[cid(0)]["error_class"] is None  # the winning row is applied whole


def test_upsert_unknown_ids_are_counted_not_inserted(
    ledger: LedgerResource, database_url: str
) -> None:
    make_job(ledger)
    make_job(ledger, "other-job", prompt_version="v2")
    ledger.add_items([item_row("only-in-other-job", status=SUBMITTED, job_id="other-job")])
    add_submitted_shard(ledger, 1)
    before = snapshot(database_url)
    stats = ledger.upsert_results(
        JOB, [ok("never-sent"), dead("never-sent-2"), ok("only-in-other-job"), ok(cid(0))]
    )
    assert stats == UpsertStats(received=4, applied=1, unknown=3)
    after = snapshot(database_url)
    assert len(after["llm_batch_result"]) == len(before["llm_batch_result"])
    assert items_by_id(database_url, "other-job")["only-in-other-job"]["status"] == SUBMITTED
    assert ledger.known_items(JOB) == ({f"src-{cid(0)}"}, set())
    assert ledger.upsert_results(JOB, []) == UpsertStats()


def test_upsert_applies_to_every_open_status(ledger: LedgerResource, database_url: str) -> None:
    job_with_shard(ledger, 3)  # cid(0..2) submitted
    set_item_status(ledger, JOB, [cid(1)], from_status=[SUBMITTED], status=RETRY)
    ledger.add_items([item_row(cid(3))])  # still pending
    stats = ledger.upsert_results(JOB, [ok(cid(0)), ok(cid(1)), dead(cid(2)), ok(cid(3))])
    assert stats == UpsertStats(received=4, applied=4)
    items = items_by_id(database_url)
    assert [items[cid(i)]["status"] for i in range(4)] == [
        SUCCEEDED,
        SUCCEEDED,
        DEAD_LETTER,
        SUCCEEDED,
    ]
    # A failure changes an item only while it is submitted: an item already in retry (its
    # retry may be planned into a shard) keeps what it has.
    set_item_status(ledger, JOB, [cid(2)], from_status=[DEAD_LETTER], status=RETRY)
    before = items_by_id(database_url)[cid(2)]
    assert ledger.upsert_results(JOB, [retry(cid(2), "newer")]).applied == 0
    assert items_by_id(database_url)[cid(2)] == before


def test_upsert_across_chunks(ledger: LedgerResource, database_url: str, small_chunks: int) -> None:
    make_job(ledger)
    k = small_chunks
    n = 3 * k + 2
    add_submitted_shard(ledger, n)

    def expected(i: int) -> str:
        return (SUCCEEDED, DEAD_LETTER, RETRY)[i % 3]

    def line(i: int) -> dict[str, Any]:
        return {SUCCEEDED: ok, DEAD_LETTER: dead, RETRY: retry}[expected(i)](cid(i))

    plain = [line(i) for i in reversed(range(4, n))]
    first_chunk = [
        ok(cid(0), "early success"),  # its failure comes in the last chunk
        retry(cid(2)),  # its success comes in the next chunk
        dead(cid(3), "duplicate_in_chunk"),  # its success comes in the same chunk
        ok(cid(3), "success in same chunk"),
        *plain[: k - 5],
        ok(cid(1), "before boundary"),  # its failure starts the next chunk
    ]
    rows = [
        *first_chunk,
        dead(cid(1), "after_boundary"),
        ok(cid(2), "retried"),
        *plain[k - 5 :],
        dead(cid(0), "late_failure"),
    ]
    assert len(first_chunk) == k
    assert len(rows) > 3 * k
    assert (rows[k - 1]["custom_id"], rows[k]["custom_id"]) == (cid(1), cid(1))

    stats = ledger.upsert_results(JOB, rows)
    assert stats.received == len(rows)
    assert stats.unknown == 0
    assert stats.applied >= n
    assert stats.duplicates >= 1
    assert_accounted(stats)

    items = items_by_id(database_url)
    assert len(items) == n
    final = {i: (items[cid(i)]["status"], items[cid(i)]["result_json"]) for i in range(4)}
    assert final == {
        0: (SUCCEEDED, "early success"),
        1: (SUCCEEDED, "before boundary"),
        2: (SUCCEEDED, "retried"),
        3: (SUCCEEDED, "success in same chunk"),
    }
    for i in range(4, n):
        assert items[cid(i)]["status"] == expected(i), i

    # Replaying the whole file changes nothing terminal and finds nothing unknown.
    before = {c: state(r) for c, r in items.items()}
    again = ledger.upsert_results(JOB, rows)
    assert again.unknown == 0
    # Not even the retry lines: their items are in retry now, no longer submitted.
    assert again.applied == 0
    assert_accounted(again)
    assert {c: state(r) for c, r in items_by_id(database_url).items()} == before


def test_upsert_success_wins_over_failure_in_an_earlier_chunk(
    ledger: LedgerResource, database_url: str, small_chunks: int
) -> None:
    job_with_shard(ledger, small_chunks + 1)
    rows = [dead(cid(0), "first_failure")]
    rows += [ok(cid(i)) for i in range(1, small_chunks + 1)]
    rows.append(ok(cid(0), "success in the next chunk"))
    stats = ledger.upsert_results(JOB, rows)
    assert items_by_id(database_url)[cid(0)]["status"] == SUCCEEDED
    assert stats.duplicates == 1


def test_upsert_of_one_shards_results_matches_its_items_first_and_still_every_other(
    ledger: LedgerResource,
    database_url: str,
    small_chunks: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A shard's result file names (nearly) only its own items: PostgreSQL matches them by
    reading the shard's rows into a hash table. Lines for items that have moved to another
    shard, lines for items of another shard, unknown ids, terminal rows and duplicates come
    out exactly as when every line is matched by custom_id."""
    monkeypatch.setattr(limits, "HASH_JOIN_ROWS", 2)
    hashed: list[int] = []
    join_by_hash = Bulk.join_by_hash

    def counted(bulk: Bulk) -> None:
        hashed.append(1)
        join_by_hash(bulk)

    monkeypatch.setattr(Bulk, "join_by_hash", counted)
    n = 2 * small_chunks + 3

    def day(job_id: str) -> str:
        make_job(ledger, job_id, prompt_version=job_id)
        s0, s1 = shard_id(0, 0, job_id), shard_id(0, 1, job_id)
        ledger.add_shard_with_items(
            shard_row(0, 0, item_count=n, job_id=job_id),
            [item_row(cid(i), shard=s0, job_id=job_id) for i in range(n)],
        )
        ledger.add_shard_with_items(
            shard_row(0, 1, item_count=3, job_id=job_id),
            [item_row(cid(i), shard=s1, job_id=job_id) for i in range(n, n + 3)],
        )
        ledger.mark_submitted(s0, f"batch-{job_id}", SUBMITTED)
        ledger.mark_submitted(s1, f"batch-1-{job_id}", SUBMITTED)
        # Items 0 and 1 are terminal already; 2..4 failed and moved to a retry shard.
        ledger.upsert_results(job_id, [ok(cid(0), "kept"), dead(cid(1), "kept")])
        ledger.upsert_results(job_id, [retry(cid(i)) for i in (2, 3, 4)])
        ledger.reassign_items_to_shard(
            job_id,
            shard_row(1, 0, item_count=3, job_id=job_id),
            [(cid(2), 0), (cid(3), 10), (cid(4), 20)],
        )
        return s0

    lines = [
        dead(cid(0), "late"),  # terminal: not applied
        ok(cid(1), "late"),  # terminal: not applied
        ok(cid(2), "moved, answered late"),  # now in the retry shard: still applied
        dead(cid(3), "moved"),  # a failure of a moved item: never takes it back
        *[ok(cid(i), f"answer {i}") for i in range(5, n)],
        retry(cid(6)),  # a duplicate: the success stays
        ok(cid(n), "of the other shard"),
        ok("20240501_not-in-the-ledger"),
    ]
    results = {}
    for job_id, by_shard in (("job-any", False), ("job-shard", True)):
        s0 = day(job_id)
        hashed.clear()
        stats = ledger.upsert_results(job_id, lines, shard_id=s0 if by_shard else None)
        assert bool(hashed) == (by_shard and ledger.engine.dialect.name == "postgresql")
        assert_accounted(stats)
        items = items_by_id(database_url, job_id)
        results[job_id] = (stats, {c: state(r) for c, r in items.items()})
    stats, items = results["job-shard"]
    assert stats == UpsertStats(
        received=len(lines),
        applied=len(lines) - 5,
        duplicates=1,
        unknown=1,
        already_terminal=3,
        duplicate_ids=[cid(6)],
    )
    assert items[cid(2)]["result_json"] == "moved, answered late"
    assert items[cid(2)]["shard_id"] == shard_id(1, 0, "job-shard")
    assert items[cid(n)]["status"] == SUCCEEDED
    assert items[cid(6)]["status"] == SUCCEEDED
    assert items[cid(4)]["status"] == PENDING  # moved, no line
    assert (items[cid(3)]["status"], items[cid(3)]["shard_id"]) == (
        PENDING,
        shard_id(1, 0, "job-shard"),
    )
    other_stats, other_items = results["job-any"]
    assert other_stats == stats

    def same_day(rows: dict[str, Any], job_id: str) -> dict[str, Any]:
        return {
            c: {**r, "shard_id": (r["shard_id"] or "").replace(job_id, "J")}
            for c, r in rows.items()
        }

    assert same_day(items, "job-shard") == same_day(other_items, "job-any")


# -------------------------------------------------------------------------- status transitions


def test_set_item_status_moves_only_from_status(
    ledger: LedgerResource, database_url: str, small_chunks: int
) -> None:
    n = 2 * small_chunks + 3
    job_with_shard(ledger, n)
    ledger.upsert_results(JOB, [ok(cid(0)), dead(cid(1)), retry(cid(2)), retry(cid(3))])
    every = [cid(i) for i in range(n)] + ["no-such-item"]

    moved = set_item_status(
        ledger, JOB, every, from_status=[RETRY], status=DEAD_LETTER, error_class="gave_up"
    )
    assert moved == 2
    answered = [(SUCCEEDED, None), (DEAD_LETTER, "deterministic")]
    assert item_states(database_url, range(4)) == answered + [(DEAD_LETTER, "gave_up")] * 2
    # Many ids over several chunks, two statuses allowed.
    moved = set_item_status(ledger, JOB, every, from_status=[SUBMITTED, PENDING], status=RETRY)
    assert moved == n - 4
    assert set_item_status(ledger, JOB, every, from_status=[PENDING], status=RETRY) == 0
    assert set_item_status(ledger, JOB, [], from_status=[RETRY], status=PENDING) == 0
    statuses = {c: r["status"] for c, r in items_by_id(database_url).items()}
    assert sum(1 for s in statuses.values() if s == RETRY) == n - 4


def test_set_item_errors_guards_on_status(ledger: LedgerResource, database_url: str) -> None:
    job_with_shard(ledger, 3)
    ledger.upsert_results(JOB, [ok(cid(0)), retry(cid(1))])
    quality = {"status": DEAD_LETTER, "error_class": "quality", "error_code": "json"}
    # A row whose status is not in from_status is left alone.
    assert (
        ledger.set_item_errors(JOB, [{"custom_id": cid(1), **quality}], from_status=[SUCCEEDED])
        == 0
    )
    assert (
        ledger.set_item_errors(JOB, [{"custom_id": cid(0), **quality}], from_status=[SUCCEEDED])
        == 1
    )
    assert (
        ledger.set_item_errors(JOB, [{"custom_id": cid(0), **quality}], from_status=[SUCCEEDED])
        == 0
    )
    assert ledger.set_item_errors(JOB, [], from_status=[SUCCEEDED]) == 0
    items = items_by_id(database_url)
    assert (items[cid(0)]["status"], items[cid(0)]["error_code"]) == (DEAD_LETTER, "json")
    assert items[cid(0)]["result_json"] == "fine"  # only the given columns change
    assert (items[cid(1)]["status"], items[cid(1)]["error_class"]) == (RETRY, "transient")
    assert items[cid(2)]["status"] == SUBMITTED


def test_set_item_errors_many_rows(
    ledger: LedgerResource, database_url: str, small_chunks: int
) -> None:
    n = 2 * small_chunks + 1
    job_with_shard(ledger, n)
    ledger.upsert_results(JOB, [retry(cid(i)) for i in range(n)])
    ledger.upsert_results(JOB, [ok(cid(0))])  # raced: already terminal, must not move
    rows = [
        {"custom_id": cid(i), "status": DEAD_LETTER, "error_message": f"gave up on {i}"}
        for i in range(n)
    ]
    assert ledger.set_item_errors(JOB, rows, from_status=[RETRY]) == n - 1
    items = items_by_id(database_url)
    assert items[cid(0)]["status"] == SUCCEEDED
    for i in range(1, n):
        assert items[cid(i)]["status"] == DEAD_LETTER
        assert items[cid(i)]["error_message"] == f"gave up on {i}"
        assert items[cid(i)]["error_class"] == "transient"  # untouched column


def test_set_shard_items_moves_one_shards_open_items(
    ledger: LedgerResource, database_url: str
) -> None:
    s0 = job_with_shard(ledger, 4)
    s1 = add_submitted_shard(ledger, 2, index=1, first=10, batch_id="batch-1")
    ledger.upsert_results(JOB, [ok(cid(0)), dead(cid(1))])
    moved = items_module.set_shard_items(
        ledger.engine,
        s0,
        from_status=[SUBMITTED],
        status=RETRY,
        error_class="expired",
        error_code="missing",
    )
    assert moved == 2
    answered = [(SUCCEEDED, None), (DEAD_LETTER, "deterministic")]
    assert item_states(database_url, range(4)) == answered + [(RETRY, "expired")] * 2
    assert item_states(database_url, [10, 11]) == [(SUBMITTED, None)] * 2
    assert (
        items_module.set_shard_items(ledger.engine, s0, from_status=[SUBMITTED], status=RETRY) == 0
    )
    assert (
        items_module.set_shard_items(ledger.engine, s1, from_status=[SUBMITTED], status=RETRY) == 2
    )


def test_close_shard_moves_open_items_freezes_the_bill_and_sets_the_shard_at_once(
    ledger: LedgerResource, database_url: str
) -> None:
    """Closing an imported shard: its unanswered items move, what its items were billed is
    frozen on the shard and its reservation, and the shard is marked (compare-and-set) — in
    one transaction, so a failure in any part leaves all of it undone."""
    s0 = job_with_shard(ledger, 4)
    s1 = add_submitted_shard(ledger, 2, index=1, first=10, batch_id="batch-1")
    assert (
        ledger.reserve_budget(
            pipeline="reviews",
            job_id=JOB,
            shards={s0: 5.0, s1: 5.0},
            max_per_day=None,
            max_per_month=None,
        )
        is None
    )
    ledger.upsert_results(JOB, [ok(cid(0), tokens=10, cost=0.25), ok(cid(1), tokens=4, cost=0.5)])
    ledger.update_shard(s0, status="completed")
    missing = {"status": RETRY, "error_class": "expired", "error_code": "missing"}

    with pytest.raises(sa.exc.SQLAlchemyError):  # the shard's values fail: nothing is kept
        ledger.close_shard(s0, from_status=[SUBMITTED], items=missing, no_such_column=1)
    assert {items_by_id(database_url)[cid(i)]["status"] for i in (2, 3)} == {SUBMITTED}
    assert ledger.get_shard(s0).actual_cost_usd is None  # type: ignore[union-attr]

    moved, changed = ledger.close_shard(
        s0,
        from_status=[SUBMITTED],
        items=missing,
        expect_status=["completed"],
        status="imported",
    )

    assert (moved, changed) == (2, True)
    assert item_states(database_url, range(4)) == [(SUCCEEDED, None)] * 2 + [(RETRY, "expired")] * 2
    assert item_states(database_url, [10, 11]) == [(SUBMITTED, None)] * 2
    shard = ledger.get_shard(s0)
    assert shard is not None
    assert (shard.status, shard.actual_input_tokens, shard.actual_output_tokens) == (
        "imported",
        14,
        7,
    )
    assert shard.actual_cost_usd == pytest.approx(0.75)
    with ledger.engine.connect() as conn:
        settled = dict(
            conn.execute(
                sa.select(L.reservation_table.c.shard_id, L.reservation_table.c.actual_usd)
            ).all()
        )
    assert settled == {s0: pytest.approx(0.75), s1: None}
    # Not in the expected state (imported already): the shard row is left as it is.
    assert ledger.close_shard(
        s0, from_status=[SUBMITTED], items=missing, expect_status=["completed"], status="x"
    ) == (0, False)
    assert ledger.get_shard(s0).status == "imported"  # type: ignore[union-attr]


def test_close_shard_moves_every_open_item_of_an_unanswered_shard(
    ledger: LedgerResource, database_url: str, small_chunks: int
) -> None:
    """A batch that answered nothing (expired, say): more open items than are moved by id
    in one statement are moved all the same, and the bill is what was answered: nothing."""
    n = 2 * small_chunks + 1
    s0 = job_with_shard(ledger, n)
    ledger.upsert_results(JOB, [ok(cid(0), tokens=10, cost=0.25)])

    moved, _ = ledger.close_shard(
        s0, from_status=[SUBMITTED], items={"status": RETRY, "error_class": "expired"}
    )

    assert moved == n - 1
    items = items_by_id(database_url)
    assert [items[cid(i)]["status"] for i in range(n)] == [SUCCEEDED] + [RETRY] * (n - 1)
    shard = ledger.get_shard(s0)
    assert shard is not None
    assert (shard.actual_input_tokens, shard.actual_cost_usd) == (10, pytest.approx(0.25))
    with pytest.raises(ValueError, match="does not change what was billed"):
        ledger.close_shard(s0, from_status=[RETRY], items={"status": RETRY, "cost_usd": 0})


def test_reassign_retry_items_to_a_new_shard(
    ledger: LedgerResource, database_url: str, small_chunks: int
) -> None:
    n = 2 * small_chunks + 2
    s0 = job_with_shard(ledger, n)
    ledger.upsert_results(JOB, [ok(cid(0)), dead(cid(1))])
    items_module.set_shard_items(
        ledger.engine, s0, from_status=[SUBMITTED], status=RETRY, error_class="transient"
    )
    assert ledger.next_round(JOB) == 1

    s1 = shard_id(1, 0)
    everything = [(cid(i), 100 * i) for i in range(n)]
    # Built with items that are not in retry (terminal ones): refused, nothing moved.
    before = snapshot(database_url)
    with pytest.raises(ShardMismatch, match=f"built with {n} items in retry, but only {n - 2}"):
        ledger.reassign_items_to_shard(JOB, shard_row(1, 0, item_count=n), everything)
    assert snapshot(database_url) == before
    retried = everything[2:]
    assert ledger.reassign_items_to_shard(JOB, shard_row(1, 0, item_count=n - 2), retried) == n - 2
    items = items_by_id(database_url)
    assert (items[cid(0)]["status"], items[cid(0)]["shard_id"]) == (SUCCEEDED, s0)
    assert (items[cid(1)]["status"], items[cid(1)]["shard_id"]) == (DEAD_LETTER, s0)
    for i in range(2, n):
        assert (items[cid(i)]["status"], items[cid(i)]["shard_id"]) == (PENDING, s1)
        assert items[cid(i)]["attempts"] == 1
        # Where its line is in the retry shard's file.
        assert items[cid(i)]["request_offset"] == 100 * i
    shard = ledger.get_shard(s1)
    assert shard is not None
    assert (shard.round, shard.status, shard.provider_batch_id) == (1, "created", None)
    assert ledger.next_round(JOB) == 2

    # Replayed: the shard exists and nothing is in retry any more; refused, nothing changes.
    before = snapshot(database_url)
    with pytest.raises(ShardMismatch):
        ledger.reassign_items_to_shard(JOB, shard_row(1, 0, item_count=n - 2), retried)
    assert snapshot(database_url) == before

    # The second submission counts a second attempt for exactly the moved items.
    ledger.mark_submitted(s1, "batch-r1", SUBMITTED)
    items = items_by_id(database_url)
    assert {items[cid(i)]["attempts"] for i in range(2, n)} == {2}
    assert items[cid(0)]["attempts"] == 1


# --------------------------------------------------------------------------- counts, reporting


def test_counts_and_refresh_job(ledger: LedgerResource, database_url: str) -> None:
    make_job(ledger)
    empty = ledger.refresh_job(JOB)
    assert (empty.total, empty.by_status, empty.open) == (0, {}, 0)
    assert ledger.get_job(JOB).status == "created"  # type: ignore[union-attr]

    sid = shard_id(0, 0)
    ledger.add_shard_with_items(
        shard_row(item_count=7), [item_row(cid(i), shard=sid) for i in range(7)]
    )
    ledger.add_items([item_row(cid(20), status=DEAD_LETTER, error_class="input")])
    assert ledger.refresh_job(JOB).open == 7
    assert ledger.get_job(JOB).status == "created"  # type: ignore[union-attr]

    ledger.mark_submitted(sid, "batch-0", SUBMITTED)
    ledger.upsert_results(
        JOB,
        [
            ok(cid(0), tokens=100, cost=0.5),
            ok(cid(1), tokens=20, cost=0.25),
            result_row(cid(2), DEAD_LETTER, error_class="expired", error_code="expired"),
            result_row(cid(3), DEAD_LETTER, error_class=None, error_code="odd"),
            ok(cid(4), tokens=8, cost=0.0625),
            retry(cid(5)),
        ],
    )
    # A success that fails validation becomes a quality dead letter but keeps its usage.
    quality = {"custom_id": cid(4), "status": DEAD_LETTER, "error_class": "quality"}
    assert ledger.set_item_errors(JOB, [quality], from_status=[SUCCEEDED]) == 1
    counts = ledger.counts(JOB)
    assert counts.total == 8
    assert counts.by_status == {SUCCEEDED: 2, DEAD_LETTER: 4, RETRY: 1, SUBMITTED: 1}
    assert counts.dead_letters_by_class == {"expired": 1, "unknown": 1, "quality": 1, "input": 1}
    assert (counts.succeeded, counts.dead_letters, counts.terminal, counts.open) == (2, 4, 6, 2)
    assert (counts.input_tokens, counts.output_tokens) == (128, 64)
    assert counts.cost_usd == pytest.approx(0.8125)

    assert ledger.refresh_job(JOB) == counts
    job = ledger.get_job(JOB)
    assert job is not None
    assert job.status == "running"
    assert (job.total_items, job.succeeded_items, job.failed_items, job.expired_items) == (
        8,
        2,
        4,
        1,
    )
    assert (job.input_tokens, job.output_tokens) == (128, 64)
    assert job.cost_usd == pytest.approx(0.8125)

    # One item still open: not completed. Every item terminal: completed.
    ledger.upsert_results(JOB, [ok(cid(5), tokens=2, cost=0.125)])
    assert ledger.refresh_job(JOB).open == 1
    assert ledger.get_job(JOB).status == "running"  # type: ignore[union-attr]
    ledger.upsert_results(JOB, [dead(cid(6))])
    final = ledger.refresh_job(JOB)
    assert (final.open, final.succeeded, final.dead_letters) == (0, 3, 5)
    job = ledger.get_job(JOB)
    assert job is not None
    assert (job.status, job.total_items, job.succeeded_items, job.failed_items) == (
        "completed",
        8,
        3,
        5,
    )
    assert job.cost_usd == pytest.approx(0.9375)

    # Counts belong to their job.
    make_job(ledger, "other-job", prompt_version="v2")
    assert ledger.counts("other-job").total == 0


def test_iter_items_streams_in_custom_id_order(
    ledger: LedgerResource, database_url: str, small_chunks: int
) -> None:
    make_job(ledger)
    make_job(ledger, "other-job", prompt_version="v2")
    n = 3 * small_chunks
    order = sorted(range(n), key=lambda i: (i * 5) % n)  # inserted out of order
    s0, s1 = shard_id(0, 0), shard_id(0, 1)
    ledger.add_shard_with_items(
        shard_row(0, 0), [item_row(cid(i), shard=s0) for i in order if i % 2]
    )
    ledger.add_shard_with_items(
        shard_row(0, 1), [item_row(cid(i), shard=s1) for i in order if not i % 2]
    )
    ledger.add_items([item_row(cid(i), job_id="other-job") for i in range(3)])
    ledger.upsert_results(JOB, [ok(cid(i)) for i in range(0, n, 3)])

    stream = ledger.iter_items(JOB)
    assert isinstance(stream, Iterator)
    everything = list(stream)
    assert [r["custom_id"] for r in everything] == [cid(i) for i in range(n)]
    assert {r["job_id"] for r in everything} == {JOB}
    assert set(everything[0]) == {c.name for c in L.result_table.columns}

    done = list(ledger.iter_items(JOB, [SUCCEEDED]))
    assert [r["custom_id"] for r in done] == [cid(i) for i in range(0, n, 3)]
    open_s1 = list(
        ledger.iter_items(JOB, [PENDING], shard_id=s1, columns=["custom_id", "shard_id"])
    )
    assert open_s1 == [
        {"custom_id": cid(i), "shard_id": s1} for i in range(n) if not i % 2 and i % 3
    ]
    assert list(ledger.iter_items(JOB, [], columns=["custom_id"])) == []
    assert list(ledger.iter_items(JOB, shard_id="no-such-shard")) == []

    # Read by one query up to `few` rows, the rest streamed after them: the same rows either
    # way, each once, in order, whether there are fewer, as many or more than `few`.
    for few in (1, len(done) - 1, len(done), len(done) + 1, 10 * n):
        read = list(ledger.iter_items(JOB, [SUCCEEDED], few=few))
        assert read == done, few
    tokens = list(ledger.iter_items(JOB, [PENDING], columns=["attempts"], few=2))
    assert [r["custom_id"] for r in tokens] == [cid(i) for i in range(n) if i % 3]
    assert {tuple(r) for r in tokens} == {("attempts", "custom_id")}
    with pytest.raises(ValueError, match="few must be 1 or more"):
        list(ledger.iter_items(JOB, few=0))


def test_shard_totals_attribute_items_tokens_and_cost(
    ledger: LedgerResource, database_url: str
) -> None:
    s0 = job_with_shard(ledger, 3)
    s1 = add_submitted_shard(ledger, 2, index=1, first=10, batch_id="batch-1")
    ledger.add_items([item_row(cid(50), status=DEAD_LETTER, error_class="input")])  # no shard
    ledger.upsert_results(
        JOB,
        [
            ok(cid(0), tokens=10, cost=0.25),
            ok(cid(1), tokens=30, cost=0.5),
            retry(cid(2)),
            ok(cid(10), tokens=4, cost=0.125),
            dead(cid(11)),
        ],
    )
    ledger.reassign_items_to_shard(JOB, shard_row(1, 0, item_count=1), [(cid(2), 0)])
    totals = ledger.shard_report(JOB).shards
    assert [t["shard_id"] for t in totals] == [s0, s1, shard_id(1, 0)]
    by_id = {t["shard_id"]: t for t in totals}
    assert by_id[s0] | {"cost_usd": 0} == {
        "shard_id": s0,
        "kind": "first",
        "round": 0,
        "status": SUBMITTED,
        "provider_batch_id": "batch-0",
        "requests": 3,
        "items_now": 2,  # cid(2) moved to the retry shard
        "succeeded": 2,
        "estimated_input_tokens": 0,
        "input_tokens": 40,
        "output_tokens": 20,
        "estimated_cost_usd": 0.0,
        "estimated_cost_upper_usd": 0.0,
        "cost_usd": 0,
    }
    assert by_id[s0]["cost_usd"] == pytest.approx(0.75)
    assert (by_id[s1]["items_now"], by_id[s1]["succeeded"], by_id[s1]["input_tokens"]) == (2, 1, 4)
    assert by_id[s1]["cost_usd"] == pytest.approx(0.125)
    retry_shard = by_id[shard_id(1, 0)]
    assert (retry_shard["round"], retry_shard["status"], retry_shard["provider_batch_id"]) == (
        1,
        "created",
        None,
    )
    assert (retry_shard["items_now"], retry_shard["succeeded"], retry_shard["cost_usd"]) == (
        1,
        0,
        0.0,
    )
    # A shard with no items left still shows up, with zeros.
    ledger.add_shard_with_items(shard_row(2, 0), [])
    assert ledger.shard_report(JOB).shards[-1]["items_now"] == 0


def test_shard_report_estimate_error_and_cache_use_over_billed_and_succeeded_items(
    ledger: LedgerResource,
) -> None:
    """The estimate's error counts the items billed (their last attempt) whatever their
    outcome; cache use counts succeeded items only, per shard with the prices it recorded."""
    make_job(ledger)
    estimates = {0: 10, 1: 20, 2: 30, 3: 16, 10: 40, 11: 7}
    for index, first, n in ((0, 0, 4), (1, 10, 2)):
        sid = shard_id(0, index)
        ids = range(first, first + n)
        ledger.add_shard_with_items(
            shard_row(0, index, item_count=n) | {"price_json": f'{{"shard": {index}}}'},
            [item_row(cid(i), shard=sid, estimated_input_tokens=estimates[i]) for i in ids],
        )
        ledger.mark_submitted(sid, f"batch-{index}", SUBMITTED)
    ledger.add_items([item_row(cid(50), status=DEAD_LETTER, error_class="input")])  # no shard

    def cached(row: dict[str, Any], read: int, written: int) -> dict[str, Any]:
        return row | {"cached_input_tokens": read, "cache_write_input_tokens": written}

    quality_failure = result_row(cid(3), DEAD_LETTER, error_class="quality", input_tokens=16)
    ledger.upsert_results(
        JOB,
        [
            cached(ok(cid(0), tokens=12), 5, 0),
            cached(ok(cid(1), tokens=18), 0, 4),
            dead(cid(2)),  # never billed
            cached(quality_failure, 9, 0),  # billed, its cache use not the day's saving
            ok(cid(10), tokens=44),
            retry(cid(11)),
        ],
    )
    report = ledger.shard_report(JOB)
    assert report.input_token_estimate_error == pytest.approx((12 + 18 + 16 + 44) / 86 - 1)
    assert report.cache_usage == [("batch-0", '{"shard": 0}', 5, 4)]
    assert [t["succeeded"] for t in report.shards] == [2, 1]
    # No item billed yet: no error to report.
    assert ledger.shard_report("no-such-job") == L.ShardReport(
        shards=[], input_token_estimate_error=None, cache_usage=[]
    )


def test_job_cost_rows_of_a_window_sum_only_its_jobs_items(ledger: LedgerResource) -> None:
    """A window's rows are the full history's rows of its dates, each with its own job's
    items; the cost report's month is the days of the report's month up to its day."""
    from llm_assets.steps.reports import month_so_far

    days = [dt.date(2024, 4, 30), dt.date(2024, 5, 1), dt.date(2024, 5, 2), dt.date(2024, 5, 3)]
    for n, day in enumerate(days):
        job = f"reviews-{day:%Y%m%d}-abc"
        make_job(ledger, job, partition_date=day)
        ledger.add_items(
            [
                item_row(f"{day:%Y%m%d}_item-{k:03d}", job_id=job, status=SUCCEEDED)
                for k in range(n + 1)
            ]
            + [item_row(f"{day:%Y%m%d}_dead", job_id=job, status=DEAD_LETTER)]
        )
    make_job(ledger, "other-20240501-abc", pipeline="other")
    ledger.add_items([item_row("x", job_id="other-20240501-abc", status=SUCCEEDED)])

    history = ledger.job_cost_rows("reviews")
    assert [(r["date"], r["items"], r["succeeded"], r["dead_letters"]) for r in history] == [
        (day.isoformat(), n + 2, n + 1, 1) for n, day in enumerate(days)
    ]
    for start in (None, *days):
        for end in (None, *days):
            window = ledger.job_cost_rows("reviews", start, end)
            assert window == [
                r
                for r in history
                if (start is None or r["date"] >= start.isoformat())
                and (end is None or r["date"] <= end.isoformat())
            ]
    assert [r["date"] for r in month_so_far(history, days[2])] == ["2024-05-01", "2024-05-02"]
    assert [r["date"] for r in month_so_far(history, days[0])] == ["2024-04-30"]


def test_update_shard_is_compare_and_set(ledger: LedgerResource, database_url: str) -> None:
    sid = job_with_shard(ledger, 1)
    before = snapshot(database_url)
    assert not ledger.update_shard(sid, expect_status=["ended", "failed"], status="imported")
    assert not ledger.update_shard(sid, expect_status=[], status="imported")
    assert not ledger.update_shard("no-such-shard", status="imported")
    assert snapshot(database_url) == before

    assert ledger.update_shard(
        sid, expect_status=[SUBMITTED, "in_progress"], status="ended", raw_status="completed"
    )
    shard = ledger.get_shard(sid)
    assert shard is not None
    assert (shard.status, shard.raw_status, shard.provider_batch_id) == (
        "ended",
        "completed",
        "batch-0",
    )
    # Two importers racing: only the first move out of "ended" wins.
    assert ledger.update_shard(sid, expect_status=["ended"], status="imported")
    assert not ledger.update_shard(sid, expect_status=["ended"], status="imported", message="again")
    shard = ledger.get_shard(sid)
    assert shard is not None
    assert (shard.status, shard.message) == ("imported", None)
    # Without expect_status the update is unconditional.
    assert ledger.update_shard(sid, message="note")
    assert [s.shard_id for s in shards_in_states(ledger, ["imported"], pipeline="reviews")] == [sid]
    assert shards_in_states(ledger, ["imported"], pipeline="other") == []


def test_bulk_writes_keep_every_character_and_raise_driver_errors_as_sqlalchemy_does(
    ledger: LedgerResource, small_chunks: int
) -> None:
    """COPY text (PostgreSQL) and raw executemany (SQLite) store any text exactly, in
    chunks, and a failed bulk write is the IntegrityError the rest of the code expects."""
    make_job(ledger)
    n = 2 * small_chunks + 1
    added = L.utcnow()
    sid = add_submitted_shard(ledger, n)
    hard = ["tab\there", "new\nline\r\n", "back\\slash \\N", "\\.", "日本語 ✓ \ue000", "", "'; --"]
    rows = [ok(cid(i), text=hard[i % len(hard)] + f" {i}") for i in range(n)]
    rows[3] = dead(cid(3), code="tab\tcode") | {"error_message": "line\nbreak \\ and \\N"}

    stats = ledger.upsert_results(JOB, rows)
    before = L.utcnow()
    with ledger.replacing_outputs(JOB) as write:
        outputs = [
            (r["custom_id"], None, "v1", "m", r["result_json"] or "")
            for r in rows
            if r["status"] == SUCCEEDED
        ]
        write(outputs[:small_chunks])
        write(outputs[small_chunks:])

    assert stats.applied == n
    stored = items_by_id(ledger.database_url)
    for row in rows:
        got = stored[row["custom_id"]]
        assert (got["status"], got["result_json"], got["error_message"]) == (
            row["status"],
            row["result_json"],
            row["error_message"],
        )
        assert got["shard_id"] == sid
    written = table_rows(ledger.database_url, L.output_table)
    outputs = {r["custom_id"]: r["output_json"] for r in written}
    assert outputs == {r["custom_id"]: r["result_json"] for r in rows if r["status"] == SUCCEEDED}
    # One time for the whole set, encoded once and read back as the time it was.
    stamps = {L.as_utc(r["created_at"]) for r in written}
    assert len(stamps) == 1 and before <= stamps.pop() <= L.utcnow()
    # So are the items' creation times (SQLite: encoded once for all the rows), stored as
    # SQLAlchemy stores a time, or comparisons in SQL would compare other strings.
    stamps = {L.as_utc(r["created_at"]) for r in stored.values()}
    assert len(stamps) == 1 and added <= (stamp := stamps.pop()) <= before
    engine = engine_of(ledger.database_url)
    if engine.dialect.name == "sqlite":
        with engine.connect() as conn:
            raw = set(conn.exec_driver_sql("SELECT created_at FROM llm_batch_result").scalars())
        encode = tables.Timestamp.dialect_impl(engine.dialect).bind_processor(engine.dialect)
        assert raw == {encode(stamp)}

    # An item row without a status: the NOT NULL constraint refuses the whole chunk.
    with pytest.raises(sa.exc.IntegrityError):
        ledger.add_items([item_row(cid(900)), item_row("no-status") | {"status": None}])
    assert cid(900) not in items_by_id(ledger.database_url)


@pytest.mark.parametrize("version", [2, 3, 4])
def test_an_older_ledger_loses_the_status_index_and_keeps_room_for_updates(
    database_url: str, version: int
) -> None:
    """Imports rewrite every item's status: without an index on it, and with free space in
    each page, PostgreSQL updates rows in place. An older ledger is upgraded to that: version
    2 had the index, version 3 left less room (fillfactor 70); before version 5 items had no
    request_offset; before version 14 outputs had a serial key, dropped on PostgreSQL."""
    schema_version(LedgerResource(database_url=database_url))
    postgres = engine_of(database_url).dialect.name == "postgresql"
    statements = [
        "ALTER TABLE llm_batch_result DROP COLUMN request_offset",
        "DROP TABLE llm_batch_notification",  # version 6 adds it
        "DROP TABLE llm_batch_pipeline_state",  # version 7 adds it
    ]
    if postgres:  # items and outputs had a foreign key to their job
        statements += [
            f"ALTER TABLE {table} ADD FOREIGN KEY (job_id) REFERENCES llm_batch_job"
            for table in ("llm_batch_result", "llm_batch_output")
        ]
        # and outputs a serial key
        statements.append("ALTER TABLE llm_batch_output ADD COLUMN id BIGSERIAL PRIMARY KEY")
    if version == 2:
        statements.append("CREATE INDEX ix_result_job_status ON llm_batch_result (job_id, status)")
    if postgres:
        statements.append("ALTER TABLE llm_batch_result SET (fillfactor = 70)")

    upgraded = upgraded_from(database_url, version, *statements)

    inspector = sa.inspect(upgraded.engine)
    columns = {c["name"] for c in inspector.get_columns("llm_batch_result")}
    assert "request_offset" in columns
    assert {"llm_batch_notification", "llm_batch_pipeline_state"} <= set(
        inspector.get_table_names()
    )
    names = {i["name"] for i in inspector.get_indexes("llm_batch_result")}
    assert "ix_result_job_status" not in names and "ix_result_shard" in names
    if postgres:
        assert inspector.get_foreign_keys("llm_batch_result") == []
        assert inspector.get_foreign_keys("llm_batch_output") == []
        assert "id" not in {c["name"] for c in inspector.get_columns("llm_batch_output")}
        with upgraded.engine.connect() as conn:
            options = conn.execute(
                sa.text("SELECT reloptions FROM pg_class WHERE oid = 'llm_batch_result'::regclass")
            ).scalar()
        assert f"fillfactor={tables.RESULT_FILLFACTOR}" in (options or [])
    # Outputs are replaced as before, in the table as it was upgraded.
    make_job(upgraded)
    for text in ("first", "second"):
        with upgraded.replacing_outputs(JOB) as write:
            write([(cid(n), None, "v1", "m", f"{text} {n}") for n in range(3)])
    assert sorted(upgraded.job_outputs(JOB)) == [(cid(n), f"second {n}") for n in range(3)]


def test_a_version_8_ledger_gains_the_lock_leases_and_the_lifecycle_columns(
    database_url: str,
) -> None:
    """Version 9 adds the locks' fencing leases, an eval job's parent pipeline, when a day was
    validated and reported, and when a shard's cancel was sent."""
    first = LedgerResource(database_url=database_url)
    make_job(first)
    added = {
        "llm_batch_job": ("parent_pipeline", "validated_at", "reported_at"),
        "llm_batch_shard": ("cancel_sent_at",),
    }
    upgraded = upgraded_from(
        database_url,
        8,
        "DROP TABLE llm_lock_lease",
        *(
            f"ALTER TABLE {table} DROP COLUMN {column}"
            for table, columns in added.items()
            for column in columns
        ),
    )

    inspector = sa.inspect(upgraded.engine)
    assert "llm_lock_lease" in inspector.get_table_names()
    for table, columns in added.items():
        assert set(columns) <= {c["name"] for c in inspector.get_columns(table)}
    job = upgraded.get_job(JOB)
    assert job is not None and job.validated_at is None and job.parent_pipeline is None
    with upgraded.day_lock(JOB, holder="after the upgrade"):
        upgraded.update_job(JOB, reported_at=L.utcnow())
    assert upgraded.get_job(JOB).reported_at is not None


def test_a_version_9_ledger_gains_when_retention_expired_a_day(database_url: str) -> None:
    """Version 10 adds when retention expired a day; a version 9 ledger's jobs are not."""
    first = LedgerResource(database_url=database_url)
    make_job(first)
    upgraded = upgraded_from(
        database_url, 9, "ALTER TABLE llm_batch_job DROP COLUMN retention_expired_at"
    )
    job = upgraded.get_job(JOB)
    assert job is not None and job.retention_expired_at is None
    assert upgraded.expire_jobs([JOB]).jobs_expired == 1
    expired = upgraded.get_job(JOB)
    assert expired is not None and expired.retention_expired_at is not None


def test_a_version_10_ledger_gains_the_id_key_table_and_keeps_its_ids(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Version 11 derives custom_ids with a key, the ledger's own when none is configured;
    a version 10 ledger gains its table, and its items stay known by their source ids."""
    monkeypatch.delenv("LLM_ASSETS_ID_KEY", raising=False)
    first = LedgerResource(database_url=database_url)
    make_job(first)
    first.add_items([item_row("20261102_R-1_0123456789abcdef0123", status=PENDING)])
    upgraded = upgraded_from(database_url, 10, "DROP TABLE llm_id_key")
    key = upgraded.item_id_key()
    assert len(key) == 64 and LedgerResource(database_url=database_url).item_id_key() == key
    assert upgraded.known_items(JOB) == ({"src-20261102_R-1_0123456789abcdef0123"}, set())


def test_a_version_11_ledger_gains_the_learned_quotas_and_when_batches_started(
    database_url: str,
) -> None:
    """Version 12 learns provider quotas (llm_quota) and records when a batch started; a
    version 11 ledger keeps its shards, which have not started as far as it knows."""
    from llm_assets.resources.ledger import QuotaKey
    from llm_assets.steps import quota

    first = LedgerResource(database_url=database_url)
    make_job(first)
    first.add_shard_with_items(shard_row(item_count=1), [item_row(cid(1), shard=shard_id(0, 0))])
    upgraded = upgraded_from(
        database_url,
        11,
        "DROP TABLE llm_quota",
        "ALTER TABLE llm_batch_shard DROP COLUMN started_at",
    )
    shard = upgraded.get_shard(shard_id(0, 0))
    assert shard is not None and shard.started_at is None
    assert upgraded.mark_started(shard.shard_id) and not upgraded.mark_started(shard.shard_id)
    key = QuotaKey(provider="openai", account="default", model_name="m", kind=quota.TOKENS)
    learned = upgraded.learn_quota(
        key, lambda r: quota.after_refusal(r, load=900, amount=300, stated=None, now=L.utcnow())
    )
    assert (learned.learned_limit, learned.refusals) == (900, 1)


def test_a_version_6_ledger_gains_the_pipeline_state_table(database_url: str) -> None:
    """Version 7 adds the pipeline pauses; a version 6 ledger keeps its rows and can pause."""
    first = LedgerResource(database_url=database_url)
    make_job(first)
    upgraded = upgraded_from(database_url, 6, "DROP TABLE llm_batch_pipeline_state")
    assert "llm_batch_pipeline_state" in sa.inspect(upgraded.engine).get_table_names()
    assert upgraded.get_job(JOB) is not None
    assert upgraded.pipeline_pause("reviews") is None
    upgraded.pause_pipeline("reviews", paused_by="ops", reason="after the upgrade")
    assert upgraded.pipeline_pause("reviews") is not None


def test_each_connection_opens_with_the_ledger_session_settings(ledger: LedgerResource) -> None:
    """SQLite: WAL and a busy timeout for concurrent runs. PostgreSQL: temp_buffers big enough
    that an import's staged chunk is not written out and read back (settable only before a
    session's first temporary table, so it must come with the connection), and no JIT."""
    with ledger.engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            # A pooled connection used for a staged upsert first, then a fresh one.
            ledger.upsert_results("no-job", [{"custom_id": "c", "status": "succeeded"}])
            assert conn.execute(sa.text("SHOW temp_buffers")).scalar() == schema.TEMP_BUFFERS
        else:
            assert conn.execute(sa.text("PRAGMA journal_mode")).scalar() == "wal"
            assert conn.execute(sa.text("PRAGMA busy_timeout")).scalar() == 30000
    ledger.engine.dispose()
    with ledger.engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            assert conn.execute(sa.text("SHOW temp_buffers")).scalar() == schema.TEMP_BUFFERS
            assert conn.execute(sa.text("SHOW jit")).scalar() == "off"


def test_the_background_writer_runs_in_order_and_stops_at_the_first_error() -> None:
    done: list[int] = []

    def fail() -> None:
        raise ValueError("write failed")

    with pytest.raises(ValueError, match="write failed"), L.BackgroundWriter(depth=1) as writer:
        writer.submit(lambda: done.append(1))
        writer.submit(fail)
        writer.submit(lambda: done.append(3), skipped=lambda: done.append(-3))
    assert done == [1, -3]  # the third never ran (an earlier write failed): its cleanup did

    # The caller's own error wins over a write's.
    with pytest.raises(KeyError), L.BackgroundWriter() as writer:
        writer.submit(fail)
        raise KeyError("caller")


@pytest.mark.parametrize("database_url", [DATABASES[1]], indirect=True)
def test_copy_data_is_read_as_utf8_whatever_the_session_encoding_was(
    database_url: str,
) -> None:
    """Result rows reach PostgreSQL's COPY as UTF-8 bytes made in worker processes: a
    connection whose default client encoding is another (here LATIN1, from the URL) must
    still store them exactly. (PostgreSQL only: SQLite stores Python strings.)"""
    url = sa.engine.make_url(database_url).update_query_dict({"client_encoding": "LATIN1"})
    ledger = LedgerResource(database_url=url.render_as_string(hide_password=False))
    try:
        make_job(ledger)
        add_submitted_shard(ledger, 2)
        texts = ["日本語 ✓ café", "tab\there"]
        rows = [ok(cid(i), text=texts[i]) for i in range(2)]

        assert ledger.upsert_results(JOB, rows).applied == 2

        stored = items_by_id(ledger.database_url)
        assert [stored[cid(i)]["result_json"] for i in range(2)] == [r["result_json"] for r in rows]
    finally:
        L.dispose_engines(ledger.database_url)


def test_every_result_column_is_stored_as_given_through_the_bulk_format(
    ledger: LedgerResource,
) -> None:
    """Result rows go to PostgreSQL as binary COPY made for the ledger's column types (to
    SQLite as values): texts of any characters, NULLs in every nullable column, integers to
    the column's limit, costs to the last bit and a non-string output text all come back as
    they were given (the text of what is not a string)."""
    job_with_shard(ledger, 5)
    rows = [
        ok(cid(0), text="日本語 ✓ café \\N tab\there\nnew\r\\", tokens=2**31 - 1, cost=0.1 + 0.2),
        ok(cid(1), text="", tokens=0, cost=1e-300),
        {**ok(cid(2), cost=123456.789012345678), "result_json": None, "finish_reason": None},
        {**dead(cid(3), code="e\tr\\r"), "error_message": "line\none ✓", "model_name": None},
        {**ok(cid(4)), "result_json": 12.5, "cached_input_tokens": 3},
    ]

    assert ledger.upsert_results(JOB, rows).applied == 5

    stored = items_by_id(ledger.database_url)
    for row in rows:
        expected = {k: row.get(k, RESULT_DEFAULTS.get(k)) for k in L.RESULT_COLUMNS}
        if row["custom_id"] == cid(4):
            expected["result_json"] = "12.5"
        got = {k: stored[row["custom_id"]][k] for k in L.RESULT_COLUMNS}
        assert got == expected
        assert isinstance(got["cost_usd"], float)


@pytest.mark.parametrize("database_url", [DATABASES[1]], indirect=True)
def test_join_settings_go_with_the_next_statement_and_last_the_transaction(
    ledger: LedgerResource,
) -> None:
    """join_by_hash / join_by_index are sent with the statement after them (one round trip);
    they hold for the rest of the transaction and are gone after it."""

    def setting(bulk: Bulk) -> str:
        bulk.execute("SHOW enable_seqscan")
        return str(bulk.cursor.fetchone()[0])

    with ledger.begin() as conn:
        bulk = Bulk(conn)
        assert setting(bulk) == "on"
        bulk.join_by_hash()
        assert setting(bulk) == "off"
        assert setting(bulk) == "off"
        bulk.execute("SHOW enable_hashjoin")
        assert bulk.cursor.fetchone()[0] == "on"
        bulk.join_by_index()
        bulk.execute("SELECT 1 WHERE false")
        assert bulk.cursor.rowcount == 0  # the statement's, not the settings'
        assert setting(bulk) == "on"
        bulk.execute("SHOW enable_hashjoin")
        assert bulk.cursor.fetchone()[0] == "off"
    with ledger.begin() as conn:
        bulk = Bulk(conn)
        bulk.execute("SHOW enable_hashjoin")
        assert bulk.cursor.fetchone()[0] == "on"


def test_an_sqlite_too_old_for_the_import_is_refused_with_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SQLite import applies results with UPDATE ... FROM (SQLite 3.33, 2020): an older
    library is refused when the ledger opens, not at the first import with a syntax error."""
    import sqlite3

    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 31, 1))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.31.1")
    url = f"sqlite:///{tmp_path / 'old.db'}"

    with pytest.raises(RuntimeError, match=r"needs SQLite 3\.33\.0 or newer .* has 3\.31\.1"):
        L.get_engine(url)
    assert all(key[0] != url for key in L._engines)


@pytest.mark.parametrize("database_url", [DATABASES[1]], indirect=True)
@pytest.mark.parametrize("form", ["postgresql", "postgresql+psycopg2", "postgresql+psycopg"])
def test_every_postgresql_url_form_opens_the_ledger_with_its_driver(
    database_url: str, form: str
) -> None:
    """`postgresql://`, `postgresql+psycopg2://` and `postgresql+psycopg://` all name the
    same ledger, opened with the one driver the ledger writes with (its COPY included)."""
    url = sa.engine.make_url(database_url).set(drivername=form)
    ledger = LedgerResource(database_url=url.render_as_string(hide_password=False))
    try:
        assert ledger.engine.dialect.driver == schema.POSTGRES_DRIVER
        make_job(ledger)
        add_submitted_shard(ledger, 3)
        assert ledger.upsert_results(JOB, [ok(cid(i)) for i in range(3)]).applied == 3
        with ledger.replacing_outputs(JOB) as write:
            write([(cid(0), None, "v1", "m", "{}")])
        assert len(table_rows(ledger.database_url, L.output_table)) == 1
    finally:
        L.dispose_engines(ledger.database_url)


@pytest.mark.parametrize("driver", ["asyncpg", "pg8000"])
def test_a_postgresql_url_of_another_driver_is_refused_naming_the_forms_that_work(
    driver: str,
) -> None:
    """A driver the ledger does not write with is refused when the ledger opens, with the URL
    forms that work, never as a missing module in the middle of a step."""
    url = f"postgresql+{driver}://postgres@127.0.0.1:5432/llm_assets_test"
    ledger = LedgerResource(database_url=url)
    with pytest.raises(ValueError) as refused:
        ledger.engine  # noqa: B018
    message = str(refused.value)
    assert f"postgresql+{driver}" in message
    for form in ("postgresql://", "postgresql+psycopg://", "postgresql+psycopg2://"):
        assert form in message
    assert all(key[0] != url for key in L._engines)


# ------------------------------------------------------------------------------ notifications


def test_one_claimer_sends_a_day_summary(ledger: LedgerResource) -> None:
    """Sensors of several daemons, ticks and runs claim the same summary at once: exactly one
    claim wins (it sends the summary); a new fingerprint of the day is a new claim."""
    claim = {
        "pipeline": "reviews",
        "partition_date": DAY,
        "fingerprint": "f" * 64,
        "outcome": "finished",
        "text": "reviews 2024-05-01: finished",
        "job_id": JOB,
    }
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        won = list(
            pool.map(lambda n: ledger.claim_notification(**claim, run_id=f"run-{n}"), range(8))
        )
    assert won.count(True) == 1
    assert not ledger.claim_notification(**claim)
    assert ledger.claim_notification(**(claim | {"fingerprint": "e" * 64}))
    ledger.record_delivery("reviews", DAY, "f" * 64, "webhook answered HTTP 500")

    sent = ledger.sent_notifications("reviews", DAY)
    assert [(row["fingerprint"][0], row["outcome"]) for row in sent] == [
        ("f", "finished"),
        ("e", "finished"),
    ]
    assert sent[0]["delivery_error"] == "webhook answered HTTP 500"
    assert sent[0]["delivered_at"] is not None and sent[1]["delivered_at"] is None
    assert sent[0]["run_id"] == f"run-{won.index(True)}"


# ------------------------------------------------------------------------------------- pauses


def test_pause_and_resume_are_idempotent_and_per_pipeline(ledger: LedgerResource) -> None:
    """The first pause is kept (who, when, why) however often it is repeated, also by many at
    once; a resume ends it once; other pipelines are never paused by it."""
    assert ledger.pipeline_pause("reviews") is None
    assert ledger.resume_pipeline("reviews", resumed_by="ops") is None

    with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(
            pool.map(
                lambda n: ledger.pause_pipeline("reviews", paused_by=f"op-{n}", reason=f"r{n}"),
                range(6),
            )
        )
    made = [pause for pause, first in answers if first]
    assert len(made) == 1
    [first] = made
    assert {pause for pause, _ in answers} == {first}
    assert ledger.pipeline_pause("reviews") == first
    assert first.reason == f"r{first.paused_by.removeprefix('op-')}"
    assert ledger.pipeline_pause("tickets") is None

    again, made_again = ledger.pause_pipeline("reviews", paused_by="someone", reason="other")
    assert (again, made_again) == (first, False)

    assert ledger.resume_pipeline("reviews", resumed_by="ops") == first
    assert ledger.pipeline_pause("reviews") is None
    assert ledger.resume_pipeline("reviews", resumed_by="ops") is None

    later, made_later = ledger.pause_pipeline("reviews", paused_by="ana", reason="")
    assert made_later and later.paused_by == "ana" and later.reason == ""
    assert later.paused_at >= first.paused_at
