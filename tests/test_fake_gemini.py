"""The fake Gemini Files API and Batch Mode server, exercised only through the official
google-genai SDK.

The adapter is tested against this fake alone, so these tests pin the fake to what the SDK
sends and parses, and to the awkward cases of the real service. The SDK retries nothing
unless `HttpOptions.retry_options` is set, so every injected fault is seen exactly once.
"""

import io
import json
from collections.abc import Callable
from typing import Any

import httpx2
import pytest
from google import genai
from google.genai import errors, types

from tests.fakes.common import ControlFault
from tests.fakes.gemini_model import first_sentence, stable_pick
from tests.fakes.gemini_server import FakeGemini, LostResponseFault

MODEL = "gemini-2.5-flash"
CREATE = ":batchGenerateContent"
TERMINAL = {
    types.JobState.JOB_STATE_SUCCEEDED,
    types.JobState.JOB_STATE_FAILED,
    types.JobState.JOB_STATE_CANCELLED,
    types.JobState.JOB_STATE_EXPIRED,
}
S = types.JobState

pytestmark = pytest.mark.fake_server("gemini")


def line(key: str, text: str, **request: Any) -> dict[str, Any]:
    contents = [{"role": "user", "parts": [{"text": text}]}]
    return {"key": key, "request": {"contents": contents, **request}}


def lines(n: int) -> list[dict[str, Any]]:
    return [line(f"k{i}", f"Review number {i} is fine. It has more text.") for i in range(n)]


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def upload(client: genai.Client, data: bytes) -> types.File:
    config = {"mime_type": "application/jsonl", "display_name": "requests"}
    return client.files.upload(file=io.BytesIO(data), config=config)


def submit(client: genai.Client, rows: list[dict[str, Any]], name: str = "job") -> types.BatchJob:
    source = upload(client, jsonl(rows))
    assert source.name is not None
    return client.batches.create(model=MODEL, src=source.name, config={"display_name": name})


def poll(client: genai.Client, name: str | None) -> tuple[list[S], types.BatchJob]:
    """Every state seen until a terminal one; the fake advances per get, so no sleeps."""
    assert name is not None
    seen: list[S] = []
    for _ in range(20):
        job = client.batches.get(name=name)
        assert job.state is not None
        seen.append(job.state)
        if job.state in TERMINAL:
            return seen, job
    raise AssertionError(f"batch never finished: {seen}")


def results(client: genai.Client, job: types.BatchJob) -> list[dict[str, Any]]:
    assert job.dest is not None and job.dest.file_name
    data = client.files.download(file=job.dest.file_name)
    return [json.loads(raw) for raw in data.decode().splitlines() if raw]


def by_key(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["key"]: row for row in rows}


def fault_map(mapping: dict[str, str]) -> Callable[[str, dict[str, Any]], str | None]:
    return lambda key, _request: mapping.get(key)


def calls(fake: FakeGemini, path_part: str) -> list[dict[str, Any]]:
    return [c for c in fake.calls.entries() if path_part in c["path"]]


def test_a_file_batch_runs_to_succeeded_and_its_shuffled_output_matches_by_key(
    fake: FakeGemini, client: genai.Client
) -> None:
    rows = lines(6)
    created = submit(client, rows, name="reviews-2024-05-01")
    assert created.name is not None and created.name.startswith("batches/")
    assert (created.state, created.display_name) == (S.JOB_STATE_PENDING, "reviews-2024-05-01")
    assert created.model == f"models/{MODEL}" and created.dest is None

    states, job = poll(client, created.name)

    assert states == [S.JOB_STATE_PENDING, S.JOB_STATE_RUNNING, S.JOB_STATE_SUCCEEDED]
    assert job.create_time and job.update_time and job.end_time
    assert job.create_time <= job.update_time and job.create_time <= job.end_time
    assert job.dest is not None
    assert job.dest.file_name == "files/batch-" + created.name.removeprefix("batches/")
    stats = (fake.batch(created.name) or {})["metadata"]["batchStats"]
    assert stats == {"requestCount": "6", "successfulRequestCount": "6"}
    output = results(client, job)
    assert [r["key"] for r in output] != [r["key"] for r in rows]
    assert sorted(r["key"] for r in output) == sorted(r["key"] for r in rows)
    for key, result in by_key(output).items():
        response = types.GenerateContentResponse.model_validate(result["response"])
        assert response.text == first_sentence(f"Review number {key[1:]} is fine. More.")
        assert response.candidates and response.candidates[0].finish_reason == "STOP"
        usage = response.usage_metadata
        assert usage is not None
        assert (usage.prompt_token_count, usage.candidates_token_count) == (9, 5)
        assert usage.total_token_count == 14
    generated = client.files.get(name=job.dest.file_name)
    assert generated.source == types.FileSource.GENERATED and generated.download_uri
    assert client.files.download(file=generated) == client.files.download(file=generated.name)


