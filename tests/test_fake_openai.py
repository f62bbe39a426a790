"""The fake OpenAI Files + Batches server, exercised only through the official SDK.

The adapter is tested against this fake alone, so these tests pin the fake to what the SDK
parses and to the awkward cases of the real service.
"""

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types import Batch, CreateEmbeddingResponse, FileObject
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from tests.fakes.common import ControlFault
from tests.fakes.openai_server import FakeOpenAI, count_tokens, prompt_tokens_of, stable_pick

CHAT = "/v1/chat/completions"
TERMINAL = {"completed", "failed", "expired", "cancelled"}
SENTIMENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "sentiment": {"type": "string", "enum": ["positive", "negative", "neutral"]},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "stars": {"type": "integer", "minimum": 1, "maximum": 5},
        "summary": {"type": "string", "maxLength": 12},
        "vector": {"type": "array", "items": {"type": "number"}},
        "sarcastic": {"type": "boolean"},
    },
    "required": ["sentiment", "score", "stars", "summary", "vector", "sarcastic"],
    "additionalProperties": False,
}

pytestmark = pytest.mark.fake_server("openai", state_dir="openai")


def chat_line(custom_id: str, text: str, url: str = CHAT, **body: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": url,
        "body": {"model": "gpt-4o-mini", "messages": messages, **body},
    }


def chat_lines(n: int) -> list[dict[str, Any]]:
    return [chat_line(f"c{i}", f"Review number {i} is fine. It has more text.") for i in range(n)]


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def upload(client: openai.OpenAI, data: bytes, name: str = "requests.jsonl") -> FileObject:
    return client.files.create(file=(name, data), purpose="batch")


def submit(
    client: openai.OpenAI,
    lines: list[dict[str, Any]],
    endpoint: str = CHAT,
    metadata: dict[str, str] | None = None,
) -> Batch:
    input_file = upload(client, jsonl(lines))
    return client.batches.create(
        input_file_id=input_file.id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window="24h",
        metadata=metadata,
    )


def poll(client: openai.OpenAI, batch_id: str) -> tuple[list[str], Batch]:
    """Every status seen until a terminal one; the fake advances per retrieve, so no sleeps."""
    seen: list[str] = []
    for _ in range(20):
        batch = client.batches.retrieve(batch_id)
        seen.append(batch.status)
        if batch.status in TERMINAL:
            return seen, batch
    raise AssertionError(f"batch never finished: {seen}")


def download(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines() if line]


def run(client: openai.OpenAI, lines: list[dict[str, Any]], endpoint: str = CHAT) -> Batch:
    return poll(client, submit(client, lines, endpoint).id)[1]


def fault_map(mapping: dict[str, str]) -> Callable[[str, dict[str, Any]], str | None]:
    return lambda custom_id, _body: mapping.get(custom_id)


