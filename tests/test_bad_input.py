"""Bad input never vanishes: every source row ends as one ledger row, sent or dead-lettered.

A day of reviews mixes good rows with every kind of bad row (blank or missing text, missing
ids, repeated ids, text over the context window, invalid UTF-8, lines that are not JSON
objects, a row without a date) and with ids that try to escape paths or inject SQL. The day
runs through Dagster against the fake OpenAI server on SQLite and PostgreSQL.
"""

import datetime as dt
import decimal
import hashlib
import json
import multiprocessing
import os
import pickle
import re
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_assets import steps
from llm_assets.defs.factory import asset_key
from llm_assets.items.source import SourceRow, SourceRowModel
from llm_assets.resources.ledger import TERMINAL, metadata, output_table, result_table
from tests import test_openai_provider as openai_tests
from tests.fakes.openai_server import FakeOpenAI
from tests.harness import DAY, Harness, open_harness, provider_for, review_spec, truthful

pytestmark = pytest.mark.fake_server("openai", responder=truthful)

CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
ARTIFACT_KINDS = {"snapshots", "shards", "outputs", "dead_letters", "reports"}
STAMP = "2026-11-02T09:30:00Z"
# gpt-4o-mini has a 128,000-token window and the estimate is about four characters a token.
OVERSIZED_TEXT = "This blender is great. " * 27_000  # 621,000 characters
WEIRD_IDS = [
    "a/b",
    "../../etc/passwd",
    "x'; DROP TABLE llm_batch_result; --",
    '"quoted"',
    "line\nbreak",
    "z" * 1000,
    "ümlaut-ñ",
]
PADDED = "   padded   "  # kept exactly: see test_an_id_with_surrounding_spaces_is_kept_exactly


@dataclass(frozen=True)
class Line:
    """One physical line of the source file and what must become of it."""

    raw: bytes
    code: str | None = None  # None: sent and succeeded; "blank": skipped; else input error_code
    source_id: str | None = None
    first_line: int | None = None  # duplicates: the line of the row that is kept


def review(review_id: Any = ..., text: Any = ..., created_at: Any = STAMP) -> bytes:
    row: dict[str, Any] = {}
    if review_id is not ...:
        row["review_id"] = review_id
    if created_at is not ...:
        row["created_at"] = created_at
    if text is not ...:
        row["text"] = text
    return json.dumps(row).encode()


def good_text(n: int) -> str:
    word = ["great", "terrible", "excellent", "awful"][n % 4]
    return f"The kettle is {word}. Order {2000 + n} arrived on time."


def good(source_id: str, n: int) -> Line:
    return Line(review(source_id, good_text(n)), source_id=source_id)


def bad_day() -> list[Line]:
    lines = [good(f"G-{n:03d}", n) for n in range(8)]
    lines += [
        Line(review("E-space", " \t  "), "empty_field", "E-space"),
        Line(review("E-empty", ""), "empty_field", "E-empty"),
        Line(review("E-null", None), "empty_field", "E-null"),
        Line(review(text=good_text(50)), "missing_id"),
        Line(review("", good_text(51)), "missing_id"),
        good("D-1", 52),
    ]
    dup_first = len(lines)  # 1-based line number of "D-1"
    lines += [good(f"G-{n:03d}", n) for n in range(8, 11)] + [
        Line(review("D-1", good_text(53)), "duplicate_id", "D-1", dup_first),
        Line(b"", "blank"),
        Line(b"   \t", "blank"),
        Line(review("D-1", good_text(54)), "duplicate_id", "D-1", dup_first),
        Line(review("C-huge", OVERSIZED_TEXT), "context_exceeded", "C-huge"),
        Line(
            b'{"review_id": "U-1", "created_at": "'
            + STAMP.encode()
            + b'", "text": "caf\xe9 \xff"}',
            "invalid_row",
        ),
        Line(b'{"review_id": "J-1", "created_at": ', "invalid_row"),
        Line(b"this line is not JSON at all", "invalid_row"),
        Line(json.dumps(["A-1", STAMP, "an array, not an object"]).encode(), "invalid_row"),
        Line(review("N-date", good_text(55), created_at=...), "missing_date", "N-date"),
    ]
    lines += [good(weird, 60 + n) for n, weird in enumerate(WEIRD_IDS)]
    lines.append(good(PADDED, 70))
    lines += [good(f"G-{n:03d}", n) for n in range(11, 20)]
    return lines


def write_source(home: Path, lines: list[Line]) -> Path:
    path = home / "reviews" / f"reviews-{DAY.isoformat()}.jsonl"
    path.write_bytes(b"\n".join(line.raw for line in lines) + b"\n")
    return path


def make_harness(
    tmp_path: Path, database_url: str, fake: FakeOpenAI, **overrides: Any
) -> Iterator[Harness]:
    spec = review_spec("openai", "gpt-4o-mini", **overrides)
    with open_harness(tmp_path, database_url, spec, provider_for(fake), reviews=0) as harness:
        (harness.home / "reviews" / f"reviews-{DAY.isoformat()}.jsonl").unlink()
        yield harness


@pytest.fixture
def harness(tmp_path: Path, database_url: str, fake: FakeOpenAI) -> Iterator[Harness]:
    yield from make_harness(tmp_path, database_url, fake)


def harness_reading(
    tmp_path: Path, database_url: str, fake: FakeOpenAI, kind: str
) -> Iterator[tuple[Harness, Path]]:
    """A harness whose spec reads `kind` files (csv, parquet), with the day's file to write."""
    overrides = {"source": {"kind": kind, "uri": f"reviews/*.{kind}"}}
    for harness in make_harness(tmp_path, database_url, fake, **overrides):
        yield harness, harness.home / "reviews" / f"reviews-{DAY.isoformat()}.{kind}"


