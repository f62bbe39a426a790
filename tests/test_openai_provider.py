"""The openai adapter through the official SDK against the fake Files + Batches server."""

import contextlib
import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from llm_assets.defs.factory import asset_key
from llm_assets.defs.run_failures import StepFailed
from llm_assets.items.tokens import counter_for
from llm_assets.resources.ledger import utcnow
from llm_assets.resources.providers.base import ShardState, ShardSubmission
from tests.fakes.openai_server import FakeOpenAI, user_text
from tests.harness import Harness, first_time, make_harness, truthful

# One database (PostgreSQL in CI): these tests exercise the provider and the gate; the ledger
# and pipeline tests compare SQLite and PostgreSQL.
pytestmark = [pytest.mark.one_database, pytest.mark.fake_server("openai", responder=truthful)]


@pytest.fixture
def harness(tmp_path: Path, database_url: str, fake: FakeOpenAI) -> Iterator[Harness]:
    yield from make_harness(tmp_path, database_url, fake)


def test_batches_carry_metadata_and_a_null_error_file_is_fine(
    harness: Harness, fake: FakeOpenAI
) -> None:
    fake.error_file_when_clean = "null"

    outcome = harness.run_day()

    assert outcome.succeeded == len(harness.truth)
    shards = harness.ledger.shards(harness.job_id())
    for shard in shards:
        batch = fake.batch(shard.provider_batch_id)
        assert batch is not None
        assert batch["metadata"] == {
            "job_id": harness.job_id(),
            "shard_id": shard.shard_id,
            "pipeline": harness.spec.name,
        }
        assert batch["error_file_id"] is None


def test_an_all_failed_batch_with_a_null_output_file_dead_letters_its_lines(
    harness: Harness, fake: FakeOpenAI
) -> None:
    fake.null_output_file = True
    fake.line_fault = lambda custom_id, body: "4xx"

    outcome = harness.run_day()

    assert outcome.open_items == 0
    assert outcome.dead_letters == len(harness.truth)
    assert outcome.dead_letters_by_class == {"deterministic": len(harness.truth)}
    assert all(
        fake.batch(s.provider_batch_id)["output_file_id"] is None
        for s in harness.ledger.shards(harness.job_id())
    )


def test_a_failed_validation_reports_line_numbers(harness: Harness, fake: FakeOpenAI) -> None:
    lines = [
        {
            "custom_id": "a",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]},
        },
        {
            "custom_id": "a",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "y"}]},
        },
        {
            "custom_id": "b",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "gpt-4o-mini", "input": "z"},
        },
    ]
    written = harness.storage.write_lines(
        "bad.jsonl", (json.dumps(line).encode() for line in lines)
    )
    batch_id = harness.provider.submit(
        ShardSubmission(
            shard_id="bad", job_id="j", pipeline="p", input_uri=written.uri, item_count=3
        ),
        harness.storage,
    )

    status = harness.provider.poll(batch_id)
    while not status.ended:
        status = harness.provider.poll(batch_id)

    assert status.state == ShardState.FAILED
    assert "line 2: duplicate_custom_id" in (status.message or "")
    assert "line 3: invalid_url" in (status.message or "")
    assert list(harness.provider.results(batch_id)) == []


@pytest.mark.parametrize("endpoint", ["/v1/responses", "/v1/embeddings"])
def test_the_responses_and_embeddings_endpoints(
    tmp_path: Path, database_url: str, fake: FakeOpenAI, endpoint: str
) -> None:
    overrides: dict[str, Any] = {"model": {"options": {"endpoint": endpoint}}}
    if endpoint == "/v1/embeddings":
        overrides["output"] = {"schema": {"embedding": {"type": "list[float]"}}}
    fake.responder = None if endpoint == "/v1/embeddings" else truthful
    for harness in make_harness(tmp_path, database_url, fake, **overrides):
        outcome = harness.run_day()

        assert outcome.succeeded == len(harness.truth)
        result = harness.materialize("validated_outputs")
        assert result.success
        rows = harness.rows()
        first = json.loads(next(iter(rows.values()))["result_json"])
        if endpoint == "/v1/embeddings":
            assert len(first["embedding"]) > 0
        else:
            assert harness.labels() == harness.truth