@pytest.mark.parametrize(
    ("polls", "expected"),
    [
        (0, [S.JOB_STATE_SUCCEEDED]),
        (2, [S.JOB_STATE_PENDING] * 2 + [S.JOB_STATE_RUNNING] * 2 + [S.JOB_STATE_SUCCEEDED]),
    ],
)
def test_polls_per_state_sets_how_many_gets_each_state_lasts(
    fake: FakeGemini, client: genai.Client, polls: int, expected: list[S]
) -> None:
    fake.polls_per_state = polls
    job = submit(client, lines(2))
    for _ in range(3):
        assert next(iter(client.batches.list())).state == S.JOB_STATE_PENDING, "only get advances"
    assert poll(client, job.name)[0] == expected


def test_a_resumable_upload_spans_chunks_and_only_generated_files_download(
    fake: FakeGemini, client: genai.Client
) -> None:
    data = b"x" * (8 * 1024 * 1024 + 10)  # the SDK sends 8 MiB chunks

    uploaded = upload(client, data)

    assert uploaded.name is not None and uploaded.name.startswith("files/")
    assert (uploaded.size_bytes, uploaded.mime_type) == (len(data), "application/jsonl")
    assert uploaded.state == types.FileState.ACTIVE and uploaded.source == types.FileSource.UPLOADED
    upload_calls = calls(fake, "/upload/v1beta/files")
    assert [bool(c.get("query")) for c in upload_calls] == [False, True, True]
    assert [c["keyed"] for c in upload_calls] == [True, False, False], "chunks carry no key"
    assert client.files.get(name=uploaded.name).display_name == "requests"
    with pytest.raises(errors.ClientError) as refused:
        client.files.download(file=uploaded.name)
    assert refused.value.code == 400
    client.files.delete(name=uploaded.name)
    with pytest.raises(errors.ClientError) as gone:
        client.files.get(name=uploaded.name)
    assert (gone.value.code, gone.value.status) == (403, "PERMISSION_DENIED")


def refused_get(api_key: str, options: types.HttpOptions) -> errors.ClientError:
    """The error a batches.get with this key and these options is refused with."""
    with (
        genai.Client(api_key=api_key, http_options=options) as sdk,
        pytest.raises(errors.ClientError) as refused,
    ):
        sdk.batches.get(name="batches/abc")
    return refused.value


def test_a_missing_key_is_403_and_an_unknown_key_400(fake: FakeGemini) -> None:
    keyless = types.HttpOptions(base_url=fake.base_url, headers={"x-goog-api-key": ""})
    missing = refused_get("unused", keyless)
    assert (missing.code, missing.status) == (403, "PERMISSION_DENIED")
    assert "API Key" in (missing.message or "")

    fake.api_keys = {"the-real-key"}
    wrong = refused_get("a-wrong-key", types.HttpOptions(base_url=fake.base_url))
    assert (wrong.code, wrong.status) == (400, "INVALID_ARGUMENT")
    assert "API key not valid" in (wrong.message or "")


def test_the_sdk_honours_google_gemini_base_url_and_gemini_api_key(
    fake: FakeGemini, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake.base_url)
    monkeypatch.setenv("GEMINI_API_KEY", "env-key")
    for name in ("GOOGLE_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_GENAI_API_VERSION"):
        monkeypatch.delenv(name, raising=False)
    fake.api_keys = {"env-key"}

    with genai.Client() as sdk:
        states, job = poll(sdk, submit(sdk, lines(2)).name)

    assert states[-1] == S.JOB_STATE_SUCCEEDED
    seen = fake.calls.entries()
    assert {c["api_version"] for c in seen} == {"v1"}, "the SDK's default version is v1"
    assert all(c["status"] == 200 for c in seen)


def test_list_pages_through_every_batch_and_finds_one_by_display_name(
    fake: FakeGemini, client: genai.Client
) -> None:
    names = [submit(client, lines(1), name=f"day-{i}").name for i in range(5)]

    listed = list(client.batches.list(config={"page_size": 2}))

    assert [job.name for job in listed] == list(reversed(names)), "newest first"
    found = [job for job in listed if job.display_name == "day-1"]
    assert [job.name for job in found] == [names[1]]
    queries = [c.get("query", "") for c in calls(fake, "/v1beta/batches")]
    assert len(queries) == 3 and all("pageSize=2" in q for q in queries)
    assert ["pageToken=" in q for q in queries] == [False, True, True]