def line_of(message: str, source: Path) -> int:
    """The line number an input dead letter's message names (it starts with `file:line: `)."""
    found = re.match(re.escape(str(source)) + r":(\d+): ", message)
    assert found is not None, f"{message[:200]!r} does not start with {source}:<line>"
    return int(found.group(1))


def rows_by_line(harness: Harness, source: Path) -> dict[int, dict[str, Any]]:
    """Ledger rows keyed by the source line they came from (one row per line)."""
    lines = {n: line for n, line in enumerate(bad_day(), start=1)}
    by_source = {line.source_id: n for n, line in lines.items() if line.code is None}
    by_source["padded"] = by_source[PADDED]  # today the id is stored stripped
    found: dict[int, dict[str, Any]] = {}
    for row in harness.rows().values():
        if row["status"] == "dead_letter":
            number = line_of(row["error_message"], source)
        else:
            number = by_source[row["source_id"]]
        assert number not in found, f"line {number} has two ledger rows"
        found[number] = row
    return found


def snapshot_lines(harness: Harness) -> list[dict[str, Any]]:
    uri = steps.current_snapshot_uri(harness.spec, DAY, harness.storage)
    return [json.loads(line) for line in harness.storage.open_lines(uri)]


def snapshot_row_count(harness: Harness) -> int:
    event = harness.instance.get_latest_materialization_event(
        asset_key(harness.spec, "input_snapshot")
    )
    assert event is not None and event.asset_materialization is not None
    assert event.asset_materialization.partition == DAY.isoformat()
    value = event.asset_materialization.metadata["dagster/row_count"].value
    assert isinstance(value, int)
    return value


def all_files(root: Path) -> list[Path]:
    return sorted(Path(folder) / name for folder, _, names in os.walk(root) for name in names)


def test_every_bad_row_becomes_one_input_dead_letter_and_the_rest_succeed(
    tmp_path: Path, harness: Harness, fake: FakeOpenAI
) -> None:
    lines = bad_day()
    numbered = dict(enumerate(lines, start=1))
    source = write_source(harness.home, lines)
    outside_before = sorted(p.name for p in tmp_path.parent.iterdir())

    outcome = harness.run_day()

    kept = {n: line for n, line in numbered.items() if line.code != "blank"}
    goods = {n for n, line in kept.items() if line.code is None}
    bads = set(kept) - goods
    assert len(goods) == 29 and len(bads) == 13
    assert (outcome.total, outcome.succeeded, outcome.dead_letters) == (42, 29, 13)
    assert outcome.open_items == 0 and outcome.done
    assert outcome.dead_letters_by_class == {"input": 13}

    # The snapshot has one row per non-blank line (blank lines are not rows; undated and
    # unreadable rows come after the dated ones) and its count is succeeded + dead letters.
    snapshot = snapshot_lines(harness)
    assert sorted(row["line"] for row in snapshot) == sorted(kept)
    assert {row["file"] for row in snapshot} == {str(source)}
    assert snapshot_row_count(harness) == len(snapshot) == outcome.succeeded + outcome.dead_letters

    # Exactly one terminal ledger row per non-blank line.
    rows = rows_by_line(harness, source)
    assert set(rows) == set(kept)
    assert len(harness.rows()) == len(kept)
    assert all(row["status"] in TERMINAL for row in rows.values())
    for number, line in kept.items():
        row = rows[number]
        if line.code is None:
            assert row["status"] == "succeeded", (number, row)
            assert row["error_class"] is None
            continue
        assert (row["status"], row["error_class"], row["error_code"]) == (
            "dead_letter",
            "input",
            line.code,
        ), (number, row)
        assert row["error_message"].startswith(f"{source}:{number}: ")
        assert row["source_id"] == line.source_id
        assert row["shard_id"] is None and row["attempts"] == 0
        if line.first_line is not None:
            assert f"already seen at {source}:{line.first_line}" in row["error_message"]
    assert (
        "invalid UTF-8"
        in rows[next(n for n, li in kept.items() if b"\xff" in li.raw)]["error_message"]
    )
    assert sum(1 for row in rows.values() if row["source_id"] == "D-1") == 3

    # Weird ids succeed, keep their business key exactly, and get a safe custom_id.
    by_source = {row["source_id"]: row for row in rows.values() if row["status"] == "succeeded"}
    for weird in WEIRD_IDS:
        assert by_source[weird]["status"] == "succeeded", weird
    assert PADDED in by_source or "padded" in by_source
    assert all(CUSTOM_ID.match(row["custom_id"]) for row in rows.values())
    assert len({row["custom_id"] for row in rows.values()}) == len(rows)

    # Nothing dead-lettered reached the provider; every good row was sent exactly once.
    sent = Counter(fake.submitted_custom_ids())
    assert sent == Counter({rows[n]["custom_id"]: 1 for n in goods})

    # Outputs and the dead-letter export carry the same split, with the business keys intact.
    outputs = pd.read_parquet(
        harness.storage.uri(
            f"outputs/{harness.spec.name}/{DAY.isoformat()}/{harness.job_id()}.parquet"
        )
    )
    assert sorted(outputs["source_id"]) == sorted(by_source)
    assert set(WEIRD_IDS) <= set(outputs["source_id"])
    dead_export = harness.storage.uri(
        f"dead_letters/{harness.spec.name}/{DAY.isoformat()}/{harness.job_id()}.jsonl"
    )
    exported = [json.loads(line) for line in harness.storage.open_lines(dead_export)]
    assert sorted(e["custom_id"] for e in exported) == sorted(rows[n]["custom_id"] for n in bads)

    # The SQL-metacharacter id changed nothing: every ledger table is there and counts right.
    with harness.ledger.engine.connect() as conn:
        assert set(metadata.tables) <= set(sa.inspect(conn).get_table_names())
        total = conn.execute(sa.select(sa.func.count()).select_from(result_table)).scalar_one()
    assert total == len(kept)

    # No file outside the storage root, the source folder, Dagster's and the fake's state.
    assert sorted(p.name for p in tmp_path.parent.iterdir()) == outside_before
    artifacts = harness.home / "artifacts"
    allowed = [artifacts, harness.home / "reviews", tmp_path / "dagster", tmp_path / "fake_openai"]
    for path in all_files(tmp_path):
        assert ".." not in path.name and path.name != "passwd", path
        if path.relative_to(tmp_path).parts[0].startswith("ledger.db"):
            continue  # the SQLite ledger, its journal and its submission locks
        assert any(path.is_relative_to(root) for root in allowed), path
    assert all_files(harness.home / "reviews") == [source]
    for path in all_files(artifacts):
        parts = path.relative_to(artifacts).parts
        if parts[0] in ("published", "qa", "gate"):
            assert parts[1] == harness.spec.name and parts[2].startswith(DAY.isoformat())
            continue
        assert parts[0] in ARTIFACT_KINDS and parts[1:3] == (harness.spec.name, DAY.isoformat())
        assert not any(frag in str(path) for frag in ("passwd", "DROP", "quoted", "zzzz", "\n"))