def test_retry_rounds_wait_for_their_backoff(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    fake.polls_per_state = 0
    fake.line_fault = first_time({2: "5xx"})
    spec = {"retry": {"max_attempts": 3, "backoff_seconds": 600}}
    for harness in make_harness(tmp_path, database_url, fake, **spec):
        assert harness.materialize(
            "input_snapshot", "request_shards", "provider_batches", "batch_results"
        ).success
        [retry] = harness.ledger.shards(harness.job_id(), ["created"])
        assert retry.not_before is not None
        wait = (retry.not_before - utcnow()).total_seconds()
        assert 290 < wait <= 600

        early = harness.materialize("provider_batches")
        assert early.success
        assert harness.ledger.get_shard(retry.shard_id).status == "created"
        [event] = [e for e in early.get_asset_materialization_events()]
        metadata = event.step_materialization_data.materialization.metadata
        assert metadata["retry_shards_waiting_for_backoff"].value == 1
        assert metadata["next_submission_at"].value == retry.not_before.isoformat()

        harness.ledger.update_shard(retry.shard_id, not_before=utcnow())
        submitted = harness.materialize("provider_batches")
        assert submitted.success
        [event] = submitted.get_asset_materialization_events()
        metadata = event.step_materialization_data.materialization.metadata
        assert "next_submission_at" not in metadata, "no retry waits any more"
        assert harness.ledger.get_shard(retry.shard_id).status == "submitted"


def test_batch_results_checks_list_missing_and_duplicated_custom_ids(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    fake.polls_per_state = 0

    def fault(custom_id: str, body: dict[str, Any]) -> str | None:
        text = user_text(body)
        if "Order 1003 " in text:
            return "missing"
        return "duplicate" if "Order 1004 " in text else None

    fake.line_fault = fault
    for harness in make_harness(tmp_path, database_url, fake, retry={"max_attempts": 2}):
        # An item never answered blocks publication too (validated_outputs' gate check).
        with pytest.raises(
            StepFailed, match=r"blocked by outputs_complete \(1 items never answered\)$"
        ):
            harness.run_day()
        result = harness.materialize("batch_results")
        assert result.success
        evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
        rows = {r["source_id"]: r for r in harness.rows().values()}
        missing = rows["R-20261102-0003"]
        assert (missing["status"], missing["attempts"]) == ("dead_letter", 2)
        assert missing["error_code"].startswith("missing_result")

        check = evaluations["no_missing_results"]
        assert not check.passed
        assert check.severity == dg.AssetCheckSeverity.ERROR
        assert missing["custom_id"] in check.metadata["custom_ids"].value

        # The duplicate was seen in the import runs of the day; the check of such a run warns.
        records = harness.instance.event_log_storage.get_asset_check_execution_history(
            dg.AssetCheckKey(asset_key(harness.spec, "batch_results"), "no_duplicate_results"),
            limit=20,
        )
        evaluations_seen = [r.event.asset_check_evaluation for r in records if r.event]
        evaluations_seen = [e for e in evaluations_seen if e is not None]
        warned = [e for e in evaluations_seen if not e.passed]
        duplicated = rows["R-20261102-0004"]["custom_id"]
        assert warned and all(e.severity == dg.AssetCheckSeverity.WARN for e in warned)
        assert any(duplicated in e.metadata["custom_ids"].value for e in warned)


def _add_review(harness: Harness, review_id: str, text: str) -> None:
    path = harness.home / "reviews" / "reviews-2026-11-02.jsonl"
    row = {"review_id": review_id, "created_at": "2026-11-02T12:00:00Z", "text": text}
    with path.open("a") as handle:
        handle.write(json.dumps(row) + "\n")


def test_a_request_over_the_shard_byte_cap_is_an_input_dead_letter(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    sharding = {"max_requests_per_shard": 10, "max_bytes_per_shard": 4096}
    for harness in make_harness(tmp_path, database_url, fake, sharding=sharding):
        _add_review(harness, "R-big", "This is good. " * 400)

        outcome = harness.run_day()

        row = next(r for r in harness.rows().values() if r["source_id"] == "R-big")
        assert (row["status"], row["error_class"], row["error_code"]) == (
            "dead_letter",
            "input",
            "request_too_large",
        )
        assert "4096" in row["error_message"]
        assert outcome.succeeded == len(harness.truth)
        assert row["custom_id"] not in fake.submitted_custom_ids()


@pytest.mark.parametrize("truncate", [False, True])
def test_over_context_text_is_dead_lettered_or_truncated_as_the_spec_asks(
    tmp_path: Path, database_url: str, fake: FakeOpenAI, truncate: bool
) -> None:
    prompt = {"truncate_to_context": truncate}
    for harness in make_harness(tmp_path, database_url, fake, prompt=prompt):
        long_text = "It is good. " * 50_000  # 600,000 chars, 200,000 tokens
        _add_review(harness, "R-long", long_text)

        harness.run_day()

        row = next(r for r in harness.rows().values() if r["source_id"] == "R-long")
        if not truncate:
            assert (row["status"], row["error_code"]) == ("dead_letter", "context_exceeded")
            continue
        assert row["status"] == "succeeded"
        shard = harness.ledger.get_shard(row["shard_id"])
        sent = next(
            json.loads(line)
            for line in harness.storage.open_lines(shard.input_uri)
            if json.loads(line)["custom_id"] == row["custom_id"]
        )
        content = sent["body"]["messages"][-1]["content"]
        assert long_text.startswith(content)
        # Cut by the model's own tokenizer to exactly what fits beside the kept output room.
        room = 128_000 - harness.spec.model.max_output_tokens
        sent_tokens = counter_for(harness.spec).request(harness.spec.prompt.system, content)
        assert room - 4 <= sent_tokens <= room
        assert row["input_tokens"] == sent_tokens


# --- Result lines: the typed fast path reads every line as the general path does ---------

_MISSING = object()
_CHAT = {
    "id": "batch_req_1",
    "custom_id": "c-1",
    "response": {
        "status_code": 200,
        "request_id": "req_1",
        "body": {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1764547200,
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": '{"label": "ok"}', "refusal": None},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": 96,
                "completion_tokens": 38,
                "total_tokens": 134,
                "prompt_tokens_details": {"cached_tokens": 32, "audio_tokens": 0},
            },
            "system_fingerprint": "fp_1",
        },
    },
    "error": None,
}
_ERROR_FILE = {
    "id": "batch_req_2",
    "custom_id": "c-2",
    "response": {
        "status_code": 429,
        "body": {"error": {"message": "slow down", "type": "rate_limit_error", "code": None}},
    },
    "error": None,
}
_EXPIRED = {
    "id": "batch_req_3",
    "custom_id": "c-3",
    "response": None,
    "error": {"code": "batch_expired", "message": "not run before the batch expired"},
}
_RESPONSES = {
    "custom_id": "c-4",
    "response": {
        "status_code": 200,
        "body": {
            "object": "response",
            "output": [{"content": [{"type": "output_text", "text": "hello"}]}],
            "usage": {"input_tokens": 10, "output_tokens": 2, "input_tokens_details": {}},
        },
    },
    "error": None,
}
# Where a line can hold something else, and what else it can hold.
_PATHS = [
    ("custom_id",),
    ("error",),
    ("response",),
    ("response", "status_code"),
    ("response", "body"),
    ("response", "body", "object"),
    ("response", "body", "choices"),
    ("response", "body", "choices", 0),
    ("response", "body", "choices", 0, "message"),
    ("response", "body", "choices", 0, "message", "content"),
    ("response", "body", "choices", 0, "finish_reason"),
    ("response", "body", "usage"),
    ("response", "body", "usage", "prompt_tokens"),
    ("response", "body", "usage", "completion_tokens"),
    ("response", "body", "usage", "prompt_tokens_details"),
    ("response", "body", "usage", "prompt_tokens_details", "cached_tokens"),
    ("response", "body", "usage", "input_tokens"),
    ("response", "body", "usage", "output_tokens"),
    ("response", "body", "usage", "input_tokens_details"),
    ("response", "body", "usage", "total_tokens"),
    ("response", "body", "usage", "completion_tokens_details"),
]
_VALUES = [
    _MISSING, None, {}, [], "", "x", 0, 7, 1.0, 2.5, True, 200, 404, 500,
    {"code": "server_error", "message": "boom"}, [{"message": {"content": "hi"}}],
    [{}], [{"message": None, "finish_reason": "length"}, "not a choice"],
    {"cached_tokens": 5}, {"prompt_tokens": 3.0}, "tab\there\\back\nnew\rret é ✓",
]  # fmt: skip


def _mutated(line: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any] | None:
    line = json.loads(json.dumps(line))
    node: Any = line
    for step in path[:-1]:
        try:
            node = node[step]
        except (KeyError, IndexError, TypeError):
            return None
        if not isinstance(node, dict | list):
            return None
    last = path[-1]
    if isinstance(node, list) and not (isinstance(last, int) and last < len(node)):
        return None
    if isinstance(node, dict) and not isinstance(last, str):
        return None
    if value is _MISSING:
        if isinstance(node, list):
            return None
        node.pop(last, None)
    else:
        node[last] = value
    return line


def _outcome(read: Any, raw: bytes) -> tuple[str, Any]:
    try:
        return "read", read(raw)
    except Exception as exc:  # the same failure either way
        return "raised", type(exc)


def _odd_lines() -> list[dict[str, Any]]:
    """Result lines of every shape: one or two changes to real ones, odd values anywhere."""
    import random

    lines: list[dict[str, Any]] = []
    for base in (_CHAT, _ERROR_FILE, _EXPIRED, _RESPONSES):
        lines.append(base)
        for path in _PATHS:
            for value in _VALUES:
                changed = _mutated(base, path, value)
                if changed is not None:
                    lines.append(changed)
    rng = random.Random(7)
    for _ in range(3000):
        changed = _mutated(_CHAT, rng.choice(_PATHS), rng.choice(_VALUES))
        if changed is not None:
            changed = _mutated(changed, rng.choice(_PATHS), rng.choice(_VALUES))
        if changed is not None:
            lines.append(changed)
    # Which details the general path reads depends on whether prompt_tokens_details is empty.
    for prompt_details in ({}, {"audio_tokens": 0}, None, {"cached_tokens": 0}):
        line = json.loads(json.dumps(_CHAT))
        usage = line["response"]["body"]["usage"]
        usage["prompt_tokens_details"] = prompt_details
        usage["input_tokens_details"] = {"cached_tokens": 5}
        lines.append(line)
    return lines


def test_result_lines_read_the_same_on_the_fast_and_the_general_path() -> None:
    """normalize_line decodes answered chat lines into typed structs of the fields it reads and
    sends everything else through the general dict path: for any line, odd values anywhere
    included (one or two changes to real line shapes), both give the same result or the
    same error."""
    import orjson

    from llm_assets.resources.providers import openai_lines

    def general(raw: bytes) -> Any:
        return openai_lines._normalize(orjson.loads(raw))

    lines = _odd_lines()
    fast = 0
    for line in lines:
        raw = orjson.dumps(line)
        expected = _outcome(general, raw)
        assert _outcome(openai_lines.normalize_line, raw) == expected, raw
        assert _outcome(openai_lines.normalize_line, raw.decode()) == expected, raw
        with contextlib.suppress(Exception):
            fast += openai_lines._answered_chat(openai_lines._chat_line.decode(raw)) is not None
    assert len(lines) > 2000
    # Both paths were exercised: answered chat lines on the fast one, the rest on the other.
    assert 200 < fast < len(lines) - 1000
    answered = openai_lines.normalize_line(orjson.dumps(_CHAT))
    assert answered is not None and answered.succeeded
    assert (answered.input_tokens, answered.cached_input_tokens, answered.output_tokens) == (
        96,
        32,
        38,
    )
    assert openai_lines._answered_chat(openai_lines._chat_line.decode(orjson.dumps(_CHAT)))


def test_an_import_makes_the_same_ledger_rows_from_answered_lines_as_from_their_results() -> None:
    """An import's workers make a plain success (an Answered, from read_line) into its ledger
    row directly, without an ItemResult: for lines of every shape, in both ledger formats
    (binary COPY, tuples), the rows are those made from what normalize_line gives, escapes in
    ids and texts and a price with cached tokens included."""
    import orjson

    from llm_assets.resources.pricing import load_price_table
    from llm_assets.resources.providers import openai_lines
    from llm_assets.results.rows import Answered, ResultStager, RowMaker, staged_results

    price = load_price_table().get("openai", "gpt-4o-mini")
    assert price is not None
    to_row = RowMaker(price.cost_calculator(batch=True), "gpt-4o-mini\tbatch")
    lines = [orjson.dumps(line) for line in _odd_lines()]
    odd_id = json.loads(json.dumps(_CHAT))
    odd_id["custom_id"] = "c\\1\t2"
    lines.append(orjson.dumps(odd_id))
    answered = sum(isinstance(_outcome(openai_lines.read_line, raw)[1], Answered) for raw in lines)
    assert 200 < answered < len(lines) - 1000

    def rows(stage: ResultStager, raw: bytes) -> Any:
        result = openai_lines.normalize_line(raw)
        return stage([to_row(result)] if result is not None else [])

    def staged(stage: ResultStager, raw: bytes) -> Any:
        return staged_results((openai_lines.read_line, to_row, stage), [raw])

    for binary_copy in (True, False):
        stage = ResultStager(binary_copy=binary_copy)
        for raw in lines:
            # Lines that cannot be read (a custom_id of another type, say) fail both ways.
            expected = _outcome(functools.partial(rows, stage), raw)
            assert _outcome(functools.partial(staged, stage), raw) == expected, raw


def test_an_import_worker_reads_blocks_of_whole_lines_as_the_lines_they_hold() -> None:
    """An import hands a worker the result files in the blocks they were read in: however the
    bytes were cut, the rows are those of the files' lines one by one, blank lines skipped
    and a file's unfinished last line never run on into the next file. Blocks go to workers
    in chunks weighing CHUNK_ROWS lines."""
    import orjson

    from llm_assets.resources.pricing import load_price_table
    from llm_assets.resources.providers import openai_lines
    from llm_assets.resources.storage import line_blocks
    from llm_assets.results.rows import ResultStager, RowMaker, block_lines, staged_results
    from llm_assets.util import parallel

    price = load_price_table().get("openai", "gpt-4o-mini")
    assert price is not None
    to_row = RowMaker(price.cost_calculator(batch=True), "gpt-4o-mini")
    stage = ResultStager(binary_copy=True)
    output = [dict(_CHAT, custom_id=f"ok-{n}") for n in range(7)] + [_RESPONSES]
    errors = [_ERROR_FILE, _EXPIRED]
    lines = [orjson.dumps(line) for line in output + errors]
    expected = stage([to_row(openai_lines.normalize_line(line)) for line in lines])
    # The output file ends without a newline and has blank lines in it.
    output_file = b"\n".join(lines[:3]) + b"\n\n \r\n" + b"\n".join(lines[3:8])
    error_file = b"\n".join(lines[8:]) + b"\n"
    for size in (1, 7, 100, 1 << 20):
        blocks = [
            block
            for data in (output_file, error_file)
            for block in line_blocks(data[at : at + size] for at in range(0, len(data), size))
        ]
        assert list(block_lines(blocks)) == lines
        got = staged_results((openai_lines.read_line, to_row, stage), blocks)
        assert got == expected, size

    def count(block: bytes) -> int:
        return block.count(b"\n")

    blocks = [b"a\nb\n", b"c\n", b"d\ne\nf\n", b"g"]
    assert list(parallel.chunked(blocks, 3, weight=count)) == [blocks[:2], blocks[2:3], blocks[3:]]
