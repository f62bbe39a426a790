"""The fake Message Batches server, exercised only through the official anthropic SDK.

If the SDK parses what the fake says and raises what it should, an adapter tested against the
fake is tested against the wire protocol it will meet in production.
"""

import json
from pathlib import Path
from typing import Any

import anthropic
import pytest

from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.common import ControlFault, LostResponseFault, delay_fault

MODEL = "claude-fake-1"
BATCHES = "/v1/messages/batches"

pytestmark = pytest.mark.fake_server("anthropic", state_dir="anthropic")


def make_requests(n: int, prefix: str = "item", **params: Any) -> list[dict[str, Any]]:
    return [
        {
            "custom_id": f"{prefix}-{i}",
            "params": {
                "model": MODEL,
                "max_tokens": 256,
                "messages": [{"role": "user", "content": f"Review {i} is great. Would buy again."}],
                **params,
            },
        }
        for i in range(n)
    ]


def new_client(fake: FakeAnthropic, **kwargs: Any) -> anthropic.Anthropic:
    options: dict[str, Any] = {"api_key": "test", "base_url": fake.base_url, "max_retries": 0}
    return anthropic.Anthropic(**{**options, **kwargs})


def run_to_end(client: anthropic.Anthropic, batch_id: str) -> anthropic.types.messages.MessageBatch:
    for _ in range(10):
        batch = client.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            return batch
    raise AssertionError(f"{batch_id} never ended")


def results_by_id(client: anthropic.Anthropic, batch_id: str) -> dict[str, Any]:
    lines = list(client.messages.batches.results(batch_id))
    assert len({line.custom_id for line in lines}) == len(lines)
    return {line.custom_id: line.result for line in lines}


def statuses(fake: FakeAnthropic, method: str, path: str) -> list[int | None]:
    return [
        c["status"] for c in fake.calls.entries() if c["method"] == method and c["path"] == path
    ]


@pytest.fixture(autouse=True)
def no_ambient_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_CUSTOM_HEADERS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp_path / "no-anthropic-config"))


