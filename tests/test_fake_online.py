"""The fake online chat endpoint, exercised only through the official SDK.

The online provider is tested and benchmarked against this fake alone, so these tests pin it to
what the SDK parses and raises, and prove its knobs do what they claim: rate limits, latency,
capacity and faults.
"""

import asyncio
import json
import re
import time
from collections import Counter
from typing import Any, Literal

import openai
import pytest
from openai.types.chat import ChatCompletion
from pydantic import BaseModel, Field

from tests.fakes.online_server import FakeOnline, go_duration, retry_after_headers
from tests.fakes.openai_server import count_tokens, prompt_tokens_of

MODEL = "gpt-4o-mini"
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "The soup was cold. The waiter was rude."},
]
DURATION = re.compile(r"^(\d+h)?(\d+m)?(\d+(\.\d+)?s|\d+ms)$")

pytestmark = pytest.mark.fake_server("online")


class Review(BaseModel):
    sentiment: Literal["positive", "negative", "neutral"]
    score: float = Field(ge=0, le=1)
    stars: int = Field(ge=1, le=5)
    summary: str = Field(max_length=12)


def ask(client: openai.OpenAI, custom_id: str | None = None, **body: Any) -> ChatCompletion:
    headers = {"X-Client-Request-Id": custom_id} if custom_id else {}
    return client.chat.completions.create(
        model=body.pop("model", MODEL),
        messages=body.pop("messages", MESSAGES),
        extra_headers=headers,
        **body,
    )


def burst(fake: FakeOnline, n: int, timeout: float = 10.0, **body: Any) -> tuple[list[Any], float]:
    """n requests at once through AsyncOpenAI: (raw responses or the errors raised, seconds)."""

    async def run() -> list[Any]:
        async with openai.AsyncOpenAI(
            api_key="test", base_url=fake.base_url, max_retries=0, timeout=timeout
        ) as sdk:

            async def one(index: int) -> Any:
                try:
                    return await sdk.chat.completions.with_raw_response.create(
                        model=MODEL,
                        messages=MESSAGES,
                        extra_headers={"X-Client-Request-Id": f"item-{index}"},
                        **body,
                    )
                except openai.APIError as exc:
                    return exc

            return await asyncio.gather(*(one(i) for i in range(n)))

    started = time.monotonic()
    results = asyncio.run(run())
    return results, time.monotonic() - started


def split(results: list[Any]) -> tuple[list[Any], list[Any]]:
    errors = [r for r in results if isinstance(r, Exception)]
    return [r for r in results if not isinstance(r, Exception)], errors


def test_answer_parses_as_chat_completion_with_usage(
    fake: FakeOnline, client: openai.OpenAI
) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, extra_headers={"X-Client-Request-Id": "item-1"}
    )
    completion = raw.parse()

    assert isinstance(completion, ChatCompletion)
    assert completion.id.startswith("chatcmpl-")
    assert completion.object == "chat.completion"
    assert completion.model == MODEL
    choice = completion.choices[0]
    assert (choice.index, choice.finish_reason) == (0, "stop")
    assert choice.message.role == "assistant"
    assert choice.message.content == "The soup was cold."
    assert choice.message.refusal is None
    usage = completion.usage
    assert usage is not None
    expected_prompt = prompt_tokens_of({"messages": MESSAGES}, MODEL)
    assert usage.prompt_tokens == expected_prompt
    assert usage.completion_tokens == count_tokens("The soup was cold.", MODEL)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert raw.headers["x-request-id"].startswith("req_")
    assert "x-ratelimit-limit-requests" not in raw.headers
    [call] = fake.calls()
    assert (call.request_id, call.status) == ("item-1", 200)
    assert (call.prompt_tokens, call.completion_tokens) == (
        usage.prompt_tokens,
        usage.completion_tokens,
    )