def test_running_the_day_again_changes_nothing(harness: Harness, fake: FakeOpenAI) -> None:
    write_source(harness.home, bad_day())
    first = harness.run_day()
    rows = harness.rows()
    shards = harness.ledger.shards(harness.job_id())
    sent = fake.submitted_custom_ids()
    snapshot = steps.current_snapshot_uri(harness.spec, DAY, harness.storage)

    again = harness.run_day()

    assert again.model_dump(exclude={"run_ids"}) == first.model_dump(exclude={"run_ids"})
    assert harness.rows() == rows
    assert harness.ledger.shards(harness.job_id()) == shards
    assert fake.submitted_custom_ids() == sent
    assert steps.current_snapshot_uri(harness.spec, DAY, harness.storage) == snapshot
    event = harness.instance.get_latest_materialization_event(
        asset_key(harness.spec, "input_snapshot")
    )
    assert event is not None and event.asset_materialization is not None
    assert event.asset_materialization.metadata["reused_existing_snapshot"].value is True
    assert snapshot_row_count(harness) == again.succeeded + again.dead_letters


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_csv_and_parquet_sources_dead_letter_a_missing_id_and_an_empty_text(
    tmp_path: Path, database_url: str, fake: FakeOpenAI, kind: str
) -> None:
    for harness, source in harness_reading(tmp_path, database_url, fake, kind):
        records = [
            {"review_id": f"T-{n}", "created_at": STAMP, "text": good_text(n)} for n in range(6)
        ]
        records.insert(2, {"review_id": None, "created_at": STAMP, "text": good_text(40)})
        records.insert(4, {"review_id": "T-empty", "created_at": STAMP, "text": ""})
        records.insert(5, {"review_id": "T-blank", "created_at": STAMP, "text": "   "})
        frame = pd.DataFrame.from_records(records)
        if kind == "csv":
            frame.to_csv(source, index=False)
            first_line = 2  # line 1 is the header
        else:
            frame.to_parquet(source, index=False)
            first_line = 1

        outcome = harness.run_day()

        assert (outcome.total, outcome.succeeded, outcome.dead_letters) == (9, 6, 3)
        assert outcome.dead_letters_by_class == {"input": 3} and outcome.open_items == 0
        assert snapshot_row_count(harness) == outcome.succeeded + outcome.dead_letters
        dead = {
            line_of(r["error_message"], source): r
            for r in harness.rows().values()
            if r["status"] == "dead_letter"
        }
        expected = {
            first_line + 2: ("missing_id", None),
            first_line + 4: ("empty_field", "T-empty"),
            first_line + 5: ("empty_field", "T-blank"),
        }
        assert {n: (r["error_code"], r["source_id"]) for n, r in dead.items()} == expected
        assert all(r["error_class"] == "input" for r in dead.values())
        assert harness.labels().keys() == {f"T-{n}" for n in range(6)}
        sent = Counter(fake.submitted_custom_ids())
        assert sent == Counter(
            {r["custom_id"]: 1 for r in harness.rows().values() if r["status"] == "succeeded"}
        )


def day_of(*extra: Line) -> list[Line]:
    return [good(f"G-{n:03d}", n) for n in range(4)] + list(extra)


def test_an_id_with_surrounding_spaces_is_kept_exactly(harness: Harness, fake: FakeOpenAI) -> None:
    write_source(harness.home, day_of(good("   padded   ", 10), good("padded", 11)))

    outcome = harness.run_day()

    assert outcome.total == outcome.succeeded == 6
    assert {"   padded   ", "padded"} <= set(harness.labels())


def test_the_first_row_of_an_id_is_kept_even_when_it_has_no_date(
    harness: Harness, fake: FakeOpenAI
) -> None:
    """Undated rows belong to the file's day and keep their place in the file: a later, dated
    row with the same id is the duplicate, as the message says."""
    source = write_source(
        harness.home,
        day_of(Line(review("D-1", good_text(20), created_at="someday")), good("D-1", 21)),
    )

    harness.run_day()

    rows = [r for r in harness.rows().values() if r["source_id"] == "D-1"]
    by_code = {r["error_code"]: r for r in rows}
    assert len(rows) == 2 and set(by_code) == {"missing_date", "duplicate_id"}
    assert by_code["missing_date"]["error_message"].startswith(f"{source}:5: ")
    assert by_code["duplicate_id"]["error_message"].startswith(f"{source}:6: ")
    assert f"already seen at {source}:5" in by_code["duplicate_id"]["error_message"]
    assert not {r["custom_id"] for r in rows} & set(fake.submitted_custom_ids())