def test_create_poll_and_stream_shuffled_results_with_usage(
    fake: FakeAnthropic, client: anthropic.Anthropic
) -> None:
    requests = make_requests(6)
    requests[5]["params"]["messages"][0]["content"] = "Terrible. It broke."
    created = client.messages.batches.create(requests=requests)

    assert created.id.startswith("msgbatch_")
    assert created.type == "message_batch"
    assert created.processing_status == "in_progress"
    assert created.request_counts.processing == 6
    assert created.results_url is None and created.ended_at is None
    assert (created.expires_at - created.created_at).total_seconds() == 24 * 3600

    assert client.messages.batches.retrieve(created.id).processing_status == "in_progress"
    ended = client.messages.batches.retrieve(created.id)
    assert ended.processing_status == "ended"
    assert ended.ended_at is not None
    assert ended.request_counts.model_dump() == {
        "processing": 0,
        "succeeded": 6,
        "errored": 0,
        "canceled": 0,
        "expired": 0,
    }
    assert ended.results_url == f"{fake.base_url}{BATCHES}/{created.id}/results"

    lines = list(client.messages.batches.results(created.id))
    order = [line.custom_id for line in lines]
    assert sorted(order) == sorted(r["custom_id"] for r in requests)
    assert order != [r["custom_id"] for r in requests]
    results = {line.custom_id: line.result for line in lines}
    first = results["item-0"]
    assert first.type == "succeeded"
    message = first.message
    assert message.id.startswith("msg_")
    assert (message.type, message.role, message.model) == ("message", "assistant", MODEL)
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert json.loads(message.content[0].text) == {
        "label": "positive",
        "summary": "Review 0 is great.",
    }
    assert message.usage.input_tokens == 9  # ceil(len("Review 0 is great. Would buy again.") / 4)
    assert message.usage.output_tokens == -(-len(message.content[0].text) // 4)
    assert message.usage.cache_creation_input_tokens == 0
    assert message.usage.cache_read_input_tokens == 0
    negative = json.loads(results["item-5"].message.content[0].text)
    assert negative == {"label": "negative", "summary": "Terrible."}

    results_calls = statuses(fake, "GET", f"{BATCHES}/{created.id}/results")
    assert results_calls == [200]
    assert fake.calls.entries()[0] == {
        **fake.calls.entries()[0],
        "method": "POST",
        "path": BATCHES,
        "status": 200,
        "batch_id": created.id,
        "custom_ids": [r["custom_id"] for r in requests],
    }


def test_polls_per_state_zero_ends_on_first_retrieve(
    fake: FakeAnthropic, client: anthropic.Anthropic
) -> None:
    fake.polls_per_state = 0
    fake.shuffle_results = False
    batch = client.messages.batches.create(requests=make_requests(3))
    assert client.messages.batches.retrieve(batch.id).processing_status == "ended"
    assert [line.custom_id for line in client.messages.batches.results(batch.id)] == [
        "item-0",
        "item-1",
        "item-2",
    ]


def test_responder_and_max_tokens_truncation(
    fake: FakeAnthropic, client: anthropic.Anthropic
) -> None:
    fake.responder = lambda params: "x" * 100 if params["max_tokens"] == 5 else "short answer"
    requests = make_requests(1, prefix="long", max_tokens=5) + make_requests(1, prefix="ok")
    batch = client.messages.batches.create(requests=requests)
    results = results_by_id(client, run_to_end(client, batch.id).id)

    truncated = results["long-0"].message
    assert truncated.content[0].text == "x" * 20
    assert truncated.stop_reason == "max_tokens"
    assert truncated.usage.output_tokens == 5
    assert results["ok-0"].message.content[0].text == "short answer"
    assert results["ok-0"].message.stop_reason == "end_turn"


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        pytest.param(lambda r: r[2].update(custom_id="item-0"), "requests.2", id="duplicate"),
        pytest.param(lambda r: r[1].update(custom_id="has space"), "requests.1", id="charset"),
        pytest.param(lambda r: r[1].update(custom_id="x" * 65), "requests.1", id="too-long"),
        pytest.param(lambda r: r[0].update(custom_id=""), "requests.0", id="empty-id"),
        pytest.param(lambda r: r.clear(), "at least 1 item", id="no-requests"),
        pytest.param(lambda r: r[1]["params"].pop("model"), "'item-1'", id="no-model"),
        pytest.param(lambda r: r[2]["params"].update(max_tokens=0), "'item-2'", id="max-tokens"),
        pytest.param(lambda r: r[0]["params"].update(messages=[]), "'item-0'", id="no-messages"),
    ],
)
def test_invalid_create_is_rejected_whole(
    fake: FakeAnthropic, client: anthropic.Anthropic, mutate: Any, expected: str
) -> None:
    requests = make_requests(3)
    mutate(requests)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.batches.create(requests=requests)

    assert expected in str(caught.value.api_message)
    assert caught.value.type == "invalid_request_error"
    assert caught.value.request_id is not None and caught.value.request_id.startswith("req_")
    assert isinstance(caught.value.body, dict) and caught.value.body["type"] == "error"
    assert client.messages.batches.list().data == []
    assert fake.submitted_custom_ids() == []
    assert statuses(fake, "POST", BATCHES) == [400]


def test_request_count_and_body_size_limits(
    fake: FakeAnthropic, client: anthropic.Anthropic
) -> None:
    fake.max_requests = 3
    with pytest.raises(anthropic.BadRequestError, match="at most 3 requests"):
        client.messages.batches.create(requests=make_requests(4))
    fake.max_body_bytes = 1000
    with pytest.raises(anthropic.ContentTooLargeError) as caught:
        client.messages.batches.create(requests=make_requests(10, prefix="y" * 60))
    assert caught.value.type == "request_too_large"
    assert fake.submitted_custom_ids() == []


def test_item_faults_give_consistent_counts_and_results(
    fake: FakeAnthropic, client: anthropic.Anthropic
) -> None:
    kinds = {
        "item-0": "invalid_request",
        "item-1": "api_error",
        "item-2": "overloaded",
        "item-3": "expired",
        "item-4": "canceled",
        "item-5": "missing",
        "item-6": "duplicate",
    }
    fake.item_fault = lambda custom_id, params: kinds.get(custom_id)
    batch = client.messages.batches.create(requests=make_requests(9))
    ended = run_to_end(client, batch.id)

    assert ended.request_counts.model_dump() == {
        "processing": 0,
        "succeeded": 4,  # item-5 (missing line), item-6 (duplicated line), item-7, item-8
        "errored": 3,
        "canceled": 1,
        "expired": 1,
    }
    lines = list(client.messages.batches.results(batch.id))
    ids = [line.custom_id for line in lines]
    assert "item-5" not in ids
    assert ids.count("item-6") == 2
    results = {line.custom_id: line.result for line in lines}
    for custom_id, error_type in [
        ("item-0", "invalid_request_error"),
        ("item-1", "api_error"),
        ("item-2", "overloaded_error"),
    ]:
        result = results[custom_id]
        assert result.type == "errored"
        assert result.error.type == "error"
        assert result.error.error.type == error_type
        assert result.error.error.message
    assert results["item-3"].type == "expired"
    assert results["item-4"].type == "canceled"
    assert results["item-7"].type == "succeeded"