def test_json_schema_response_format_gets_schema_valid_json(client: openai.OpenAI) -> None:
    completion = ask(
        client,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "review", "schema": Review.model_json_schema(), "strict": True},
        },
    )

    review = Review.model_validate_json(completion.choices[0].message.content or "")
    assert review.stars == 3
    assert json.loads(completion.choices[0].message.content or "")["score"] == 0.5


def test_custom_responder(fake: FakeOnline, client: openai.OpenAI) -> None:
    fake.responder = lambda body: body["messages"][-1]["content"].upper()

    assert ask(client).choices[0].message.content == MESSAGES[-1]["content"].upper()


@pytest.mark.parametrize("limit", ["max_tokens", "max_completion_tokens"])
def test_token_limit_cuts_the_answer(fake: FakeOnline, client: openai.OpenAI, limit: str) -> None:
    fake.responder = lambda body: "one two three four five six seven eight nine ten"

    completion = ask(client, **{limit: 4})

    assert completion.choices[0].finish_reason == "length"
    assert completion.choices[0].message.content == "one two three four"
    assert completion.usage is not None and completion.usage.completion_tokens == 4


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"messages": []}, "messages", "empty_array"),
        ({"messages": [{"content": "hi"}]}, "messages[0].role", "missing_required_parameter"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role", "invalid_value"),
        ({"messages": [{"role": "user", "content": 7}]}, "messages[0].content", "invalid_type"),
        ({"model": 7}, "model", "invalid_type"),
        ({"max_tokens": 0}, "max_tokens", "integer_below_min_value"),
        ({"model": "gpt-5-mini", "max_tokens": 10}, "max_tokens", "unsupported_parameter"),
    ],
)
def test_invalid_request_is_a_bad_request_error(
    fake: FakeOnline, client: openai.OpenAI, body: dict[str, Any], param: str, code: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, "bad", **body)

    assert caught.value.type == "invalid_request_error"
    assert (caught.value.param, caught.value.code) == (param, code)
    assert isinstance(caught.value.body, dict) and caught.value.body["message"]
    assert fake.count(400) == 1 and fake.successes() == []


def test_rpm_limit_admits_a_second_s_worth_and_says_when_to_retry(fake: FakeOnline) -> None:
    fake.rpm_limit = 600
    # The burst arrives at one instant as the limiter sees it, however loaded the machine is
    # (it once took 1.2 s to send, and the count is exact only inside one window).
    instant = time.monotonic()
    fake.clock = lambda: instant

    results, _ = burst(fake, 30)

    ok, errors = split(results)
    assert len(ok) == 10 and len(errors) == 20
    assert all(isinstance(e, openai.RateLimitError) for e in errors)
    for response in ok:
        assert isinstance(response.parse(), ChatCompletion)
        assert response.headers["x-ratelimit-limit-requests"] == "600"
        assert 0 <= int(response.headers["x-ratelimit-remaining-requests"]) < 10
        assert DURATION.match(response.headers["x-ratelimit-reset-requests"])
    waits = []
    for error in errors:
        headers = error.response.headers
        assert (error.type, error.code) == ("requests", "rate_limit_exceeded")
        assert 0 < float(headers["retry-after"]) <= 1.0
        assert int(headers["retry-after-ms"]) == round(float(headers["retry-after"]) * 1000)
        assert headers["x-ratelimit-limit-requests"] == "600"
        assert headers["x-ratelimit-remaining-requests"] == "0"
        assert DURATION.match(headers["x-ratelimit-reset-requests"])
        waits.append(float(headers["retry-after"]))
    assert fake.rate_limited() == 20 and fake.count(429) == 20
    assert fake.max_in_window(1.0, status=200) == 10
    assert sorted(Counter(fake.successes()).values()) == [1] * 10

    # Just before the wait the server asked for, the window is still full; after it, not.
    fake.clock = lambda: instant + max(waits) - 0.01
    early, _ = burst(fake, 1)
    assert isinstance(early[0], openai.RateLimitError)
    fake.clock = lambda: instant + max(waits) + 0.001
    retried, _ = burst(fake, 1)
    assert not isinstance(retried[0], Exception)