def test_a_duplicate_never_shares_a_custom_id_with_a_real_row(
    harness: Harness, fake: FakeOpenAI
) -> None:
    source = write_source(
        harness.home,
        day_of(good("A", 10), good("A", 11), good("A#dup1", 12)),
    )

    outcome = harness.run_day()

    assert snapshot_row_count(harness) == 7
    assert (outcome.total, outcome.succeeded, outcome.dead_letters) == (7, 6, 1)
    [dead] = [r for r in harness.rows().values() if r["status"] == "dead_letter"]
    assert (dead["error_code"], line_of(dead["error_message"], source)) == ("duplicate_id", 6)
    assert {"A", "A#dup1"} <= set(harness.labels())


def test_a_lone_surrogate_escape_is_an_input_dead_letter(
    harness: Harness, fake: FakeOpenAI
) -> None:
    raw = b'{"review_id": "S-1", "created_at": "' + STAMP.encode() + b'", "text": "a \\ud800 b"}'
    source = write_source(harness.home, day_of(Line(raw, "invalid_row")))

    outcome = harness.run_day()

    assert (outcome.total, outcome.succeeded, outcome.dead_letters) == (5, 4, 1)
    [dead] = [r for r in harness.rows().values() if r["status"] == "dead_letter"]
    assert (dead["error_class"], dead["error_code"]) == ("input", "invalid_row")
    assert line_of(dead["error_message"], source) == 5