def test_expired_batch_expires_the_unprocessed_half(
    fake: FakeAnthropic, client: anthropic.Anthropic
) -> None:
    seen: list[dict[str, Any]] = []

    def outcome(batch: dict[str, Any]) -> str:
        seen.append(batch)
        return "expired"

    fake.batch_outcome = outcome
    batch = client.messages.batches.create(requests=make_requests(4))
    ended = run_to_end(client, batch.id)

    assert ended.request_counts.succeeded == 2 and ended.request_counts.expired == 2
    results = results_by_id(client, batch.id)
    assert {k: v.type for k, v in results.items()} == {
        "item-0": "succeeded",
        "item-1": "succeeded",
        "item-2": "expired",
        "item-3": "expired",
    }
    assert seen[0]["id"] == batch.id and len(seen[0]["requests"]) == 4


def test_cancel(fake: FakeAnthropic, client: anthropic.Anthropic) -> None:
    fake.polls_per_state = 5
    batch = client.messages.batches.create(requests=make_requests(4))
    canceling = client.messages.batches.cancel(batch.id)
    assert canceling.processing_status == "canceling"
    assert canceling.cancel_initiated_at is not None
    assert canceling.request_counts.processing == 4
    assert client.messages.batches.cancel(batch.id).processing_status == "canceling"

    ended = client.messages.batches.retrieve(batch.id)
    assert ended.processing_status == "ended"
    assert ended.request_counts.model_dump() == {
        "processing": 0,
        "succeeded": 2,
        "errored": 0,
        "canceled": 2,
        "expired": 0,
    }
    types = {k: v.type for k, v in results_by_id(client, batch.id).items()}
    assert sorted(types.values()) == ["canceled", "canceled", "succeeded", "succeeded"]
    with pytest.raises(anthropic.BadRequestError, match="cannot be canceled"):
        client.messages.batches.cancel(batch.id)


def test_results_and_delete_before_the_batch_ends(
    fake: FakeAnthropic, client: anthropic.Anthropic
) -> None:
    fake.polls_per_state = 5
    batch = client.messages.batches.create(requests=make_requests(2))
    with pytest.raises(anthropic.AnthropicError, match="No `results_url`"):
        client.messages.batches.results(batch.id)
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.get(f"{BATCHES}/{batch.id}/results", cast_to=object)
    assert caught.value.type == "not_found_error"
    with pytest.raises(anthropic.BadRequestError, match="still processing"):
        client.messages.batches.delete(batch.id)

    fake.polls_per_state = 0
    run_to_end(client, batch.id)
    deleted = client.messages.batches.delete(batch.id)
    assert (deleted.id, deleted.type) == (batch.id, "message_batch_deleted")
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(batch.id)
    assert client.messages.batches.list().data == []
    assert fake.submitted_custom_ids() == ["item-0", "item-1"]


def test_list_pagination_newest_first(fake: FakeAnthropic, client: anthropic.Anthropic) -> None:
    ids = [
        client.messages.batches.create(requests=make_requests(1, prefix=f"b{i}")).id
        for i in range(5)
    ]
    newest_first = ids[::-1]

    page = client.messages.batches.list(limit=2)
    assert [b.id for b in page.data] == newest_first[:2]
    assert page.has_more is True
    assert (page.first_id, page.last_id) == (newest_first[0], newest_first[1])
    assert [b.id for b in client.messages.batches.list(limit=2)] == newest_first
    assert len(statuses(fake, "GET", BATCHES)) == 1 + 3

    older = client.messages.batches.list(limit=10, after_id=newest_first[1])
    assert [b.id for b in older.data] == newest_first[2:] and older.has_more is False
    newer = client.messages.batches.list(limit=1, before_id=newest_first[2])
    assert [b.id for b in newer.data] == [newest_first[1]] and newer.has_more is True
    assert [b.id for b in client.messages.batches.list(limit=1, before_id=ids[0])] == ids[1:]
    with pytest.raises(anthropic.BadRequestError):
        client.messages.batches.list(limit=0)