def test_tpm_limit_counts_prompt_plus_max_tokens(fake: FakeOnline) -> None:
    cost = prompt_tokens_of({"messages": MESSAGES}, MODEL) + 40
    fake.tpm_limit = 60 * (2 * cost + cost // 2)  # 2.5 requests' worth per second

    results, _ = burst(fake, 5, max_tokens=40)

    ok, errors = split(results)
    assert len(ok) == 2 and len(errors) == 3
    headers = errors[0].response.headers
    assert (errors[0].type, errors[0].code) == ("tokens", "rate_limit_exceeded")
    assert 0 < float(headers["retry-after"]) <= 1.0
    assert headers["x-ratelimit-limit-tokens"] == str(fake.tpm_limit)
    assert int(headers["x-ratelimit-remaining-tokens"]) < cost
    assert DURATION.match(headers["x-ratelimit-reset-tokens"])
    assert "x-ratelimit-limit-requests" not in headers
    assert fake.rate_limited() == 3


def test_request_larger_than_the_tpm_limit_is_refused_without_retry_after(
    fake: FakeOnline, client: openai.OpenAI
) -> None:
    fake.tpm_limit = 1000

    with pytest.raises(openai.RateLimitError) as caught:
        ask(client, max_tokens=2000)

    assert caught.value.type == "tokens"
    assert "Request too large" in caught.value.message
    assert "retry-after" not in caught.value.response.headers


def test_latency_overlaps_across_concurrent_requests(fake: FakeOnline) -> None:
    fake.latency_seconds = 0.2

    results, elapsed = burst(fake, 8)

    assert split(results)[1] == []
    assert 0.2 <= elapsed < 0.8
    assert fake.max_concurrency() == 8


def test_capacity_queues_requests_beyond_it(fake: FakeOnline) -> None:
    fake.latency_seconds = 0.2
    fake.capacity = 2

    results, elapsed = burst(fake, 8)

    assert split(results)[1] == []
    assert elapsed >= 0.8
    assert fake.max_concurrency() == 2


@pytest.mark.parametrize("status", ["500", "502", "503"])
def test_server_error_faults(fake: FakeOnline, client: openai.OpenAI, status: str) -> None:
    fake.fault = lambda custom_id, body: status if custom_id == "doomed" else None

    with pytest.raises(openai.InternalServerError) as caught:
        ask(client, "doomed")
    ask(client, "fine")

    assert caught.value.status_code == int(status)
    if status == "502":
        assert isinstance(caught.value.body, str) and "502 Bad Gateway" in caught.value.body
    else:
        assert caught.value.type == "server_error"
    assert fake.successes() == ["fine"]
    assert fake.count(int(status)) == 1


def test_rate_limit_fault_has_retry_after_and_spends_no_quota(
    fake: FakeOnline, client: openai.OpenAI
) -> None:
    fake.rpm_limit = 60
    fake.fault_retry_after_seconds = 0.35
    fake.fault = lambda custom_id, body: "429" if custom_id == "doomed" else None

    with pytest.raises(openai.RateLimitError) as caught:
        ask(client, "doomed")
    ask(client, "fine")

    headers = caught.value.response.headers
    assert (headers["retry-after"], headers["retry-after-ms"]) == ("0.35", "350")
    assert headers["x-ratelimit-remaining-requests"] == "1"
    assert caught.value.code == "rate_limit_exceeded"
    assert fake.rate_limited() == 0 and fake.count(429) == 1


def test_bad_request_fault(fake: FakeOnline, client: openai.OpenAI) -> None:
    fake.fault = lambda custom_id, body: "400"

    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, "doomed")

    assert caught.value.code == "invalid_value"