def test_a_csv_dead_letter_names_the_physical_line(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    for harness, source in harness_reading(tmp_path, database_url, fake, "csv"):
        frame = pd.DataFrame.from_records(
            [
                {"review_id": "T-0", "created_at": STAMP, "text": "Great.\nTwo\nmore lines."},
                {"review_id": "", "created_at": STAMP, "text": good_text(1)},
            ]
        )
        frame.to_csv(source, index=False)
        assert source.read_text().splitlines()[4].startswith(",")  # the missing id: line 5

        harness.run_day()

        [dead] = [r for r in harness.rows().values() if r["status"] == "dead_letter"]
        assert dead["error_code"] == "missing_id"
        assert line_of(dead["error_message"], source) == 5


def test_parquet_integer_ids_next_to_a_missing_id_keep_their_value(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    for harness, source in harness_reading(tmp_path, database_url, fake, "parquet"):
        # As Spark, DuckDB or pyarrow write it: an int64 column with a null, no pandas metadata.
        table = pa.table(
            {
                "review_id": pa.array([7, None, 9], pa.int64()),
                "created_at": [STAMP] * 3,
                "text": [good_text(n) for n in range(3)],
            }
        )
        pq.write_table(table, source)

        outcome = harness.run_day()

        assert (outcome.succeeded, outcome.dead_letters) == (2, 1)
        assert set(harness.labels()) == {"7", "9"}


def ready_pool(sent: list[tuple[Any, Any]], chunks: list[Any] | None = None) -> type:
    """A ProcessPoolExecutor for llm_assets.util.parallel whose workers are ready before its first
    chunk is sent (so chunks do go to them, not all worked here while one starts); each
    chunk's call (partial(_call, work, ...)) and future are appended to `sent`, and what is
    sent as the chunk to `chunks`."""
    from llm_assets.util import parallel

    class ReadyPool(parallel.concurrent.futures.ProcessPoolExecutor):
        def submit(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
            future = super().submit(fn, *args, **kwargs)
            if fn is parallel._warm:
                future.result()
            else:
                sent.append((fn, future))
                if chunks is not None:
                    chunks.append(args[0])
            return future

    return ReadyPool


def test_worker_processes_give_the_same_shards_dead_letters_and_results_as_one_process(
    tmp_path: Path, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large day's rows are assessed, and its result lines parsed, in worker processes;
    small chunks and a low threshold make this day one, with duplicates of an id in other
    chunks than its first row, and transient failures among the results."""
    from llm_assets.util import parallel

    submitted: list[tuple[Any, Any]] = []
    # One id key for both ledgers, so their items have the same custom_ids.
    monkeypatch.setenv("LLM_ASSETS_ID_KEY", "the id key both ledgers are given")

    def shards_and_rows(name: str, workers: str) -> tuple[list[bytes], list[tuple[Any, ...]]]:
        monkeypatch.setenv("LLM_ASSETS_WORKERS", workers)
        folder = tmp_path / name
        folder.mkdir()
        gen = make_harness(folder, f"sqlite:///{folder / 'ledger.db'}", fake)
        harness = next(gen)
        try:
            write_source(harness.home, bad_day() * 3)
            source = harness.settings.resolve_source_uri(harness.spec.source.uri)
            ctx = steps.StepContext(
                harness.spec, DAY, harness.ledger, harness.storage, harness.provider
            )
            steps.take_snapshot(ctx, source)
            built = steps.build_shards(ctx)
            shards = [harness.storage.read_bytes(uri) for uri in built.shard_uris]
            steps.submit_shards(ctx)
            harness.wait_for_batches(DAY)
            imported = steps.import_results(ctx)
            assert imported.lines.applied == 29 and imported.lines.duplicates > 0
            validated = steps.validate_outputs(ctx)
            assert validated.quality_failures and validated.valid_rows
            with harness.ledger.engine.connect() as conn:
                outputs = sorted(
                    (r.custom_id, r.output_json) for r in conn.execute(sa.select(output_table))
                )
            assert len(outputs) == validated.valid_rows
            keys = (
                "custom_id",
                "source_id",
                "status",
                "error_class",
                "error_code",
                "error_message",
                "input_tokens",
                "output_tokens",
                "cost_usd",
                "result_json",
            )
            # Rows without an id are named by their file's path, which differs by folder.
            rows = sorted(
                tuple(
                    str(row[k]).replace(str(folder), "<home>")
                    if row["source_id"] is not None or k != "custom_id"
                    else "<by path>"
                    for k in (*keys, "estimated_input_tokens")
                )
                for row in harness.rows().values()
            )
            return shards, rows + [("output", *o) for o in outputs]
        finally:
            gen.close()

    monkeypatch.setattr(parallel.concurrent.futures, "ProcessPoolExecutor", ready_pool(submitted))
    # About a fifth of the lines fail with a 500 (to be retried) and a fifth come twice; some
    # answers are not JSON or break the schema (quality dead letters).
    fake.line_fault = line_fault
    fake.responder = sloppy
    alone_shards, alone_rows = shards_and_rows("alone", "0")
    assert submitted == []
    monkeypatch.setattr(parallel, "CHUNK_ROWS", 5)
    monkeypatch.setattr(parallel, "BLOCK_ROWS", 2)
    monkeypatch.setattr(parallel, "INLINE_ROWS", 10)
    spread_shards, spread_rows = shards_and_rows("spread", "2")

    # Rows assessed and result lines parsed in the workers (and some chunks here meanwhile).
    assert {"assess_lines", "staged_results"} <= {call.args[0].__name__ for call, _ in submitted}
    assert spread_shards == alone_shards and alone_shards
    assert spread_rows == alone_rows
    codes = Counter(row[4] for row in spread_rows if row[0] != "output")
    items = [row for row in spread_rows if row[0] != "output"]
    requests = [row for row in items if row[3] != "input"]
    failed = [row for row in requests if line_fault(row[0], None) == "5xx"]
    assert len(requests) == 29 and 0 < len(failed) < 29
    assert all(row[2] != "succeeded" and row[3] == "transient" for row in failed)
    answered = Counter(row[3] for row in requests if row not in failed)
    assert answered["None"] and answered["quality"]
    assert {row[4] for row in requests if row[3] == "quality"} <= {
        "invalid_json",
        "label.literal_error",
    }
    # Every kind of bad row, and in each copy of the day after the first, every row with an
    # id a duplicate.
    with_id = sum(1 for line in bad_day() if line.source_id is not None)
    assert codes["duplicate_id"] == 2 * with_id + 2
    assert {"empty_field", "missing_id", "context_exceeded", "invalid_row", "missing_date"} < set(
        codes
    )


def test_ordered_map_keeps_order_raises_worker_errors_and_keeps_unpicklable_work_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from llm_assets.util import parallel

    monkeypatch.setattr(parallel, "CHUNK_ROWS", 3)
    monkeypatch.setattr(parallel, "INLINE_ROWS", 3)
    squares = [
        x for chunk in parallel.ordered_map(_squares, 0, range(40), workers=2) for x in chunk
    ]
    assert squares == [n * n for n in range(40)]
    with pytest.raises(ValueError, match="row 31"):
        for _ in parallel.ordered_map(_squares, 31, range(40), workers=2):
            pass
    # A context that does not pickle (a lambda) is worked in this process to the end.
    offset = 5
    local = [
        x
        for chunk in parallel.ordered_map(_apply, lambda n: n + offset, range(10), workers=2)
        for x in chunk
    ]
    assert local == [n + 5 for n in range(10)]
    monkeypatch.setenv("LLM_ASSETS_WORKERS", "two")
    with pytest.raises(ValueError, match="whole number"):
        parallel.worker_count()


def _spill_root() -> Path:
    """Where worker processes leave their results (llm_assets.util.parallel._spill_dir)."""
    return Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else Path(tempfile.gettempdir())


def test_worker_results_come_back_in_files_that_are_removed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Chunks go to workers and their results come back in files (not the pool's pipe);
    each is removed when it is read, the folder when the block ends; folders of processes
    that are gone, untouched for a while, are removed when a pool starts. Where a file
    cannot be written, chunks and results go through the pipe."""
    import subprocess
    import sys

    from llm_assets.util import parallel

    monkeypatch.setattr(parallel, "CHUNK_ROWS", 3)
    monkeypatch.setattr(parallel, "INLINE_ROWS", 3)
    returned: list[tuple[Any, Any]] = []
    chunks: list[Any] = []
    monkeypatch.setattr(
        parallel.concurrent.futures, "ProcessPoolExecutor", ready_pool(returned, chunks)
    )
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    root = _spill_root()
    stale = root / f"{parallel.SPILLS_PREFIX}{int(gone.stdout)}-test"
    stale.mkdir()
    (stale / "7").write_bytes(b"left by a killed run")
    # A folder of the same gone process, just changed: another namespace's live run.
    recent = root / f"{parallel.SPILLS_PREFIX}{int(gone.stdout)}-recent"
    recent.mkdir()
    alive = root / f"{parallel.SPILLS_PREFIX}{os.getpid()}-test"
    alive.mkdir()
    old = time.time() - parallel.STALE_SPILLS_SECONDS - 1
    for folder in (stale, alive):
        os.utime(folder, (old, old))
    try:
        with parallel.Workers(1) as workers:
            squares = [x for chunk in workers.map(_squares, 0, range(60)) for x in chunk]
            spills = workers._spills
            assert spills is not None and os.listdir(spills) == []
        assert not stale.exists() and recent.exists() and alive.exists()
    finally:
        shutil.rmtree(stale, ignore_errors=True)
        recent.rmdir()
        alive.rmdir()
    assert squares == [n * n for n in range(60)]
    assert returned and all(future.result() is None for _, future in returned)
    assert chunks and all(isinstance(chunk, parallel._Spilled) for chunk in chunks)
    assert not os.path.exists(spills)

    # No folder to write to: chunks and results go through the pipe, the same.
    returned.clear()
    chunks.clear()
    monkeypatch.setattr(parallel, "_spill_dir", lambda: str(tmp_path / "missing"))
    with parallel.Workers(1) as workers:
        squares = [x for chunk in workers.map(_squares, 0, range(60)) for x in chunk]
    assert squares == [n * n for n in range(60)]
    assert returned and all(future.result() is not None for _, future in returned)
    assert chunks and all(isinstance(chunk, list) for chunk in chunks)


def test_odd_entries_where_result_folders_go_never_stop_workers_from_starting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Only this user's real folders of processes that are gone are removed when a pool
    starts; names that only look like ours, files and symlinks under such names, another
    user's folder and a folder that cannot be emptied are left as found, and a file where
    the root folder should be sends the results to the temp folder instead."""
    import subprocess
    import sys

    from llm_assets.util import parallel

    gone = int(
        subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    root = tmp_path / "shm"
    root.mkdir()
    monkeypatch.setattr(parallel, "SPILLS_ROOT", str(root))
    prefix = parallel.SPILLS_PREFIX
    kept: list[Path] = []
    for odd in ("", "-x", "abc-1", "\u00b2-1", "\u0663-1", "0-x", "99999999999999999999-x"):
        kept.append(root / f"{prefix}{odd}")
        kept[-1].mkdir()
    a_file = root / f"{prefix}{gone}-file"
    a_file.write_bytes(b"not a folder")
    kept.append(a_file)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_bytes(b"not ours")
    kept.append(root / f"{prefix}{gone}-link")
    kept[-1].symlink_to(elsewhere, target_is_directory=True)
    stale = root / f"{prefix}{gone}-stale"
    (stale / "locked").mkdir(parents=True)
    (stale / "locked" / "7").write_bytes(b"left by a killed run")
    if os.geteuid() == 0:
        kept.append(root / f"{prefix}{gone}-theirs")
        kept[-1].mkdir()
        os.chown(kept[-1], 65534, 65534)
    else:  # a folder that cannot be emptied
        (stale / "locked").chmod(0o500)
    old = time.time() - parallel.STALE_SPILLS_SECONDS - 1
    for entry in (*kept, stale):
        os.utime(entry, (old, old), follow_symlinks=False)
    try:
        made = Path(parallel._spill_dir())
        assert made.parent == root and made.is_dir()
        assert all(entry.is_symlink() or entry.exists() for entry in kept)
        assert (elsewhere / "keep").read_bytes() == b"not ours"
        assert os.geteuid() != 0 or not stale.exists()

        # A file where the root folder should be: the temp folder holds the results.
        system_tmp = tmp_path / "tmp"
        system_tmp.mkdir()
        monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))
        monkeypatch.setattr(parallel, "SPILLS_ROOT", str(a_file))
        assert Path(parallel._spill_dir()).parent == system_tmp
        parallel._remove_stale_spills(str(a_file))
        parallel._remove_stale_spills(str(tmp_path / "missing"))
    finally:
        if stale.exists():
            (stale / "locked").chmod(0o700)


def sloppy(body: Any) -> str:
    """Answers like a good model, except for some texts: not JSON, or a label not allowed."""
    text = openai_tests.user_text(body)
    residue = int(hashlib.sha256(text.encode()).hexdigest(), 16) % 4
    if residue == 0:
        return "{not json"
    answer = json.loads(openai_tests.truthful(body))
    return json.dumps({**answer, "label": "lukewarm"}) if residue == 1 else json.dumps(answer)


def line_fault(custom_id: str, body: Any) -> str | None:
    residue = int(hashlib.sha256(custom_id.encode()).hexdigest(), 16) % 5
    return {0: "5xx", 1: "duplicate"}.get(residue)


def _squares(fail_at: int, chunk: list[int]) -> list[int]:
    if fail_at and fail_at in chunk:
        raise ValueError(f"row {fail_at}")
    return [n * n for n in chunk]


def _apply(function: Any, chunk: list[int]) -> list[int]:
    return [function(n) for n in chunk]


@pytest.mark.parametrize(
    "record",
    [
        {"a": 1, "b": 2.5, "c": "ümlaut ✓ 😀", "d": None, "e": True, "f": [1, "x", {"g": 0.1}]},
        {"ctl": "line\nbreak\ttab\x01\x7f\u2028", "q": '"quoted" \\ slash /'},
        {"big": 2**70, "neg": -(2**63)},
        {"utc": dt.datetime(2026, 11, 2, 9, 30, tzinfo=dt.UTC), "naive": dt.datetime(2026, 11, 2)},
        {"offset": dt.datetime(2026, 11, 2, tzinfo=dt.timezone(dt.timedelta(hours=1)))},
        {"day": dt.date(2026, 11, 2), "decimal": decimal.Decimal("1.10"), "tiny": 1e-7},
        {"huge": 1e300, "sum": 0.30000000000000004, "nan": float("nan")},
        None,
    ],
)
def test_snapshot_lines_are_written_as_pydantic_writes_them(record: Any) -> None:
    """The snapshot is content-addressed: its fast writer must match the pydantic model's
    JSON byte for byte (parquet sources bring datetimes and decimals; JSON brings huge
    integers), and JSON rows must read back as they were."""
    error = None if record is not None else "not a JSON object"
    expected = SourceRowModel(file="f.jsonl", line=3, record=record, error=error)
    row = SourceRow("f.jsonl", 3, record, error)
    assert row.to_json() == expected.model_dump_json().encode()
    # What JSON can hold reads back as it was (NaN is written as null, as pydantic does).
    plain = (str, int, float, bool, list, type(None))
    if record is None or all(isinstance(v, plain) and v == v for v in record.values()):
        assert SourceRow.from_json(row.to_json()) == row


@pytest.mark.parametrize(
    "text",
    [
        '{"a": NaN, "b": Infinity}',
        '{"big": 123456789012345678901234567890, "id": 9223372036854775808}',
        '{"s": "\\udc80"}',
        '{"a": "x", "b": {"c": [1, "y", {"d": 12345678901234567890123}]}}',
        '[["x", 2.5, [null, true, 1e300]]]',
        "-9223372036854775809",
    ],
)
def test_source_lines_orjson_cannot_read_are_read_as_json_reads_them(text: str) -> None:
    from llm_assets.util.fastjson import json_loads

    assert repr(json_loads(text)) == repr(json.loads(text))
    with pytest.raises(json.JSONDecodeError, match="Expecting value"):
        json_loads('{"review_id": "J-1", "created_at": ')


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(value=json_values)
def test_any_json_value_reads_as_json_reads_it(value: Any) -> None:
    """orjson's reading is kept only where it is json's: integers past 64 bits, at any depth,
    are read again by json."""
    from llm_assets.util.fastjson import json_loads

    text = json.dumps(value)
    assert repr(json_loads(text)) == repr(json.loads(text))


WORKER_PARENT = """
import itertools

from llm_assets.util import parallel
from tests.test_bad_input import _pid_then_block

if __name__ == "__main__":  # spawned workers import this module again
    parallel.CHUNK_ROWS = 1
    parallel.INLINE_ROWS = 1
    with parallel.Workers(1) as workers:
        for result in workers.map(_pid_then_block, None, itertools.count()):
            print(result, flush=True)
"""

_chunks_in_worker = [0]


def _pid_then_block(_: Any, chunk: list[int]) -> int:
    """The pid of the process that works the chunk; in a worker, only the first chunk it
    gets ends: the later ones never finish on their own."""
    if multiprocessing.parent_process() is not None:
        _chunks_in_worker[0] += 1
        if _chunks_in_worker[0] > 1:
            os.read(_never_readable(), 1)
    return os.getpid()


def _never_readable() -> int:
    read_end, _write_end = os.pipe()  # the write end stays open in this process: read blocks
    return read_end


def child_env() -> dict[str, str]:
    """This process's environment, with this checkout on a child interpreter's import path."""
    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}


def fresh_python(code: str, *args: str, given: Any = None) -> bytes:
    """The output of `code` run with `args` by a new interpreter that imports this checkout,
    `given` (when there is something) pickled to its standard input."""
    import subprocess
    import sys

    stdin = None if given is None else pickle.dumps(given)
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        input=stdin,
        env=child_env(),
        capture_output=True,
        check=True,
    )
    return done.stdout


def test_a_worker_ends_when_the_process_that_started_it_is_killed(tmp_path: Path) -> None:
    """A run killed with SIGKILL (terminated from the UI, say) must not leave its worker
    processes running with their tokenizers."""
    import select
    import signal
    import subprocess
    import sys

    script = tmp_path / "parent.py"
    script.write_text(WORKER_PARENT)
    parent = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, env=child_env()
    )
    assert parent.stdout is not None
    # Chunks are worked in the parent until its worker has started; then one by the worker.
    worker = int(parent.stdout.readline())
    assert worker == parent.pid
    while worker == parent.pid:
        worker = int(parent.stdout.readline())
    # Readable once the worker has exited (opened before the kill: its pid cannot be reused).
    exited = os.pidfd_open(worker)
    try:
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        ready, _, _ = select.select([exited], [], [], 30)
        assert ready, f"worker {worker} outlived its parent"
    finally:
        os.close(exited)
    # Its workers' results folder stays behind, for the next run that starts workers to
    # remove once it is old (test_worker_results_come_back_in_files_that_are_removed).
    from llm_assets.util import parallel

    [left] = _spill_root().glob(f"{parallel.SPILLS_PREFIX}{parent.pid}-*")
    shutil.rmtree(left)


LIGHT_CHILD = """
import pickle, sys
work, context = pickle.loads(sys.stdin.buffer.read())
staged = work(context, [sys.argv[1].encode()])
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"dagster", "sqlalchemy", "pydantic",
    "openai", "anthropic", "boto3", "pandas", "pyarrow", "yaml", "tiktoken"})
print(staged.statuses, heavy)
"""


def test_an_import_worker_needs_none_of_the_heavy_packages(tmp_path: Path) -> None:
    """What the import sends a worker (the work and its context, as import_results builds
    them) unpickles and runs in a fresh interpreter without importing Dagster, SQLAlchemy,
    pydantic or an SDK: importing the steps module cost a worker 1.8 s and 200 MB."""
    from llm_assets.resources.pricing import load_price_table
    from llm_assets.resources.providers.openai_lines import normalize_line
    from llm_assets.results.rows import ResultStager, RowMaker, staged_results

    price = load_price_table().get("openai", "gpt-4o-mini")
    assert price is not None
    context = (
        normalize_line,
        RowMaker(price.cost_calculator(batch=True), price.name),
        ResultStager(binary_copy=True),  # as LedgerResource.result_stager makes it
    )
    line = json.dumps(openai_tests._CHAT)

    out = fresh_python(LIGHT_CHILD, line, given=(staged_results, context))

    assert out.decode().split() == ["['succeeded']", "[]"]


ASSESS_CHILD = """
import pickle, sys
work, context = pickle.loads(sys.stdin.buffer.read())
rows = work(context, [(0, [sys.argv[1].encode()])])
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"dagster", "sqlalchemy", "openai",
    "anthropic", "boto3", "pandas"})
