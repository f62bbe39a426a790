"""OpenAI batch output and error lines → ItemResult: the parser an import's worker
processes run (see llm_assets.results.rows), importable without Dagster or an SDK."""

import json
from typing import Any, Literal

import msgspec
import orjson

from llm_assets.results.rows import Answered, ItemResult


def classify_error(
    status_code: int | None, code: str | None
) -> Literal["deterministic", "transient", "expired"]:
    if code == "batch_expired":
        return "expired"
    if status_code is None:
        # Lines that never ran (batch cancelled, server trouble) can run again.
        never_ran = (None, "server_error", "rate_limit_exceeded", "batch_cancelled", "batch_failed")
        return "transient" if code in never_ran else "deterministic"
    if status_code == 429 or status_code >= 500 or status_code == 408:
        return "transient"
    return "deterministic"


class _Message(msgspec.Struct, gc=False):
    content: str | None = None


class _Choice(msgspec.Struct, gc=False):
    message: _Message | None = None
    finish_reason: str | None = None


class _Details(msgspec.Struct, gc=False):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct, gc=False):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    prompt_tokens_details: _Details | None = None
    input_tokens_details: _Details | None = None


class _ChatBody(msgspec.Struct, gc=False):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None


class _Response(msgspec.Struct, gc=False):
    status_code: int | None = None
    body: _ChatBody | None = None


class _ChatLine(msgspec.Struct, gc=False):
    """The fields of a Chat Completions output line that an import reads; others are skipped
    unparsed."""

    custom_id: str | None = None
    response: _Response | None = None
    error: Any = None


_chat_line = msgspec.json.Decoder(_ChatLine)


def read_line(raw: bytes | str | dict[str, Any]) -> Answered | ItemResult | None:
    """One output or error file line, read: an Answered for an answered chat completion (a
    plain success), an ItemResult for anything else, None for a line without a custom_id.
    A status_code ≥ 400 is a failure even when `error` is null.

    Almost every line of a day is an answered chat completion: it is decoded into typed
    structs of just the fields read (a third of the time of building the whole line as dicts;
    docs/decisions.md). Any other line, or one whose values are not of the usual types,
    goes through the general path, which reads every shape.
    """
    if not isinstance(raw, dict):
        try:
            line = _chat_line.decode(raw)
        except msgspec.DecodeError:  # also a value of another type than declared
            pass
        else:
            answered = _answered_chat(line)
            if answered is not None:
                return answered
        return _normalize(orjson.loads(raw))
    return _normalize(raw)


def normalize_line(raw: bytes | str | dict[str, Any]) -> ItemResult | None:
    """One output or error file line → ItemResult (see read_line)."""
    read = read_line(raw)
    return read.result() if isinstance(read, Answered) else read


def _answered_chat(line: _ChatLine) -> Answered | None:
    """A successful chat completion line as the general path reads it; None for anything
    else (the general path decides)."""
    response = line.response
    if not line.custom_id or line.error is not None or response is None:
        return None
    status, body = response.status_code, response.body
    if status is None or status >= 400 or body is None or not body.choices:
        return None
    choice = body.choices[0]
    usage = body.usage or _NO_USAGE
    details = usage.prompt_tokens_details
    if usage.input_tokens_details is not None and (
        details is None or details.cached_tokens is None
    ):
        if details is not None:
            # An empty object here sends the general path to input_tokens_details, one with
            # other fields does not; unknown fields are not kept to tell them apart.
            return None
        details = usage.input_tokens_details
    return Answered(
        line.custom_id,
        status,
        choice.message.content if choice.message is not None else None,
        choice.finish_reason,
        usage.prompt_tokens or usage.input_tokens or 0,
        (details.cached_tokens or 0) if details is not None else 0,
        usage.completion_tokens or usage.output_tokens or 0,
    )


_NO_USAGE = _Usage()


def _normalize(line: dict[str, Any]) -> ItemResult | None:
    custom_id = line.get("custom_id")
    if not custom_id:
        return None
    response = line.get("response") or {}
    error = line.get("error") or {}
    status = response.get("status_code")
    body = response.get("body") or {}
    if error or status is None or status >= 400:
        body_error = body.get("error") if isinstance(body, dict) else None
        body_error = body_error if isinstance(body_error, dict) else {}
        code = error.get("code") or body_error.get("code") or body_error.get("type")
        message = error.get("message") or body_error.get("message") or f"HTTP {status}"
        return ItemResult(
            custom_id=custom_id,
            succeeded=False,
            status_code=status,
            error_class=classify_error(status, code),
            error_code=str(code) if code else f"http_{status}",
            error_message=str(message),
        )
    text, finish = _content_of(body)
    usage = body.get("usage") or {}
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    # Given as an ItemResult, not an Answered: an odd line's values may be of any JSON type,
    # which only the row maker's general path writes.
    return Answered(
        custom_id,
        status,
        text,
        finish,
        int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0),
        int(details.get("cached_tokens") or 0),
        int(usage.get("completion_tokens") or usage.get("output_tokens") or 0),
    ).result()


def _content_of(body: dict[str, Any]) -> tuple[str | None, str | None]:
    if body.get("object") == "chat.completion" or "choices" in body:
        choice = (body.get("choices") or [{}])[0]
        return (choice.get("message") or {}).get("content"), choice.get("finish_reason")
    if body.get("object") == "response" or "output" in body:
        texts = [
            part.get("text", "")
            for item in body.get("output") or []
            for part in item.get("content") or []
            if part.get("type") in ("output_text", "text")
        ]
        incomplete = (body.get("incomplete_details") or {}).get("reason")
        finish = "length" if incomplete == "max_output_tokens" else "stop"
        return "".join(texts), finish
    if "data" in body:
        embedding = (body.get("data") or [{}])[0].get("embedding")
        return json.dumps({"embedding": embedding}), "stop"
    return None, None