def test_cancel_ends_a_pending_batch_with_no_output_and_a_running_one_with_partial_output(
    fake: FakeGemini, client: genai.Client
) -> None:
    pending = submit(client, lines(4), name="pending")
    assert pending.name is not None
    client.batches.cancel(name=pending.name)
    states, job = poll(client, pending.name)
    assert states == [S.JOB_STATE_CANCELLED] and job.dest is None

    running = submit(client, lines(4), name="running")
    assert running.name is not None
    client.batches.get(name=running.name)
    assert client.batches.get(name=running.name).state == S.JOB_STATE_RUNNING
    client.batches.cancel(name=running.name)
    job = client.batches.get(name=running.name)
    assert job.state == S.JOB_STATE_CANCELLED
    assert sorted(by_key(results(client, job))) == ["k0", "k1"]

    with pytest.raises(errors.ClientError) as again:
        client.batches.cancel(name=running.name)
    assert (again.value.code, again.value.status) == (400, "FAILED_PRECONDITION")
    client.batches.delete(name=running.name)
    with pytest.raises(errors.ClientError) as deleted:
        client.batches.get(name=running.name)
    assert (deleted.value.code, deleted.value.status) == (404, "NOT_FOUND")


@pytest.mark.parametrize(
    ("status", "error", "name"),
    [
        (429, errors.ClientError, "RESOURCE_EXHAUSTED"),
        (500, errors.ServerError, "INTERNAL"),
        (503, errors.ServerError, "UNAVAILABLE"),
    ],
)
def test_a_create_fault_is_seen_once_and_creates_nothing(
    fake: FakeGemini, client: genai.Client, status: int, error: type[Exception], name: str
) -> None:
    source = upload(client, jsonl(lines(2)))
    assert source.name is not None
    fake.faults.add(ControlFault("POST", CREATE, status=status, retry_after=2))

    with pytest.raises(error) as raised:
        client.batches.create(model=MODEL, src=source.name, config={"display_name": "x"})

    assert isinstance(raised.value, errors.APIError)
    assert (raised.value.code, raised.value.status) == (status, name)
    assert raised.value.response.headers["retry-after"] == "2"
    assert [c["fault"] for c in calls(fake, CREATE)] == [str(status)], "the SDK did not retry"
    assert fake.batches == {}
    job = client.batches.create(model=MODEL, src=source.name, config={"display_name": "x"})
    assert job.state == S.JOB_STATE_PENDING and len(fake.batches) == 1


def test_sdk_retry_options_turn_retries_on(fake: FakeGemini) -> None:
    """The switch the tests rely on being off: with retry_options the SDK does retry."""
    retry = types.HttpRetryOptions(attempts=2, initial_delay=0, max_delay=0, jitter=0)
    options = types.HttpOptions(base_url=fake.base_url, retry_options=retry)
    fake.faults.add(ControlFault("POST", CREATE, status=503))
    with genai.Client(api_key="test-key", http_options=options) as sdk:
        job = submit(sdk, lines(1))
    assert job.state == S.JOB_STATE_PENDING
    assert [c.get("fault") for c in calls(fake, CREATE)] == ["503", None]


def test_a_create_whose_answer_is_lost_still_creates_the_batch(
    fake: FakeGemini, client: genai.Client
) -> None:
    source = upload(client, jsonl(lines(2)))
    assert source.name is not None
    fake.faults.add(LostResponseFault("POST", CREATE))

    with pytest.raises(httpx2.TransportError):
        client.batches.create(model=MODEL, src=source.name, config={"display_name": "lost-1"})

    assert [c["fault"] for c in calls(fake, CREATE)] == ["lost_response"]
    found = [job for job in client.batches.list() if job.display_name == "lost-1"]
    assert len(found) == 1 and found[0].state == S.JOB_STATE_PENDING


def test_line_faults_give_error_lines_and_blocked_answers_in_a_succeeded_batch(
    fake: FakeGemini, client: genai.Client
) -> None:
    fake.line_fault = fault_map(
        {
            "k0": "invalid_argument",
            "k1": "429",
            "k2": "500",
            "k3": "safety",
            "k4": "prompt_blocked",
            "k5": "missing",
            "k6": "duplicate",
        }
    )
    states, job = poll(client, submit(client, lines(8)).name)

    assert states[-1] == S.JOB_STATE_SUCCEEDED
    output = results(client, job)
    assert sorted(r["key"] for r in output) == ["k0", "k1", "k2", "k3", "k4", "k6", "k6", "k7"]
    found = by_key(output)
    assert (found["k0"]["error"]["code"], found["k0"]["error"]["status"]) == (
        400,
        "INVALID_ARGUMENT",
    )
    assert (found["k1"]["error"]["code"], found["k1"]["error"]["status"]) == (
        429,
        "RESOURCE_EXHAUSTED",
    )
    assert (found["k2"]["error"]["code"], found["k2"]["error"]["status"]) == (500, "INTERNAL")
    safety = types.GenerateContentResponse.model_validate(found["k3"]["response"])
    assert safety.candidates and safety.candidates[0].finish_reason == "SAFETY"
    assert safety.text is None
    blocked = types.GenerateContentResponse.model_validate(found["k4"]["response"])
    assert blocked.prompt_feedback and blocked.prompt_feedback.block_reason == "SAFETY"
    assert not blocked.candidates
    stats = (fake.batch(job.name or "") or {})["metadata"]["batchStats"]
    assert stats == {"requestCount": "8", "successfulRequestCount": "5", "failedRequestCount": "3"}
    assert fake.billed == {"k3": 1, "k4": 1, "k5": 1, "k6": 1, "k7": 1}