sys.stdout.buffer.write(pickle.dumps((rows, heavy)))
"""


def test_a_shards_worker_needs_neither_dagster_nor_the_sdks() -> None:
    """What the shards step sends a worker (assess_lines and the Preparer, as build_shards
    makes it) unpickles and assesses a row in a fresh interpreter without Dagster,
    SQLAlchemy, pandas or an SDK: Dagster alone was 65 MB of the worker and most of its
    start. pyarrow is imported (RE2 for the personal-data pre-filter, about 25 MB)."""
    from llm_assets.items.prepare import Preparer, assess_lines
    from llm_assets.resources.providers.openai_batch import OpenAIBatchProvider
    from llm_assets.spec.model import PipelineSpec

    spec = PipelineSpec.model_validate(review_spec("openai", "gpt-4o-mini"))
    provider = OpenAIBatchProvider(api_key="test-key")
    preparer = Preparer(spec, DAY, 128_000, provider.line_encoder(spec), b"k" * 32)
    record = {"review_id": "R-1", "created_at": DAY.isoformat(), "text": "Arrived broken."}
    row = json.dumps({"file": "reviews/a.jsonl", "line": 1, "record": record})  # a snapshot's

    rows, heavy = pickle.loads(fresh_python(ASSESS_CHILD, row, given=(assess_lines, preparer)))
    assert rows == assess_lines(preparer, [(0, [row.encode()])])
    assert rows[0][4] and rows[0][5] > 0  # a request line, its tokens counted
    assert heavy == []


RELEASE_CHILD = """
import os
from llm_assets.util.memory import release_free_memory