def test_timeout_fault_outlasts_the_client_and_is_not_a_success(
    fake: FakeOnline, client: openai.OpenAI
) -> None:
    fake.timeout_seconds = 0.8
    seen: set[str] = set()

    def once(custom_id: str | None, body: dict[str, Any]) -> str | None:
        if custom_id in seen:
            return None
        seen.add(str(custom_id))
        return "timeout"

    fake.fault = once

    started = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        ask(client, "slow", timeout=0.3)
    assert time.monotonic() - started < 0.8
    ask(client, "slow", timeout=0.3)

    assert fake.wait_idle(timeout=5)
    assert fake.successes() == ["slow"]
    timed_out = next(c for c in fake.calls() if c.fault == "timeout")
    assert timed_out.status == 0


def test_timeout_fault_answers_a_patient_client(fake: FakeOnline, client: openai.OpenAI) -> None:
    fake.timeout_seconds = 0.3
    fake.fault = lambda custom_id, body: "timeout"

    completion = ask(client, "patient", timeout=5)

    assert completion.choices[0].finish_reason == "stop"
    assert fake.successes() == ["patient"]


def test_reset_fault_is_a_connection_error(fake: FakeOnline, client: openai.OpenAI) -> None:
    fake.fault = lambda custom_id, body: "reset" if custom_id == "doomed" else None

    with pytest.raises(openai.APIConnectionError) as caught:
        ask(client, "doomed")
    ask(client, "fine")

    assert not isinstance(caught.value, openai.APITimeoutError)
    assert [(c.request_id, c.status, c.fault) for c in fake.calls()] == [
        ("doomed", 0, "reset"),
        ("fine", 200, None),
    ]


def test_unknown_fault_is_a_server_error_of_the_fake(
    fake: FakeOnline, client: openai.OpenAI
) -> None:
    fake.fault = lambda custom_id, body: "explode"

    with pytest.raises(openai.InternalServerError):
        ask(client)

    assert "fault returned 'explode'" in fake.server_errors.pop()


def test_records(fake: FakeOnline, client: openai.OpenAI) -> None:
    fake.fault = lambda custom_id, body: "500" if custom_id == "b" else None
    ask(client, "a")
    with pytest.raises(openai.InternalServerError):
        ask(client, "b")
    ask(client, "c")
    ask(client, "a")

    assert fake.successes() == ["a", "c", "a"]
    assert Counter(fake.successes())["a"] == 2
    assert fake.count(200) == 3 and fake.count(500) == 1
    assert fake.requests_per_second() == {0: 4}
    assert fake.requests_per_second(status=500) == {0: 1}
    assert fake.max_in_window(1.0) == 4
    assert fake.max_in_window(1.0, status=200) == 3
    assert [c.retry_count for c in fake.calls()] == [0, 0, 0, 0]
    first = fake.calls()[0]
    assert first.arrived <= (first.started or 0) <= (first.finished or 0)
    assert abs(first.arrived_wall - time.time()) < 60

    fake.reset()
    assert fake.calls() == [] and fake.requests_per_second() == {}


def test_models_and_api_key(fake: FakeOnline, client: openai.OpenAI) -> None:
    fake.models = ["served-model"]
    assert [m.id for m in client.models.list()] == ["served-model"]
    with pytest.raises(openai.NotFoundError) as caught:
        ask(client)
    assert caught.value.code == "model_not_found"
    assert ask(client, model="served-model").model == "served-model"

    fake.api_key = "right"
    with pytest.raises(openai.AuthenticationError):
        ask(client, model="served-model")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (0.0004, "1ms"), (0.12, "120ms"), (1, "1s"), (1.5, "1.5s"), (360, "6m0s")],
)
def test_go_duration(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


def test_retry_after_headers_round_up_to_a_millisecond() -> None:
    assert retry_after_headers(0.3501) == {"retry-after": "0.351", "retry-after-ms": "351"}
    assert retry_after_headers(2) == {"retry-after": "2", "retry-after-ms": "2000"}