def test_rate_limit_with_retry_after(fake: FakeAnthropic, client: anthropic.Anthropic) -> None:
    fake.faults.add(ControlFault("POST", BATCHES, status=429, retry_after=0.01))
    with pytest.raises(anthropic.RateLimitError) as caught:
        client.messages.batches.create(requests=make_requests(2))
    assert caught.value.response.headers["retry-after"] == "0.01"
    assert caught.value.type == "rate_limit_error"
    assert caught.value.request_id is not None
    assert fake.submitted_custom_ids() == []

    fake.faults.add(ControlFault("POST", BATCHES, status=429, times=2, retry_after=0.01))
    with new_client(fake, max_retries=2) as retrying:
        retrying.messages.batches.create(requests=make_requests(2))
    assert statuses(fake, "POST", BATCHES) == [429, 429, 429, 200]
    assert fake.submitted_custom_ids() == ["item-0", "item-1"]


def test_a_create_over_the_processing_batch_limit_is_refused_until_one_ends(
    fake: FakeAnthropic, client: anthropic.Anthropic
) -> None:
    fake.max_processing_batches = 2
    first = client.messages.batches.create(requests=make_requests(2, "a"))
    second = client.messages.batches.create(requests=make_requests(2, "b"))

    with pytest.raises(anthropic.RateLimitError) as refused:
        client.messages.batches.create(requests=make_requests(2, "c"))

    assert refused.value.status_code == 429
    assert refused.value.response.headers["retry-after"] == "1"
    assert refused.value.type == "rate_limit_error"
    assert refused.value.body == {
        "type": "error",
        "error": {
            "type": "rate_limit_error",
            "message": "Number of Message Batches being processed has exceeded your limit of 2. "
            "Please wait for a batch to end before creating another.",
        },
        "request_id": refused.value.request_id,
    }
    assert fake.batch_ids() == [first.id, second.id]

    fake.quota_retry_after = None
    assert client.messages.batches.cancel(second.id).processing_status == "canceling"
    with pytest.raises(anthropic.RateLimitError) as canceling:
        client.messages.batches.create(requests=make_requests(2, "c"))
    assert "retry-after" not in canceling.value.response.headers
    assert run_to_end(client, second.id).request_counts.canceled == 1
    third = client.messages.batches.create(requests=make_requests(2, "c"))
    assert third.processing_status == "in_progress"
    with pytest.raises(anthropic.RateLimitError):
        client.messages.batches.create(requests=make_requests(2, "d"))
    assert run_to_end(client, first.id).request_counts.succeeded == 2
    client.messages.batches.create(requests=make_requests(2, "d"))
    assert statuses(fake, "POST", BATCHES) == [200, 200, 429, 429, 200, 429, 200]
    assert fake.submitted_custom_ids() == ["a-0", "a-1", "b-0", "b-1", "c-0", "c-1", "d-0", "d-1"]


@pytest.mark.parametrize(
    ("status", "error", "error_type"),
    [
        (500, anthropic.InternalServerError, "api_error"),
        (529, anthropic.OverloadedError, "overloaded_error"),
    ],
)
def test_server_errors_on_poll(
    fake: FakeAnthropic,
    client: anthropic.Anthropic,
    status: int,
    error: type[anthropic.APIStatusError],
    error_type: str,
) -> None:
    batch = client.messages.batches.create(requests=make_requests(1))
    path = f"{BATCHES}/{batch.id}"
    fake.faults.add(ControlFault("GET", path, status=status, retry_after=0.01))
    with pytest.raises(error) as caught:
        client.messages.batches.retrieve(batch.id)
    assert caught.value.status_code == status and caught.value.type == error_type

    fake.faults.add(ControlFault("GET", path, status=status, times=2, retry_after=0.01))
    with new_client(fake, max_retries=2) as retrying:
        assert retrying.messages.batches.retrieve(batch.id).processing_status == "in_progress"
    assert statuses(fake, "GET", path) == [status, status, status, 200]