def test_a_batch_walks_every_status_and_its_shuffled_output_carries_usage(
    fake: FakeOpenAI, client: openai.OpenAI
) -> None:
    lines = chat_lines(12)
    structured_text = "I loved this blender, it crushed ice. Five stars."
    lines.append(
        chat_line(
            "structured",
            structured_text,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "review", "schema": SENTIMENT_SCHEMA, "strict": True},
            },
        )
    )
    created = submit(client, lines, metadata={"partition": "2024-05-01"})
    assert created.status == "validating"
    assert created.request_counts is not None and created.request_counts.total == 0
    assert created.id.startswith("batch_") and created.metadata == {"partition": "2024-05-01"}

    statuses, batch = poll(client, created.id)

    assert statuses == ["validating", "in_progress", "finalizing", "completed"]
    assert batch.created_at <= batch.in_progress_at <= batch.finalizing_at <= batch.completed_at  # type: ignore[operator]
    assert batch.expires_at == batch.created_at + 24 * 3600
    assert batch.failed_at is None and batch.errors is None and batch.error_file_id is None
    assert batch.model == "gpt-4o-mini"
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed) == (13, 13)
    assert batch.request_counts.failed == 0
    assert batch.output_file_id is not None
    output_file = client.files.retrieve(batch.output_file_id)
    assert output_file.purpose == "batch_output"
    assert output_file.filename == f"{batch.id}_output.jsonl"
    output = download(client, batch.output_file_id)
    assert [line["custom_id"] for line in output] != [line["custom_id"] for line in lines]
    assert sorted(line["custom_id"] for line in output) == sorted(x["custom_id"] for x in lines)
    by_id = {line["custom_id"]: line for line in output}
    total_in = total_out = 0
    for line in output:
        assert line["id"].startswith("batch_req_") and line["error"] is None
        assert line["response"]["status_code"] == 200 and line["response"]["request_id"]
        completion = ChatCompletion.model_validate(line["response"]["body"])
        assert completion.usage is not None
        assert completion.choices[0].finish_reason == "stop"
        content = completion.choices[0].message.content or ""
        assert completion.usage.completion_tokens == count_tokens(content, "gpt-4o-mini")
        assert completion.usage.total_tokens == (
            completion.usage.prompt_tokens + completion.usage.completion_tokens
        )
        total_in += completion.usage.prompt_tokens
        total_out += completion.usage.completion_tokens
    plain = ChatCompletion.model_validate(by_id["c3"]["response"]["body"])
    assert plain.choices[0].message.content == "Review number 3 is fine."
    structured = ChatCompletion.model_validate(by_id["structured"]["response"]["body"])
    answer = json.loads(structured.choices[0].message.content or "")
    assert answer["sentiment"] == stable_pick(["positive", "negative", "neutral"], structured_text)
    assert (answer["score"], answer["stars"], answer["sarcastic"]) == (0.5, 3, True)
    assert len(answer["summary"]) <= 12 and structured_text.startswith(answer["summary"])
    assert len(answer["vector"]) == 8 and all(isinstance(v, float) for v in answer["vector"])
    assert batch.usage is not None
    assert (batch.usage.input_tokens, batch.usage.output_tokens) == (total_in, total_out)


@pytest.mark.parametrize(
    ("polls", "expected"),
    [
        (0, ["completed"]),
        (2, ["validating"] * 2 + ["in_progress"] * 2 + ["finalizing"] * 2 + ["completed"]),
    ],
)
def test_polls_per_state_sets_how_many_retrieves_each_status_lasts(
    fake: FakeOpenAI, client: openai.OpenAI, polls: int, expected: list[str]
) -> None:
    fake.polls_per_state = polls
    batch = submit(client, chat_lines(2))
    for _ in range(3):
        assert client.batches.list().data[0].status == "validating", "only retrieve advances"
    assert poll(client, batch.id)[0] == expected