def test_an_expired_batch_has_partial_output_and_a_failed_one_an_error(
    fake: FakeGemini, client: genai.Client
) -> None:
    fake.batch_outcome = lambda op: "expired" if op["metadata"]["displayName"] == "a" else "failed"

    states, expired = poll(client, submit(client, lines(6), name="a").name)
    assert states[-1] == S.JOB_STATE_EXPIRED
    assert sorted(by_key(results(client, expired))) == ["k0", "k1", "k2"]
    stats = (fake.batch(expired.name or "") or {})["metadata"]["batchStats"]
    assert stats["pendingRequestCount"] == "3" and stats["successfulRequestCount"] == "3"

    states, failed = poll(client, submit(client, lines(2), name="b").name)
    assert states[-1] == S.JOB_STATE_FAILED and failed.dest is None
    op = fake.batch(failed.name or "") or {}
    assert op["done"] is True and op["error"]["code"] == 500 and "response" not in op


def test_an_input_file_without_requests_fails_the_batch(
    fake: FakeGemini, client: genai.Client
) -> None:
    source = upload(client, b'{"key": "a", "request": {"contents": []}}\n{not json\n')
    assert source.name is not None
    job = client.batches.create(model=MODEL, src=source.name, config={"display_name": "bad"})
    states, job = poll(client, job.name)
    assert states == [S.JOB_STATE_PENDING, S.JOB_STATE_FAILED]
    op = fake.batch(job.name or "") or {}
    assert op["error"]["status"] == "INVALID_ARGUMENT" and "Line 2" in op["error"]["message"]


def test_the_concurrent_batch_limit_refuses_one_more_with_429(
    fake: FakeGemini, client: genai.Client
) -> None:
    fake.max_active_batches = 1
    first = submit(client, lines(1))
    with pytest.raises(errors.ClientError) as refused:
        submit(client, lines(1))
    assert (refused.value.code, refused.value.status) == (429, "RESOURCE_EXHAUSTED")
    assert len(fake.batches) == 1
    poll(client, first.name)
    assert submit(client, lines(1)).state == S.JOB_STATE_PENDING


def test_responder_and_response_schema_shape_the_answers(
    fake: FakeGemini, client: genai.Client
) -> None:
    schema = {
        "type": "object",
        "properties": {"sentiment": {"type": "string", "enum": ["positive", "negative"]}},
        "required": ["sentiment"],
    }
    text = "I loved this blender."
    config = {"responseMimeType": "application/json", "responseJsonSchema": schema}
    structured = line("s", text, generationConfig=config)
    output = by_key(results(client, poll(client, submit(client, [structured]).name)[1]))
    answer = types.GenerateContentResponse.model_validate(output["s"]["response"]).text
    assert json.loads(answer or "") == {"sentiment": stable_pick(["positive", "negative"], text)}

    fake.responder = lambda request: "Always this."
    output = by_key(results(client, poll(client, submit(client, lines(1)).name)[1]))
    assert output["k0"]["response"]["candidates"][0]["content"]["parts"] == [
        {"text": "Always this."}
    ]


def test_an_upload_may_name_its_file_within_the_api_s_alphabet(
    fake: FakeGemini, client: genai.Client
) -> None:
    named = client.files.upload(
        file=io.BytesIO(b"{}\n"),
        config={"mime_type": "application/jsonl", "name": "day-2024-05-01"},
    )
    assert named.name == "files/day-2024-05-01"
    with pytest.raises(errors.ClientError) as refused:
        client.files.upload(
            file=io.BytesIO(b"{}\n"), config={"mime_type": "application/jsonl", "name": "Day_1"}
        )
    assert (refused.value.code, refused.value.status) == (400, "INVALID_ARGUMENT")
    assert "lowercase alphanumeric" in (refused.value.message or "")
    assert sorted(fake.files) == ["files/day-2024-05-01"]