def test_connection_reset(fake: FakeAnthropic, client: anthropic.Anthropic) -> None:
    batch = client.messages.batches.create(requests=make_requests(1))
    fake.faults.add(ControlFault("GET", batch.id, reset_connection=True))
    with pytest.raises(anthropic.APIConnectionError):
        client.messages.batches.retrieve(batch.id)

    fake.faults.add(ControlFault("GET", batch.id, reset_connection=True))
    with new_client(fake, max_retries=1) as retrying:
        assert retrying.messages.batches.retrieve(batch.id).id == batch.id
    resets = [c for c in fake.calls.entries() if c.get("fault") == "reset"]
    assert len(resets) == 2 and all(c["status"] is None for c in resets)


def test_lost_create_response_makes_a_naive_retry_submit_twice(fake: FakeAnthropic) -> None:
    fake.faults.add(LostResponseFault("POST", BATCHES))
    with new_client(fake, max_retries=1) as retrying:
        retrying.messages.batches.create(requests=make_requests(2))
    assert statuses(fake, "POST", BATCHES) == [200, 200]
    assert fake.submitted_custom_ids() == ["item-0", "item-1", "item-0", "item-1"]
    assert len(fake.batch_ids()) == 2


def test_server_side_delay_trips_a_short_client_timeout(
    fake: FakeAnthropic, client: anthropic.Anthropic
) -> None:
    batch = client.messages.batches.create(requests=make_requests(1))
    fake.faults.add(delay_fault("GET", batch.id, seconds=0.5))
    with pytest.raises(anthropic.APITimeoutError):
        client.with_options(timeout=0.1).messages.batches.retrieve(batch.id)
    assert client.messages.batches.retrieve(batch.id).id == batch.id


def test_restart_mid_batch_keeps_state_and_call_log(
    fake: FakeAnthropic, client: anthropic.Anthropic, tmp_path: Path
) -> None:
    fake.polls_per_state = 2
    batch = client.messages.batches.create(requests=make_requests(4))
    assert client.messages.batches.retrieve(batch.id).processing_status == "in_progress"
    calls_before = len(fake.calls.entries())

    fake.stop()
    with pytest.raises(anthropic.APIConnectionError):
        client.messages.batches.retrieve(batch.id)
    fake.start()

    assert client.messages.batches.retrieve(batch.id).processing_status == "in_progress"
    ended = client.messages.batches.retrieve(batch.id)
    assert ended.processing_status == "ended" and ended.request_counts.succeeded == 4
    assert len(results_by_id(client, batch.id)) == 4
    assert len(fake.calls.entries()) == calls_before + 4

    fake.restart()
    assert len(results_by_id(client, batch.id)) == 4
    fake.stop()

    with (
        FakeAnthropic(tmp_path / "anthropic") as reborn,
        new_client(reborn) as fresh,
    ):
        again = fresh.messages.batches.retrieve(batch.id)
        assert again.results_url is not None and again.results_url.startswith(reborn.base_url)
        assert len(results_by_id(fresh, batch.id)) == 4
        assert reborn.submitted_custom_ids() == [f"item-{i}" for i in range(4)]
    assert not list((tmp_path / "anthropic").rglob("*.tmp"))


def test_submitted_custom_ids_in_order_with_repeats(
    fake: FakeAnthropic, client: anthropic.Anthropic
) -> None:
    client.messages.batches.create(requests=make_requests(2, prefix="a"))
    with pytest.raises(anthropic.BadRequestError):
        client.messages.batches.create(requests=make_requests(2, prefix="bad id"))
    client.messages.batches.create(requests=make_requests(1, prefix="b"))
    client.messages.batches.create(requests=make_requests(2, prefix="a"))
    assert fake.submitted_custom_ids() == ["a-0", "a-1", "b-0", "a-0", "a-1"]


def test_authentication_and_version_headers(fake: FakeAnthropic) -> None:
    with new_client(fake, default_headers={"Authorization": anthropic.Omit()}) as keyless:
        with pytest.raises(anthropic.AuthenticationError) as caught:
            keyless.messages.batches.list()
        assert caught.value.type == "authentication_error"

    headers = {"Authorization": anthropic.Omit(), "x-api-key": "any"}
    with new_client(fake, default_headers=headers) as with_x_api_key:
        assert with_x_api_key.messages.batches.list().data == []

    versionless = new_client(fake, default_headers={"anthropic-version": anthropic.Omit()})
    with versionless, pytest.raises(anthropic.BadRequestError, match="anthropic-version"):
        versionless.messages.batches.list()


def test_unknown_routes_and_batches_are_404(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.get("/v1/messages/nope", cast_to=object)
    assert caught.value.type == "not_found_error"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve("msgbatch_0123456789abcdef")
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve("../../etc")