def test_validation_failures_name_their_lines(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    good = chat_line("a", "Fine.")
    data = b"".join(
        [
            jsonl([good, chat_line("a", "Duplicate id."), chat_line("b", "Wrong url.", "/v1/x")]),
            b"{not json\n",
            jsonl([{**chat_line("c", "Other model."), "body": {"model": "gpt-4o", "input": "x"}}]),
        ]
    )
    batch = client.batches.create(
        input_file_id=upload(client, data).id, endpoint=CHAT, completion_window="24h"
    )

    statuses, batch = poll(client, batch.id)

    assert statuses == ["validating", "failed"]
    assert batch.errors is not None and batch.errors.object == "list"
    found = [(e.code, e.line, e.param) for e in batch.errors.data or []]
    assert found == [
        ("duplicate_custom_id", 2, "custom_id"),
        ("invalid_url", 3, "url"),
        ("invalid_json_line", 4, None),
        ("model_mismatch", 5, "body.model"),
    ]
    assert all(e.message for e in batch.errors.data or [])
    assert batch.failed_at is not None and batch.in_progress_at is None
    assert batch.output_file_id is None and batch.error_file_id is None
    assert batch.request_counts is not None
    assert batch.request_counts.model_dump() == {"total": 5, "completed": 0, "failed": 0}


def test_line_faults_land_in_the_error_file_or_vanish_or_repeat(
    fake: FakeOpenAI, client: openai.OpenAI
) -> None:
    fake.polls_per_state = 0
    fake.line_fault = fault_map({"c1": "4xx", "c2": "5xx", "c3": "missing", "c4": "duplicate"})

    batch = run(client, chat_lines(6))

    assert batch.status == "completed"
    assert batch.request_counts is not None
    assert batch.request_counts.model_dump() == {"total": 6, "completed": 4, "failed": 2}
    output = download(client, batch.output_file_id)
    assert Counter(line["custom_id"] for line in output) == {"c0": 1, "c4": 2, "c5": 1}
    errors = {line["custom_id"]: line for line in download(client, batch.error_file_id)}
    assert set(errors) == {"c1", "c2"}
    rejected, crashed = errors["c1"], errors["c2"]
    assert rejected["error"] is None, "a 4xx line has a null top-level error"
    assert rejected["response"]["status_code"] == 400
    assert rejected["response"]["body"]["error"]["type"] == "invalid_request_error"
    assert crashed["error"] is None and crashed["response"]["status_code"] == 500
    assert crashed["response"]["body"]["error"]["type"] == "server_error"
    assert client.files.retrieve(batch.error_file_id or "").filename.endswith("_error.jsonl")


def test_an_expired_batch_keeps_partial_output_and_reports_the_rest_expired(
    fake: FakeOpenAI, client: openai.OpenAI
) -> None:
    fake.batch_outcome = lambda _batch: "expired"
    fake.line_fault = lambda custom_id, _body: "expire" if custom_id >= "c3" else None

    statuses, batch = poll(client, submit(client, chat_lines(5)).id)

    assert statuses == ["validating", "in_progress", "expired"]
    assert batch.expired_at is not None and batch.completed_at is None
    assert sorted(line["custom_id"] for line in download(client, batch.output_file_id)) == [
        "c0",
        "c1",
        "c2",
    ]
    expired = download(client, batch.error_file_id)
    assert sorted(line["custom_id"] for line in expired) == ["c3", "c4"]
    for line in expired:
        assert line["response"] is None and line["error"]["code"] == "batch_expired"
    assert batch.request_counts is not None
    assert batch.request_counts.model_dump() == {"total": 5, "completed": 3, "failed": 2}


def test_failed_and_operator_cancelled_outcomes(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.batch_outcome = lambda batch: str((batch["metadata"] or {})["outcome"])
    failing = submit(client, chat_lines(2), metadata={"outcome": "failed"})
    cancelled = submit(client, chat_lines(4), metadata={"outcome": "cancelled_after_partial"})

    statuses, failed = poll(client, failing.id)
    assert statuses == ["validating", "failed"]
    assert failed.errors is not None and failed.errors.data
    assert failed.errors.data[0].code == "token_limit_exceeded"
    assert failed.output_file_id is None

    statuses, batch = poll(client, cancelled.id)
    assert statuses == ["validating", "in_progress", "cancelling", "cancelled"]
    assert batch.cancelling_at is not None and batch.cancelled_at is not None
    assert sorted(x["custom_id"] for x in download(client, batch.output_file_id)) == ["c0", "c1"]


def test_the_enqueued_token_limit_fails_a_batch_until_room_frees_up(
    fake: FakeOpenAI, client: openai.OpenAI
) -> None:
    first_lines = chat_lines(3)
    later_lines = [chat_line(f"b{i}", f"Later review {i} is fine.") for i in range(3)]
    first_tokens, later_tokens = (
        sum(prompt_tokens_of(line["body"], "gpt-4o-mini") for line in group)
        for group in (first_lines, later_lines)
    )
    limit = first_tokens + later_tokens - 1
    fake.enqueued_token_limit = limit
    first = submit(client, first_lines)
    assert [client.batches.retrieve(first.id).status for _ in range(2)] == [
        "validating",
        "in_progress",
    ]

    statuses, refused = poll(client, submit(client, later_lines).id)

    assert statuses == ["validating", "failed"]
    assert refused.errors is not None and refused.errors.data is not None
    assert [error.model_dump() for error in refused.errors.data] == [
        {
            "code": "token_limit_exceeded",
            "message": "Enqueued token limit reached for gpt-4o-mini in organization org-fake. "
            f"Limit: {limit:,} enqueued tokens. Please try submitting your batch again later.",
            "param": None,
            "line": None,
        }
    ]
    assert refused.failed_at is not None and refused.in_progress_at is None
    assert refused.output_file_id is None and refused.error_file_id is None
    assert refused.request_counts is not None
    assert refused.request_counts.model_dump() == {"total": 3, "completed": 0, "failed": 0}
    assert refused.usage is not None and refused.usage.total_tokens == 0

    done = poll(client, first.id)[1]
    assert done.status == "completed"
    assert done.usage is not None and done.usage.input_tokens == first_tokens
    statuses, admitted = poll(client, submit(client, later_lines).id)
    assert statuses == ["validating", "in_progress", "finalizing", "completed"]
    assert admitted.usage is not None and admitted.usage.input_tokens == later_tokens
    assert fake.billed == Counter([line["custom_id"] for line in first_lines + later_lines])
    assert fake.peak_enqueued_tokens == {"gpt-4o-mini": max(first_tokens, later_tokens)}
    assert fake.peak_enqueued_tokens["gpt-4o-mini"] <= limit


def test_the_enqueued_token_limit_counts_per_model_and_refuses_a_batch_alone_over_it(
    fake: FakeOpenAI, client: openai.OpenAI
) -> None:
    lines = chat_lines(2)
    tokens = sum(prompt_tokens_of(line["body"], "gpt-4o-mini") for line in lines)
    fake.enqueued_token_limit = tokens
    other_model = [
        {**line, "body": {**line["body"], "model": "gpt-4.1-mini"}} for line in chat_lines(2)
    ]
    running = submit(client, lines)
    assert [client.batches.retrieve(running.id).status for _ in range(2)] == [
        "validating",
        "in_progress",
    ]
    assert poll(client, submit(client, other_model).id)[1].status == "completed"

    too_big = poll(client, submit(client, chat_lines(3)).id)[1]
    assert too_big.status == "failed"
    assert poll(client, running.id)[1].status == "completed"
    alone = poll(client, submit(client, chat_lines(3)).id)[1]
    assert alone.status == "failed"
    assert alone.errors is not None and alone.errors.data is not None
    assert alone.errors.data[0].code == "token_limit_exceeded"
    assert set(fake.peak_enqueued_tokens) == {"gpt-4o-mini", "gpt-4.1-mini"}
    assert fake.peak_enqueued_tokens["gpt-4o-mini"] == tokens


def test_cancel_keeps_the_first_half_and_cancelled_lines_are_errors(
    fake: FakeOpenAI, client: openai.OpenAI
) -> None:
    batch = submit(client, chat_lines(6))
    assert [client.batches.retrieve(batch.id).status for _ in range(2)] == [
        "validating",
        "in_progress",
    ]

    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    done = client.batches.retrieve(batch.id)

    assert done.status == "cancelled" and done.cancelled_at is not None
    assert sorted(x["custom_id"] for x in download(client, done.output_file_id)) == [
        "c0",
        "c1",
        "c2",
    ]
    unrun = download(client, done.error_file_id)
    assert sorted(x["custom_id"] for x in unrun) == ["c3", "c4", "c5"]
    assert {x["error"]["code"] for x in unrun} == {"batch_cancelled"}
    assert done.request_counts is not None
    assert done.request_counts.model_dump() == {"total": 6, "completed": 3, "failed": 3}
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)

    early = submit(client, chat_lines(2))
    assert client.batches.cancel(early.id).status == "cancelling"
    gone = client.batches.retrieve(early.id)
    assert gone.status == "cancelled" and gone.in_progress_at is None
    assert gone.output_file_id is None and gone.error_file_id is None


def test_null_and_empty_result_file_knobs(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.polls_per_state = 0
    fake.line_fault = lambda _cid, _body: "4xx"
    all_failed = run(client, chat_lines(2))
    assert all_failed.output_file_id is not None
    assert client.files.content(all_failed.output_file_id).content == b""
    fake.null_output_file = True
    assert run(client, chat_lines(2)).output_file_id is None

    fake.line_fault = None
    assert run(client, chat_lines(1)).error_file_id is None
    fake.error_file_when_clean = "empty_string"
    assert run(client, chat_lines(1)).error_file_id == ""
    fake.error_file_when_clean = "empty_file"
    clean = run(client, chat_lines(1))
    assert client.files.content(clean.error_file_id or "").content == b""


def test_listing_pages_newest_first_with_metadata(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    input_file = upload(client, jsonl(chat_lines(1)))
    ids = [
        client.batches.create(
            input_file_id=input_file.id,
            endpoint=CHAT,
            completion_window="24h",
            metadata={"run": str(n), "asset": "reviews"},
        ).id
        for n in range(5)
    ]

    page = client.batches.list(limit=2)
    assert [b.id for b in page.data] == ids[::-1][:2]
    assert page.has_more is True
    assert [b.metadata for b in page.data] == [
        {"run": "4", "asset": "reviews"},
        {"run": "3", "asset": "reviews"},
    ]
    raw = client.batches.with_raw_response.list(limit=2, after=ids[2]).http_response.json()
    assert (raw["object"], raw["first_id"], raw["last_id"]) == ("list", ids[1], ids[0])
    assert raw["has_more"] is False
    assert [b.id for b in client.batches.list(limit=2)] == ids[::-1]
    queries = [c.get("query", "") for c in fake.calls.entries() if c["path"] == "/v1/batches"]
    assert queries[-3:] == ["limit=2", f"limit=2&after={ids[3]}", f"limit=2&after={ids[1]}"]

    with pytest.raises(openai.BadRequestError) as too_many:
        client.batches.create(
            input_file_id=input_file.id,
            endpoint=CHAT,
            completion_window="24h",
            metadata={f"k{n}": "v" for n in range(17)},
        )
    assert too_many.value.param == "metadata"


def test_rate_limits_and_server_errors_raise_then_retry(
    fake: FakeOpenAI, client: openai.OpenAI
) -> None:
    input_file = upload(client, jsonl(chat_lines(1)))

    def create(sdk: openai.OpenAI) -> Batch:
        return sdk.batches.create(
            input_file_id=input_file.id, endpoint=CHAT, completion_window="24h"
        )

    fake.faults.add(ControlFault("POST", "/v1/batches", status=429, retry_after=0.01))
    with pytest.raises(openai.RateLimitError) as limited:
        create(client)
    assert limited.value.response.headers["retry-after"] == "0.01"
    assert limited.value.code == "rate_limit_exceeded"
    assert (limited.value.request_id or "").startswith("req_")
    fake.faults.add(ControlFault("POST", "/v1/batches", status=500))
    with pytest.raises(openai.InternalServerError) as crashed:
        create(client)
    assert crashed.value.type == "server_error"
    assert client.batches.list().data == []

    fake.faults.add(ControlFault("POST", "/v1/batches", status=429, retry_after=0.01))
    fake.faults.add(ControlFault("POST", "/v1/batches", status=500, retry_after=0.01))
    with openai.OpenAI(api_key="test", base_url=fake.base_url, max_retries=2) as patient:
        batch = create(patient)

    attempts = [c for c in fake.calls.entries() if c["method"] == "POST" and "batches" in c["path"]]
    assert [(c["status"], c.get("retry_count")) for c in attempts] == [
        (429, 0),
        (500, 0),
        (429, 0),
        (500, 1),
        (200, 2),
    ]
    assert attempts[-1]["batch_id"] == batch.id
    assert [b.id for b in client.batches.list()] == [batch.id]


def test_a_connection_reset_is_a_connection_error_and_a_retry_recovers(
    fake: FakeOpenAI, client: openai.OpenAI
) -> None:
    batch = submit(client, chat_lines(1))
    fake.faults.add(ControlFault("GET", "/v1/batches/", reset_connection=True))
    with pytest.raises(openai.APIConnectionError):
        client.batches.retrieve(batch.id)

    fake.faults.add(ControlFault("GET", "/v1/batches/", reset_connection=True))
    with openai.OpenAI(api_key="test", base_url=fake.base_url, max_retries=1) as patient:
        assert patient.batches.retrieve(batch.id).id == batch.id
    gets = [c for c in fake.calls.entries() if c["method"] == "GET"]
    assert [(c["status"], c.get("fault")) for c in gets] == [
        (0, "reset"),
        (0, "reset"),
        (200, None),
    ]


def test_a_server_side_delay_trips_a_short_client_timeout(
    fake: FakeOpenAI, client: openai.OpenAI
) -> None:
    batch = submit(client, chat_lines(1))
    fake.faults.add(ControlFault("GET", "/v1/batches/", status=200, delay_seconds=0.5))
    with pytest.raises(openai.APITimeoutError):
        client.with_options(timeout=0.1).batches.retrieve(batch.id)
    assert client.batches.list().data[0].id == batch.id


def test_a_restart_mid_batch_loses_nothing(
    fake: FakeOpenAI, client: openai.OpenAI, tmp_path: Path
) -> None:
    batch = submit(client, chat_lines(4))
    assert [client.batches.retrieve(batch.id).status for _ in range(2)] == [
        "validating",
        "in_progress",
    ]

    fake.stop()
    with pytest.raises(openai.APIConnectionError):
        client.batches.retrieve(batch.id)
    fake.start()
    assert client.batches.retrieve(batch.id).status == "finalizing"
    fake.restart()
    statuses, done = poll(client, batch.id)

    assert statuses == ["completed"]
    assert done.request_counts is not None and done.request_counts.completed == 4
    assert len(download(client, done.output_file_id)) == 4
    paths = [c["path"] for c in fake.calls.entries()]
    assert paths[:2] == ["/v1/files", "/v1/batches"]
    fake.stop()
    with (
        FakeOpenAI(tmp_path / "openai") as reborn,
        openai.OpenAI(api_key="test", base_url=reborn.base_url, max_retries=0) as other,
    ):
        again = other.batches.retrieve(batch.id)
        assert again.status == "completed" and again.output_file_id == done.output_file_id
        assert len(download(other, again.output_file_id)) == 4
        assert reborn.submitted_custom_ids() == ["c0", "c1", "c2", "c3"]


def test_submitted_custom_ids_count_only_files_batches_were_made_from(
    fake: FakeOpenAI, client: openai.OpenAI
) -> None:
    used = upload(client, jsonl([chat_line("a1", "One."), chat_line("a2", "Two.")]))
    upload(client, jsonl([chat_line("b1", "Never submitted.")]))
    for run_number in ("1", "2"):
        client.batches.create(
            input_file_id=used.id,
            endpoint=CHAT,
            completion_window="24h",
            metadata={"run": run_number},
        )

    assert fake.submitted_custom_ids() == ["a1", "a2", "a1", "a2"]
    uploads = [c for c in fake.calls.entries() if c["path"] == "/v1/files"]
    assert [c["custom_ids"] for c in uploads] == [["a1", "a2"], ["b1"]]
    creates = [c for c in fake.calls.entries() if c["path"] == "/v1/batches"]
    assert [(c["input_file_id"], c["metadata"]) for c in creates] == [
        (used.id, {"run": "1"}),
        (used.id, {"run": "2"}),
    ]
    assert all(c["batch_id"].startswith("batch_") for c in creates)


def test_missing_key_unknown_routes_and_ids_get_the_error_envelope(
    fake: FakeOpenAI, client: openai.OpenAI
) -> None:
    with pytest.raises(openai.AuthenticationError) as unauthenticated:
        client.batches.list(extra_headers={"Authorization": openai.Omit()})
    assert unauthenticated.value.status_code == 401
    assert isinstance(unauthenticated.value.body, dict)
    assert set(unauthenticated.value.body) == {"message", "type", "param", "code"}
    assert "API key" in unauthenticated.value.message

    with pytest.raises(openai.NotFoundError) as unknown_route:
        client.get("/nothing/here", cast_to=object)
    assert "Invalid URL (GET /v1/nothing/here)" in unknown_route.value.message
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_doesnotexist")

    raw = client.batches.with_raw_response.list()
    assert raw.headers["x-request-id"].startswith("req_")
    assert raw.headers["content-type"] == "application/json"


def test_files_endpoints_and_batch_creation_checks(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad_purpose:
        client.files.create(file=("x.jsonl", b"{}\n"), purpose="bogus")  # type: ignore[arg-type]
    assert bad_purpose.value.param == "purpose"
    with pytest.raises(openai.BadRequestError):
        upload(client, b"{}\n", name="requests.txt")

    data = jsonl(chat_lines(2000))
    stored = upload(client, data)
    assert stored.id.startswith("file-") and stored.bytes == len(data)
    assert stored.purpose == "batch" and stored.status == "processed"
    assert client.files.retrieve(stored.id) == stored
    with client.files.with_streaming_response.content(stored.id) as streamed:
        assert streamed.headers["transfer-encoding"] == "chunked"
        assert b"".join(streamed.iter_bytes()) == data
    assert stored.id in [f.id for f in client.files.list(purpose="batch")]

    with pytest.raises(openai.BadRequestError) as bad_window:
        client.batches.create(
            input_file_id=stored.id,
            endpoint=CHAT,
            completion_window="48h",  # type: ignore[arg-type]
        )
    assert bad_window.value.param == "completion_window"
    assert client.files.delete(stored.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(stored.id)
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id=stored.id, endpoint=CHAT, completion_window="24h")


def test_responses_and_embeddings_batches(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.polls_per_state = 0
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
        "required": ["colour"],
        "additionalProperties": False,
    }
    text_format = {"format": {"type": "json_schema", "name": "c", "schema": schema, "strict": True}}
    responses = run(
        client,
        [
            {
                "custom_id": "structured",
                "method": "POST",
                "url": "/v1/responses",
                "body": {"model": "gpt-4.1-mini", "input": "Pick a colour.", "text": text_format},
            },
            {
                "custom_id": "plain",
                "method": "POST",
                "url": "/v1/responses",
                "body": {
                    "model": "gpt-4.1-mini",
                    "instructions": "Answer tersely.",
                    "input": [{"role": "user", "content": "Hello there. How are you?"}],
                },
            },
        ],
        endpoint="/v1/responses",
    )
    by_id = {x["custom_id"]: x for x in download(client, responses.output_file_id)}
    structured = Response.model_validate(by_id["structured"]["response"]["body"])
    assert json.loads(structured.output_text) == {
        "colour": stable_pick(["red", "green", "blue"], "Pick a colour.")
    }
    plain = Response.model_validate(by_id["plain"]["response"]["body"])
    assert plain.output[0].content[0].text == "Hello there."  # type: ignore[union-attr]
    assert plain.usage is not None
    assert plain.usage.output_tokens == count_tokens("Hello there.", plain.model)
    assert plain.usage.input_tokens > 0

    embed_lines = [
        {
            "custom_id": f"e{n}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "text-embedding-3-small", "input": f"text {n}", **extra},
        }
        for n, extra in enumerate([{}, {"dimensions": 8}])
    ]
    embeddings = run(client, embed_lines, endpoint="/v1/embeddings")
    by_id = {x["custom_id"]: x for x in download(client, embeddings.output_file_id)}
    full = CreateEmbeddingResponse.model_validate(by_id["e0"]["response"]["body"])
    small = CreateEmbeddingResponse.model_validate(by_id["e1"]["response"]["body"])
    assert (len(full.data[0].embedding), len(small.data[0].embedding)) == (1536, 8)
    assert full.usage.prompt_tokens == count_tokens("text 0", "text-embedding-3-small")
    assert embeddings.usage is not None and embeddings.usage.output_tokens == 0


def test_a_custom_responder_and_max_tokens_truncation(
    fake: FakeOpenAI, client: openai.OpenAI
) -> None:
    fake.polls_per_state = 0
    fake.responder = lambda body: "many words " * 20
    batch = run(client, [chat_line("short", "Hi.", max_tokens=5), chat_line("long", "Hi.")])

    by_id = {x["custom_id"]: x for x in download(client, batch.output_file_id)}
    short = ChatCompletion.model_validate(by_id["short"]["response"]["body"])
    assert short.choices[0].finish_reason == "length"
    # Cut at the token limit, as the API cuts it: five BPE tokens.
    assert short.choices[0].message.content == "many words many words many"
    assert short.usage is not None and short.usage.completion_tokens == 5
    long = ChatCompletion.model_validate(by_id["long"]["response"]["body"])
    assert long.choices[0].finish_reason == "stop"
    assert long.choices[0].message.content == "many words " * 20