def rss_mb():
    with open("/proc/self/status") as status:
        return int(status.read().split("VmRSS:")[1].split()[0]) // 1024

# Lines of a shard (bytes past pymalloc's small-object size come from malloc), most freed
# and a few kept alive between them: the heap is full of holes glibc keeps for reuse.
lines = [bytes([n % 251]) * 600 for n in range(400_000)]
kept = lines[::50]
del lines
freed = rss_mb()
release_free_memory()
print(freed, rss_mb(), len(kept))
"""


def test_memory_freed_between_shards_goes_back_to_the_operating_system(tmp_path: Path) -> None:
    """The shards step builds and frees a shard's lines again and again; what it freed must
    not stay in the process's RSS (glibc keeps it unless asked)."""
    freed, released, _ = map(int, fresh_python(RELEASE_CHILD).decode().split())
    assert freed > 200  # about 250 MB of lines were allocated, a fiftieth kept
    assert released < freed - 150, (freed, released)


def test_the_collector_is_paused_in_the_block_and_left_as_it_was() -> None:
    import gc

    from llm_assets.util.memory import collector_paused

    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():  # nested: the inner block leaves it paused
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("a failed step")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # paused by someone else before: not ours to start
    finally:
        gc.enable()


def test_shards_are_built_with_the_collector_paused(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shards step holds a shard's items while it makes millions of short-lived objects:
    full collections walking the live ones again cost seconds at a million items."""
    import gc

    seen: list[bool] = []
    write_shard = steps.shards.write_shard

    def recording(*args: Any, **kwargs: Any) -> str:
        seen.append(gc.isenabled())
        return write_shard(*args, **kwargs)

    monkeypatch.setattr(steps.shards, "write_shard", recording)
    write_source(harness.home, bad_day())
    source = harness.settings.resolve_source_uri(harness.spec.source.uri)
    ctx = steps.StepContext(harness.spec, DAY, harness.ledger, harness.storage, harness.provider)
    steps.take_snapshot(ctx, source)
    built = steps.build_shards(ctx)
    assert built.shards_created and seen == [False] * len(built.shards_created)
    assert gc.isenabled()


ID_KEYS = ["T00000001", "", "a b/c?d", "日本語", "\ud800 lone", "x" * 100, "--a--", "A_b-9"]


@pytest.mark.parametrize("key", ID_KEYS)
@pytest.mark.parametrize("kind", ["id", "dup-1", "row"])
def test_legacy_custom_ids_stay_what_earlier_versions_made(key: str, kind: str) -> None:
    """A legacy custom_id is an item's identity in ledgers written before keyed ids: however
    it is computed, it stays the date, the readable part and the first 20 hex digits of the
    SHA-256 of pipeline, date, kind and key joined by U+001F."""
    from llm_assets.items import ids

    day = dt.date(2026, 11, 2)
    joined = "\x1f".join(("reviews", day.isoformat(), kind, key))
    digest = hashlib.sha256(joined.encode("utf-8", errors="surrogatepass")).hexdigest()[:20]
    readable = re.sub(r"[^A-Za-z0-9]+", "-", key).strip("-")[:30].strip("-") or "x"
    assert ids.legacy_custom_id("reviews", day, key, kind) == f"20261102_{readable}_{digest}"


@pytest.mark.parametrize("key", ID_KEYS)
def test_custom_ids_are_what_their_definition_says(key: str) -> None:
    """An item's custom_id is the date, its row's position in the snapshot (8 hex digits)
    and the first 32 hex digits of the HMAC-SHA256, under the id key, of pipeline, date,
    `id` and source id joined by U+001F; a row never sent has the SHA-256 of pipeline, date,
    kind and key instead. Both fit every provider's rule."""
    import hmac

    from llm_assets.items import ids

    day = dt.date(2026, 11, 2)
    secret = b"an id key of thirty-two bytes..."

    def parts(kind: str) -> bytes:
        return "\x1f".join(("reviews", day.isoformat(), kind, key)).encode(
            "utf-8", errors="surrogatepass"
        )

    for other in (b"", b"a key longer than SHA-256's block of 64 bytes " * 3):
        keyed = hmac.new(other, parts("id"), hashlib.sha256).hexdigest()[:32]
        assert ids.custom_id(other, "reviews", day, key, 0) == f"20261102_00000000_{keyed}"
    keyed = hmac.new(secret, parts("id"), hashlib.sha256).hexdigest()[:32]
    plain = hashlib.sha256(parts("row")).hexdigest()[:32]
    assert ids.custom_id(secret, "reviews", day, key, 300) == f"20261102_0000012c_{keyed}"
    assert ids.unsent_id("reviews", day, key, "row") == f"20261102_{plain}"
    made = [
        ids.custom_id(secret, "reviews", day, key, 2**40),
        ids.unsent_id("reviews", day, key, "row"),
    ]
    assert all(re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", m) for m in made)
